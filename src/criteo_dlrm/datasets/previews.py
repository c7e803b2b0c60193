"""What kedro viz shows of a dataset: it reads the *name* of ``preview``'s return annotation (``JSONPreview``,
``ImagePreview``) and renders the value accordingly. The names are kedro-viz's contract; kedro-datasets keeps
its own copies in a private module (``kedro_datasets._typing``), which this project does not import."""

from typing import NewType

JSONPreview = NewType("JSONPreview", str)  # a JSON document, as text
ImagePreview = NewType("ImagePreview", str)  # a PNG, base64-encoded

"""Matplotlib figures saved as PNG, versioned, written atomically with their digest."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from .previews import ImagePreview
from .versioned_file import VersionedFileDataset

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: 0.3 s of every kedro command's start
    from matplotlib.figure import Figure


class FigureDataset(VersionedFileDataset):
    """Saves a ``matplotlib.figure.Figure`` as PNG (``save_args`` go to ``savefig``); loads the PNG's bytes.

    Example ``catalog.yml`` entry::

        roc_curve_plot:
          type: criteo_dlrm.datasets.FigureDataset
          filepath: data/08_reporting/roc_curve.png
          versioned: true
          save_args:
            dpi: 110
    """

    def __init__(self, filepath: str, save_args: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(filepath, **kwargs)
        self._save_args = {"format": "png", **(save_args or {})}

    def load(self) -> bytes:
        return self._read(lambda handle: handle.read())

    def save(self, data: Figure) -> None:
        self._write_atomically(lambda handle: data.savefig(handle, **self._save_args))

    def preview(self) -> ImagePreview:
        """What kedro viz shows: the image, base64-encoded."""
        return ImagePreview(base64.b64encode(self.load()).decode())

"""Versioned binary files: exported models, the serving encoder, predictions written by a node."""

from __future__ import annotations

import shutil
from pathlib import Path

from .versioned_file import VersionedFileDataset


class BinaryFileDataset(VersionedFileDataset):
    """Saves ``bytes`` (written atomically) or a local file a node has written (copied into place in
    16 MB pieces, then deleted, so a file larger than memory is never read whole); loads the path of
    the version it points at.

    Example ``catalog.yml`` entries::

        dlrm_onnx:
          type: criteo_dlrm.datasets.BinaryFileDataset
          filepath: data/06_models/dlrm.onnx
          versioned: true
    """

    def load(self) -> str:
        """The file's path (or URL), once its digest is checked: open it with the library that reads its format."""
        return self._verified_path()

    def save(self, data: bytes | Path) -> None:
        if isinstance(data, bytes):
            self._write_atomically(lambda handle: handle.write(data))
            return
        staged = Path(data)
        try:
            self._write_atomically(lambda handle: shutil.copyfileobj(staged.open("rb"), handle, 1 << 24))
        finally:
            staged.unlink(missing_ok=True)

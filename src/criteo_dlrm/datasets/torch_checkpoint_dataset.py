"""Versioned PyTorch checkpoints, written atomically with their digest and loaded with ``weights_only=True``."""

from __future__ import annotations

from typing import Any

import torch

from criteo_dlrm.common.storage import DamagedFileError, reading
from criteo_dlrm.engine.checkpoint import DIGEST_KEY, state_digest

from .versioned_file import VersionedFileDataset

# Checkpoints of this format on carry their content digest inside (format 2 and older: the file digest only).
FIRST_FORMAT_WITH_DIGEST = 3


class TorchCheckpointDataset(VersionedFileDataset):
    """Saves a checkpoint dict with ``torch.save``; loads it with ``weights_only=True`` onto the CPU, after
    checking its digests (a damaged or truncated file is refused, naming it, instead of scoring garbage): the
    file's, beside it, and the content's, inside it (``engine.checkpoint.state_digest``), so an edited checkpoint
    is refused even when its file digest was written again.

    The loaded dict gets ``catalog_version``: the version it was loaded from, so a report can name it.

    Example ``catalog.yml`` entry::

        dlrm_checkpoint:
          type: criteo_dlrm.datasets.TorchCheckpointDataset
          filepath: data/06_models/dlrm_checkpoint.pt
          versioned: true
    """

    def load(self) -> dict[str, Any]:
        path = self._verified_path()

        def load() -> dict[str, Any]:
            with self._fs.open(path, "rb") as handle:
                return torch.load(handle, map_location="cpu", weights_only=True)

        checkpoint = reading(path, load, self._fix())
        if not isinstance(checkpoint, dict):
            raise DamagedFileError(f"{path} is not a checkpoint written by this project. {self._fix()}")
        expected = checkpoint.pop(DIGEST_KEY, None)
        if expected is None and checkpoint.get("format", 0) >= FIRST_FORMAT_WITH_DIGEST:
            raise DamagedFileError(f"{path} has lost the content digest it was written with. {self._fix()}")
        if expected is not None and state_digest(checkpoint) != expected:
            raise DamagedFileError(
                f"{path} is damaged: its content is not what was written (a rewrite with a new file digest beside "
                f"it is still found: the content digest inside no longer matches). {self._fix()}"
            )
        checkpoint["catalog_version"] = self.loaded_version()
        return checkpoint

    def save(self, data: dict[str, Any]) -> None:
        data = {key: value for key, value in data.items() if key != "catalog_version"}
        self._write_atomically(lambda handle: torch.save({**data, DIGEST_KEY: state_digest(data)}, handle))

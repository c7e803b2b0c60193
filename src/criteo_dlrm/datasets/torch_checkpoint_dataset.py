"""Versioned PyTorch checkpoints, written atomically with their digest and loaded with ``weights_only=True``."""

from __future__ import annotations

from typing import Any

import torch

from criteo_dlrm.common.storage import reading

from .versioned_file import VersionedFileDataset


class TorchCheckpointDataset(VersionedFileDataset):
    """Saves a checkpoint dict with ``torch.save``; loads it with ``weights_only=True`` onto the CPU, after
    checking its digest (a damaged or truncated file is refused, naming it, instead of scoring garbage).

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
        checkpoint["catalog_version"] = self.loaded_version()
        return checkpoint

    def save(self, data: dict[str, Any]) -> None:
        self._write_atomically(lambda handle: torch.save(data, handle))

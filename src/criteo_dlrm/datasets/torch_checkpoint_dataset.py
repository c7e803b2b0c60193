"""Versioned PyTorch checkpoints, written atomically and loaded with ``weights_only=True``."""

from __future__ import annotations

from typing import Any

import torch

from .versioned_file import VersionedFileDataset


class TorchCheckpointDataset(VersionedFileDataset):
    """Saves a checkpoint dict with ``torch.save``; loads it with ``weights_only=True`` onto the CPU.

    The loaded dict gets ``catalog_version``: the version it was loaded from, so a report can name it.

    Example ``catalog.yml`` entry::

        dlrm_checkpoint:
          type: criteo_dlrm.datasets.TorchCheckpointDataset
          filepath: data/06_models/dlrm_checkpoint.pt
          versioned: true
    """

    def load(self) -> dict[str, Any]:
        checkpoint = self._read(lambda handle: torch.load(handle, map_location="cpu", weights_only=True))
        checkpoint["catalog_version"] = self.loaded_version()
        return checkpoint

    def save(self, data: dict[str, Any]) -> None:
        self._write_atomically(lambda handle: torch.save(data, handle))

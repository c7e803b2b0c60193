"""Encoded model inputs as ``.npy`` files in a folder, loaded memory-mapped."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from kedro.io import AbstractDataset

from criteo_dlrm.data.encoding import EncodedArrays, EncodedDays

FIELDS = ("labels", "dense", "sparse")


class EncodedArraysDataset(AbstractDataset[EncodedArrays | EncodedDays, EncodedArrays]):
    """``labels.npy``, ``dense.npy``, ``sparse.npy`` in ``path``; loads them with ``mmap_mode="r"``,
    so training reads rows from disk on demand instead of holding the whole set in memory.

    Saving ``EncodedDays`` encodes them straight into the files (memory stays at one batch); saving
    ``EncodedArrays`` writes arrays that are already in memory.
    """

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        self._path = Path(path)
        self.metadata = metadata

    def load(self) -> EncodedArrays:
        return EncodedArrays(*(np.load(self._path / f"{name}.npy", mmap_mode="r") for name in FIELDS))

    def save(self, data: EncodedArrays | EncodedDays) -> None:
        # Written beside, then swapped in, so a crash never leaves a half-written set behind.
        staging = self._path.with_name(self._path.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if isinstance(data, EncodedDays):
            written = data.write(staging)
            del written  # close the memory maps before the folder moves
        else:
            for name in FIELDS:
                np.save(staging / f"{name}.npy", getattr(data, name))
        shutil.rmtree(self._path, ignore_errors=True)
        staging.rename(self._path)

    def _exists(self) -> bool:
        return all((self._path / f"{name}.npy").exists() for name in FIELDS)

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}

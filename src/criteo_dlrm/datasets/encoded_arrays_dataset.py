"""Encoded model inputs as ``.npy`` files in a folder, loaded memory-mapped, with their lineage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from kedro.io import AbstractDataset
from loguru import logger

from criteo_dlrm.data.encoding import STORED_FIELDS as FIELDS
from criteo_dlrm.data.encoding import EncodedArrays, EncodedDays, open_encoded

LINEAGE = "lineage.json"


class EncodedArraysDataset(AbstractDataset[EncodedArrays | EncodedDays, EncodedArrays]):
    """``labels.npy``, ``dense.npy``, ``sparse.npy`` (packed indices), ``layout.json`` and ``lineage.json`` in
    ``path``; loads the arrays memory-mapped, so training reads rows from disk on demand instead of holding the whole set in memory.

    Saving ``EncodedDays`` encodes them straight into the files (memory stays at one batch), unless the
    folder already holds rows with the same lineage (same metadata version and vocabularies, same Parquet
    days): those are reused as they are. Saving ``EncodedArrays`` writes arrays already in memory.
    """

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        self._path = Path(path)
        self.metadata = metadata

    def load(self) -> EncodedArrays:
        return open_encoded(self._path, lineage=self._stored_lineage())

    def _stored_lineage(self) -> dict | None:
        path = self._path / LINEAGE
        return json.loads(path.read_text()) if path.exists() else None

    def save(self, data: EncodedArrays | EncodedDays) -> None:
        if data.lineage is not None and self._exists() and self._stored_lineage() == data.lineage:
            logger.info("{}: already encoded from the same metadata version and days; reused", self._path)
            return
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
        if data.lineage is not None:
            (staging / LINEAGE).write_text(json.dumps(data.lineage, indent=1))
        shutil.rmtree(self._path, ignore_errors=True)
        staging.rename(self._path)

    def _exists(self) -> bool:
        return all((self._path / f"{name}.npy").exists() for name in FIELDS)

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}

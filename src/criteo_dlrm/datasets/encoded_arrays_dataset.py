"""Encoded model inputs as ``.npy`` files in a folder, loaded memory-mapped, with their lineage and digests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset
from loguru import logger

from criteo_dlrm.common.locks import exclusive
from criteo_dlrm.common.storage import (
    DamagedFileError,
    atomic_folder,
    in_project,
    reading,
    remove_stale_partials,
    write_bytes_atomically,
)
from criteo_dlrm.data.chunk_digests import REENCODE, write_digests
from criteo_dlrm.data.encoding import EncodedDays
from criteo_dlrm.data.stored import EncodedArrays, check_index_range, open_encoded, write_encoded

LINEAGE = "lineage.json"


class EncodedArraysDataset(AbstractDataset[EncodedArrays | EncodedDays, EncodedArrays]):
    """``labels.npy``, ``dense.npy``, ``sparse.npy`` (packed indices), ``layout.json``, ``lineage.json`` and
    ``digests.json`` in ``path``; loads the arrays memory-mapped, so training reads rows from disk on demand
    instead of holding the whole set in memory.

    Saving ``EncodedDays`` encodes them straight into the files (memory stays at one batch), unless the
    folder already holds intact rows with the same lineage (same metadata version and vocabularies, same
    Parquet days): those are reused as they are; damaged ones are encoded again. The rows are written into a
    staged folder that replaces ``path`` when complete, under a lock, so two runs never mix their rows.
    Loading checks the small files and the files' sizes against their digests; each chunk of rows is checked
    when it is first read (``data.chunk_digests``), so damaged rows are refused, naming them, before they are
    used, without a full read before training starts. Damage found that way is recorded in the folder, and the
    next save encodes the rows again.
    """

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        self._path = Path(path)
        self.metadata = metadata

    @property
    def path(self) -> Path:
        """The folder of the rows."""
        return self._path

    @property
    def _shown(self) -> Path:
        """The folder as log lines name paths: relative to the project (the working folder) when inside it."""
        return in_project(self._path) or self._path

    def load(self) -> EncodedArrays:
        return open_encoded(self._path, lineage=self._stored_lineage())

    def _stored_lineage(self) -> dict | None:
        """The folder's ``lineage.json`` (None: none there).

        Raises:
            DamagedFileError: it cannot be read as what was written, naming it and the command that encodes again.
        """
        path = self._path / LINEAGE
        if not path.exists():
            return None
        lineage = reading(path, lambda: json.loads(path.read_text()), REENCODE, "the encoded rows' lineage")
        if not isinstance(lineage, dict):
            raise DamagedFileError(
                f"the encoded rows' lineage: {path} is not a lineage record. {REENCODE}", fix=REENCODE
            )
        return lineage

    def _reusable(self, data: EncodedArrays | EncodedDays) -> bool:
        if data.lineage is None or not self._exists():
            return False
        try:
            if self._stored_lineage() != data.lineage:
                return False
            stored = open_encoded(self._path)  # small files, sizes; damage an earlier reader recorded
            if isinstance(data, EncodedDays):  # a lineage that claims these tables, and indices beyond them
                check_index_range(stored, data.encoder.table_sizes, "the stored rows")
        except DamagedFileError as error:
            logger.warning("{} Encoding them again.", error)
            return False
        # Rows written before chunk digests, or in another row order, are encoded again (once).
        return stored.digests is not None and (not isinstance(data, EncodedDays) or stored.row_order == data.row_order)

    def save(self, data: EncodedArrays | EncodedDays) -> None:
        with exclusive(self._path, f"the encoded rows {self._path.name}"):
            remove_stale_partials(self._path.parent)
            if self._reusable(data):
                logger.info("{}: already encoded from the same metadata version and days; reused", self._shown)
                return
            with atomic_folder(self._path, f"the encoded rows {self._path.name}") as staging:
                if isinstance(data, EncodedDays):
                    written = data.write(staging)
                    del written  # close the memory maps before the folder moves
                    if data.lineage is not None:
                        write_bytes_atomically(staging / LINEAGE, json.dumps(data.lineage, indent=1).encode())
                    write_digests(staging, chunks_recorded=True)  # the chunks' by the encoder, as it wrote them
                else:
                    if data.lineage is not None:
                        staging.mkdir(parents=True, exist_ok=True)
                        write_bytes_atomically(staging / LINEAGE, json.dumps(data.lineage, indent=1).encode())
                    write_encoded(data, staging)
        logger.info("{}: {:,} encoded rows written", self._shown, len(open_encoded(self._path, verify=False)))

    def _exists(self) -> bool:
        return self._path.is_dir() and all((self._path / f"{name}.npy").exists() for name in ("labels", "dense"))

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}

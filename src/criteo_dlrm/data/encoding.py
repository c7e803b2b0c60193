"""Turning typed Criteo columns into model inputs: table indices and standardised dense floats.

Vocabulary lookups go through pandas' hash-table index (one per feature, built once), so encoding
runs at tens of millions of lookups per second on one core, with no Python per value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from loguru import logger

from criteo_dlrm.common.parallel import Runner, choose_workers, run_parallel, where_tasks_run
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import (
    DENSE_COLUMNS,
    DENSE_TRANSFORMS,
    LABEL_COLUMN,
    NUM_DENSE,
    NUM_SPARSE,
    SPARSE_COLUMNS,
)
from criteo_dlrm.common.storage import size_text
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.chunk_digests import write_chunk_digests, written_digests
from criteo_dlrm.data.feature_metadata import MISSING_ROW, OUT_OF_VOCABULARY_ROW, RESERVED_ROWS, FeatureMetadata
from criteo_dlrm.data.parquet import Day, DayRows, count_rows, dense_values, iter_batches, sparse_values
from criteo_dlrm.data.shuffle import BucketWriter, day_buckets, shuffle_destinations
from criteo_dlrm.data.stored import (
    EncodedArrays,
    RowWriter,
    bytes_per_row,
    create_stored,
    open_encoded,
    write_index_maxima,
)

if TYPE_CHECKING:  # pandas is imported by the lookups that use it (_hash_tables): training never needs it
    import pandas as pd


@dataclass
class EncodedDays:
    """Days to encode, not encoded yet: whoever stores them decides where the rows go (see ``write``)."""

    encoder: FeatureEncoder
    paths: list[Day]  # whole days, or parts of them (DayRows)
    lineage: dict | None = None  # stored with the rows, so they are reused only for the same inputs
    workers: int | None = None  # processes encoding whole days; None: one per core (bounded by memory)
    shuffle: bool = False  # store the rows shuffled (training rows: the loader then reads them in order)
    run: Runner = run_parallel  # where the days are encoded (or run_on_spark: one Spark task per day)

    def __len__(self) -> int:
        return count_rows(self.paths)

    @property
    def row_order(self) -> str:
        return "shuffled" if self.shuffle else "as read"

    def write(self, folder: Path) -> EncodedArrays:
        """Encode straight into ``labels.npy``, ``dense.npy`` and ``sparse.npy`` in ``folder``."""
        return self.encoder.encode_days(
            self.paths, into=folder, workers=self.workers, shuffle=self.shuffle, run=self.run
        )


def reserved_rows(missing_row: bool) -> int:
    """Rows before the vocabulary: 2 (unseen, missing), or 1 in the earlier layout (unseen or missing)."""
    return RESERVED_ROWS if missing_row else 1


class FeatureEncoder:
    """Encodes typed Criteo rows with the statistics and vocabularies of ``feature_metadata``.

    Sparse value ``v`` of feature ``f`` maps to ``2 + position of v in f's vocabulary``, to 0 when the
    vocabulary does not hold it, to 1 when it is missing. In modulus-hash mode it maps to
    ``2 + v mod (table_size - 2)`` and missing to 1. With ``missing_row=False`` (the earlier layout) missing and
    unseen share row 0 and everything else is one row lower. Dense value ``x`` of feature ``i`` maps to
    ``(log1p(max(x + dense_offset[i], 0)) - dense_mean[i]) / dense_std[i]``, and a missing one to ``dense_missing[i]``:
    with the ``standardised`` transform the offset is 0 and a missing value 0 (the mean); with ``log_plus_3``
    (MLPerf's ``log(x + 3)``, missing as 0) the offset 2, mean 0, deviation 1, and a missing value ``log(3)``.
    """

    def __init__(
        self,
        table_sizes: list[int],
        dense_mean: np.ndarray,
        dense_std: np.ndarray,
        vocabularies: list[np.ndarray] | None,
        missing_row: bool = True,
        dense_offset: np.ndarray | None = None,
        dense_missing: np.ndarray | None = None,
    ):
        if len(table_sizes) != NUM_SPARSE or len(dense_mean) != NUM_DENSE:
            raise ValueError(f"Expected {NUM_SPARSE} tables and {NUM_DENSE} dense statistics.")
        self.missing_row = missing_row
        self.table_sizes = [int(size) for size in table_sizes]
        self.dense_mean = np.asarray(dense_mean, dtype=np.float64)
        self.dense_std = np.asarray(dense_std, dtype=np.float64)
        self.dense_offset = (
            np.zeros(NUM_DENSE, np.int64) if dense_offset is None else np.asarray(dense_offset, np.int64)
        )
        self.dense_missing = np.zeros(NUM_DENSE) if dense_missing is None else np.asarray(dense_missing, np.float64)
        self.vocabularies = vocabularies
        self._indexes = _hash_tables(vocabularies)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_indexes": None}  # workers rebuild the hash tables instead of unpickling copies

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._indexes = _hash_tables(self.vocabularies)

    @property
    def use_modulus_hash(self) -> bool:
        return self.vocabularies is None

    @classmethod
    def from_metadata(
        cls,
        metadata: FeatureMetadata,
        vocabularies: dict[str, np.ndarray] | None,
        dense_transform: str = "standardised",
    ) -> FeatureEncoder:
        """The encoder of ``metadata``'s tables and statistics, its dense features transformed by
        ``dense_transform`` (a name of ``DENSE_TRANSFORMS``)."""
        modulus = metadata.uses_modulus_hash
        if not modulus and vocabularies is None:
            raise ValueError("feature_metadata uses vocabularies, but none were given.")
        transform = DENSE_TRANSFORMS[dense_transform]
        offset = np.full(NUM_DENSE, transform["offset"], np.int64)
        mean, std = metadata.dense_means, metadata.dense_stds
        missing = np.zeros(NUM_DENSE)  # the mean, standardised
        if not transform["standardise"]:
            mean, std, missing = np.zeros(NUM_DENSE), np.ones(NUM_DENSE), np.log1p(offset.astype(np.float64))
        return cls(
            table_sizes=metadata.table_sizes,
            dense_mean=mean,
            dense_std=std,
            vocabularies=None if modulus else [np.asarray(vocabularies[name]) for name in SPARSE_COLUMNS],
            missing_row=metadata.has_missing_row,
            dense_offset=offset,
            dense_missing=missing,
        )

    @property
    def first_vocabulary_row(self) -> int:
        return reserved_rows(self.missing_row)

    def encode_sparse_column(self, feature: int, values: np.ndarray) -> np.ndarray:
        """``values``: (N,) int64 ids, -1 for missing -> (N,) int32 table indices."""
        first = self.first_vocabulary_row
        if self.vocabularies is None:
            indices = first + np.mod(values, self.table_sizes[feature] - first)
        else:
            position = self._indexes[feature].get_indexer(values)  # -1 when the vocabulary does not hold it
            indices = np.where(position >= 0, position + first, OUT_OF_VOCABULARY_ROW)
        indices[values < 0] = MISSING_ROW if self.missing_row else OUT_OF_VOCABULARY_ROW
        return indices.astype(np.int32)

    def encode_dense(self, values: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """``values``, ``missing``: (N, 13) -> (N, 13) float32."""
        if self.dense_offset.any():
            values = values + self.dense_offset.astype(values.dtype)
        scaled = np.log1p(np.maximum(values, 0, dtype=np.float32))
        scaled -= self.dense_mean.astype(np.float32)
        scaled /= self.dense_std.astype(np.float32)
        scaled[missing] = np.broadcast_to(self.dense_missing.astype(np.float32), scaled.shape)[missing]
        return scaled

    def encode_batch(self, batch: pa.RecordBatch | pa.Table, contiguous: bool = True) -> EncodedArrays:
        """Encode a typed batch (Parquet columns ``labels``, ``DENSE_*``, ``SPARSE_*``).

        With ``contiguous=False`` the 2-D arrays stay column-major (cheaper when they are copied anyway).
        """
        rows = batch.num_rows
        # Filled column by column in Fortran order (contiguous writes), made row-major once at the end
        # because training gathers whole rows.
        dense = np.empty((rows, NUM_DENSE), dtype=np.float32, order="F")
        missing = np.empty((rows, NUM_DENSE), dtype=bool, order="F")
        for i, name in enumerate(DENSE_COLUMNS):
            dense[:, i], missing[:, i] = dense_values(batch.column(name), np.float32)
        sparse = np.empty((rows, NUM_SPARSE), dtype=np.int32, order="F")
        for i, name in enumerate(SPARSE_COLUMNS):
            sparse[:, i] = self.encode_sparse_column(i, sparse_values(batch.column(name)))
        labelled = LABEL_COLUMN in batch.schema.names
        labels = np.asarray(batch.column(LABEL_COLUMN)).astype(np.float32) if labelled else None
        dense = self.encode_dense(dense, missing)
        if contiguous:
            dense, sparse = np.ascontiguousarray(dense), np.ascontiguousarray(sparse)
        return EncodedArrays(labels, dense, sparse)

    def encode_days(
        self,
        paths: list[Day],
        into: Path | None = None,
        workers: int | None = 1,
        shuffle: bool = False,
        run: Runner = run_parallel,
    ) -> EncodedArrays:
        """Encode whole days, into memory or, with ``into``, into files in that folder (``open_encoded``).

        In memory: float32 labels, dense and int32 indices, 160 bytes per row. On disk: uint8 labels,
        float32 dense and ``PackedIndices``, 53 bytes + the tables' index widths per row, and the digests of
        their chunks (``chunk_digests.npy``, hashed as the rows are written). The files are written batch by
        batch, so the days never need to fit in memory, and ``workers`` processes
        (None: one per core) each encode whole days into their own rows; the files are the same whatever
        the number of workers.

        ``shuffle`` (stored rows only) stores them in a uniformly random order, drawn from a fixed seed
        (``shuffle_destinations``): an external shuffle with memory bounded by ``SHUFFLE_BUCKET_ROWS`` rows per
        worker, so a reader of contiguous chunks gets rows from every day.

        ``run`` is where the days (and the shuffle's buckets) are encoded: this machine's worker processes, or
        ``criteo_dlrm.spark.tasks.run_on_spark`` (one Spark task each, the same files).
        """
        rows_per_day = [count_rows([path]) for path in paths]
        rows = sum(rows_per_day)
        if into is None:
            out = EncodedArrays(
                np.empty(rows, np.float32),
                np.empty((rows, NUM_DENSE), np.float32),
                np.empty((rows, NUM_SPARSE), np.int32),
            )
            out.index_maxima = self._encode_rows(paths, out, 0)
            return out
        create_stored(into, rows, self.table_sizes, "shuffled" if shuffle else "as read")
        starts = np.concatenate([[0], np.cumsum(rows_per_day)[:-1]]).tolist()
        destinations = shuffle_destinations(rows_per_day) if shuffle else None
        chosen = choose_workers(workers, len(paths), ENCODING_MEMORY, rows, ENCODING_CORES)
        tasks = [
            (
                path if isinstance(path, DayRows) else str(path),
                str(into),
                start
                if destinations is None
                else (day, destinations.buckets, destinations.block_rows, destinations.day_starts[day]),
            )
            for day, (path, start) in enumerate(zip(paths, starts, strict=True))
        ]
        maxima, hashed = [0] * NUM_SPARSE, {}
        with progress_bar(rows, f"encoding ({where_tasks_run(run, chosen)})", "rows") as bar:
            for index, (day_maxima, written) in run(
                _encode_day_into, tasks, chosen, shared=self, preload=WORKER_MODULES
            ):
                maxima = np.maximum(maxima, day_maxima).tolist()
                hashed.update(written)
                bar.update(rows_per_day[index])
        if destinations is not None:
            hashed = destinations.shuffle_buckets(into, workers, run)
        # The chunks' digests from what the workers wrote (the rows are not read back for them: under a memory
        # limit they have left the page cache); only the chunks no task wrote whole are read.
        write_chunk_digests(into, hashed)
        write_index_maxima(into, maxima)
        encoded = open_encoded(into, verify=False)
        size = bytes_per_row(encoded)
        logger.info("{:,} rows encoded, {} bytes a row ({})", rows, size, size_text(rows * size))
        return encoded

    def _encode_rows(
        self, paths: list[Day], out: EncodedArrays | RowWriter | BucketWriter, start: int | tuple
    ) -> list[int]:
        """Encode ``paths`` batch by batch into ``out`` (rows in memory) from row ``start`` on, or into stored rows
        in order (``out`` a ``RowWriter``), or (``out`` a ``BucketWriter``, ``start`` a day's
        ``(day, buckets, block_rows, bucket_starts)``) into that day's rows of each bucket; returns each table's
        largest index."""
        maxima = np.zeros(NUM_SPARSE, dtype=np.int64)
        read = 0
        for batch in iter_batches(paths):
            encoded = self.encode_batch(batch, contiguous=False)
            if isinstance(out, BucketWriter):  # a shuffled write: each row to the next free row of its bucket
                out.write(day_buckets(start, read, len(encoded)), encoded)
            elif isinstance(out, RowWriter):
                out.write(encoded)
            else:
                where = slice(start + read, start + read + len(encoded))
                out.labels[where] = encoded.labels
                out.dense[where] = encoded.dense
                out.sparse[where] = encoded.sparse
            read += len(encoded)
            if len(encoded):
                np.maximum(maxima, encoded.sparse.max(axis=0), out=maxima)
        return maxima.tolist()

    def state_dict(self) -> dict:
        """Tensors and plain values only, so a checkpoint holding it loads with ``weights_only=True``."""
        import torch  # here only: encoding workers never import torch (it takes seconds)

        return {
            "missing_row": self.missing_row,
            "table_sizes": list(self.table_sizes),
            "dense_mean": torch.from_numpy(self.dense_mean.copy()),
            "dense_std": torch.from_numpy(self.dense_std.copy()),
            "dense_offset": torch.from_numpy(self.dense_offset.copy()),
            "dense_missing": torch.from_numpy(self.dense_missing.copy()),
            "vocabularies": None
            if self.vocabularies is None
            else [torch.from_numpy(np.asarray(v, dtype=np.int64)) for v in self.vocabularies],
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> FeatureEncoder:
        vocabularies = state["vocabularies"]
        return cls(
            table_sizes=state["table_sizes"],
            dense_mean=state["dense_mean"].numpy(),
            dense_std=state["dense_std"].numpy(),
            vocabularies=None if vocabularies is None else [v.numpy() for v in vocabularies],
            missing_row=state.get("missing_row", False),  # checkpoints before the missing row: the earlier layout
            # Checkpoints before the dense transform was a setting: the standardised one.
            dense_offset=state["dense_offset"].numpy() if "dense_offset" in state else None,
            dense_missing=state["dense_missing"].numpy() if "dense_missing" in state else None,
        )


def _hash_tables(vocabularies: list[np.ndarray] | None) -> list[pd.Index] | None:
    """One pandas index per vocabulary (its hash table is built on the first lookup). pandas is imported here, by
    the encoders that look values up, not by training, which imports this module for the encoder's record."""
    import pandas as pd

    return None if vocabularies is None else [pd.Index(np.asarray(v, dtype=np.int64)) for v in vocabularies]


# Per encoding worker: the vocabularies' hash tables (sent once per worker, built on its first day) and
# one 262,144-row batch in flight.
ENCODING_MEMORY = 1 << 30
# Cores one encoding worker keeps busy by itself (56-60% of 2 cores, measured by benchmarks/preprocessing.py):
# a second worker on 2 cores measured 1.19x in one run and 0.62x in another, so by default one per 2 cores.
ENCODING_CORES = 2


def _encode_day_into(
    encoder: FeatureEncoder, path: str | DayRows, folder: str, start: int | tuple
) -> tuple[list[int], dict[tuple[int, int], bytes]]:
    """A worker's task: encode one day into its rows of the files in ``folder``; returns its tables' largest
    indices and the digests of the chunks it wrote whole in order (none for a shuffled write: the shuffle's
    pass writes the rows last)."""
    out = open_encoded(Path(folder), writable=True)
    if not isinstance(start, tuple):
        rows = RowWriter(out, start)
        try:
            maxima = encoder._encode_rows([path], rows, start)
        finally:
            rows.close()
        return maxima, written_digests(rows.chunks)
    writer = BucketWriter(out, np.array(start[3], dtype=np.int64))  # the day's first row in each bucket, advanced
    try:
        return encoder._encode_rows([path], writer, start), {}
    finally:
        writer.close()

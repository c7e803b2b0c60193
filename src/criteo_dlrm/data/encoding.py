"""Turning typed Criteo columns into model inputs: table indices and standardised dense floats.

Vocabulary lookups go through pandas' hash-table index (one per feature, built once), so encoding
runs at tens of millions of lookups per second on one core, with no Python per value.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from loguru import logger

from criteo_dlrm.common.parallel import choose_workers, run_parallel
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import DENSE_COLUMNS, LABEL_COLUMN, NUM_DENSE, NUM_SPARSE, SPARSE_COLUMNS
from criteo_dlrm.common.storage import (
    DamagedFileError,
    check_free_space,
    disk_full_error,
    reading,
    reserve,
    size_text,
)
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.chunk_digests import ChunkDigests, open_digests, reencode, write_digests
from criteo_dlrm.data.parquet import Day, DayRows, count_rows, dense_values, iter_batches, sparse_values


def index_widths(table_sizes: list[int]) -> list[int]:
    """Bytes each table's indices need on disk: 1 up to 256 rows, 2 up to 65,536, 3 up to 16,777,216, else 4."""
    return [next(width for width in (1, 2, 3, 4) if size <= 1 << (8 * width) or width == 4) for size in table_sizes]


class PackedIndices:
    """(N, 26) table indices stored in ``sum(widths)`` bytes a row: each table's index in its own width
    (little-endian), so a row of Criteo 1TB's tables takes about 60 bytes instead of 104 as int32.

    Reading rows (``packed[rows]``) gives the usual (B, 26) int32 indices: the packed bytes are gathered into
    one buffer, read as little-endian 4-byte words starting at each table's offset (an unaligned, overlapping
    view: no per-byte work) and masked to each table's width. That is as fast as gathering int32 rows, as
    fewer bytes are read (``benchmarks/preprocessing.py``). Writing ``packed[a:b] = indices`` refuses an
    index that does not fit its width.
    """

    def __init__(self, packed: np.ndarray, widths: list[int]):
        if len(widths) != NUM_SPARSE or packed.ndim != 2 or packed.shape[1] != sum(widths):
            raise ValueError(f"packed indices of shape {packed.shape} do not match widths {widths}")
        self.packed, self.widths = packed, [int(width) for width in widths]
        self._offsets = np.cumsum([0, *self.widths[:-1]])  # each table's first byte in a packed row
        self._masks = np.array([(1 << (8 * width)) - 1 for width in self.widths], dtype=np.uint32)
        # Byte k of an int32 row's table t is stored when k < width_t, in table order: what writing keeps.
        self._kept = np.array([k < width for width in self.widths for k in range(4)])
        self._limits = np.array([1 << (8 * width) if width < 4 else 1 << 31 for width in self.widths], dtype=np.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.packed), NUM_SPARSE)

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, rows: np.ndarray | slice) -> np.ndarray:
        row_bytes = self.packed.shape[1]
        count = len(range(len(self))[rows]) if isinstance(rows, slice) else len(rows)
        buffer = np.empty(count * row_bytes + 3, dtype=np.uint8)  # 3 spare bytes: the last row's last word
        buffer[-3:] = 0
        gathered = buffer[: count * row_bytes].reshape(count, row_bytes)
        if isinstance(rows, slice):
            gathered[:] = self.packed[rows]
        else:
            np.take(self.packed, rows, axis=0, out=gathered)
        # words[i, j]: the 4 bytes from byte j of row i on; a table's word holds its index in its low bytes.
        words = np.ndarray((count, row_bytes), dtype="<u4", buffer=buffer, strides=(row_bytes, 1))
        return (words[:, self._offsets] & self._masks).view(np.int32)

    def __setitem__(self, rows: slice | np.ndarray, indices: np.ndarray) -> None:
        indices = np.asarray(indices, dtype="<i4")
        too_wide = ((indices < 0) | (indices >= self._limits)).any(axis=0)
        if too_wide.any():
            table = int(np.flatnonzero(too_wide)[0])
            raise ValueError(f"SPARSE_{table}: an index does not fit in {self.widths[table]} bytes")
        self.packed[rows] = np.ascontiguousarray(indices).view(np.uint8)[:, self._kept]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        unpacked = self[:]
        return unpacked if dtype is None else unpacked.astype(dtype)

    def flush(self) -> None:
        if isinstance(self.packed, np.memmap):
            self.packed.flush()


@dataclass
class EncodedArrays:
    """Model inputs for N rows."""

    labels: np.ndarray | None  # (N,) 0 or 1 (float32 in memory, uint8 on disk); None for unlabelled rows
    dense: np.ndarray  # (N, 13) float32, standardised log1p counts
    sparse: np.ndarray | PackedIndices  # (N, 26) int32 table indices: 0 out of vocabulary, 1 missing, 2.. values
    lineage: dict | None = None  # what they were encoded from (``lineage.encoded_lineage``), when stored
    # (26,) the largest index of each table, as recorded when stored rows were written (None: not recorded).
    index_maxima: list[int] | None = None
    # Stored rows: each chunk's digest, checked on its first read (``check_rows``); None for rows in memory.
    digests: ChunkDigests | None = None
    # "shuffled": stored in an order drawn once when they were written (``encode_days(shuffle=True)``); else as read.
    row_order: str = "as read"

    def __len__(self) -> int:
        return len(self.dense)

    def check_rows(self, start: int, end: int) -> None:
        """Verify the stored chunks holding rows ``start:end`` (each once per process) before they are used.

        Raises:
            DamagedFileError: naming the damaged file, its rows and the fix.
        """
        if self.digests is not None:
            for name in STORED_FIELDS:
                self.digests.check(name, start, end)

    def stored(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Labels, dense and sparse as stored: packed index bytes as they are (``PackedIndices.packed``)."""
        sparse = self.sparse.packed if isinstance(self.sparse, PackedIndices) else self.sparse
        return self.labels, self.dense, sparse

    def checked_labels(self) -> np.ndarray:
        """All labels, verified: what a reader of the whole label column uses."""
        if self.digests is not None:
            self.digests.check_all("labels")
        return np.asarray(self.labels)

    @property
    def folder(self) -> Path | None:
        """The folder of stored rows (memory-mapped ``.npy`` files), None for rows in memory."""
        filename = getattr(self.dense, "filename", None)
        return Path(filename).parent if filename else None


@dataclass
class EncodedDays:
    """Days to encode, not encoded yet: whoever stores them decides where the rows go (see ``write``)."""

    encoder: FeatureEncoder
    paths: list[Day]  # whole days, or parts of them (DayRows)
    lineage: dict | None = None  # stored with the rows, so they are reused only for the same inputs
    workers: int | None = None  # processes encoding whole days; None: one per core (bounded by memory)
    shuffle: bool = False  # store the rows shuffled (training rows: the loader then reads them in order)

    def __len__(self) -> int:
        return count_rows(self.paths)

    @property
    def row_order(self) -> str:
        return "shuffled" if self.shuffle else "as read"

    def write(self, folder: Path) -> EncodedArrays:
        """Encode straight into ``labels.npy``, ``dense.npy`` and ``sparse.npy`` in ``folder``."""
        return self.encoder.encode_days(self.paths, into=folder, workers=self.workers, shuffle=self.shuffle)


# Table rows of each categorical feature: a value the vocabulary does not hold, a missing value (a row of
# its own: in click logs a missing value has an effect of its own, while rare values average out), then the
# vocabulary, most frequent first. feature_metadata of format 1 (and the checkpoints made with it) kept
# missing and unseen values together in row 0, the vocabulary from row 1.
OUT_OF_VOCABULARY_ROW = 0
MISSING_ROW = 1
RESERVED_ROWS = 2


def reserved_rows(missing_row: bool) -> int:
    """Rows before the vocabulary: 2 (unseen, missing), or 1 in the earlier layout (unseen or missing)."""
    return RESERVED_ROWS if missing_row else 1


class FeatureEncoder:
    """Encodes typed Criteo rows with the statistics and vocabularies of ``feature_metadata``.

    Sparse value ``v`` of feature ``f`` maps to ``2 + position of v in f's vocabulary``, to 0 when the
    vocabulary does not hold it, to 1 when it is missing. In modulus-hash mode it maps to
    ``2 + v mod (table_size - 2)`` and missing to 1. With ``missing_row=False`` (the earlier layout) missing and
    unseen share row 0 and everything else is one row lower. Dense value ``x`` maps to
    ``(log1p(max(x, 0)) - mean) / std``; missing maps to 0 (the mean).
    """

    def __init__(
        self,
        table_sizes: list[int],
        dense_mean: np.ndarray,
        dense_std: np.ndarray,
        vocabularies: list[np.ndarray] | None,
        missing_row: bool = True,
    ):
        if len(table_sizes) != NUM_SPARSE or len(dense_mean) != NUM_DENSE:
            raise ValueError(f"Expected {NUM_SPARSE} tables and {NUM_DENSE} dense statistics.")
        self.missing_row = missing_row
        self.table_sizes = [int(size) for size in table_sizes]
        self.dense_mean = np.asarray(dense_mean, dtype=np.float64)
        self.dense_std = np.asarray(dense_std, dtype=np.float64)
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
    def from_metadata(cls, metadata: dict, vocabularies: dict[str, np.ndarray] | None) -> FeatureEncoder:
        modulus = metadata["encoding"] == "modulus_hash"
        if not modulus and vocabularies is None:
            raise ValueError("feature_metadata uses vocabularies, but none were given.")
        return cls(
            table_sizes=[metadata["sparse"][name]["table_size"] for name in SPARSE_COLUMNS],
            dense_mean=np.array([metadata["dense"][name]["log1p_mean"] for name in DENSE_COLUMNS]),
            dense_std=np.array([metadata["dense"][name]["log1p_std"] for name in DENSE_COLUMNS]),
            vocabularies=None if modulus else [np.asarray(vocabularies[name]) for name in SPARSE_COLUMNS],
            missing_row=metadata.get("format", 1) >= 2,
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
        scaled = np.log1p(np.maximum(values, 0, dtype=np.float32))
        scaled -= self.dense_mean.astype(np.float32)
        scaled /= self.dense_std.astype(np.float32)
        scaled[missing] = 0.0
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
        self, paths: list[Day], into: Path | None = None, workers: int | None = 1, shuffle: bool = False
    ) -> EncodedArrays:
        """Encode whole days, into memory or, with ``into``, into files in that folder (``open_encoded``).

        In memory: float32 labels, dense and int32 indices, 160 bytes per row. On disk: uint8 labels,
        float32 dense and ``PackedIndices``, 53 bytes + the tables' index widths per row. The files are
        written through memory maps, so the days never need to fit in memory, and ``workers`` processes
        (None: one per core) each encode whole days into their own rows; the files are the same whatever
        the number of workers.

        ``shuffle`` (stored rows only) stores them in a uniformly random order, drawn from a fixed seed
        (``shuffle_destinations``): an external shuffle with memory bounded by ``SHUFFLE_BUCKET_ROWS`` rows per
        worker, so a reader of contiguous chunks gets rows from every day.
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
        into.mkdir(parents=True, exist_ok=True)
        widths = index_widths(self.table_sizes)
        layout = {"format": STORED_FORMAT, "sparse_widths": widths, "row_order": "shuffled" if shuffle else "as read"}
        (into / LAYOUT).write_text(json.dumps(layout))
        shapes = {
            "labels": ((rows,), np.uint8),
            "dense": ((rows, NUM_DENSE), np.float32),
            "sparse": ((rows, sum(widths)), np.uint8),
        }
        # The size is known before any row is written: a disk too small is refused now, and the files' space is
        # allocated up front, so the disk cannot fill up under the memory maps (where it would kill the process).
        needed = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
        check_free_space(into, needed + (1 << 20), f"{rows:,} encoded rows")
        for name, (shape, dtype) in shapes.items():
            np.lib.format.open_memmap(into / f"{name}.npy", "w+", dtype, shape).flush()
            with open(into / f"{name}.npy", "r+b") as handle:
                try:
                    reserve(handle, os.fstat(handle.fileno()).st_size)
                except OSError as error:
                    raise disk_full_error(into, f"{rows:,} encoded rows", needed) from error
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
        maxima = [0] * NUM_SPARSE
        with progress_bar(rows, f"encoding ({chosen} workers)", "rows") as bar:
            for index, day_maxima in run_parallel(_encode_day_into, tasks, chosen, shared=self, preload=WORKER_MODULES):
                maxima = np.maximum(maxima, day_maxima).tolist()
                bar.update(rows_per_day[index])
        if destinations is not None:
            destinations.shuffle_buckets(into, workers)
        write_index_maxima(into, maxima)
        encoded = open_encoded(into, verify=False)
        size = bytes_per_row(encoded)
        logger.info("{:,} rows encoded, {} bytes a row ({})", rows, size, size_text(rows * size))
        return encoded

    def _encode_rows(self, paths: list[Day], out: EncodedArrays, start: int | tuple) -> list[int]:
        """Encode ``paths`` batch by batch into ``out`` from row ``start`` on, or (``start`` a day's
        ``(day, buckets, block_rows, bucket_starts)``) into that day's rows of each bucket; returns each table's
        largest index."""
        maxima = np.zeros(NUM_SPARSE, dtype=np.int64)
        read = 0
        for batch in iter_batches(paths):
            encoded = self.encode_batch(batch, contiguous=False)
            if isinstance(start, tuple):  # a shuffled write: each row goes to the next free row of its bucket
                where = _bucket_rows(*start[:3], read, len(encoded), start[3])
            else:
                where = slice(start + read, start + read + len(encoded))
            read += len(encoded)
            out.labels[where] = encoded.labels
            out.dense[where] = encoded.dense
            out.sparse[where] = encoded.sparse
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
        )


def _hash_tables(vocabularies: list[np.ndarray] | None) -> list[pd.Index] | None:
    """One pandas index per vocabulary (its hash table is built on the first lookup)."""
    return None if vocabularies is None else [pd.Index(np.asarray(v, dtype=np.int64)) for v in vocabularies]


# Per encoding worker: the vocabularies' hash tables (sent once per worker, built on its first day) and
# one 262,144-row batch in flight.
ENCODING_MEMORY = 1 << 30
# Cores one encoding worker keeps busy by itself (56-60% of 2 cores, measured by benchmarks/preprocessing.py):
# a second worker on 2 cores measured 1.19x in one run and 0.62x in another, so by default one per 2 cores.
ENCODING_CORES = 2


def _encode_day_into(encoder: FeatureEncoder, path: str | DayRows, folder: str, start: int | tuple) -> list[int]:
    """A worker's task: encode one day into its rows of the files in ``folder``; returns its tables' largest
    indices."""
    out = open_encoded(Path(folder), writable=True)
    if isinstance(start, tuple):
        start = (*start[:3], np.array(start[3], dtype=np.int64))  # advanced as rows are written
    maxima = encoder._encode_rows([path], out, start)
    for array in (out.labels, out.dense, out.sparse):
        array.flush()
    return maxima


# The stored shuffle (``encode_days(shuffle=True)``): each row goes to one of ``ceil(rows / SHUFFLE_BUCKET_ROWS)``
# buckets, drawn from (SHUFFLE_SEED, its day's position, its block of SHUFFLE_BLOCK_ROWS rows), and is written
# to the next free row of that bucket's range; then each bucket is permuted in memory. A uniform random order
# (every arrangement of the rows equally likely) with state per bucket and per block, not per row. The seed is
# fixed: the stored order is part of the rows' layout, not of a training run (each epoch draws its own chunk
# order, ``data.batches``), so changing ``training.seed`` never re-encodes.
SHUFFLE_SEED = 20_260_101
SHUFFLE_BUCKET_ROWS = 2_097_152  # per bucket: 230 MB of Criteo 1TB rows in a worker's memory, twice
SHUFFLE_BLOCK_ROWS = 1 << 20


def _block_buckets(day: int, block: int, rows: int, buckets: int) -> np.ndarray:
    """The bucket of each of the ``rows`` rows of block ``block`` of day ``day``."""
    if buckets == 1:
        return np.zeros(rows, dtype=np.int64)
    return np.random.default_rng([SHUFFLE_SEED, day, block]).integers(0, buckets, size=rows, dtype=np.int64)


def _day_buckets(day: int, first: int, rows: int, buckets: int, block_rows: int) -> np.ndarray:
    """The buckets of rows ``first:first + rows`` of day ``day`` (the blocks they fall in, drawn again)."""
    parts, row = [], first
    while row < first + rows:
        block, offset = divmod(row, block_rows)
        take = min(block_rows - offset, first + rows - row)
        parts.append(_block_buckets(day, block, block_rows, buckets)[offset : offset + take])
        row += take
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _bucket_rows(day: int, buckets: int, block_rows: int, first: int, rows: int, cursors: np.ndarray) -> np.ndarray:
    """Where rows ``first:first + rows`` of day ``day`` are stored: the next free rows of their buckets
    (``cursors``, advanced)."""
    assigned = _day_buckets(day, first, rows, buckets, block_rows)
    counts = np.bincount(assigned, minlength=buckets)
    order = np.argsort(assigned, kind="stable")
    group_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(rows) - group_starts[assigned[order]]  # each row's place among its bucket's rows here
    where = np.empty(rows, dtype=np.int64)
    where[order] = cursors[assigned[order]] + rank
    cursors += counts
    return where


@dataclass
class ShuffleDestinations:
    """Where each day's rows go in a shuffled write: bucket ``b`` holds rows ``bucket_starts[b]:bucket_starts[b+1]``,
    day ``d``'s rows in bucket ``b`` start at ``day_starts[d][b]``."""

    buckets: int
    block_rows: int  # rows per block of bucket draws (sent to the workers with the rest: no module state)
    bucket_starts: list[int]
    day_starts: list[list[int]]

    def shuffle_buckets(self, folder: Path, workers: int | None) -> None:
        """Permute each bucket's rows in memory (in parallel workers, one bucket each)."""
        ranges = list(zip(self.bucket_starts[:-1], self.bucket_starts[1:], strict=True))
        rows = self.bucket_starts[-1]
        chosen = choose_workers(workers, len(ranges), 3 * SHUFFLE_BUCKET_ROWS * 160, rows)
        tasks = [(str(folder), bucket, start, end) for bucket, (start, end) in enumerate(ranges)]
        with progress_bar(rows, f"shuffling ({chosen} workers)", "rows") as bar:
            for index, _ in run_parallel(_shuffle_bucket, tasks, chosen, preload=WORKER_MODULES):
                bar.update(ranges[index][1] - ranges[index][0])


def shuffle_destinations(rows_per_day: list[int]) -> ShuffleDestinations:
    """Count each day's rows per bucket (the buckets drawn block by block, no rows read) and place them."""
    rows = sum(rows_per_day)
    buckets = max(1, -(-rows // SHUFFLE_BUCKET_ROWS))
    counts = np.zeros((len(rows_per_day), buckets), dtype=np.int64)
    for day, day_rows in enumerate(rows_per_day):
        for block in range(-(-day_rows // SHUFFLE_BLOCK_ROWS)):
            size = min(SHUFFLE_BLOCK_ROWS, day_rows - block * SHUFFLE_BLOCK_ROWS)
            counts[day] += np.bincount(
                _block_buckets(day, block, SHUFFLE_BLOCK_ROWS, buckets)[:size], minlength=buckets
            )
    bucket_starts = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
    day_starts = bucket_starts[:-1] + np.cumsum(counts, axis=0) - counts
    return ShuffleDestinations(buckets, SHUFFLE_BLOCK_ROWS, bucket_starts.tolist(), day_starts.tolist())


def _shuffle_bucket(folder: str, bucket: int, start: int, end: int) -> None:
    """A worker's task: permute rows ``start:end`` (one bucket) of the files in ``folder``, in memory."""
    out = open_encoded(Path(folder), writable=True)
    order = np.random.default_rng([SHUFFLE_SEED, bucket]).permutation(end - start)
    for array in out.stored():
        array[start:end] = np.asarray(array[start:end])[order]
        array.flush()


# The stored layout: ``layout.json`` beside ``labels.npy`` (uint8), ``dense.npy`` (float32) and ``sparse.npy``
# (packed index bytes). Folders written before it (float32 labels, int32 indices, no layout) still load.
LAYOUT = "layout.json"
STORED_FORMAT = 2
STORED_FIELDS = ("labels", "dense", "sparse")


# Each table's largest stored index, written with the rows: rows are checked against the tables they are used
# with without reading them (``check_index_range``).
INDEX_MAXIMA = "index_maxima.json"


def open_encoded(
    folder: str | Path, writable: bool = False, lineage: dict | None = None, verify: bool = True
) -> EncodedArrays:
    """The encoded rows stored in ``folder``, memory-mapped: rows are read from disk when a batch needs them.

    Rows opened to read (``verify``) have their small files and sizes checked against their digests now, and each
    chunk of rows when it is first read (``EncodedArrays.check_rows``, ``data.chunk_digests``); ``writable`` and
    ``verify=False`` are for the writer, before the digests exist.

    Raises:
        DamagedFileError: a file is missing, truncated, changed or does not match the others, naming it.
    """
    folder = Path(folder)
    digests = open_digests(folder) if verify and not writable else None
    mode = "r+" if writable else "r"
    arrays = [
        reading(folder / f"{name}.npy", lambda name=name: np.load(folder / f"{name}.npy", mmap_mode=mode), reencode())
        for name in STORED_FIELDS
    ]
    labels, dense, sparse = arrays
    layout = {}
    if (folder / LAYOUT).exists():
        layout = reading(folder / LAYOUT, lambda: json.loads((folder / LAYOUT).read_text()), reencode())
        sparse = reading(folder / "sparse.npy", lambda: PackedIndices(sparse, layout["sparse_widths"]), reencode())
    elif sparse.dtype == np.uint8:  # packed indices, which only their layout can read
        raise DamagedFileError(f"{folder / LAYOUT} is missing. {reencode()}")
    if not len(labels) == len(dense) == len(sparse):
        raise DamagedFileError(
            f"{folder}: its files hold {len(labels):,}, {len(dense):,} and {len(sparse):,} rows. {reencode()}"
        )
    maxima_path = folder / INDEX_MAXIMA
    maxima = (
        reading(maxima_path, lambda: json.loads(maxima_path.read_text()), reencode()) if maxima_path.exists() else None
    )
    return EncodedArrays(
        labels, dense, sparse, lineage, maxima, digests=digests, row_order=layout.get("row_order", "as read")
    )


def write_index_maxima(folder: Path, maxima: list[int]) -> None:
    (folder / INDEX_MAXIMA).write_text(json.dumps([int(value) for value in maxima]))


def index_maxima(rows: EncodedArrays) -> list[int]:
    """Each table's largest index in ``rows``: as recorded, or (rows in memory, or stored before maxima were
    recorded) by one pass over them in pieces."""
    if rows.index_maxima is not None:
        return list(rows.index_maxima)
    maxima = np.zeros(NUM_SPARSE, dtype=np.int64)
    for start in range(0, len(rows), 1 << 20):
        piece = np.asarray(rows.sparse[start : start + (1 << 20)])
        if len(piece):
            np.maximum(maxima, piece.max(axis=0), out=maxima)
    return maxima.tolist()


def check_index_range(rows: EncodedArrays, table_sizes: list[int], what: str) -> None:
    """Refuse rows holding an index beyond its table (rows encoded with other metadata than they claim to be).

    Raises:
        DamagedFileError: naming the rows' folder (or ``what``), the tables and the fix.
    """
    maxima = index_maxima(rows)
    beyond = [
        f"{name}: index {largest:,} in a table of {size:,} rows"
        for name, largest, size in zip(SPARSE_COLUMNS, maxima, table_sizes, strict=True)
        if largest >= size
    ]
    if beyond:
        where = rows.folder or what
        raise DamagedFileError(
            f"{where}: {what} were not encoded with the tables of the metadata they are used with "
            f"({'; '.join(beyond[:3])}{'; ...' if len(beyond) > 3 else ''}). {reencode()}"
        )


def write_encoded(arrays: EncodedArrays, folder: Path) -> None:
    """Store rows held in memory in ``folder`` (``labels.npy``, ``dense.npy``, ``sparse.npy`` and digests)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in STORED_FIELDS:
        np.save(folder / f"{name}.npy", np.asarray(getattr(arrays, name)))
    write_index_maxima(folder, index_maxima(arrays))
    write_digests(folder)


def bytes_per_row(arrays: EncodedArrays) -> int:
    """Bytes one row of ``arrays`` takes (on disk, for stored rows)."""
    return sum(array.itemsize * int(np.prod(array.shape[1:])) for array in arrays.stored())

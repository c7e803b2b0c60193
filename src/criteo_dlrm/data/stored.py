"""Encoded rows as they are stored: ``labels.npy`` (uint8), ``dense.npy`` (float32) and ``sparse.npy`` (each
table's index in as few bytes as its size needs, ``PackedIndices``) beside ``layout.json``, the tables' largest
indices and the chunk digests (``data.chunk_digests``); and ``EncodedArrays``, rows in memory or memory-mapped
from such a folder, which the loader, evaluation and scoring read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from criteo_dlrm.common.schema import NUM_DENSE, NUM_SPARSE, SPARSE_COLUMNS
from criteo_dlrm.common.storage import (
    DamagedFileError,
    check_free_space,
    disk_full_error,
    reading,
    reserve,
    write_bytes_atomically,
)
from criteo_dlrm.data.chunk_digests import REENCODE, ChunkDigests, WrittenChunks, open_digests, write_digests


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
        self.packed[rows] = self.pack(indices)

    def pack(self, indices: np.ndarray) -> np.ndarray:
        """(B, 26) int32 indices as their stored bytes, (B, sum(widths)) uint8; an index that does not fit its
        width is refused."""
        indices = np.asarray(indices, dtype="<i4")
        too_wide = ((indices < 0) | (indices >= self._limits)).any(axis=0)
        if too_wide.any():
            table = int(np.flatnonzero(too_wide)[0])
            raise ValueError(f"SPARSE_{table}: an index does not fit in {self.widths[table]} bytes")
        return np.ascontiguousarray(indices).view(np.uint8)[:, self._kept]

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

    def as_stored(self, encoded: EncodedArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``encoded`` rows (in memory) as these stored rows hold them, field by field as ``stored()`` gives them:
        uint8 labels, float32 dense, packed index bytes (an index too wide for its table refused)."""
        labels, dense, sparse = self.stored()
        packed = (
            self.sparse.pack(encoded.sparse)
            if isinstance(self.sparse, PackedIndices)
            else np.asarray(encoded.sparse, sparse.dtype)
        )
        return np.asarray(encoded.labels, labels.dtype), np.asarray(encoded.dense, dense.dtype), packed

    @property
    def folder(self) -> Path | None:
        """The folder of stored rows (memory-mapped ``.npy`` files), None for rows in memory."""
        filename = getattr(self.dense, "filename", None)
        return Path(filename).parent if filename else None


def create_stored(into: Path, rows: int, table_sizes: list[int], row_order: str) -> None:
    """Allocate the files of ``rows`` stored rows in ``into`` (``layout.json`` and the three ``.npy`` files at
    their full size), for writers to fill (``open_encoded(into, writable=True)``; ``RowWriter``,
    ``shuffle.BucketWriter``).

    Raises:
        DiskFullError (``common.storage``): the disk cannot hold them, said before any row is written.
    """
    into.mkdir(parents=True, exist_ok=True)
    widths = index_widths(table_sizes)
    layout = {"format": STORED_FORMAT, "sparse_widths": widths, "row_order": row_order}
    write_bytes_atomically(into / LAYOUT, json.dumps(layout).encode())
    shapes = {
        "labels": ((rows,), np.uint8),
        "dense": ((rows, NUM_DENSE), np.float32),
        "sparse": ((rows, sum(widths)), np.uint8),
    }
    # The size is known before any row is written: a disk too small is refused now, and the files' space is
    # allocated up front, so the disk cannot fill up under the writers' tasks (or a memory map, which it kills).
    needed = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
    check_free_space(into, needed + (1 << 20), f"{rows:,} encoded rows")
    for name, (shape, dtype) in shapes.items():
        np.lib.format.open_memmap(into / f"{name}.npy", "w+", dtype, shape).flush()
        with open(into / f"{name}.npy", "r+b") as handle:
            try:
                reserve(handle, os.fstat(handle.fileno()).st_size)
            except OSError as error:
                raise disk_full_error(into, f"{rows:,} encoded rows", needed) from error


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
        reading(folder / f"{name}.npy", lambda name=name: np.load(folder / f"{name}.npy", mmap_mode=mode), REENCODE)
        for name in STORED_FIELDS
    ]
    labels, dense, sparse = arrays
    layout = {}
    if (folder / LAYOUT).exists():
        layout = reading(folder / LAYOUT, lambda: json.loads((folder / LAYOUT).read_text()), REENCODE)
        sparse = reading(folder / "sparse.npy", lambda: PackedIndices(sparse, layout["sparse_widths"]), REENCODE)
    elif sparse.dtype == np.uint8:  # packed indices, which only their layout can read
        raise DamagedFileError(f"{folder / LAYOUT} is missing. {REENCODE}", fix=REENCODE)
    if not len(labels) == len(dense) == len(sparse):
        raise DamagedFileError(
            f"{folder}: its files hold {len(labels):,}, {len(dense):,} and {len(sparse):,} rows. {REENCODE}",
            fix=REENCODE,
        )
    maxima_path = folder / INDEX_MAXIMA
    maxima = (
        reading(maxima_path, lambda: json.loads(maxima_path.read_text()), REENCODE) if maxima_path.exists() else None
    )
    return EncodedArrays(
        labels, dense, sparse, lineage, maxima, digests=digests, row_order=layout.get("row_order", "as read")
    )


def write_index_maxima(folder: Path, maxima: list[int]) -> None:
    write_bytes_atomically(folder / INDEX_MAXIMA, json.dumps([int(value) for value in maxima]).encode())


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
            f"({'; '.join(beyond[:3])}{'; ...' if len(beyond) > 3 else ''}). {REENCODE}",
            fix=REENCODE,
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
    return sum(row_bytes(array) for array in arrays.stored())


def read_rows(source: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Rows ``begin:end`` of ``source``; from a memory-mapped file with one ``pread`` (the pages are not mapped
    into the process, so they stay the kernel's page cache, not the reader's memory).

    Raises:
        OSError: the file is shorter than its rows (truncated after it was opened).
    """
    filename = getattr(source, "filename", None)
    if filename is None or not isinstance(source, np.memmap):
        return np.asarray(source[begin:end])
    out = np.empty((end - begin, *source.shape[1:]), dtype=source.dtype)
    with open(filename, "rb") as handle:
        done = os.preadv(handle.fileno(), [memoryview(out).cast("B")], row_position(source, begin))
    if done != out.nbytes:
        raise OSError(f"{filename}: read {done:,} of {out.nbytes:,} bytes at row {begin:,}")
    return out


def write_rows(target: np.memmap, begin: int, rows: np.ndarray) -> None:
    """Write ``rows`` (in ``target``'s dtype) at row ``begin`` of ``target``'s file with ``pwrite``, not through
    the memory map: whole pages written are never read from disk first, as a memory map's faults read them
    (with read-around), which under a memory limit reads back what was just written, over and over."""
    with open(target.filename, "r+b") as handle:
        write_at(handle.fileno(), np.ascontiguousarray(rows, dtype=target.dtype), row_position(target, begin))
        os.fdatasync(handle.fileno())  # on disk when the writer's task is done, as a memory map's flush did


class RowWriter:
    """Rows written in order from row ``start`` of stored rows ``out`` by ``pwrite``s (see ``write_rows``), each
    file's whole chunks hashed from the bytes written (``chunks``, ``chunk_digests.WrittenChunks``)."""

    def __init__(self, out: EncodedArrays, start: int):
        self.out, self.row = out, start
        self._fields = out.stored()
        self._handles = [open(array.filename, "r+b") for array in self._fields]
        self.chunks = [WrittenChunks(start, len(array)) for array in self._fields]

    def write(self, rows: EncodedArrays) -> None:
        """Write ``rows`` (encoded, in memory) after those written so far."""
        stored = self.out.as_stored(rows)
        for handle, array, chunks, values in zip(self._handles, self._fields, self.chunks, stored, strict=True):
            values = np.ascontiguousarray(values)
            write_at(handle.fileno(), values, row_position(array, self.row))
            chunks.add(values)
        self.row += len(rows)

    def close(self) -> None:
        """Put the files on disk (as a memory map's flush did) and close them."""
        try:
            for handle in self._handles:
                os.fdatasync(handle.fileno())
        finally:
            for handle in self._handles:
                handle.close()


def write_at(descriptor: int, data: np.ndarray | memoryview, position: int) -> None:
    """All of ``data``'s bytes at ``position`` of the open file ``descriptor``."""
    view = memoryview(data).cast("B")
    while len(view):
        done = os.pwrite(descriptor, view, position)
        view, position = view[done:], position + done


def row_bytes(array: np.ndarray) -> int:
    """Bytes one row of ``array`` takes."""
    return array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def row_position(array: np.memmap, row: int) -> int:
    """Where row ``row`` of a memory-mapped ``.npy`` file starts in the file (after its header)."""
    return array.offset + row * row_bytes(array)

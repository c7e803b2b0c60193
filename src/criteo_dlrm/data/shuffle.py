"""The stored shuffle of the training rows (``FeatureEncoder.encode_days(shuffle=True)``).

Each row goes to one of ``ceil(rows / SHUFFLE_BUCKET_ROWS)`` buckets, drawn from (SHUFFLE_SEED, its day's
position, its block of SHUFFLE_BLOCK_ROWS rows), and is written to the next free row of that bucket's range;
then each bucket is permuted in memory. A uniform random order (every arrangement of the rows equally likely)
with state per bucket and per block, not per row. The seed is fixed: the stored order is part of the rows'
layout, not of a training run (each epoch draws its own chunk order, ``data.batches``), so changing
``training.seed`` never re-encodes.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from criteo_dlrm.common.parallel import Runner, choose_workers, run_parallel, where_tasks_run
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.chunk_digests import WrittenChunks, written_digests
from criteo_dlrm.data.stored import (
    EncodedArrays,
    open_encoded,
    read_rows,
    row_bytes,
    row_position,
    write_at,
    write_rows,
)

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


# Writes are of whole pages wherever they can be (``BucketWriter``).
WRITE_ALIGNMENT = mmap.PAGESIZE


class BucketWriter:
    """A day's rows written to the next free rows of their buckets (``cursors``, advanced), field by field, by
    ``pwrite``s of whole pages: the bytes of a bucket that do not fill its next page yet wait here (under a page
    per bucket and field) for that bucket's next rows, and are written by ``close``. A page written whole is never
    read from disk. (Writing through a memory map faults each page in first, reading it with read-around; under a
    memory limit the pages just written were evicted and read back again and again: 94 GB read to write 3.4 GB
    in a 1.1 GB group.)"""

    def __init__(self, out: EncodedArrays, cursors: np.ndarray):
        self.out, self.cursors = out, cursors
        self._fields = out.stored()
        self._handles = [open(array.filename, "r+b") for array in self._fields]
        self._pending: list[dict[int, tuple[int, np.ndarray]]] = [{} for _ in self._fields]

    def write(self, buckets: np.ndarray, rows: EncodedArrays) -> None:
        """Write ``rows`` (encoded, in memory), row ``i`` to the next free row of bucket ``buckets[i]``."""
        counts = np.bincount(buckets, minlength=len(self.cursors))
        order = np.argsort(buckets, kind="stable")
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for field, (array, values) in enumerate(zip(self._fields, self.out.as_stored(rows), strict=True)):
            size = row_bytes(array)
            grouped = np.ascontiguousarray(values[order]).view(np.uint8).reshape(-1)  # bucket by bucket
            for bucket in np.flatnonzero(counts):
                piece = grouped[firsts[bucket] * size : (firsts[bucket] + counts[bucket]) * size]
                self._append(field, int(bucket), row_position(array, int(self.cursors[bucket])), piece)
        self.cursors += counts

    def _append(self, field: int, bucket: int, position: int, piece: np.ndarray) -> None:
        held = self._pending[field].pop(bucket, None)
        if held is not None:  # the bucket's bytes waiting for this piece, which follows them
            position, piece = held[0], np.concatenate([held[1], piece])
        whole = (position + len(piece)) // WRITE_ALIGNMENT * WRITE_ALIGNMENT - position  # up to a page's end
        if whole > 0:
            write_at(self._handles[field].fileno(), piece[:whole], position)
            position, piece = position + whole, piece[whole:]
        if len(piece):
            self._pending[field][bucket] = (position, piece.copy())

    def close(self) -> None:
        """Write what waits and put the files on disk (as a memory map's flush did)."""
        try:
            for handle, pending in zip(self._handles, self._pending, strict=True):
                for position, piece in pending.values():
                    write_at(handle.fileno(), piece, position)
                pending.clear()
                os.fdatasync(handle.fileno())
        finally:
            for handle in self._handles:
                handle.close()


def day_buckets(destinations: tuple, first: int, rows: int) -> np.ndarray:
    """The buckets of rows ``first:first + rows`` of a day, ``destinations`` being its
    ``(day, buckets, block_rows, ...)`` as ``encode_days`` sends it to the day's task."""
    day, buckets, block_rows = destinations[:3]
    return _day_buckets(day, first, rows, buckets, block_rows)


@dataclass
class ShuffleDestinations:
    """Where each day's rows go in a shuffled write: bucket ``b`` holds rows ``bucket_starts[b]:bucket_starts[b+1]``,
    day ``d``'s rows in bucket ``b`` start at ``day_starts[d][b]``."""

    buckets: int
    block_rows: int  # rows per block of bucket draws (sent to the workers with the rest: no module state)
    bucket_starts: list[int]
    day_starts: list[list[int]]

    def shuffle_buckets(
        self, folder: Path, workers: int | None, run: Runner = run_parallel
    ) -> dict[tuple[int, int], bytes]:
        """Permute each bucket's rows in memory (in parallel workers, or ``run``'s tasks, one bucket each); returns
        the digests of the chunks each task wrote whole (``chunk_digests.WrittenChunks``)."""
        ranges = list(zip(self.bucket_starts[:-1], self.bucket_starts[1:], strict=True))
        rows = self.bucket_starts[-1]
        largest = max(row_bytes(array) for array in open_encoded(folder, writable=True).stored())
        chosen = choose_workers(workers, len(ranges), shuffle_worker_memory(largest), rows)
        tasks = [(str(folder), bucket, start, end) for bucket, (start, end) in enumerate(ranges)]
        hashed = {}
        with progress_bar(rows, f"shuffling ({where_tasks_run(run, chosen)})", "rows") as bar:
            for index, written in run(_shuffle_bucket, tasks, chosen, preload=WORKER_MODULES):
                hashed.update(written)
                bar.update(ranges[index][1] - ranges[index][0])
        return hashed


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


def _shuffle_bucket(folder: str, bucket: int, start: int, end: int) -> dict[tuple[int, int], bytes]:
    """A worker's task: permute rows ``start:end`` (one bucket) of the files in ``folder``, field by field in
    memory (read and written with ``pread`` / ``pwrite``, not through a memory map: see ``BucketWriter``);
    returns the digests of the chunks it wrote whole, hashed from memory."""
    out = open_encoded(Path(folder), writable=True)
    order = np.random.default_rng([SHUFFLE_SEED, bucket]).permutation(end - start)
    chunks = []
    for array in out.stored():
        permuted = read_rows(array, start, end)[order]
        write_rows(array, start, permuted)
        chunks.append(WrittenChunks(start, len(array)))
        chunks[-1].add(permuted)
    return written_digests(chunks)


def shuffle_worker_memory(row_bytes_largest: int) -> int:
    """A shuffle worker's own memory: a bucket's largest field twice (as read, and permuted), the permutation, and
    the worker process itself."""
    return SHUFFLE_BUCKET_ROWS * (2 * row_bytes_largest + 8) + WORKER_PROCESS_MEMORY


# A worker process's own memory before its task: Python, numpy, pyarrow and this package's data modules.
WORKER_PROCESS_MEMORY = 150 << 20

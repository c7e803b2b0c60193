"""The stored shuffle of the training rows (``FeatureEncoder.encode_days(shuffle=True)``).

Each row goes to one of ``ceil(rows / SHUFFLE_BUCKET_ROWS)`` buckets, drawn from (SHUFFLE_SEED, its day's
position, its block of SHUFFLE_BLOCK_ROWS rows), and is written to the next free row of that bucket's range;
then each bucket is permuted in memory. A uniform random order (every arrangement of the rows equally likely)
with state per bucket and per block, not per row. The seed is fixed: the stored order is part of the rows'
layout, not of a training run (each epoch draws its own chunk order, ``data.batches``), so changing
``training.seed`` never re-encodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from criteo_dlrm.common.parallel import Runner, choose_workers, run_parallel, where_tasks_run
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.stored import open_encoded

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


def bucket_rows(day: int, buckets: int, block_rows: int, first: int, rows: int, cursors: np.ndarray) -> np.ndarray:
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

    def shuffle_buckets(self, folder: Path, workers: int | None, run: Runner = run_parallel) -> None:
        """Permute each bucket's rows in memory (in parallel workers, or ``run``'s tasks, one bucket each)."""
        ranges = list(zip(self.bucket_starts[:-1], self.bucket_starts[1:], strict=True))
        rows = self.bucket_starts[-1]
        chosen = choose_workers(workers, len(ranges), 3 * SHUFFLE_BUCKET_ROWS * 160, rows)
        tasks = [(str(folder), bucket, start, end) for bucket, (start, end) in enumerate(ranges)]
        with progress_bar(rows, f"shuffling ({where_tasks_run(run, chosen)})", "rows") as bar:
            for index, _ in run(_shuffle_bucket, tasks, chosen, preload=WORKER_MODULES):
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

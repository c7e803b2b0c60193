"""Batches cut from columnar arrays: one numpy gather per batch, no per-row Python, no collate."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from criteo_dlrm.data.encoding import EncodedArrays


@dataclass
class Batch:
    labels: torch.Tensor  # (B,) float32
    dense: torch.Tensor  # (B, 13) float32
    sparse: torch.Tensor  # (B, 26) int64 table indices
    global_rows: int | None = None  # rows of the whole global batch this one is a share of (None: this batch)

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        tensors = (t.to(device, non_blocking=non_blocking) for t in (self.labels, self.dense, self.sparse))
        return Batch(*tensors, global_rows=self.global_rows)

    def pin_memory(self) -> Batch:
        return Batch(*(t.pin_memory() for t in (self.labels, self.dense, self.sparse)), global_rows=self.global_rows)

    def __len__(self) -> int:
        return len(self.labels)


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The row order of one epoch: a permutation drawn from (seed, epoch), so a resumed run sees the same."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


class BatchLoader:
    """Iterates over ``arrays`` (in memory or memory-mapped) in batches of ``batch_size`` rows.

    Args:
        arrays: encoded rows.
        batch_size: rows per batch; the last batch of an epoch may be smaller.
        shuffle: a new permutation each epoch from ``seed``; else file order.
        seed: the shuffling seed.
        pin_memory: page-lock batches so that copies to a GPU can be asynchronous.
        rank, world_size: data-parallel training: every process draws the same global batches of
            ``batch_size`` rows (the same order as one process) and takes its ``rank``-th part of each, so
            every row is used once per epoch across the processes.
    """

    def __init__(
        self,
        arrays: EncodedArrays,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        pin_memory: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.arrays, self.batch_size, self.shuffle, self.seed, self.pin = arrays, batch_size, shuffle, seed, pin_memory
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return -(-len(self.arrays) // self.batch_size)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """Batches ``start``, ``start + 1``, ... of epoch ``epoch``."""
        rows = len(self.arrays)
        order = epoch_order(rows, self.seed, epoch) if self.shuffle else None
        for begin in range(start * self.batch_size, rows, self.batch_size):
            end = min(begin + self.batch_size, rows)
            # Index arrays make numpy copy the rows (memory-mapped sources are read-only). Shuffled rows are
            # sorted within the batch: the same rows, read with better locality.
            take = np.arange(begin, end) if order is None else np.sort(order[begin:end])
            if self.world_size > 1:
                take = np.array_split(take, self.world_size)[self.rank]
            batch = Batch(
                torch.from_numpy(self.arrays.labels[take].astype(np.float32, copy=False)),
                torch.from_numpy(self.arrays.dense[take]),
                torch.from_numpy(self.arrays.sparse[take].astype(np.int64)),
                global_rows=end - begin,
            )
            yield batch.pin_memory() if self.pin else batch

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()


class Prefetcher:
    """Prepares the next ``depth`` batches of ``batches`` in a background thread while the caller trains on the
    current one: the gather from the (memory-mapped) rows, pinning, and on CUDA the copy to ``device`` on a side
    stream. A step then waits for its batch only when the input is slower than the step (time per step: the
    larger of the two, not their sum). Batches come in the same order as from ``batches``.

    ``close()`` (or leaving a ``with`` block) stops the thread; batches it prepared beyond what was taken are
    dropped, so a caller that stops early (validation, the last step) never sees them.
    """

    _END = object()

    def __init__(self, batches: Iterator[Batch], depth: int = 2, device: torch.device | None = None):
        import queue
        import threading

        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._device = device if device is not None and device.type == "cuda" else None
        self._stream = torch.cuda.Stream(self._device) if self._device is not None else None
        self._thread = threading.Thread(target=self._fill, args=(batches,), name="batch-prefetch", daemon=True)
        self._thread.start()

    def _fill(self, batches: Iterator[Batch]) -> None:
        try:
            for batch in batches:
                item = batch
                if self._stream is not None:  # the copy overlaps the step, which runs on the default stream
                    with torch.cuda.stream(self._stream):
                        item = batch.to(self._device, non_blocking=True)
                        ready = torch.cuda.Event()
                        ready.record(self._stream)
                    item = (item, ready)
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(error)

    def _put(self, item) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Batch:
        item = self._queue.get()
        if item is self._END:
            self._queue.put(self._END)  # every later call ends too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, tuple):  # on CUDA: wait (on the GPU, not here) for its copy, and keep its memory
            batch, ready = item
            current = torch.cuda.current_stream(self._device)
            current.wait_event(ready)
            for tensor in (batch.labels, batch.dense, batch.sparse):
                tensor.record_stream(current)
            return batch
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

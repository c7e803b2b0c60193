"""Batches cut from columnar arrays: one numpy gather per batch, no per-row Python, no collate."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.data.chunk_digests import REENCODE
from criteo_dlrm.data.stored import EncodedArrays, PackedIndices, read_rows


def rank_share(rows: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """Process ``rank``'s part of a batch's ``rows`` in data-parallel evaluation: the ``rank``-th of
    ``world_size`` nearly equal consecutive parts (the first ``len % world_size`` one row longer). Undone by
    ``rank_order``."""
    return np.array_split(rows, world_size)[rank]


def rank_order(shares: list, rows: int, batch_size: int):
    """Undo ``rank_share`` over the batches of ``rows`` rows: ``shares[r]`` holds rank r's part of each batch
    in turn (numpy arrays, or tensors, put in order where they are)."""
    parts, cursors = [], [0] * len(shares)
    for begin in range(0, rows, batch_size):
        size = min(batch_size, rows - begin)
        for rank, share in enumerate(shares):
            count = size // len(shares) + (rank < size % len(shares))
            parts.append(share[cursors[rank] : cursors[rank] + count])
            cursors[rank] += count
    return torch.cat(parts) if isinstance(parts[0], torch.Tensor) else np.concatenate(parts)


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


# Shuffled batches come from chunks of contiguous rows: each epoch reads the chunks in an order drawn from
# (seed, epoch), WINDOW_CHUNKS at a time, each chunk with one sequential read (its digests checked on the
# first), its rows permuted in memory; a window's batches interleave its chunks' rows, so each batch holds rows
# of every chunk of its window. State: one entry per chunk (O(rows / CHUNK_ROWS)) and one window's rows
# (WINDOW_CHUNKS x CHUNK_ROWS = 1,048,576 rows, about 120 MB of Criteo 1TB rows, split between the processes).
# Training rows are stored shuffled (``data.shuffle.SHUFFLE_SEED``), so a chunk is already a uniform sample.
CHUNK_ROWS = 65_536
WINDOW_CHUNKS = 16


def epoch_chunks(chunks: int, seed: int, epoch: int) -> np.ndarray:
    """The chunk order of one epoch: a permutation drawn from (seed, epoch), so a resumed run sees the same."""
    return np.random.default_rng([seed, epoch]).permutation(chunks)


def interleave(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The (chunk slot, row) at each position of a window holding chunks of ``sizes`` rows: row j of slot i at
    key ((j + 0.5) / size_i, i), so every stretch of the window holds each chunk's rows in proportion."""
    sizes = np.asarray(sizes, dtype=np.int64)
    slots = np.repeat(np.arange(len(sizes)), sizes)
    rows = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    order = np.lexsort((slots, (rows + 0.5) / sizes[slots]))
    return slots[order], rows[order]


@dataclass
class _Window:
    """One window of an epoch, as one process holds it: its own chunks' rows, read and permuted."""

    start: int  # its first position in the epoch's stream
    sizes: list[int]  # rows of each chunk (slot) in it
    owned: np.ndarray  # (slots,) whether this process reads the slot
    first: np.ndarray  # (slots,) the slot's first row in ``rows`` (owned slots)
    rows: tuple  # labels, dense, sparse of the owned chunks, concatenated, each chunk's rows permuted
    _interleaved: tuple | None = None  # ``interleave(sizes)``, for a window of unequal chunks (made once)

    @property
    def end(self) -> int:
        return self.start + sum(self.sizes)

    def positions(self, begin: int, end: int) -> np.ndarray:
        """Indices into ``rows`` of this process's rows at stream positions ``begin:end`` (inside the window)."""
        count = len(self.sizes)
        if len(set(self.sizes)) == 1:  # equal chunks: the interleave is round-robin
            local = np.arange(begin - self.start, end - self.start)
            slots, rows = local % count, local // count
        else:
            if self._interleaved is None:
                self._interleaved = interleave(self.sizes)
            slots, rows = self._interleaved
            slots, rows = slots[begin - self.start : end - self.start], rows[begin - self.start : end - self.start]
        mine = self.owned[slots]
        return self.first[slots[mine]] + rows[mine]


class BatchLoader:
    """Iterates over ``arrays`` (in memory or memory-mapped) in batches of ``batch_size`` rows.

    Args:
        arrays: encoded rows.
        batch_size: rows per batch; the last batch of an epoch may be smaller.
        shuffle: a new order each epoch from ``seed`` (chunk by chunk: ``CHUNK_ROWS``); else file order.
        seed: the shuffling seed.
        pin_memory: page-lock batches so that copies to a GPU can be asynchronous.
        rank, world_size: data-parallel training: every process draws the same global batches of
            ``batch_size`` rows (the same rows as one process) and takes its part of each: shuffled, the rows
            of the chunks it reads (slot ``i`` of each window is read by process ``i % world_size``: each reads
            only its share of the rows); in file order, its ``np.array_split`` part. Every row is used once
            per epoch across the processes.
        chunk_rows, window_chunks: the shuffle's chunk and window (defaults ``CHUNK_ROWS`` and
            ``WINDOW_CHUNKS``); fewer rows than a window's make smaller chunks, so a window always has
            ``window_chunks`` chunks (rounded up to a multiple of ``world_size``, so each process reads as many).
        reading_threads: threads reading a window's chunks at once (shuffled): each chunk is one read and one
            permutation into its own part of the window, so the rows are the same with any number.
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
        chunk_rows: int | None = None,
        window_chunks: int = WINDOW_CHUNKS,
        reading_threads: int = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if reading_threads < 1:
            raise ValueError(f"reading_threads must be at least 1, got {reading_threads}")
        self.reading_threads = reading_threads
        self.arrays, self.batch_size, self.shuffle, self.seed, self.pin = arrays, batch_size, shuffle, seed, pin_memory
        self.rank, self.world_size = rank, world_size
        self.window_chunks = -(-max(window_chunks, 1) // world_size) * world_size
        rows = len(arrays)
        self.chunk_rows = chunk_rows or min(CHUNK_ROWS, max(1, -(-rows // self.window_chunks)))
        self.chunks = -(-rows // self.chunk_rows)

    def __len__(self) -> int:
        return -(-len(self.arrays) // self.batch_size)

    def batches(self, epoch: int = 0, start: int = 0, read_ahead: bool = False) -> Iterator[Batch]:
        """Batches ``start``, ``start + 1``, ... of epoch ``epoch``. ``read_ahead`` (shuffled): the next window is
        read in a thread of its own while this one's batches are cut, so no batch waits for a window's read (two
        windows in memory instead of one)."""
        rows = len(self.arrays)
        if self.shuffle:
            yield from self._shuffled(epoch, start, read_ahead)
            return
        for begin in range(start * self.batch_size, rows, self.batch_size):
            end = min(begin + self.batch_size, rows)
            take = np.arange(begin, end)
            if self.world_size > 1:
                take = rank_share(take, self.world_size, self.rank)
            self.arrays.check_rows(begin, end)
            low, high = (int(take[0]), int(take[-1]) + 1) if len(take) else (begin, begin)  # a contiguous range
            yield self._gather([tuple(self._read(source, low, high) for source in self.arrays.stored())], end - begin)

    def _chunk_size(self, chunk: int) -> int:
        return min(self.chunk_rows, len(self.arrays) - chunk * self.chunk_rows)

    def _shuffled(self, epoch: int, start: int, read_ahead: bool) -> Iterator[Batch]:
        order = epoch_chunks(self.chunks, self.seed, epoch)
        windows = [order[i : i + self.window_chunks] for i in range(0, self.chunks, self.window_chunks)]
        starts = np.concatenate([[0], np.cumsum([sum(map(self._chunk_size, window)) for window in windows])])
        rows, window = len(self.arrays), None
        reader = _WindowReader(self, windows, starts, epoch, read_ahead)
        try:
            for begin in range(start * self.batch_size, rows, self.batch_size):
                end = min(begin + self.batch_size, rows)
                parts = []
                position = begin
                while position < end:
                    if window is None or position >= window.end:
                        index = int(np.searchsorted(starts, position, side="right")) - 1
                        window = None  # its rows for this batch are taken already: one window held, and the next
                        window = reader.window(index)
                    stop = min(end, window.end)
                    take = window.positions(position, stop)
                    parts.append(tuple(field[take] for field in window.rows))
                    position = stop
                yield self._gather(parts, end - begin)
        finally:
            reader.close()

    def _read_window(self, chunks: np.ndarray, start: int, epoch: int, pool: Executor | None = None) -> _Window:
        """Read this process's chunks of a window (each one sequential read, checked), rows permuted; by ``pool``'s
        threads at once if given (numpy and the reads release the GIL)."""
        sizes = [self._chunk_size(int(chunk)) for chunk in chunks]
        owned = np.arange(len(chunks)) % self.world_size == self.rank
        first = np.concatenate([[0], np.cumsum(np.where(owned, sizes, 0))[:-1]])
        total = int(np.where(owned, sizes, 0).sum())
        sources = self.arrays.stored()
        rows = tuple(np.empty((total, *array.shape[1:]), dtype=array.dtype) for array in sources)

        def read(slot: int) -> None:
            chunk, size, at = int(chunks[slot]), sizes[slot], int(first[slot])
            begin = chunk * self.chunk_rows
            self.arrays.check_rows(begin, begin + size)
            permutation = np.random.default_rng([self.seed, epoch, chunk]).permutation(size)
            for out, source in zip(rows, sources, strict=True):
                np.take(self._read(source, begin, begin + size), permutation, axis=0, out=out[at : at + size])

        slots = np.flatnonzero(owned).tolist()
        for _ in map(read, slots) if pool is None else pool.map(read, slots):  # raises the first slot's error
            pass
        return _Window(start, sizes, owned, first, rows)

    def _gather(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], global_rows: int) -> Batch:
        labels, dense, sparse = (
            parts[0][field] if len(parts) == 1 else np.concatenate([part[field] for part in parts])
            for field in range(3)
        )
        if isinstance(self.arrays.sparse, PackedIndices):
            sparse = PackedIndices(sparse, self.arrays.sparse.widths)[:]
        batch = Batch(
            torch.from_numpy(labels.astype(np.float32, copy=False)),
            torch.from_numpy(dense),
            torch.from_numpy(sparse.astype(np.int64)),
            global_rows=global_rows,
        )
        return batch.pin_memory() if self.pin else batch

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def _read(self, source: np.ndarray, begin: int, end: int) -> np.ndarray:
        """``read_rows``, with a file shorter than it was written (truncated while the run reads it) refused naming
        it and the fix, and recorded as damage, as a digest mismatch is (never a memory map's SIGBUS).

        Raises:
            DamagedFileError: the file could not give the rows.
        """
        try:
            return read_rows(source, begin, end)
        except OSError as error:
            message = f"{error}: the file is not what was written (shorter: truncated while this run read it?)"
            if self.arrays.digests is not None:
                self.arrays.digests.record_damage(message)
            raise DamagedFileError(f"{message}. It was not used. {REENCODE}", fix=REENCODE) from error


class _WindowReader:
    """An epoch's windows for ``BatchLoader._shuffled``: read when asked (``read_ahead`` off), or each one's
    successor read in a thread of its own as soon as it is handed out (on); each window's chunks by the loader's
    ``reading_threads``."""

    def __init__(self, loader: BatchLoader, windows: list[np.ndarray], starts: np.ndarray, epoch: int, ahead: bool):
        self.loader, self.windows, self.starts, self.epoch = loader, windows, starts, epoch
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="window-read-ahead") if ahead else None
        threads = loader.reading_threads
        self.readers = ThreadPoolExecutor(threads, thread_name_prefix="window-read") if threads > 1 else None
        self.next: tuple | None = None  # (index, future) of the window being read ahead

    def _read(self, index: int) -> _Window:
        return self.loader._read_window(self.windows[index], int(self.starts[index]), self.epoch, self.readers)

    def window(self, index: int) -> _Window:
        if self.pool is None:
            return self._read(index)
        ahead, self.next = self.next, None
        found = ahead[1].result() if ahead is not None and ahead[0] == index else self._read(index)
        if index + 1 < len(self.windows):
            self.next = (index + 1, self.pool.submit(self._read, index + 1))
        return found

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.next = None
        if self.readers is not None:
            self.readers.shutdown(wait=True, cancel_futures=True)


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

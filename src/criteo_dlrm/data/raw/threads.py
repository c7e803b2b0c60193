"""Background threads that overlap reading, parsing and writing a day: read-ahead and write-behind."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq


def in_background(work: Callable[[], None]) -> Callable[[], None]:
    """Run ``work`` in a thread; the returned ``join`` waits for it and re-raises its error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # re-raised by join
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return join


def read_ahead(reader: pa_csv.CSVStreamingReader, depth: int = 2) -> Iterator[pa.RecordBatch]:
    """Yield the reader's batches while a background thread reads the next ones.

    pyarrow releases the GIL while it decompresses and splits text, so reading overlaps with our parsing
    and Parquet writing. The reader itself stays single-threaded: only then does it report line numbers.
    If the consumer stops early (an error while parsing), the reader thread is told to stop and joined.
    """
    batches: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in reader:
                if stop.is_set():
                    return
                batches.put(batch)
        finally:
            batches.put(None)

    join = in_background(produce)
    finished = False
    try:
        while (batch := batches.get()) is not None:
            yield batch
        finished = True
    finally:
        if not finished:
            stop.set()
            while batches.get() is not None:  # unblock the reader's pending put, up to its final None
                pass
        join()


class WriteBehind:
    """Writes Parquet row groups in a background thread, at most ``depth`` tables behind.

    A failed write is re-raised by ``close``; the thread keeps taking tables until then, so ``write``
    never waits on a thread that has stopped.
    """

    def __init__(self, writer: pq.ParquetWriter, depth: int = 1):
        self._tables: queue.Queue = queue.Queue(maxsize=depth)
        self._writer = writer
        self._join = in_background(self._drain)

    def _drain(self) -> None:
        error: BaseException | None = None
        while (table := self._tables.get()) is not None:
            if error is None:
                try:
                    self._writer.write_table(table)
                except BaseException as failure:  # re-raised through close()
                    error = failure
        if error is not None:
            raise error

    def write(self, table: pa.Table) -> None:
        self._tables.put(table)

    def close(self) -> None:
        self._tables.put(None)
        self._join()

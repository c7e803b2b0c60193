"""Read-ahead and write-behind threads: failures surface, early stops stop."""

import threading

import pyarrow as pa
import pytest

from criteo_dlrm.common.schema import COLUMNS
from criteo_dlrm.data.raw.reader import LineTracker, csv_reader
from criteo_dlrm.data.raw.threads import WriteBehind, read_ahead
from tests.data.raw.samples import good_line


class _FailingWriter:
    def __init__(self):
        self.calls = 0

    def write_table(self, table):
        self.calls += 1
        raise OSError("disk full")


def test_a_failed_parquet_write_is_raised_instead_of_hanging():
    writer = _FailingWriter()
    behind = WriteBehind(writer)
    finished = threading.Event()

    def write_many():
        for _ in range(5):  # more than the queue holds: must not block on a dead thread
            behind.write(pa.table({"a": [1]}))
        finished.set()

    threading.Thread(target=write_many, daemon=True).start()
    assert finished.wait(timeout=10), "write() blocked after the writer thread failed"
    with pytest.raises(OSError, match="disk full"):
        behind.close()
    assert writer.calls == 1


def test_stopping_early_stops_the_reader_thread(tmp_path):
    source = tmp_path / "day_0"
    source.write_text("\n".join(good_line(seed) for seed in range(3000)) + "\n")
    before = threading.active_count()
    with pa.OSFile(str(source), "rb") as stream:
        batches = read_ahead(csv_reader(stream, 16 << 10, LineTracker(), COLUMNS))
        next(batches)
        batches.close()  # the consumer gives up after one batch, as on a parse error
    assert threading.active_count() == before

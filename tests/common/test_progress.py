import time

import pytest
from loguru import logger

from criteo_dlrm.common.progress import PROGRESS_SECONDS, progress_bar


@pytest.fixture
def lines(monkeypatch):
    """What the logger writes, with a progress interval of 0.2 s; stderr is not a terminal under pytest."""
    monkeypatch.setenv(PROGRESS_SECONDS, "0.2")
    written: list[str] = []
    sink = logger.add(lambda message: written.append(message.record["message"]), level="INFO")
    yield written
    logger.remove(sink)


def test_off_a_terminal_long_work_logs_what_is_done_its_rate_and_the_time_left(lines):
    with progress_bar(1000, "encoding", "rows") as bar:
        for _ in range(10):
            time.sleep(0.06)
            bar.update(100)
            bar.set_postfix(loss="0.5012", refresh=False)
    assert len(lines) >= 2, lines
    assert all(line.startswith("encoding: ") and " rows (" in line and " rows/s, " in line for line in lines), lines
    assert " left, loss=0.5012" in lines[-1]
    done = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    assert done == sorted(done) and done[-1] < 1000, "steady lines while it runs, no repeat of the end"


def test_work_shorter_than_the_interval_logs_nothing_and_a_bar_asked_off_stays_off(lines):
    with progress_bar(1000, "metadata", "row") as bar:
        bar.update(1000)
    with progress_bar(1000, "training", "step", show=False) as bar:
        time.sleep(0.3)
        bar.update(1000)
    assert lines == []

"""Worker processes: how many are started, and what each task sees."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from criteo_dlrm.common import parallel
from criteo_dlrm.common.parallel import ROWS_PER_WORKER, WorkerDiedError, choose_workers, run_parallel


def test_default_workers_follow_cores_tasks_memory_and_data_size(monkeypatch):
    monkeypatch.setattr(parallel, "available_cores", lambda: 16)
    monkeypatch.setattr(parallel, "available_memory", lambda: 64 << 30)
    assert choose_workers(None, 24, 1 << 30) == 16
    assert choose_workers(None, 3, 1 << 30) == 3
    assert choose_workers(None, 24, 16 << 30) == 4  # free memory for four
    assert choose_workers(None, 24, 1 << 30, rows=100_000) == 1  # the sample: starting workers costs more
    assert choose_workers(None, 24, 1 << 30, rows=5 * ROWS_PER_WORKER) == 5
    assert choose_workers(2, 24, 1 << 30, rows=10) == 2  # asked for: always honoured (up to the tasks)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        choose_workers(0, 24, 1 << 30)


def _tag(shared: dict, value: int) -> tuple[int, int, str]:
    return os.getpid(), value * shared["factor"], shared["name"]


def _fail_on_three(value: int) -> int:
    if value == 3:
        raise RuntimeError(f"task {value} failed")
    return value


def test_shared_object_reaches_every_task_in_workers_and_in_process():
    shared = {"factor": 10, "name": "encoder"}
    for workers in (1, 2):
        results = dict(run_parallel(_tag, [(value,) for value in range(5)], workers, shared=shared))
        assert [results[index][1:] for index in range(5)] == [(value * 10, "encoder") for value in range(5)]
        assert all(pid != os.getpid() for pid, _, _ in results.values()) == (workers == 2)


def test_first_failure_is_raised_with_its_own_message():
    with pytest.raises(RuntimeError, match="task 3 failed"):
        list(run_parallel(_fail_on_three, [(value,) for value in range(6)], 2))


def _wait_for(path: str) -> str:
    for _ in range(300):  # at most 30 s, so that a regression fails instead of hanging
        if Path(path).exists():
            return "released"
        time.sleep(0.1)
    return "timed out"


def test_results_arrive_as_tasks_finish_not_when_all_have(tmp_path):
    # Task 1 waits for a file that the consumer writes only after it has received task 0's result: the
    # progress bars (days done, passes done) depend on results arriving one by one.
    present, release = tmp_path / "present", tmp_path / "release"
    present.touch()
    results = {}
    for index, result in run_parallel(_wait_for, [(str(present),), (str(release),)], 2):
        results[index] = result
        release.touch()
    assert results[1] == "released"


def _killed_on_two(value: int) -> int:
    if value == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a worker
    time.sleep(0.2)
    return value


def test_a_worker_killed_by_a_signal_ends_the_job_naming_the_signal_and_what_lowers_memory():
    with pytest.raises(WorkerDiedError) as died:
        list(run_parallel(_killed_on_two, [(value,) for value in range(6)], 2))
    message = str(died.value)
    assert "A worker process of 2 was killed by SIGKILL" in message, message
    assert "out-of-memory killer" in message and "training.encoding_workers" in message


class _Worker:
    """A pool's worker whose exit code is known once the pool has shut down (its manager thread joined it)."""

    def __init__(self, pool: "_BrokenPool", code: int):
        self.pool, self.code = pool, code

    @property
    def exitcode(self) -> int:
        return self.code if self.pool.shut_down else 255  # the forkserver's pipe read by the other thread


class _BrokenPool:
    def __init__(self, codes: list[int]):
        self.shut_down = False
        self._processes = {index: _Worker(self, code) for index, code in enumerate(codes)}

    def shutdown(self, wait: bool = True) -> None:
        self.shut_down = wait


def test_a_dead_worker_s_signal_is_read_after_the_pool_has_joined_it_and_the_pool_s_own_sigterm_is_not_named():
    # The killed worker's signal, not the SIGTERM the pool then sends the other one (CI once said "ended without
    # a result": the exit code was read while the pool's manager thread was reading it).
    message = parallel._died(_BrokenPool([-signal.SIGKILL, -signal.SIGTERM]), 2)
    assert message.startswith("A worker process of 2 was killed by SIGKILL. "), message
    assert parallel._died(_BrokenPool([-signal.SIGTERM, 0]), 2).startswith(
        "A worker process of 2 was killed by SIGTERM."
    )


_JOB = """
import time
from criteo_dlrm.common.parallel import run_parallel
if __name__ == "__main__":
    list(run_parallel(time.sleep, [(60,), (60,), (60,)], 2))
"""


def _marked(mark: str) -> list[int]:
    """Processes whose environment holds ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _left_after(mark: str, seconds: float = 10.0) -> list[int]:
    """The processes holding ``mark`` still running after up to ``seconds`` (none once they have all ended)."""
    deadline = time.monotonic() + seconds
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _kill_marked(mark: str) -> None:
    """SIGKILL whatever still holds ``mark`` (a test that failed leaves nothing running)."""
    for pid in _marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_job_killed_with_sigkill_leaves_no_worker_forkserver_or_resource_tracker(tmp_path):
    mark = f"CRITEO_DLRM_TEST_MARK={uuid.uuid4().hex}"
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    job = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # the job, its resource tracker, the forkserver and two workers
            if len(_marked(mark)) >= 5:
                break
            time.sleep(0.1)
        assert len(_marked(mark)) >= 5, "the workers started"
        job.kill()
        job.wait()
        assert _left_after(mark) == [], "every process of the job ends with it"
    finally:
        _kill_marked(mark)

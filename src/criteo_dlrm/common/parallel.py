"""Worker processes for preprocessing: whole days (or feature groups) per process, every core busy.

Workers come from a ``forkserver``: a clean process that imports the data code once and forks a worker
per slot, so workers start in milliseconds without inheriting the parent's threads (Kedro's, torch's).
The first failed task cancels the ones not started, lets the running ones finish (each writes its
output atomically, so nothing partial is left) and is raised with its own message. A worker that dies (the
out-of-memory killer's SIGKILL) ends the job with ``WorkerDiedError``: its signal and what lowers memory.

Nothing outlives the process that started the job: each worker watches it (``_lifeline``) and ends with it.
Without that, a killed ``kedro run`` left its workers, the forkserver and its resource tracker running (each
worker holds the forkserver's "alive" pipe and both ends of the pool's queues, so none of them sees an EOF).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import psutil

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.memory import available_memory


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Starting the workers costs about 0.7 s (the forkserver imports the data code): by default a worker is
# started only for about this much work, so small data (the embedded sample) stays in one process.
ROWS_PER_WORKER = 2_000_000


def choose_workers(
    requested: int | None, tasks: int, memory_per_worker: int, rows: int | None = None, cores_per_worker: int = 1
) -> int:
    """``requested``, or (None) one worker per ``cores_per_worker`` cores (what one worker keeps busy by itself,
    with pyarrow's threads: a second worker on those cores only competes with the first), never more than the
    tasks, than free memory allows, or (when ``rows`` is known) than one per ``ROWS_PER_WORKER`` rows."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"workers must be >= 1 (or null for one per core), got {requested}")
        return max(1, min(requested, tasks))
    by_cores = max(1, available_cores() // max(cores_per_worker, 1))
    by_memory = max(1, available_memory() // max(memory_per_worker, 1))
    by_size = max(1, rows // ROWS_PER_WORKER) if rows is not None else tasks
    return max(1, min(by_cores, tasks, by_memory, by_size))


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# Where a job's tasks run: ``run_parallel`` (this machine's worker processes) or, with the same signature,
# ``criteo_dlrm.spark.tasks.run_on_spark``: ``run(function, tasks, workers, shared=None, preload=())`` yields
# ``(task index, result)``.
Runner = Callable[..., Iterator[tuple[int, Any]]]


def where_tasks_run(run: Runner, workers: int) -> str:
    """For progress bars: ``N workers`` locally, or the engine's own name (Spark's tasks report as they finish in
    Spark's own console progress)."""
    return f"{workers} workers" if run is run_parallel else getattr(run, "engine", "another engine")


_SHARED: Any = None  # in a worker process: the ``shared`` object of the job it serves


class WorkerDiedError(UserError, RuntimeError):
    """A worker process ended without a result (killed by a signal, most often for memory)."""


WORKER_SETTINGS = (
    "ingestion.workers, metadata.workers and training.encoding_workers (parameters_*.yml; 1 runs a stage in the "
    "kedro process alone)"
)


def _lifeline(pid: int) -> None:
    """End this process when process ``pid`` ends, however it ends (SIGKILL included): a daemon thread waits on
    a pidfd of it (Linux 5.3+; elsewhere it looks every second)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(1)
    except (AttributeError, OSError):
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:
            while psutil.pid_exists(pid):
                time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="criteo-dlrm-lifeline", daemon=True).start()


def _start_worker(shared: Any, threads: int, parent: int) -> None:
    """Runs once in each worker: end with the job's process, keep the job's shared object, and give pyarrow the
    worker's share of cores."""
    global _SHARED
    _lifeline(parent)
    _SHARED = shared
    import pyarrow

    pyarrow.set_cpu_count(threads)
    pyarrow.set_io_thread_count(threads)


def _call_with_shared(function: Callable[..., Any], *task: Any) -> Any:
    return function(_SHARED, *task)


def run_parallel(
    function: Callable[..., Any],
    tasks: Iterable[tuple],
    workers: int,
    shared: Any = None,
    preload: Sequence[str] = (),
) -> Iterator[tuple[int, Any]]:
    """Run ``function(*task)`` (``function(shared, *task)`` when ``shared`` is given) for each task; yields
    ``(task index, result)`` as tasks finish. ``preload``: modules the forkserver imports once, before it forks
    the workers (the caller names its own: this module knows none of them).

    With one worker the tasks run here, in order (no process is started). Otherwise they run in
    ``workers`` processes, each with ``cores / workers`` pyarrow threads, so that workers do not fight over
    the cores; ``shared`` (e.g. an encoder with its hash tables) is sent to each worker once, not with every
    task. The first exception stops the job as described in the module docstring.
    """
    tasks = [task if shared is None else (shared, *task) for task in tasks]
    if workers <= 1:
        for index, task in enumerate(tasks):
            yield index, function(*task)
        return
    if shared is not None:
        tasks = [(function, *task[1:]) for task in tasks]
        function = _call_with_shared
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    threads = max(1, available_cores() // workers)
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_start_worker, initargs=(shared, threads, os.getpid())
    ) as pool:
        futures: dict[Future, int] = {pool.submit(function, *task): index for index, task in enumerate(tasks)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failed = [future for future in done if future.exception() is not None]
            if failed:
                for future in pending:
                    future.cancel()
                wait(pending)  # the running tasks finish (their outputs are complete); the rest never start
                error = failed[0].exception()
                if isinstance(error, BrokenProcessPool):
                    raise WorkerDiedError(_died(pool, workers)) from error
                raise error
            for future in done:
                yield futures[future], future.result()


def _died(pool: ProcessPoolExecutor, workers: int) -> str:
    """What to say of a pool whose worker died: its signal and the likely cause.

    The exit codes are read once the pool has shut down: its manager thread joins the workers, and a worker's
    exit code is read from the forkserver's pipe only once, so reading it beside that thread could find the
    pipe already read (an exit code of 255, and no signal named). The pool ends the other workers itself with
    SIGTERM: that signal is named only when no other one is there."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=True)
    killed = sorted({-process.exitcode for process in processes if (process.exitcode or 0) < 0})
    killed = [number for number in killed if number != signal.SIGTERM] or killed
    how = (
        "was killed by " + ", ".join(signal.Signals(number).name for number in killed)
        if killed
        else "ended without a result"
    )
    return (
        f"A worker process of {workers} {how}. SIGKILL there is most often the kernel's out-of-memory killer: the "
        f"job's memory limit (a cgroup's, or the machine's) was reached. Fewer workers need less memory: lower "
        f"{WORKER_SETTINGS}. What finished is kept: the same command continues from it."
    )

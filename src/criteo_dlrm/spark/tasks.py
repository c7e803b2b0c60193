"""The local engine's per-item work as Spark tasks: one task per raw file, per day, per shuffle bucket.

``run_on_spark`` has ``common.parallel.run_parallel``'s signature, so ingestion (``convert_days``), encoding
(``FeatureEncoder.encode_days``) and the stored shuffle take either: the work inside a task is the same code, so
the outputs are the same files. Spark schedules the tasks over its executors and retries a task that fails
(``spark.task.maxFailures``, 4 on a cluster; ``local[N,F]`` locally); a ``UserError`` (bad data, a setting) is
the task's answer, not a failure, so it is raised here once, as the local engine raises it, without retries.

The tasks read and write files through the local filesystem API, as the local engine does: every executor must
see the project's data folders at the same paths (a shared filesystem, or object storage mounted).
"""

from __future__ import annotations

import os
import pickle
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from loguru import logger

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.spark.session import BACK, SPARK_YML, master, spark_session


class SparkJobError(UserError, RuntimeError):
    """A Spark job whose task failed on every try (an executor lost, a failing disk), named with the task's error."""


# An exception's line in a traceback (``OSError: ...``, ``org.apache.spark.SparkException: ...``), and the
# prefixes of the ones that are Spark's or the JVM's, not the task's own Python.
_ERROR_LINE = r"\w+(?:\.\w+)*(?:Error|Exception)\b: .*"
_NOT_THE_TASKS = ("org.", "java.", "py4j.", "pyspark.")


def _last_python_error(error: Exception) -> str:
    """The task's own exception line (``OSError: ...``) out of Spark's wrapped traceback, or Spark's first line."""
    text = str(error)
    found = re.findall(f"^({_ERROR_LINE})$", text, flags=re.MULTILINE)
    python = [line for line in found if not line.startswith(_NOT_THE_TASKS)]
    return (python or found or [text.strip().splitlines()[0] if text.strip() else type(error).__name__])[-1]


def _workers_python(session) -> str:
    """The interpreter a session starts its Python workers with (PySpark's ``pythonExec``)."""
    try:
        return session.sparkContext.pythonExec
    except Exception:  # Spark Connect has no SparkContext: a server started here inherited the variable
        return os.environ.get("PYSPARK_PYTHON", "python3 on the PATH")


def _job_error(name: str, tasks: int, where: str, python: str, cause: str) -> SparkJobError:
    """What a job whose tasks failed every try says: a Python worker that cannot import the project (the executors'
    interpreter is not the one it is installed in: no retry helps), or the task's own error."""
    missing = re.fullmatch(r"ModuleNotFoundError: No module named '([\w.]+)'", cause)
    if missing:
        failed = f"Spark job {name} ({tasks} tasks on {where}) failed: its Python workers cannot import "
        if where.startswith("sc://"):  # a Spark Connect server's workers run the server's own Python
            remedy = "They run the Spark Connect server's own Python: install criteo-dlrm and its dependencies there"
        else:
            remedy = (
                f"They run the Python that spark.pyspark.python names (here: {python}): set spark.pyspark.python in "
                f"{SPARK_YML} to the interpreter where criteo-dlrm and its dependencies are installed on every "
                "executor (docs/spark.md)"
            )
        return SparkJobError(f"{failed}{missing.group(1)} ({cause}). {remedy}, {BACK}.", fix=BACK)
    if _raised_by_the_task(cause):  # the task's own code, on every try: the same input raises it again
        what = (
            f"{cause}, raised by the task on every try. Fix what it names (the executors' logs, in Spark's UI or the "
            "cluster's, hold the whole traceback), then"
        )
    else:  # Spark's or the JVM's (an executor lost, killed for its memory): may pass on a rerun
        what = f"{cause}. The executors' logs (Spark's UI, or the cluster's) say why;"
    return SparkJobError(
        f"Spark job {name} ({tasks} tasks on {where}) failed after Spark's retries: {what} run the same command "
        "again: nothing half-written is left (every output is staged and renamed), and the days already converted "
        "are reused."
    )


def _raised_by_the_task(cause: str) -> bool:
    """Whether a failed job's cause (``_last_python_error``) is a Python exception, not Spark's or the JVM's."""
    return re.fullmatch(_ERROR_LINE, cause) is not None and not cause.startswith(_NOT_THE_TASKS)


def run_on_spark(
    function: Callable[..., Any],
    tasks: Iterable[tuple],
    workers: int | None = None,
    shared: Any = None,
    preload: Sequence[str] = (),
) -> Iterator[tuple[int, Any]]:
    """Run ``function(*task)`` (``function(shared, *task)`` when ``shared`` is given) as one Spark task per task;
    yields ``(task index, result)`` in task order once the job is done. ``workers`` and ``preload`` are the local
    engine's and ignored (Spark's executors and cores decide); ``shared`` travels with the job once (Spark
    broadcasts a large closure), not with every task.

    Raises:
        UserError: the first task's (by index) that raised one; the other tasks ran to their end.
    """
    tasks = list(tasks)
    if not tasks:
        return
    session = spark_session()
    name = getattr(getattr(function, "func", function), "__name__", "tasks")  # a partial's function
    project = os.getcwd()

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:  # the task's share of the executor's cores (spark.task.cpus)
            pa.set_cpu_count(max(1, int(context.cpus())))
        # The catalog's paths are relative to the project, and a day's identity names its raw file relative to
        # it: the tasks run there (a Spark Connect server's Python workers start in a folder of their own). An
        # executor that does not see the project folder keeps its own (absolute paths still work there).
        own = os.getcwd()
        if os.path.isdir(project):
            os.chdir(project)
        try:
            for batch in batches:
                indices, results = [], []
                for index in batch.column(0).to_pylist():
                    task = tasks[index]
                    try:
                        answer = ("ok", function(shared, *task) if shared is not None else function(*task))
                    except UserError as error:
                        answer = ("error", error)
                    indices.append(index)
                    results.append(pickle.dumps(answer))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(indices, pa.int64()), pa.array(results, pa.binary())], names=["index", "result"]
                )
        finally:
            os.chdir(own)  # the worker is reused for other jobs

    started = time.perf_counter()
    logger.info("{}: {} Spark tasks on {}", name, len(tasks), master(session))
    try:
        rows = (
            session.range(len(tasks), numPartitions=len(tasks)).mapInArrow(run, "index long, result binary").collect()
        )
    except Exception as error:  # a task failed every try Spark gave it (spark.task.maxFailures)
        where, python = master(session), _workers_python(session)
        raise _job_error(name, len(tasks), where, python, _last_python_error(error)) from error
    answers = sorted(((row["index"], pickle.loads(row["result"])) for row in rows), key=lambda answer: answer[0])
    logger.info("{}: {} Spark tasks done in {:.1f}s", name, len(tasks), time.perf_counter() - started)
    for _, (status, value) in answers:
        if status == "error":
            raise value
    for index, (_, value) in answers:
        yield index, value


run_on_spark.engine = "Spark"  # named so in the progress bars (common.parallel.where_tasks_run)

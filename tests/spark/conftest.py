"""One Spark session per test process: local[2,2] (two cores, a failed task tried twice), few shuffle partitions."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

SETTINGS = {
    "spark.master": "local[2,2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
}


def needs_spark() -> None:
    """Skip without the spark extra or Java (a user's choice; CI installs both and fails on a skip)."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.spark.session import require_spark

    try:
        require_spark()
    except ConfigError as error:
        pytest.skip(str(error))


@contextlib.contextmanager
def local_connect_port():
    """Hold PySpark's fixed local Spark Connect port (15002) for this test process, machine-wide: a local Connect
    server listens there, one per machine, so a second suite's test waits for the first instead of failing."""
    with open(Path(tempfile.gettempdir()) / "criteo_dlrm_spark_connect_15002.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# A ``python3`` first on the PATH that refuses to run Spark's Python workers (and runs anything else as the PATH's
# own would): every Spark test then shows that the workers run this environment's Python, whatever the PATH.
NOT_THE_PATHS_PYTHON = """#!/bin/sh
case "$*" in *pyspark.daemon*|*pyspark.worker*)
  echo "Spark started its Python worker with the PATH's python3, not this environment's Python" >&2; exit 3;;
esac
exec {python} "$@"
"""


@contextlib.contextmanager
def path_python_refusing_spark_workers(folder: Path):
    """Within: a ``PATH`` whose ``python3`` and ``python`` refuse Spark's workers, and no ``PYSPARK_PYTHON`` (a
    batch job that runs the environment's ``kedro`` by its path, without activating the environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python3", "python"):
        script = folder / name
        script.write_text(NOT_THE_PATHS_PYTHON.format(python=shutil.which(name) or sys.executable))
        script.chmod(0o755)
    with pytest.MonkeyPatch.context() as environment:  # everything set back on leaving, whatever it was
        environment.setenv("PATH", str(folder), prepend=os.pathsep)
        environment.delenv("PYSPARK_PYTHON", raising=False)
        environment.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
        yield


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The session, started the way a batch job starts it: Spark's JVM keeps the PATH it started with, so its
    workers would find the refusing ``python3`` if they were started by name."""
    needs_spark()
    from criteo_dlrm.spark.session import spark_session

    with path_python_refusing_spark_workers(tmp_path_factory.mktemp("path")):
        session = spark_session(SETTINGS)
    yield session
    session.stop()

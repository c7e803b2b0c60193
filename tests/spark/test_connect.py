"""Spark Connect (``spark.remote``): the same tasks and metadata through a Connect session, with a local server
(``spark.remote: local[2]`` starts one in this machine's JVM; ``sc://host:15002`` reaches a remote one the same
way). In its own process: a process holds one kind of Spark session at a time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.spark.conftest import local_connect_port, needs_spark, path_python_refusing_spark_workers

SCRIPT = """
import numpy as np
import pyarrow.parquet as pq
from pathlib import Path
from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_days
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.spark.metadata import count_on_spark
from criteo_dlrm.spark.session import spark_session
from criteo_dlrm.spark.tasks import run_on_spark

session = spark_session({"spark.remote": "local[2]", "spark.sql.shuffle.partitions": "4"})
assert type(session).__module__ == "pyspark.sql.connect.session", type(session)
# Paths relative to the project (the working folder), as the catalog gives them: the Connect server's Python
# workers run in a folder of their own.
write_day(Path("raw/day_0.gz"), 5_000, day=0, model=ClickModel(seed=1))
local = convert_days([(Path("raw/day_0.gz"), Path("local/day_0.parquet"))])
remote = convert_days([(Path("raw/day_0.gz"), Path("connect/day_0.parquet"))], run=run_on_spark)
assert Path("connect/day_0.parquet").read_bytes() == Path("local/day_0.parquet").read_bytes()
assert pq.read_schema("connect/day_0.parquet").metadata[b"criteo_dlrm.source"] == b"raw/day_0.gz"
expected, vocabularies = compute_feature_metadata([local[0].parquet], MetadataConfig(), progress=False)
counted, counted_vocabularies = count_on_spark([local[0].parquet], MetadataConfig())
assert counted == expected
assert all(np.array_equal(counted_vocabularies[name], vocabularies[name]) for name in vocabularies)
print("same over Spark Connect")
"""


@pytest.mark.slow
def test_spark_connect_runs_the_same_tasks_and_counts_on_paths_relative_to_the_project(tmp_path):
    """Issue 62 item 8: through a local Connect server, ingestion failed on the catalog's relative paths."""
    needs_spark()
    pytest.importorskip("grpc_status", reason="the spark extra's Connect client is not installed")
    with local_connect_port():
        # Started as a batch job starts it: the server's Python workers must not be the PATH's python3.
        with path_python_refusing_spark_workers(tmp_path / "path"):
            env = dict(os.environ)
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "same over Spark Connect" in result.stdout

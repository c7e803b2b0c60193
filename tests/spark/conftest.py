"""One Spark session per test process: local[2,2] (two cores, a failed task tried twice), few shuffle partitions."""

from __future__ import annotations

import pytest

SETTINGS = {
    "spark.master": "local[2,2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
    from criteo_dlrm.spark.session import spark_session

    session = spark_session(SETTINGS)
    yield session
    session.stop()

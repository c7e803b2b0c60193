"""One Spark session per test process: local[2,2] (two cores, a failed task tried twice), few shuffle partitions."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def spark():
    needs_spark()
    from criteo_dlrm.spark.session import spark_session

    session = spark_session(SETTINGS)
    yield session
    session.stop()

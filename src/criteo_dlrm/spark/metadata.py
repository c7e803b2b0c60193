"""Feature metadata counted by Spark: the same ``feature_metadata`` and vocabularies as
``data.metadata.compute_feature_metadata``, from Spark SQL aggregations over the training days' Parquet.

Three jobs, none of which brings rows to the driver: the rows and clicks; the exact (feature, value) counts of
the 26 categorical features (one shuffle, spilled to disk by Spark when it outgrows memory), from which each
feature's distinct and present counts and its vocabulary (count >= min_frequency, most frequent first, ties to
the smaller value, capped: the local rule) are taken, the vocabulary ranked within its feature by a window; and
the histograms of the 13 dense features, from which ``DenseStatistics`` summarises exactly as it does locally.
The driver receives 26 summaries, the vocabularies (what the metadata stores anyway) and the dense histograms.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from loguru import logger

from criteo_dlrm.common.errors import DataError, UserError
from criteo_dlrm.common.schema import DENSE_COLUMNS, LABEL_COLUMN, SPARSE_COLUMNS
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.metadata import (
    DenseStatistics,
    SparseCounts,
    assemble_metadata,
    check_training_paths,
    effective_config,
    no_rows_error,
    vocabulary_caps,
)
from criteo_dlrm.data.parquet import DamagedDayError, verify_day
from criteo_dlrm.spark.session import master, spark_session


def _long_format(frame, columns: Sequence[str], cast: str):
    """``(f, v)`` rows, one per cell of ``columns`` (``f`` the column's position, ``v`` its value as ``cast``):
    Spark's ``stack`` (a fifth faster than ``inline`` of an array of structs, measured)."""
    from pyspark.sql import functions as F

    cells = ", ".join(f"{index}, CAST(`{name}` AS {cast})" for index, name in enumerate(columns))
    return frame.select(F.expr(f"stack({len(columns)}, {cells}) AS (f, v)"))


def _sparse_counts(frame, config: MetadataConfig, rows: int) -> dict[str, SparseCounts]:
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counts = (
        _long_format(frame, SPARSE_COLUMNS, "BIGINT")
        .where(F.col("v") >= 0)  # null (missing) and the predecessor's -1 alike
        .groupBy("f", "v")
        .count()
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        totals = {
            row["f"]: (row["distinct"], row["present"])
            for row in counts.groupBy("f")
            .agg(F.count("*").alias("distinct"), F.sum("count").alias("present"))
            .collect()
        }
        caps = vocabulary_caps(config)
        vocabularies: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if not config.use_modulus_hash:
            cap = F.element_at(F.array(*[F.lit(caps[name]) for name in SPARSE_COLUMNS]), F.col("f") + 1)
            order = Window.partitionBy("f").orderBy(F.desc("count"), F.asc("v"))
            ranked = (
                counts.where(F.col("count") >= config.min_frequency)
                .withColumn("rank", F.row_number().over(order))
                .where(F.col("rank") <= cap)
                .select("f", "rank", "v", "count")
                .toArrow()
            )
            f, rank = ranked.column("f").to_numpy(), ranked.column("rank").to_numpy()
            values, value_counts = ranked.column("v").to_numpy(), ranked.column("count").to_numpy()
            order_all = np.lexsort((rank, f))
            f, values, value_counts = f[order_all], values[order_all], value_counts[order_all]
            for index in range(len(SPARSE_COLUMNS)):
                start, end = np.searchsorted(f, index, "left"), np.searchsorted(f, index, "right")
                vocabularies[index] = (values[start:end].astype(np.int64), value_counts[start:end].astype(np.int64))
    finally:
        counts.unpersist()
    result = {}
    for index, name in enumerate(SPARSE_COLUMNS):
        distinct, present = totals.get(index, (0, 0))
        if config.use_modulus_hash:
            result[name] = SparseCounts(int(distinct), rows - int(present), np.zeros(0, dtype=np.int64), int(present))
        else:
            vocabulary, covered = vocabularies[index]
            result[name] = SparseCounts(int(distinct), rows - int(present), vocabulary, int(covered.sum()))
    return result


def _dense_statistics(frame, rows: int) -> dict[str, DenseStatistics]:
    from pyspark.sql import functions as F

    histogram = (
        _long_format(frame, DENSE_COLUMNS, "DOUBLE")
        .where(F.col("v").isNotNull() & ~F.isnan("v"))  # missing: nulls (and NaN in the predecessor's float days)
        .groupBy("f", "v")
        .count()
        .toArrow()
    )
    f, values, counts = (histogram.column(name).to_numpy() for name in ("f", "v", "count"))
    result = {}
    for index, name in enumerate(DENSE_COLUMNS):
        mine = f == index
        present = values[mine]
        statistics = DenseStatistics.from_histogram(
            np.maximum(present, 0.0),
            counts[mine],
            rows - int(counts[mine].sum()),
            float(present.min()) if len(present) else None,
            float(present.max()) if len(present) else None,
        )
        result[name] = statistics
    return result


def _damage_of(path: str) -> str:
    """'' when the day's pages are intact (their CRCs verified), else the local engine's message naming it: run
    by the executors, one task per day."""
    try:
        verify_day(path)
    except DataError as damaged:
        return str(damaged)
    return ""


def verify_days(session, train_paths: Sequence[str | Path]) -> None:
    """Verify every day's page checksums before Spark reads them: Spark's Parquet reader does not (measured: a day
    with a damaged data page, which the local engine refuses, was counted as other numbers), so a damaged day would
    be a wrong answer. One task per day on the executors (without a session, or with a Spark Connect one, which has
    no tasks of Python functions: here, on the driver).

    Raises:
        DamagedDayError: naming the first damaged day and the fix, as the local engine does.
    """
    paths = [str(Path(path).resolve()) for path in train_paths]
    try:
        context = session.sparkContext if session is not None else None
    except Exception:  # Spark Connect: no SparkContext
        context = None
    found = context.parallelize(paths, len(paths)).map(_damage_of).collect() if context else map(_damage_of, paths)
    problem = next((message for message in found if message), "")
    if problem:
        raise DamagedDayError(problem)


def count_on_spark(
    train_paths: Sequence[str | Path], config: MetadataConfig
) -> tuple[FeatureMetadata, dict[str, np.ndarray]]:
    """``compute_feature_metadata`` on Spark: the same ``(metadata, vocabularies)`` (``metadata.workers`` and
    ``features_per_pass`` are the local engine's; Spark's executors and its spilling aggregation take their place).
    """
    from pyspark.sql import functions as F

    check_training_paths(train_paths)
    session = spark_session()
    started = time.perf_counter()
    verify_days(session, train_paths)
    try:
        frame = session.read.parquet(*[Path(path).resolve().as_uri() for path in train_paths])
        totals = frame.agg(F.count("*").alias("rows"), F.sum(F.col(LABEL_COLUMN).cast("long")).alias("clicks")).first()
        rows, positives = int(totals["rows"]), int(totals["clicks"] or 0)
        if rows == 0:
            raise no_rows_error(train_paths)
        config = effective_config(config, rows, positives)
        sparse = _sparse_counts(frame, config, rows)
        dense = _dense_statistics(frame, rows)
    except Exception as error:
        if not isinstance(error, UserError):
            # A day damaged since it was verified fails Spark with a Java exception that names no day.
            verify_days(None, train_paths)
        raise
    logger.info(
        "feature metadata counted by Spark on {} in {:.1f}s ({:,} rows)", master(session),
        time.perf_counter() - started, rows,
    )  # fmt: skip
    return assemble_metadata(rows, positives, sparse, dense, config)

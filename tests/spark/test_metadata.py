"""Feature metadata counted by Spark equals the local engine's: every count, vocabulary, and dense statistic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.common.schema import PARQUET_SCHEMA, SPARSE_COLUMNS
from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.spark.metadata import count_on_spark


def _days(folder, ctr: float, rows: tuple[int, ...] = (9_000, 7_000)) -> list[str]:
    model = ClickModel(seed=3, ctr=ctr)
    paths = []
    for day, count in enumerate(rows):
        write_day(folder / f"day_{day}.gz", count, day=day, model=model, chunk_rows=3_000)
        paths.append(convert_day(folder / f"day_{day}.gz", folder / f"day_{day}.parquet").parquet)
    return paths


def _same(paths, config: MetadataConfig) -> dict:
    local, local_vocabularies = compute_feature_metadata(paths, config, progress=False)
    spark, spark_vocabularies = count_on_spark(paths, config)
    assert spark == local  # every count and coverage; the dense statistics to the bit; the vocabularies' digest
    for name in SPARSE_COLUMNS:
        assert spark_vocabularies[name].dtype == np.int64
        assert np.array_equal(spark_vocabularies[name], local_vocabularies[name])
    return spark


@pytest.mark.parametrize("ctr", [0.25, 0.03])  # Kaggle's click rate and Criteo 1TB's
def test_spark_counts_the_local_engines_metadata(spark, tmp_path, ctr):
    paths = _days(tmp_path, ctr)
    metadata = _same(paths, MetadataConfig())  # min_expected_clicks raises min_frequency at either rate
    assert metadata.min_frequency == math.ceil(3 / metadata.click_rate)  # 13 and 95 here
    assert sum(metadata.sparse[name]["vocabulary_size"] for name in SPARSE_COLUMNS) > 26


def test_caps_per_feature_overrides_and_ties_follow_the_local_rule(spark, tmp_path):
    paths = _days(tmp_path, 0.25)
    config = MetadataConfig(
        min_frequency=1,
        min_expected_clicks=0,
        max_vocabulary_size=50,
        vocabulary_size_overrides={"SPARSE_2": 3, "SPARSE_20": 1},
    )
    metadata = _same(paths, config)
    sizes = {name: metadata.sparse[name]["vocabulary_size"] for name in SPARSE_COLUMNS}
    assert sizes["SPARSE_2"] == 3 and sizes["SPARSE_20"] == 1 and max(sizes.values()) == 50
    # With min_frequency 1 many values are seen once: the cap cuts through a tie, broken by the smaller value.
    assert any(metadata.sparse[name]["distinct"] > 50 for name in SPARSE_COLUMNS)


def test_modulus_hash_mode_counts_the_same(spark, tmp_path):
    paths = _days(tmp_path, 0.25)
    _same(paths, MetadataConfig(use_modulus_hash=True, min_expected_clicks=0))
    _same(paths, MetadataConfig(use_modulus_hash=True, modulus_hash_size=1000, min_expected_clicks=0))


def test_the_real_criteo_rows_count_the_same(spark, real_data, tmp_path):
    paths = [
        convert_day(source, tmp_path / f"{source.stem}.parquet").parquet for source in sorted(real_data.glob("*.tsv"))
    ]
    metadata = _same(paths, MetadataConfig())
    assert metadata.rows == 10_000 + 4_584 + 10_000


def test_no_rows_is_refused_as_locally(spark, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "day_0.parquet"
    pq.write_table(PARQUET_SCHEMA.empty_table(), path)
    with pytest.raises(DataError, match="hold no rows"):
        count_on_spark([str(path)], MetadataConfig())


def test_a_damaged_day_is_named_as_the_local_engine_names_it(spark, tmp_path):
    """Issue 46 item 6: a damaged Parquet day read by the Spark vocabulary pass ended in a Java exception
    (ArrayIndexOutOfBoundsException) instead of the local engine's DamagedDayError naming the day and the fix."""
    from criteo_dlrm.data.parquet import DamagedDayError

    paths = _days(tmp_path, 0.25)
    damaged = tmp_path / "day_1.parquet"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 1 << 3  # inside the data pages
    damaged.write_bytes(bytes(data))
    with pytest.raises(DamagedDayError, match=str(damaged)):
        count_on_spark(paths, MetadataConfig())

import dataclasses
import math
import tracemalloc

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.schema import DENSE_COLUMNS, PARQUET_SCHEMA, SPARSE_COLUMNS
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data import metadata as metadata_module
from criteo_dlrm.data import parquet as parquet_module
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import ValueCounter, build_vocabulary, compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


@pytest.fixture(scope="module")
def generated_days(tmp_path_factory):
    folder = tmp_path_factory.mktemp("days")
    model = ClickModel(seed=4)
    paths = []
    for day in range(2):
        write_day(folder / f"day_{day}", 6000, day=day, model=model)
        paths.append(convert_day(folder / f"day_{day}", folder / f"day_{day}.parquet").parquet)
    return paths


def _expected_vocabulary(series: pd.Series, min_frequency: int, cap: int) -> list[int]:
    counts = series.dropna().astype("int64").value_counts()
    frame = counts[counts >= min_frequency].rename("count").rename_axis("value").reset_index()
    return frame.sort_values(["count", "value"], ascending=[False, True])["value"].head(cap).tolist()


def _check_against_pandas(paths, settings, threshold: int | None = None):
    metadata, vocabularies = compute_feature_metadata(paths, settings)
    frame = pd.concat([pd.read_parquet(path) for path in paths], ignore_index=True)
    assert metadata.to_dict()["label"] == {
        "rows": len(frame),
        "positives": int(frame["labels"].sum()),
        "ctr": frame["labels"].mean(),
    }
    for name in SPARSE_COLUMNS:
        column, stats = frame[name], metadata.sparse[name]
        assert stats["missing"] == column.isna().sum()
        assert stats["distinct"] == column.nunique()
        expected = _expected_vocabulary(column, threshold or settings.min_frequency, settings.cap(name))
        assert vocabularies[name].tolist() == expected, name
        assert stats["table_size"] == len(expected) + 2, "the vocabulary, a row for unseen and one for missing"
    for name in DENSE_COLUMNS:
        column, stats = frame[name].dropna(), metadata.dense[name]
        transformed = np.log1p(np.maximum(column.to_numpy(dtype=float), 0))
        assert stats["count"] == len(column) and stats["missing"] == frame[name].isna().sum()
        assert stats["min"] == column.min() and stats["max"] == column.max()
        assert stats["log1p_mean"] == pytest.approx(transformed.mean(), rel=1e-9)
        assert stats["log1p_std"] == pytest.approx(transformed.std(), rel=1e-6)
    return metadata, vocabularies


def test_metadata_matches_pandas_on_generated_days(generated_days):
    _check_against_pandas(
        generated_days, MetadataConfig(min_expected_clicks=0, min_frequency=2, max_vocabulary_size=500)
    )


def test_metadata_matches_pandas_on_real_rows(tmp_path, real_data):
    paths = [
        convert_day(path, tmp_path / f"{path.stem}.parquet").parquet for path in sorted(real_data.glob("kaggle*.tsv"))
    ]
    metadata, _ = _check_against_pandas(
        paths, MetadataConfig(min_expected_clicks=0, min_frequency=1, max_vocabulary_size=10**6)
    )
    assert metadata.rows == 14_584


def test_frequency_threshold_and_cap_at_their_edges():
    values = np.array([10, 20, 30, 40, 50])
    counts = np.array([3, 5, 3, 2, 5])
    assert build_vocabulary(values, counts, min_frequency=3, cap=10).tolist() == [20, 50, 10, 30]
    assert build_vocabulary(values, counts, min_frequency=5, cap=10).tolist() == [20, 50]
    assert build_vocabulary(values, counts, min_frequency=6, cap=10).tolist() == []
    # Ties at the cap go to the smaller value, whatever the input order.
    assert build_vocabulary(values[::-1], counts[::-1], min_frequency=1, cap=3).tolist() == [20, 50, 10]
    assert build_vocabulary(values, counts, min_frequency=1, cap=1).tolist() == [20]


def test_value_counter_merges_many_batches_exactly():
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 5000, 3000) for _ in range(40)]
    counter = ValueCounter()
    for batch in batches:
        counter.add(batch)
    values, counts = counter.result()
    expected = pd.Series(np.concatenate(batches)).value_counts().sort_index()
    assert values.tolist() == expected.index.tolist() and counts.tolist() == expected.tolist()


def test_per_feature_cap_override(generated_days):
    settings = MetadataConfig(
        min_expected_clicks=0, min_frequency=1, max_vocabulary_size=100, vocabulary_size_overrides={"SPARSE_2": 7}
    )
    metadata, vocabularies = compute_feature_metadata(generated_days, settings)
    assert len(vocabularies["SPARSE_2"]) == 7 and metadata.sparse["SPARSE_2"]["table_size"] == 9
    assert len(vocabularies["SPARSE_3"]) == 100


def test_missing_and_unseen_values_encode_to_rows_of_their_own(generated_days):
    metadata, vocabularies = compute_feature_metadata(
        generated_days, MetadataConfig(min_expected_clicks=0, min_frequency=1)
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    vocabulary = vocabularies["SPARSE_0"]
    values = np.array([vocabulary[0], vocabulary[-1], -1, 2**40, vocabulary[3]])
    assert encoder.encode_sparse_column(0, values).tolist() == [2, len(vocabulary) + 1, 1, 0, 5]


def test_encoder_matches_a_python_dict_lookup(generated_days):
    metadata, vocabularies = compute_feature_metadata(
        generated_days, MetadataConfig(min_expected_clicks=0, min_frequency=2)
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    table = pq.read_table(generated_days[1])
    encoded = encoder.encode_batch(table)
    for feature, name in enumerate(SPARSE_COLUMNS):
        lookup = {int(v): i + 2 for i, v in enumerate(vocabularies[name])}
        expected = [1 if v is None else lookup.get(v, 0) for v in table.column(name).to_pylist()]
        assert encoded.sparse[:, feature].tolist() == expected, name
    stats = metadata.dense["DENSE_4"]
    raw = table.column("DENSE_4").to_pylist()
    expected = [0.0 if v is None else (np.log1p(max(v, 0)) - stats["log1p_mean"]) / stats["log1p_std"] for v in raw]
    np.testing.assert_allclose(encoded.dense[:, 4], expected, rtol=1e-5, atol=1e-5)
    assert encoded.labels.tolist() == table.column("labels").to_pylist()


def test_modulus_hash_mode(generated_days):
    settings = MetadataConfig(min_frequency=1, min_expected_clicks=0, use_modulus_hash=True, modulus_hash_size=1000)
    metadata, vocabularies = compute_feature_metadata(generated_days, settings)
    assert metadata.encoding == "modulus_hash" and all(len(v) == 0 for v in vocabularies.values())
    assert all(metadata.sparse[name]["table_size"] == 1000 for name in SPARSE_COLUMNS)
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    values = np.array([0, 997, 998, 123456, -1])
    assert encoder.encode_sparse_column(5, values).tolist() == [2, 999, 2, 2 + 123456 % 998, 1]
    default = compute_feature_metadata(
        generated_days,
        MetadataConfig(min_frequency=1, min_expected_clicks=0, use_modulus_hash=True, max_vocabulary_size=50),
    )[0]
    assert default.sparse["SPARSE_8"]["table_size"] == default.sparse["SPARSE_8"]["distinct"] + 2
    assert default.sparse["SPARSE_2"]["table_size"] == 52


def test_encoder_state_round_trips(generated_days):
    metadata, vocabularies = compute_feature_metadata(
        generated_days, MetadataConfig(min_expected_clicks=0, min_frequency=2)
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    restored = FeatureEncoder.from_state_dict(encoder.state_dict())
    table = pq.read_table(generated_days[0])
    left, right = encoder.encode_batch(table), restored.encode_batch(table)
    np.testing.assert_array_equal(left.sparse, right.sparse)
    np.testing.assert_array_equal(left.dense, right.dense)


def _peak(paths, settings: MetadataConfig) -> tuple[int, tuple[dict, dict]]:
    """Peak traced memory of a single-process pass (tracemalloc sees this process only)."""
    settings = dataclasses.replace(settings, workers=1)
    compute_feature_metadata(paths[:1], settings, progress=False)  # lazy imports and caches out of the way
    tracemalloc.start()
    result = compute_feature_metadata(paths, settings, progress=False)
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top, result


def _bounded_vocabulary_days(folder, days: int, rows: int = 10_000) -> list:
    """Days whose categories come from 500 values per feature: more rows, no more distinct values."""
    rng = np.random.default_rng(days)
    paths = []
    for day in range(days):
        columns = {"labels": pa.array(rng.integers(0, 2, rows), pa.int8())}
        columns |= {name: pa.array(rng.integers(0, 1000, rows)) for name in DENSE_COLUMNS}
        columns |= {name: pa.array(rng.integers(0, 500, rows) * 7919) for name in SPARSE_COLUMNS}
        path = folder / f"day_{day}.parquet"
        pq.write_table(pa.table(columns, schema=PARQUET_SCHEMA), path)
        paths.append(path)
    return paths


def test_memory_does_not_grow_with_rows(tmp_path, monkeypatch):
    # Small batches and a small merge floor reach their bounds within a few thousand rows.
    monkeypatch.setattr(parquet_module, "BATCH_ROWS", 2000)
    monkeypatch.setattr(metadata_module, "MERGE_FLOOR", 1000)
    (tmp_path / "few").mkdir()
    (tmp_path / "many").mkdir()
    few, _ = _peak(
        _bounded_vocabulary_days(tmp_path / "few", 4, rows=10_000),
        MetadataConfig(min_frequency=1, min_expected_clicks=0),
    )
    many, (metadata, _) = _peak(
        _bounded_vocabulary_days(tmp_path / "many", 4, rows=40_000),
        MetadataConfig(min_frequency=1, min_expected_clicks=0),
    )
    assert metadata.rows == 160_000 and metadata.sparse["SPARSE_0"]["distinct"] == 500
    assert many < 1.2 * few, f"4x the rows took {many / few:.2f}x the memory"


def test_splitting_the_same_rows_into_more_days_changes_nothing(tmp_path):
    model = ClickModel(seed=9)
    write_day(tmp_path / "whole", 60_000, day=0, model=model, chunk_rows=10_000)
    whole = convert_day(tmp_path / "whole", tmp_path / "whole.parquet").parquet
    table = pq.read_table(whole)
    pieces = []
    for i in range(6):
        path = tmp_path / f"piece_{i}.parquet"
        pq.write_table(table.slice(i * 10_000, 10_000), path)
        pieces.append(path)
    metadata_whole, vocab_whole = compute_feature_metadata(
        [whole], MetadataConfig(min_expected_clicks=0, min_frequency=2), progress=False
    )
    metadata_split, vocab_split = compute_feature_metadata(
        pieces, MetadataConfig(min_expected_clicks=0, min_frequency=2), progress=False
    )
    dense_whole, dense_split = metadata_whole.dense, metadata_split.dense
    assert dataclasses.replace(metadata_whole, dense={}) == dataclasses.replace(metadata_split, dense={})
    for name in DENSE_COLUMNS:  # sums in another order: equal up to rounding
        assert dense_whole[name] == pytest.approx(dense_split[name], rel=1e-12)
    assert all(np.array_equal(vocab_whole[n], vocab_split[n]) for n in SPARSE_COLUMNS)


def test_fewer_features_per_pass_give_the_same_metadata_in_less_memory(tmp_path):
    write_day(tmp_path / "day_0", 60_000, day=0, model=ClickModel(seed=2), chunk_rows=60_000)
    day = convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet").parquet
    one_pass, (metadata, vocabularies) = _peak([day], MetadataConfig(min_expected_clicks=0, min_frequency=2))
    by_two, (metadata_by_two, vocabularies_by_two) = _peak(
        [day], MetadataConfig(min_expected_clicks=0, min_frequency=2, features_per_pass=2)
    )
    assert metadata_by_two == metadata
    assert all(np.array_equal(vocabularies[n], vocabularies_by_two[n]) for n in SPARSE_COLUMNS)
    assert by_two < 0.8 * one_pass


def test_a_day_with_another_schema_is_refused(tmp_path):
    path = tmp_path / "day_0.parquet"
    pq.write_table(pa.table({"label": [1], "I1": [2]}), path)
    with pytest.raises(ValueError, match=r"day_0.parquet: not a Criteo day.*missing columns"):
        compute_feature_metadata([path], MetadataConfig(min_frequency=1, min_expected_clicks=0))


def test_empty_training_set_is_refused(tmp_path):
    with pytest.raises(ValueError, match="No training day"):
        compute_feature_metadata([], MetadataConfig(min_frequency=1, min_expected_clicks=0))
    path = tmp_path / "day_0.parquet"
    pq.write_table(PARQUET_SCHEMA.empty_table(), path)
    with pytest.raises(ValueError, match="hold no rows"):
        compute_feature_metadata([path], MetadataConfig(min_frequency=1, min_expected_clicks=0))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_frequency": 0}, "min_frequency must be >= 1"),
        ({"max_vocabulary_size": -5}, "max_vocabulary_size must be >= 1"),
        ({"vocabulary_size_overrides": {"SPARSE_99": 3}}, "unknown feature 'SPARSE_99'"),
        ({"modulus_hash_size": 2}, "modulus_hash_size must be >= 3"),
        ({"features_per_pass": 0}, "features_per_pass must be 1 to 26"),
        ({"min_expected_clicks": -1}, "min_expected_clicks must be >= 0"),
    ],
)
def test_nonsense_parameters_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        MetadataConfig.from_dict(settings, "metadata.")


def test_the_predecessor_projects_parquet_loads_with_its_minus_one_as_missing(tmp_path):
    # The predecessor wrote labels as int64, dense as float32 with NaN filled by 0, categories as int64 with -1 missing.
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"labels": rng.integers(0, 2, 500)})
    for name in DENSE_COLUMNS:
        frame[name] = rng.integers(0, 50, 500).astype(np.float32)
    for name in SPARSE_COLUMNS:
        frame[name] = np.where(rng.random(500) < 0.2, -1, rng.integers(0, 30, 500)).astype(np.int64)
    frame.loc[3, "DENSE_2"] = np.nan  # a NaN that escaped the predecessor's fillna counts as missing too
    path = tmp_path / "seed.parquet"
    frame.to_parquet(path)
    metadata, vocabularies = compute_feature_metadata(
        [path], MetadataConfig(min_expected_clicks=0, min_frequency=1), progress=False
    )
    for name in SPARSE_COLUMNS:
        assert metadata.sparse[name]["missing"] == (frame[name] == -1).sum()
        assert -1 not in vocabularies[name]
    assert metadata.dense["DENSE_2"]["missing"] == 1
    encoded = FeatureEncoder.from_metadata(metadata, vocabularies).encode_days([path])
    assert (encoded.sparse[(frame[SPARSE_COLUMNS] == -1).to_numpy()] == 1).all(), "the missing row"
    assert np.isfinite(encoded.dense).all() and encoded.dense[3, 2] == 0.0


def test_parallel_workers_count_exactly_what_one_process_counts(tmp_path):
    days = []
    for day in range(3):
        write_day(tmp_path / f"day_{day}", 8_000, day=day, model=ClickModel(seed=5))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    settings = MetadataConfig(min_expected_clicks=0, min_frequency=2, max_vocabulary_size=300)
    one = compute_feature_metadata(days, dataclasses.replace(settings, workers=1), progress=False)
    two = compute_feature_metadata(days, dataclasses.replace(settings, workers=2), progress=False)
    small_groups = compute_feature_metadata(
        days, dataclasses.replace(settings, workers=2, features_per_pass=3), progress=False
    )
    for metadata, vocabularies in (two, small_groups):
        assert metadata == one[0]
        assert all(np.array_equal(vocabularies[name], one[1][name]) for name in SPARSE_COLUMNS)


@pytest.mark.parametrize(("features_per_pass", "workers", "passes"), [(26, 1, 1), (4, 1, 7), (26, 2, 4), (4, 16, 26)])
def test_feature_groups_cover_every_column_once_with_two_passes_per_worker(features_per_pass, workers, passes):
    groups = metadata_module.feature_groups(features_per_pass, workers)
    assert len(groups) == passes
    sparse = [name for group, _ in groups for name in group]
    dense = [name for _, dense_group in groups for name in dense_group]
    assert sorted(sparse) == sorted(SPARSE_COLUMNS) and sorted(dense) == sorted(DENSE_COLUMNS)
    assert max(len(group) for group, _ in groups) <= features_per_pass
    # Balanced: with two workers, no pass holds more than a quarter of the columns (plus rounding).
    if workers == 2:
        assert max(len(group) + len(dense_group) for group, dense_group in groups) <= 11


def test_low_click_rates_raise_min_frequency_so_a_value_comes_with_enough_clicks():
    rule = MetadataConfig(min_frequency=3, min_expected_clicks=3)
    assert [rule.effective_min_frequency(ctr) for ctr in (0.03, 0.0265, 0.1, 0.25, 0.5, 0.9)] == [
        100,
        114,
        30,
        12,
        6,
        4,
    ]
    assert MetadataConfig(min_expected_clicks=0, min_frequency=3).effective_min_frequency(0.01) == 3, "0: off"
    assert rule.effective_min_frequency(0.0) == 3, "no click at all: nothing to scale by"


def test_metadata_at_a_low_click_rate_applies_and_records_the_raised_threshold(generated_days):
    # min_expected_clicks 20 x the training CTR gives 20, checked against pandas' own counts.
    labels = np.concatenate(
        [pq.read_table(path, columns=["labels"]).column("labels").to_numpy() for path in generated_days]
    )
    config = MetadataConfig(min_frequency=2, min_expected_clicks=20 * labels.mean() * 0.999, max_vocabulary_size=10**6)
    metadata, vocabularies = _check_against_pandas(generated_days, config, 20)
    assert metadata.min_frequency == 20
    plain, plain_vocabularies = compute_feature_metadata(
        generated_days, MetadataConfig(min_expected_clicks=0, min_frequency=2)
    )
    assert plain.min_frequency == 2
    assert sum(map(len, vocabularies.values())) < sum(map(len, plain_vocabularies.values()))


def test_dense_statistics_are_the_same_bits_whatever_the_batches_and_match_an_exact_reference():
    from criteo_dlrm.data.metadata import DenseStatistics

    rng = np.random.default_rng(4)
    values = np.concatenate([rng.integers(-3, 200, 5_000), rng.integers(4_000, 2_000_000, 700)]).astype(np.float64)
    rng.shuffle(values)
    missing = rng.random(len(values)) < 0.2
    whole, batched = DenseStatistics(), DenseStatistics()
    whole.add(values, missing)
    for part in np.array_split(np.arange(len(values)), 7):
        batched.add(values[part], missing[part])
    present = values[~missing]
    clipped, counts = np.unique(np.maximum(present, 0), return_counts=True)
    elsewhere = DenseStatistics.from_histogram(clipped, counts, int(missing.sum()), present.min(), present.max())
    summary = whole.summary()
    assert batched.summary() == summary == elsewhere.summary()  # bit for bit, not within rounding
    transformed = [math.log1p(max(value, 0.0)) for value in present.tolist()]
    assert summary["log1p_mean"] == pytest.approx(math.fsum(transformed) / len(present), rel=1e-14)
    assert summary["count"] == len(present) and summary["missing"] == int(missing.sum())
    assert (summary["min"], summary["max"]) == (present.min(), present.max())
    variance = math.fsum(t * t for t in transformed) / len(present) - summary["log1p_mean"] ** 2
    assert summary["log1p_std"] == pytest.approx(math.sqrt(variance), rel=1e-12)

from __future__ import annotations

import numpy as np

from criteo_dlrm.common.storage import DiskFullError
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from tests.faults import encoded_rows, fails_with


def test_days_encoded_in_parallel_give_the_same_arrays_as_one_process(tmp_path):
    days = []
    for day in range(3):
        write_day(tmp_path / f"day_{day}", 2000 + 700 * day, day=day, model=ClickModel(seed=8))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(
        days[:1], MetadataConfig(min_expected_clicks=0, min_frequency=2, workers=1)
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    in_memory = encoder.encode_days(days)
    one = encoder.encode_days(days, into=tmp_path / "one", workers=1)
    two = encoder.encode_days(days, into=tmp_path / "two", workers=2)
    assert len(two) == 2000 + 2700 + 3400
    for name in ("labels", "dense", "sparse"):
        expected = getattr(in_memory, name)
        assert np.array_equal(getattr(one, name), expected) and np.array_equal(getattr(two, name), expected), name
        assert (tmp_path / "one" / f"{name}.npy").read_bytes() == (tmp_path / "two" / f"{name}.npy").read_bytes()


def test_missing_and_unseen_values_land_on_rows_of_their_own_and_the_earlier_layout_still_encodes():
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.feature_metadata import MISSING_ROW, OUT_OF_VOCABULARY_ROW

    vocabularies = [np.array([7, 3, 9])] + [np.array([1])] * 25
    encoder = FeatureEncoder([5] + [3] * 25, np.zeros(13), np.ones(13), vocabularies)
    values = np.array([7, 3, 9, 42, -1])  # three known, one unseen, one missing
    assert encoder.encode_sparse_column(0, values).tolist() == [2, 3, 4, OUT_OF_VOCABULARY_ROW, MISSING_ROW]
    assert OUT_OF_VOCABULARY_ROW != MISSING_ROW
    round_trip = FeatureEncoder.from_state_dict(encoder.state_dict())
    assert round_trip.encode_sparse_column(0, values).tolist() == [2, 3, 4, 0, 1]
    # A checkpoint made before missing values had a row (no "missing_row" in its encoder): its own layout.
    earlier = encoder.state_dict()
    del earlier["missing_row"]
    legacy = FeatureEncoder.from_state_dict(earlier)
    assert legacy.encode_sparse_column(0, values).tolist() == [1, 2, 3, 0, 0]


def test_the_reference_recipes_dense_transform_is_log_x_plus_3_with_missing_as_0(tmp_path):
    """Issue 47 item 5: MLPerf's and TorchRec's preprocessing feed the model log(x + 3), a missing count as 0;
    the default stays the standardised log1p. Both travel in the checkpoint's encoder; one from before the setting
    reads as the standardised one."""
    write_day(tmp_path / "day_0", 3000, day=0, model=ClickModel(seed=8))
    day = convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet").parquet
    metadata, vocabularies = compute_feature_metadata([day], MetadataConfig(min_expected_clicks=0, workers=1))
    metadata = metadata
    counts = np.array([[0, 5, -2, -7, 1000] + [0] * 8], dtype=np.float32)
    missing = np.zeros_like(counts, dtype=bool)
    missing[0, 1] = True
    mlperf = FeatureEncoder.from_metadata(metadata, vocabularies, "log_plus_3").encode_dense(counts.copy(), missing)
    np.testing.assert_allclose(mlperf[0, :5], np.log([3, 3, 1, 1, 1003]), rtol=1e-6)  # missing as 0; -7 as -2
    standard = FeatureEncoder.from_metadata(metadata, vocabularies)
    expected = (np.log1p(np.maximum(counts, 0)) - metadata.dense_means) / metadata.dense_stds
    expected[missing] = 0.0
    np.testing.assert_allclose(standard.encode_dense(counts.copy(), missing), expected, rtol=1e-5, atol=1e-6)
    state = FeatureEncoder.from_metadata(metadata, vocabularies, "log_plus_3").state_dict()
    assert np.array_equal(FeatureEncoder.from_state_dict(state).encode_dense(counts.copy(), missing), mlperf)
    earlier = standard.state_dict()
    del earlier["dense_offset"], earlier["dense_missing"]
    assert np.array_equal(
        FeatureEncoder.from_state_dict(earlier).encode_dense(counts.copy(), missing),
        standard.encode_dense(counts.copy(), missing),
    )


def test_encoding_checks_the_space_it_needs_before_writing_a_row(converted_day, tmp_path, monkeypatch):
    import shutil

    dataset, days = encoded_rows(converted_day, tmp_path)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=10_000))
    fails_with(
        DiskFullError, lambda: dataset.save(days), r"No space left on .* 3,000 encoded rows \(10.0 kB free; it needs"
    )
    assert not (tmp_path / "train_features").exists()

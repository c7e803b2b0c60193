import numpy as np

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


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


def _table(rows) -> np.ndarray:
    """Rows as one table (sparse, dense, label), sorted: the multiset of rows, whatever their order."""
    table = np.column_stack([np.asarray(rows.sparse), np.asarray(rows.dense), np.asarray(rows.labels)])
    return table[np.lexsort(table.T)]


def test_shuffled_rows_are_the_same_rows_in_a_uniform_order_whatever_the_workers(tmp_path, monkeypatch):
    import criteo_dlrm.data.encoding as encoding

    # 4 days of 3,000 rows, buckets of 1,000 rows and blocks of 700 (Criteo 1TB's scale, in miniature).
    monkeypatch.setattr(encoding, "SHUFFLE_BUCKET_ROWS", 1000)
    monkeypatch.setattr(encoding, "SHUFFLE_BLOCK_ROWS", 700)
    days = []
    for day in range(4):
        write_day(tmp_path / f"day_{day}", 3000, day=day, model=ClickModel(seed=8))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(days[:1], MetadataConfig(min_expected_clicks=0, workers=1))
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    in_order = encoder.encode_days(days)
    one = encoder.encode_days(days, into=tmp_path / "one", workers=1, shuffle=True)
    encoder.encode_days(days, into=tmp_path / "two", workers=2, shuffle=True)
    assert one.row_order == "shuffled"
    np.testing.assert_array_equal(_table(one), _table(in_order))  # every row once, its fields together
    for name in ("labels", "dense", "sparse"):
        assert (tmp_path / "one" / f"{name}.npy").read_bytes() == (tmp_path / "two" / f"{name}.npy").read_bytes()
    # Where each day's rows landed: the dense features identify a row; a uniform order puts each day's rows
    # evenly over the file (each tenth of the file holds 300 +- 3 sd of each day's rows).
    keys = {row.tobytes(): index // 3000 for index, row in enumerate(np.asarray(in_order.dense))}
    day_of = np.array([keys.get(row.tobytes(), -1) for row in np.asarray(one.dense)])
    counts = np.array(
        [[np.sum(day_of[tenth * 1200 : (tenth + 1) * 1200] == day) for day in range(4)] for tenth in range(10)]
    )
    assert np.abs(counts - 300).max() < 3 * np.sqrt(1200 * 0.25 * 0.75), counts
    assert not np.array_equal(np.asarray(one.dense), np.asarray(in_order.dense))


def test_index_widths_are_the_smallest_that_hold_every_index():
    from criteo_dlrm.data.encoding import index_widths

    sizes = [2, 256, 257, 65_536, 65_537, 1 << 24, (1 << 24) + 1, 40_000_000] + [2] * 18
    assert index_widths(sizes)[:8] == [1, 1, 2, 2, 3, 3, 4, 4]


def test_packed_indices_round_trip_at_every_width_boundary_and_refuse_what_does_not_fit():
    import pytest

    from criteo_dlrm.data.encoding import PackedIndices, index_widths

    sizes = [256, 65_536, 1 << 24, 1 << 31] * 6 + [3, 3]
    rng = np.random.default_rng(3)
    indices = np.stack([rng.integers(0, size, 1_000) for size in sizes], axis=1).astype(np.int32)
    indices[0] = np.array(sizes) - 1  # the largest index of every table
    packed = PackedIndices(np.zeros((1_000, sum(index_widths(sizes))), np.uint8), index_widths(sizes))
    packed[0:1_000] = indices
    assert packed.packed.shape[1] == (1 + 2 + 3 + 4) * 6 + 2
    rows = np.array([0, 5, 999, 5])
    assert np.array_equal(packed[rows], indices[rows]) and packed[rows].dtype == np.int32
    assert np.array_equal(np.asarray(packed), indices)
    too_big = indices[:2].copy()
    too_big[1, 1] = 65_536
    with pytest.raises(ValueError, match="SPARSE_1"):
        packed[0:2] = too_big


def test_stored_rows_take_fewer_bytes_and_folders_of_the_old_layout_still_load(tmp_path):
    from criteo_dlrm.data.encoding import bytes_per_row, open_encoded

    write_day(tmp_path / "day_0", 3_000, day=0, model=ClickModel(seed=4))
    day = convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet").parquet
    metadata, vocabularies = compute_feature_metadata(
        [day], MetadataConfig(min_expected_clicks=0, min_frequency=2, workers=1)
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    in_memory = encoder.encode_days([day])
    stored = encoder.encode_days([day], into=tmp_path / "stored")
    assert bytes_per_row(in_memory) == 160
    assert bytes_per_row(stored) == 1 + 52 + sum(
        1 if size <= 256 else 2 if size <= 65_536 else 3 for size in encoder.table_sizes
    )
    assert bytes_per_row(stored) < 120
    old = tmp_path / "old"  # written before the packed layout: float32 labels, int32 indices, no layout.json
    old.mkdir()
    for name in ("labels", "dense", "sparse"):
        np.save(old / f"{name}.npy", getattr(in_memory, name))
    loaded = open_encoded(old, verify=False)  # the layout only: digests are tested with the dataset
    assert np.array_equal(loaded.sparse, stored.sparse) and np.array_equal(loaded.labels, stored.labels)


def test_missing_and_unseen_values_land_on_rows_of_their_own_and_the_earlier_layout_still_encodes():
    from criteo_dlrm.data.encoding import MISSING_ROW, OUT_OF_VOCABULARY_ROW, FeatureEncoder

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

"""Encoded rows as stored: packed indices, the layout, the folders of the former layout."""

import numpy as np

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


def test_index_widths_are_the_smallest_that_hold_every_index():
    from criteo_dlrm.data.stored import index_widths

    sizes = [2, 256, 257, 65_536, 65_537, 1 << 24, (1 << 24) + 1, 40_000_000] + [2] * 18
    assert index_widths(sizes)[:8] == [1, 1, 2, 2, 3, 3, 4, 4]


def test_packed_indices_round_trip_at_every_width_boundary_and_refuse_what_does_not_fit():
    import pytest

    from criteo_dlrm.data.stored import PackedIndices, index_widths

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
    from criteo_dlrm.data.stored import bytes_per_row, open_encoded

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

"""Encoded rows as stored: packed indices, the layout, the folders of the former layout."""

from __future__ import annotations

import os

import numpy as np
import pytest

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.datasets import EncodedArraysDataset
from tests.faults import encoded_rows, refused


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


@pytest.mark.parametrize(
    "damage",
    ["noise in labels", "deleted layout", "truncated sparse"],
)
def test_damaged_encoded_rows_are_refused_before_use_and_rebuilt_on_the_next_save(converted_day, tmp_path, damage):
    dataset, days = encoded_rows(converted_day, tmp_path)
    dataset.save(days)
    clean = {name: np.array(getattr(dataset.load(), name)) for name in ("labels", "dense", "sparse")}
    folder = tmp_path / "train_features"
    if damage == "noise in labels":
        with open(folder / "labels.npy", "r+b") as handle:
            handle.seek(200)
            handle.write(os.urandom(4096)[: 3000 - 200])
    elif damage == "deleted layout":
        (folder / "layout.json").unlink()
    else:
        with open(folder / "sparse.npy", "r+b") as handle:
            handle.truncate(os.path.getsize(folder / "sparse.npy") // 2)
    from criteo_dlrm.data.batches import BatchLoader

    def train_on_them():  # what training does: load the rows, read them in shuffled batches
        return list(BatchLoader(EncodedArraysDataset(str(folder)).load(), 500, shuffle=True).batches())

    message = refused(train_on_them, folder)
    if damage == "noise in labels":  # found as the chunk is first read (not on load), with its rows named
        assert "labels.npy is damaged: rows 0-2,999 are not what was written" in message
        assert "found by an earlier run" in refused(EncodedArraysDataset(str(folder)).load, folder)
    fresh = EncodedArraysDataset(str(folder))
    fresh.save(days)  # same lineage: without the digests these rows would be reused as they are
    rebuilt = fresh.load()
    for name, array in clean.items():
        np.testing.assert_array_equal(np.array(getattr(rebuilt, name)), array, err_msg=name)


def test_encoded_rows_without_their_digests_are_refused_and_rebuilt(converted_day, tmp_path):
    dataset, days = encoded_rows(converted_day, tmp_path)
    dataset.save(days)
    folder = tmp_path / "train_features"
    (folder / "digests.json").unlink()
    assert "digests.json is missing" in refused(EncodedArraysDataset(str(folder)).load, folder)
    EncodedArraysDataset(str(folder)).save(days)
    assert (folder / "digests.json").exists()


def test_stored_rows_with_indices_beyond_their_claimed_tables_are_refused_naming_the_folder(converted_day, tmp_path):
    from criteo_dlrm.common.storage import DamagedFileError
    from criteo_dlrm.data.stored import check_index_range, open_encoded

    dataset, days = encoded_rows(converted_day, tmp_path)
    dataset.save(days)
    folder = tmp_path / "train_features"
    rows = open_encoded(folder)
    true_maxima = np.asarray(rows.sparse[:]).max(axis=0)
    assert rows.index_maxima == true_maxima.tolist(), "the recorded maxima are the rows' own"
    sizes = list(days.encoder.table_sizes)
    check_index_range(rows, sizes, "the training rows")
    smaller = list(sizes)
    smaller[5] = int(true_maxima[5])  # the metadata a forged lineage claims: one table a row too small
    with pytest.raises(DamagedFileError, match=rf"{folder}: the training rows .*SPARSE_5: index {true_maxima[5]:,}"):
        check_index_range(rows, smaller, "the training rows")
    in_memory = days.encoder.encode_days(days.paths)
    assert in_memory.index_maxima == true_maxima.tolist()
    in_memory.index_maxima = None  # rows without recorded maxima are read for them
    with pytest.raises(DamagedFileError, match="SPARSE_5"):
        check_index_range(in_memory, smaller, "the training rows")
    from loguru import logger

    said = []
    handler = logger.add(lambda message: said.append(str(message)), level="WARNING")
    try:
        days.encoder.table_sizes = smaller  # the same lineage, claiming smaller tables: not reused as they are
        EncodedArraysDataset(str(folder)).save(days)
    finally:
        logger.remove(handler)
    assert any("SPARSE_5" in line and "Encoding them again" in line for line in said), said

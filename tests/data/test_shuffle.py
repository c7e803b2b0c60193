"""The stored shuffle: the same rows, in a uniform order, the same bytes whatever the workers."""

import numpy as np

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import FeatureMetadata, compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


def _table(rows) -> np.ndarray:
    """Rows as one table (sparse, dense, label), sorted: the multiset of rows, whatever their order."""
    table = np.column_stack([np.asarray(rows.sparse), np.asarray(rows.dense), np.asarray(rows.labels)])
    return table[np.lexsort(table.T)]


def test_shuffled_rows_are_the_same_rows_in_a_uniform_order_whatever_the_workers(tmp_path, monkeypatch):
    import criteo_dlrm.data.shuffle as shuffle

    # 4 days of 3,000 rows, buckets of 1,000 rows and blocks of 700 (Criteo 1TB's scale, in miniature).
    monkeypatch.setattr(shuffle, "SHUFFLE_BUCKET_ROWS", 1000)
    monkeypatch.setattr(shuffle, "SHUFFLE_BLOCK_ROWS", 700)
    days = []
    for day in range(4):
        write_day(tmp_path / f"day_{day}", 3000, day=day, model=ClickModel(seed=8))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(days[:1], MetadataConfig(min_expected_clicks=0, workers=1))
    encoder = FeatureEncoder.from_metadata(FeatureMetadata(metadata), vocabularies)
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

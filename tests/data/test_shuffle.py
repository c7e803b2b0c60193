"""The stored shuffle: the same rows, in a uniform order, the same bytes whatever the workers."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import criteo_dlrm.data.chunk_digests as chunk_digests
import criteo_dlrm.data.shuffle as shuffle
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.shuffle import shuffle_destinations
from criteo_dlrm.data.synthetic import ClickModel, write_day


def _table(rows) -> np.ndarray:
    """Rows as one table (sparse, dense, label), sorted: the multiset of rows, whatever their order."""
    table = np.column_stack([np.asarray(rows.sparse), np.asarray(rows.dense), np.asarray(rows.labels)])
    return table[np.lexsort(table.T)]


def _days_and_encoder(tmp_path, monkeypatch) -> tuple[list, FeatureEncoder]:
    """4 days of 3,000 rows, buckets of 1,000 rows and blocks of 700 (Criteo 1TB's scale, in miniature)."""
    monkeypatch.setattr(shuffle, "SHUFFLE_BUCKET_ROWS", 1000)
    monkeypatch.setattr(shuffle, "SHUFFLE_BLOCK_ROWS", 700)
    days = []
    for day in range(4):
        write_day(tmp_path / f"day_{day}", 3000, day=day, model=ClickModel(seed=8))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(days[:1], MetadataConfig(min_expected_clicks=0, workers=1))
    return days, FeatureEncoder.from_metadata(metadata, vocabularies)


def test_shuffled_rows_are_the_same_rows_in_a_uniform_order_whatever_the_workers(tmp_path, monkeypatch):
    days, encoder = _days_and_encoder(tmp_path, monkeypatch)
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


def test_each_row_is_stored_where_the_documented_rule_puts_it(tmp_path, monkeypatch):
    """The module's rule, restated row by row: row r of day d goes to bucket
    ``default_rng([SHUFFLE_SEED, d, r // block]).integers(0, buckets, block)[r % block]``, a bucket holds its rows
    by day then row, then is permuted by ``default_rng([SHUFFLE_SEED, bucket]).permutation``. (Pages of 256 bytes:
    every field, the 1-byte labels too, goes through whole-page writes and the bytes held between them.)"""
    monkeypatch.setattr(shuffle, "WRITE_ALIGNMENT", 256)
    days, encoder = _days_and_encoder(tmp_path, monkeypatch)
    in_order = encoder.encode_days(days)
    stored = encoder.encode_days(days, into=tmp_path / "stored", workers=1, shuffle=True)
    buckets, block = 12, 700
    assigned = np.concatenate(
        [
            [np.random.default_rng([shuffle.SHUFFLE_SEED, day, row // block]).integers(0, buckets, block)[row % block]
             for row in range(3000)]
            for day in range(4)
        ]
    )  # fmt: skip
    expected = []
    for bucket in range(buckets):
        rows = np.flatnonzero(assigned == bucket)  # by day, then row
        expected.append(rows[np.random.default_rng([shuffle.SHUFFLE_SEED, bucket]).permutation(len(rows))])
    where = np.concatenate(expected)
    np.testing.assert_array_equal(np.asarray(stored.labels), np.asarray(in_order.labels)[where].astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(stored.dense), np.asarray(in_order.dense)[where])
    np.testing.assert_array_equal(np.asarray(stored.sparse), np.asarray(in_order.sparse)[where])


def test_the_scatter_into_buckets_writes_each_byte_once_in_whole_pages(tmp_path, monkeypatch):
    """Rows reach their buckets through ``pwrite``s of whole pages, each byte once; a page is written in parts only
    where a day's rows in a bucket begin or end. (Through a memory map, each page written is first faulted in,
    read from disk with read-around: under a memory limit that evicted them, the pages just written were read back
    again and again, 94 GB read to write 3.4 GB.) The shuffle pass writes each bucket's field once."""
    monkeypatch.setattr(shuffle, "WRITE_ALIGNMENT", 256)
    days, encoder = _days_and_encoder(tmp_path, monkeypatch)
    writes, phase = [], ["scatter"]
    real_pwrite, real_shuffle = os.pwrite, shuffle.ShuffleDestinations.shuffle_buckets

    def recording(descriptor, data, position):
        done = real_pwrite(descriptor, data, position)
        writes.append((phase[0], Path(os.readlink(f"/proc/self/fd/{descriptor}")).name, position, done))
        return done

    def shuffling(self, *args, **kwargs):
        phase[0] = "shuffle"
        return real_shuffle(self, *args, **kwargs)

    monkeypatch.setattr(os, "pwrite", recording)
    monkeypatch.setattr(shuffle.ShuffleDestinations, "shuffle_buckets", shuffling)
    stored = encoder.encode_days(days, into=tmp_path / "stored", workers=1, shuffle=True)
    segments = 4 * 12  # (day, bucket) pairs
    for array in stored.stored():
        name, header = Path(array.filename).name, array.offset
        size = shuffle.row_bytes(array)
        scatter = sorted((p, n) for what, file, p, n in writes if what == "scatter" and file == name)
        covered = np.zeros(len(array) * size, dtype=np.int64)
        for position, length in scatter:
            covered[position - header : position - header + length] += 1
        assert (covered == 1).all(), f"{name}: every byte written once ({(covered == 0).sum()} never)"
        partial = [(p, n) for p, n in scatter if p % 256 or (p + n) % 256]
        assert len(partial) <= 2 * segments, (name, len(partial), len(scatter))
        shuffled = sorted((p, n) for what, file, p, n in writes if what == "shuffle" and file == name)
        ends = [header, *(p + n for p, n in shuffled)]
        assert len(shuffled) == 12 and [p for p, _ in shuffled] == ends[:-1], f"{name}: one write per bucket"
        assert ends[-1] == header + len(array) * size


@pytest.mark.parametrize("shuffled", [False, True], ids=["as read", "shuffled"])
def test_encoded_chunks_are_hashed_from_what_was_written_reading_only_those_no_task_wrote_whole(
    tmp_path, monkeypatch, shuffled
):
    """The chunks' digests come from the bytes the writers held (under a memory limit the rows just written have
    left the page cache, and reading them back for their digests read the encoded rows a second time): only
    chunk 0 (the header) and a chunk that a day (as read) or a bucket (shuffled) begins inside are read. The
    recorded digests are each chunk's sha256 of the bytes on disk, computed here from the files."""
    monkeypatch.setattr(chunk_digests, "DIGEST_CHUNK_ROWS", 250)  # 48 chunks; days start mid-chunk (3,000 rows)
    days, encoder = _days_and_encoder(tmp_path, monkeypatch)
    read, real_read = [], chunk_digests._read_digest

    def recording(path, start, end):
        read.append(Path(path).name)
        return real_read(path, start, end)

    monkeypatch.setattr(chunk_digests, "_read_digest", recording)
    folder = tmp_path / "stored"
    stored = encoder.encode_days(days, into=folder, workers=1, shuffle=shuffled)
    recorded = np.load(folder / chunk_digests.CHUNK_DIGESTS)
    starts = [0, 3000, 6000, 9000] if not shuffled else shuffle_destinations([3000] * 4).bucket_starts[:-1]
    begun_inside = {start // 250 for start in starts if start % 250} | {0}
    for index, (name, array) in enumerate(zip(chunk_digests.CHUNKED, stored.stored(), strict=True)):
        data = (folder / name).read_bytes()
        size = shuffle.row_bytes(array)
        for chunk in range(48):
            first = 0 if chunk == 0 else array.offset + chunk * 250 * size
            expected = hashlib.sha256(data[first : array.offset + (chunk + 1) * 250 * size]).digest()
            assert recorded[index, chunk].tobytes() == expected, (name, chunk)
        assert read.count(name) == len(begun_inside) < 48, (name, read.count(name), sorted(begun_inside))

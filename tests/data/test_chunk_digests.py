"""Chunk digests: damage is found when the damaged chunk is first read, named by file and rows, before its rows
are used, and without reading the other chunks first."""

import hashlib
import itertools
import json

import numpy as np
import pytest

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.chunk_digests import (
    CHUNK_DIGESTS,
    DAMAGED,
    DIGESTS,
    WrittenChunks,
    open_digests,
    write_digests,
)
from criteo_dlrm.data.stored import EncodedArrays, open_encoded, write_encoded

ROWS, CHUNK = 10_000, 1_000


def _stored(folder) -> EncodedArrays:
    index = np.arange(ROWS)
    arrays = EncodedArrays(
        (index % 2).astype(np.float32),
        np.repeat(index[:, None], 13, 1).astype(np.float32),
        np.repeat(index[:, None] % 7, 26, 1).astype(np.int32),
    )
    write_encoded(arrays, folder)
    write_digests(folder, chunk_rows=CHUNK)
    return arrays


def _damage_row(folder, name: str, row: int) -> None:
    """Change one byte of ``row`` in ``name``.npy (its header untouched)."""
    mapped = np.load(folder / f"{name}.npy", mmap_mode="r")
    position = mapped.offset + row * mapped.strides[0]
    with open(folder / f"{name}.npy", "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0x40]))


def test_each_chunk_s_digest_is_the_sha256_of_its_bytes_the_first_with_the_header(tmp_path):
    _stored(tmp_path)
    digests = np.load(tmp_path / CHUNK_DIGESTS)
    assert digests.shape == (3, ROWS // CHUNK, 32)
    data = (tmp_path / "dense.npy").read_bytes()
    offset = np.load(tmp_path / "dense.npy", mmap_mode="r").offset
    row_bytes = 13 * 4
    assert digests[1, 0].tobytes() == hashlib.sha256(data[: offset + CHUNK * row_bytes]).digest()
    third = data[offset + 3 * CHUNK * row_bytes : offset + 4 * CHUNK * row_bytes]
    assert digests[1, 3].tobytes() == hashlib.sha256(third).digest()
    record = json.loads((tmp_path / DIGESTS).read_text())
    assert record["chunk_rows"] == CHUNK and CHUNK_DIGESTS in record["files"]


@pytest.mark.parametrize("name", ["labels", "dense", "sparse"])
def test_a_damaged_chunk_stops_the_reader_at_that_chunk_naming_the_file_and_its_rows(tmp_path, name):
    _stored(tmp_path)
    _damage_row(tmp_path, name, 7_345)
    rows = open_encoded(tmp_path)  # opening reads no rows: the damage is not seen yet
    delivered = []
    with pytest.raises(DamagedFileError) as caught:
        for batch in BatchLoader(rows, 500).batches():  # in file order: chunks 0-6 are read and used first
            delivered.append(batch)
    message = str(caught.value)
    assert f"{tmp_path / f'{name}.npy'} is damaged: rows 7,000-7,999" in message
    assert "kedro run --pipelines=training" in message
    assert len(delivered) == 14, "the batches before the damaged chunk, none from it"
    assert (tmp_path / DAMAGED).exists()
    with pytest.raises(DamagedFileError, match="found by an earlier run"):
        open_digests(tmp_path)


def test_shuffled_reading_checks_each_chunk_once_and_finds_damage_whichever_order(tmp_path):
    _stored(tmp_path)
    _damage_row(tmp_path, "dense", 2_001)
    loader = BatchLoader(open_encoded(tmp_path), 250, shuffle=True, chunk_rows=CHUNK, window_chunks=2)
    with pytest.raises(DamagedFileError, match="rows 2,000-2,999"):
        list(loader.batches(epoch=0))


def test_a_changed_size_or_small_file_is_refused_on_opening(tmp_path):
    _stored(tmp_path)
    with open(tmp_path / "sparse.npy", "ab") as handle:
        handle.write(b"\0" * 26)  # one row more than its header says
    with pytest.raises(DamagedFileError, match="sparse.npy is damaged"):
        open_digests(tmp_path)
    _stored(tmp_path / "again")
    (tmp_path / "again" / "index_maxima.json").write_text("[1]")
    with pytest.raises(DamagedFileError, match="index_maxima.json"):
        open_digests(tmp_path / "again")


def test_folders_with_one_digest_per_file_are_still_checked_whole_on_opening(tmp_path):
    from criteo_dlrm.common.storage import file_digest

    _stored(tmp_path)
    (tmp_path / CHUNK_DIGESTS).unlink()
    names = ["labels.npy", "dense.npy", "sparse.npy", "index_maxima.json"]
    (tmp_path / DIGESTS).write_text(json.dumps({name: file_digest(tmp_path / name) for name in names}))
    assert open_digests(tmp_path) is None
    _damage_row(tmp_path, "labels", 9_999)
    with pytest.raises(DamagedFileError, match="labels.npy is damaged"):
        open_digests(tmp_path)


def test_the_damage_record_replaces_a_link_planted_at_its_name_and_writes_nothing_through_it(tmp_path):
    """Issue 46 item 3: damaged.txt planted as a link to a file outside the project: the record was written
    through it."""
    folder = tmp_path / "rows"
    folder.mkdir()
    _stored(folder)
    outside = tmp_path / "outside.txt"  # not there: the link dangles, so no earlier record is seen
    (folder / DAMAGED).symlink_to(outside)
    _damage_row(folder, "dense", 10)
    with pytest.raises(DamagedFileError):
        for _ in BatchLoader(open_encoded(folder), 500).batches():
            pass
    assert not outside.exists(), "nothing written through the link"
    assert not (folder / DAMAGED).is_symlink() and "is damaged" in (folder / DAMAGED).read_text()


def test_no_marker_or_report_is_written_through_a_link_planted_at_its_name(tmp_path):
    """Every file written into a folder that exists goes through a staged file renamed over the name."""
    from kedro.io.core import Version

    from criteo_dlrm.datasets import JSONDataset
    from criteo_dlrm.datasets.versioned_file import INCOMPLETE

    outside = tmp_path / "outside.txt"
    outside.write_text("not the project's\n")
    version = "2026-01-01T00.00.00.000Z"
    marker = tmp_path / "metrics.json" / version / INCOMPLETE
    marker.parent.mkdir(parents=True)
    marker.symlink_to(outside)
    JSONDataset(str(tmp_path / "metrics.json"), version=Version(None, version)).mark_incomplete(version, {"run": "r"})
    assert outside.read_text() == "not the project's\n" and not marker.is_symlink()


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_file_truncated_while_the_run_reads_it_is_named_with_the_fix_and_recorded(tmp_path, shuffle):
    """Issue 46 item 2: a file truncated mid-run, its chunks verified already, ended the run in a bare OSError
    (shuffled reads) or killed it with a memory map's SIGBUS (sequential reads)."""
    _stored(tmp_path)
    rows = open_encoded(tmp_path)
    rows.check_rows(0, len(rows))  # every chunk verified already (an earlier epoch read them)
    loader = BatchLoader(rows, 500, shuffle=shuffle, seed=0, chunk_rows=CHUNK, window_chunks=1)  # a read a window
    batches = loader.batches()
    next(batches)  # the run is reading
    dense = tmp_path / "dense.npy"
    with dense.open("r+b") as handle:
        handle.truncate(dense.stat().st_size // 3)
    with pytest.raises(DamagedFileError) as caught:
        for _ in batches:
            pass
    message = str(caught.value)
    assert str(dense) in message and "truncated" in message and "kedro run --pipelines=training" in message
    assert "truncated" in (tmp_path / DAMAGED).read_text(), "recorded: the next run encodes the rows again"


@pytest.mark.parametrize("first", [0, 1_000, 1_300])
def test_written_chunks_hash_whole_chunks_from_rows_added_in_any_pieces(first):
    """A writer's rows added in pieces that cross chunks' ends: each chunk it wrote whole (but chunk 0, which
    holds the header) has the sha256 of its rows; a chunk begun before ``first`` is left out."""
    rows = np.random.default_rng(first).integers(0, 255, size=(10_000, 3), dtype=np.uint8)
    written = WrittenChunks(first, len(rows), chunk_rows=CHUNK)
    cuts = [first, first + 1, first + 777, first + 2_000, 6_543, 6_544, len(rows)]
    for begin, end in itertools.pairwise(cuts):
        written.add(rows[begin:end])
    whole = range(-(-first // CHUNK), ROWS // CHUNK)
    expected = {chunk: hashlib.sha256(rows[chunk * CHUNK : (chunk + 1) * CHUNK].tobytes()).digest() for chunk in whole}
    expected.pop(0, None)
    assert written.hashed == expected

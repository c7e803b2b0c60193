"""Many days at once: the same bytes whatever the number of workers, no partial output on failure."""

from __future__ import annotations

import os
import re
import subprocess

import pyarrow.parquet as pq
import pytest

from criteo_dlrm.data.raw import IngestionError, convert_or_reuse
from criteo_dlrm.data.synthetic import ClickModel, write_day


def test_days_converted_in_parallel_are_byte_identical_to_one_worker(tmp_path):
    from criteo_dlrm.data.raw import convert_days

    sources = []
    for day in range(3):
        sources.append(tmp_path / "raw" / f"day_{day}.gz")
        write_day(sources[-1], 3000 + 500 * day, day=day, model=ClickModel(seed=6))
    one = convert_days([(s, tmp_path / "one" / f"{s.stem}.parquet") for s in sources], workers=1, block_size=64 << 10)
    two = convert_days([(s, tmp_path / "two" / f"{s.stem}.parquet") for s in sources], workers=2, block_size=64 << 10)
    assert [r.rows for r in two] == [3000, 3500, 4000] == [r.rows for r in one], "reports in day order"
    for a, b in zip(one, two, strict=True):
        assert open(a.parquet, "rb").read() == open(b.parquet, "rb").read()


def test_a_failing_day_among_several_fails_with_its_own_message_and_leaves_no_partial_output(tmp_path):
    from criteo_dlrm.data.raw import convert_days

    sources = []
    for day in range(4):
        sources.append(tmp_path / "raw" / f"day_{day}")
        write_day(sources[-1], 4000, day=day, model=ClickModel(seed=7))
    with sources[2].open("a") as handle:
        handle.write("1\t2\n")
    out = tmp_path / "out"
    with pytest.raises(IngestionError, match=r"day_2: 1 of 4,001 lines rejected"):
        convert_days([(s, out / f"{s.name}.parquet") for s in sources], workers=2)
    left = sorted(p.name for p in out.iterdir())
    assert not [name for name in left if name.endswith(".partial")]
    assert "day_2.parquet" not in left and "day_2.rejects.tsv" in left
    for name in left:
        if name.endswith(".parquet"):  # days that finished are whole
            assert pq.ParquetFile(out / name).metadata.num_rows == 4000


def test_a_raw_file_whose_time_alone_changed_names_how_to_restore_its_day(converted_day, tmp_path):
    import shlex
    import shutil

    from criteo_dlrm.data.lineage import LineageError, check_days, day_lineage

    raw = tmp_path / "raw" / "day_0"
    raw.parent.mkdir()
    shutil.copy(converted_day[0], raw)
    parquet = tmp_path / "out" / "day_0.parquet"
    convert_or_reuse(raw, parquet)
    recorded = day_lineage("day_0", parquet)
    os.utime(raw, ns=(raw.stat().st_atime_ns, raw.stat().st_mtime_ns + 5 * 10**9))  # `touch`: same bytes
    convert_or_reuse(raw, parquet)  # a plain rerun converts it again: another Parquet
    with pytest.raises(LineageError) as refused:
        check_days([recorded], "dlrm_checkpoint")
    message = str(refused.value)
    assert "cannot be restored" not in message
    touch = re.search(r"`(touch -d [^`]+)`", message).group(1)
    subprocess.run(shlex.split(touch), check=True)
    convert_or_reuse(raw, parquet)  # what `kedro run --pipelines=ingestion` does for this day
    check_days([recorded], "dlrm_checkpoint")


def test_a_day_converted_again_says_why_its_conversion_was_not_reused(tmp_path):
    """Issue 62 item 12: a day converted again was only 'converted'; the report now says why (for the summary)."""
    from criteo_dlrm.data.parquet import fingerprint_path
    from criteo_dlrm.data.raw import split_or_reuse

    raw = tmp_path / "raw" / "day_0"
    write_day(raw, 3000, day=0, model=ClickModel(seed=2))
    parquet = tmp_path / "out" / "day_0.parquet"
    assert convert_or_reuse(raw, parquet).converted_because is None, "nothing before it"
    assert convert_or_reuse(raw, parquet).reused
    os.utime(raw, ns=(raw.stat().st_atime_ns, raw.stat().st_mtime_ns + 5 * 10**9))
    again = convert_or_reuse(raw, parquet)
    assert not again.reused and again.converted_because == "the raw file's modification time changed"
    assert convert_or_reuse(raw, parquet, force=True).converted_because == "ingestion.force"
    fingerprint_path(parquet).unlink()
    assert convert_or_reuse(raw, parquet).converted_because == "half-written (no fingerprint)"
    with raw.open("a") as handle:
        handle.write(raw.read_text().splitlines(keepends=True)[0])
    assert convert_or_reuse(raw, parquet).converted_because == "the raw file's size and modification time changed"
    moved = tmp_path / "elsewhere" / "day_0"
    moved.parent.mkdir()
    raw.rename(moved)
    assert convert_or_reuse(moved, parquet).converted_because == f"converted from {raw}"

    split = tmp_path / "split"
    assert all(r.converted_because is None for r in split_or_reuse(moved, split, 1000))
    assert all(r.reused for r in split_or_reuse(moved, split, 1000))
    assert {r.converted_because for r in split_or_reuse(moved, split, 2000)} == {"split at ingestion.rows_per_day=1000"}

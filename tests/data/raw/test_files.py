"""Which files of a raw folder are days."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from criteo_dlrm.data.raw import IngestionError, find_day_files, find_scoring_input, scan_raw_folder
from criteo_dlrm.data.synthetic import ClickModel, write_day
from tests.conftest import ingestion_report


def test_missing_or_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(IngestionError, match="does not exist.*ingestion.raw_dir"):
        find_day_files(tmp_path / "nowhere")
    (tmp_path / "notes.md").write_text("hello")
    with pytest.raises(IngestionError, match="holds no Criteo day file"):
        find_day_files(tmp_path)


def test_day_files_are_found_in_day_order(tmp_path):
    for name in ("day_10.gz", "day_2", "day_1.gz", "train.txt", "day_1.click_probability.npy", "README"):
        (tmp_path / name).write_text("")
    assert [p.name for p in find_day_files(tmp_path)] == ["day_1.gz", "day_2", "day_10.gz", "train.txt"]


@pytest.mark.parametrize("names", [("day_0", "day_0.gz"), ("train.txt", "train.tsv")])
def test_two_files_for_one_day_are_refused(tmp_path, names):
    for name in (*names, "day_1"):
        (tmp_path / name).write_text("")
    first, second = sorted(names)
    with pytest.raises(IngestionError, match=rf"{first} and {second} are both {first.split('.')[0]}"):
        find_day_files(tmp_path)


def test_an_empty_day_to_score_is_refused_before_any_work_naming_it(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "day_0").write_text("1\t" + "\t" * 38 + "\n")
    (raw / "day_1.gz").write_bytes(gzip.compress(b""))  # a valid gzip file of nothing
    with pytest.raises(IngestionError, match=r"day_1.gz holds no rows: .* Move it out of scoring.input_dir"):
        find_scoring_input(raw)
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    day = Path(ingestion_report(tmp_path / "days", days=1).days[0].parquet)
    pq.write_table(pq.read_table(day).slice(0, 0), parquet / "day_0.parquet")
    with pytest.raises(IngestionError, match=r"day_0.parquet holds no rows"):
        find_scoring_input(parquet)


def test_entries_not_used_are_said_once_though_the_folder_is_scanned_twice(tmp_path, logged):
    """The check before the run and the ingestion node both scan the raw folder: it was said twice."""
    from criteo_dlrm.data.raw import scan_raw_folder

    (tmp_path / "day_0").write_text("1\t" + "\t" * 38 + "\n")
    (tmp_path / "notes.md").write_text("")
    scan_raw_folder(tmp_path)
    scan_raw_folder(tmp_path)
    said = [line for line in logged if "not used" in line]
    assert len(said) == 1 and said[0].startswith(f"{tmp_path}: not used (") and said[0].strip().endswith("notes.md"), (
        said
    )


def test_every_unused_file_of_a_raw_folder_is_named_and_unreadable_days_are_refused(tmp_path):
    folder = tmp_path / "raw"
    write_day(folder / "day_0", 50, day=0, model=ClickModel(seed=1))
    (folder / "part-1.txt").write_bytes((folder / "day_0").read_bytes())
    (folder / "README.md").write_text("notes")
    scanned = scan_raw_folder(folder)
    assert [p.name for p in scanned.days] == ["day_0", "part-1.txt"]
    assert "README.md" in scanned.ignored and "day_0.click_probability.npy" in scanned.ignored
    os.mkfifo(folder / "day_3")
    (folder / "day_4.gz").symlink_to(folder / "day_4.gz")  # a link to itself: a loop
    (folder / "day 5.gz").write_bytes(b"")
    with pytest.raises(IngestionError) as caught:
        scan_raw_folder(folder)
    message = str(caught.value)
    assert "day_3: is a FIFO, not a regular file" in message
    assert "day_4.gz: cannot be opened" in message
    assert "'day 5.gz': looks like a day file but its name is not one" in message


@pytest.mark.parametrize("name", ["día_0.txt.gz", "day_8.gz\n", "trаin.txt"])  # the last with a Cyrillic 'а'
def test_day_names_outside_the_documented_naming_are_refused_not_converted_or_sorted_last(tmp_path, name):
    for day in ("day_0.gz", "day_1.gz"):
        (tmp_path / day).write_bytes(b"")
    (tmp_path / name).write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(IngestionError, match="looks like a day file but its name is not one") as refused:
        scan_raw_folder(tmp_path)
    assert repr(name) in str(refused.value), "the name is shown as it is, newline included"


def test_the_order_of_days_is_one_rule_and_a_mixed_folder_says_which_day_validates(tmp_path):
    from loguru import logger

    for day in ("day_10.gz", "day_9.gz", "zeta.txt", "alpha.tsv.gz"):
        (tmp_path / day).write_bytes(b"")
    said = []
    handler = logger.add(lambda message: said.append(str(message)), level="WARNING")
    try:
        days = scan_raw_folder(tmp_path).days
    finally:
        logger.remove(handler)
    assert [p.name for p in days] == ["day_9.gz", "day_10.gz", "alpha.tsv.gz", "zeta.txt"]
    assert any("zeta comes last and validates" in line for line in said), said


def test_a_raw_folder_that_is_a_file_says_so(tmp_path):
    (tmp_path / "day_0.gz").write_bytes(b"")
    with pytest.raises(
        IngestionError, match=rf"day_0.gz is a file, not a folder.*`kedro run --params=ingestion.raw_dir={tmp_path}`$"
    ):
        scan_raw_folder(tmp_path / "day_0.gz")

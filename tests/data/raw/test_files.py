"""Which files of a raw folder are days."""

import gzip
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from criteo_dlrm.data.raw import IngestionError, find_day_files, find_scoring_input
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
    day = Path(ingestion_report(tmp_path / "days", days=1)["days"][0]["parquet"])
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

"""Which files of a raw folder are days."""

import pytest

from criteo_dlrm.data.raw import IngestionError, find_day_files


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

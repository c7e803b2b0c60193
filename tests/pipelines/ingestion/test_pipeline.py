import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from criteo_dlrm.data.source_days import IngestionReport
from criteo_dlrm.data.synthetic import write_days
from criteo_dlrm.pipelines.ingestion import create_pipeline


def _params(tmp_path: Path, **overrides) -> dict:
    return {
        "output_dir": str(tmp_path / "intermediate"),
        "force": False,
        "max_reject_fraction": 0.0,
        "block_size_mb": 1,
        **overrides,
    }


def _run(params: dict, raw: Path) -> IngestionReport:
    catalog = DataCatalog(
        {
            "params:ingestion": MemoryDataset({**params, "raw_dir": str(raw)}),
            "params:preprocessing": MemoryDataset({"engine": "local"}),
            "ingestion_report": MemoryDataset(),
        }
    )
    SequentialRunner().run(create_pipeline(), catalog)
    return catalog.load("ingestion_report")


def test_pipeline_converts_each_day_and_skips_converted_ones(tmp_path):
    write_days(tmp_path / "raw", days=2, rows_per_day=1500, seed=0)
    report = _run(_params(tmp_path), tmp_path / "raw")
    assert [d.day for d in report.days] == ["day_0", "day_1"]
    assert all(pq.ParquetFile(d.parquet).metadata.num_rows == 1500 for d in report.days)
    assert report.days[0].click_probability.endswith("day_0.click_probability.npy")
    written = Path(report.days[0].parquet).stat().st_mtime_ns

    again = _run(_params(tmp_path), tmp_path / "raw")
    assert Path(again.days[0].parquet).stat().st_mtime_ns == written
    assert [d.rows for d in again.days] == [1500, 1500]

    forced = _run(_params(tmp_path, force=True), tmp_path / "raw")
    assert Path(forced.days[0].parquet).stat().st_mtime_ns != written


def test_another_raw_folder_gets_its_own_parquet_and_overwrites_nothing(tmp_path):
    write_days(tmp_path / "raw", days=1, rows_per_day=300, seed=0)
    first = _run(_params(tmp_path), tmp_path / "raw").days[0]
    converted = Path(first.parquet).stat().st_mtime_ns
    write_days(tmp_path / "other", days=1, rows_per_day=200, seed=1)
    other = _run(_params(tmp_path), tmp_path / "other").days[0]
    assert other.rows == 200 and other.seconds > 0
    assert Path(other.parquet).parent != Path(first.parquet).parent
    assert Path(first.parquet).parent.name.startswith("raw-") and Path(other.parquet).parent.name.startswith("other-")
    assert Path(first.parquet).stat().st_mtime_ns == converted, "the first folder's day is untouched"
    assert other.fingerprint != first.fingerprint
    assert other.source.path == str((tmp_path / "other" / "day_0.gz").resolve())

    again = _run(_params(tmp_path), tmp_path / "raw").days[0]
    assert again.seconds == 0.0 and again.parquet == first.parquet, "the same folder is skipped"
    assert again.fingerprint == first.fingerprint


def test_a_changed_raw_file_is_converted_again(tmp_path):
    write_days(tmp_path / "raw", days=1, rows_per_day=300, seed=0, compress=False)
    _run(_params(tmp_path), tmp_path / "raw")
    with (tmp_path / "raw" / "day_0").open("a") as handle:
        handle.write("\t".join(["1"] + [""] * 39) + "\n")
    assert _run(_params(tmp_path), tmp_path / "raw").days[0].rows == 301


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_raw_file_rewritten_with_its_size_and_time_kept_is_converted_again(tmp_path, where):
    """A raw day rewritten with the same size and its modification time restored (cp -p, rsync -t, touch -r) was
    taken as unchanged: its content sample (three blocks) tells it apart."""
    import os

    write_days(tmp_path / "raw", days=1, rows_per_day=3000, seed=0, compress=False)
    raw = tmp_path / "raw" / "day_0"
    first = _run(_params(tmp_path), tmp_path / "raw").days[0]
    data, stat = bytearray(raw.read_bytes()), raw.stat()
    position, step = {"start": (2, 1), "middle": (len(data) // 2, 1), "end": (len(data) - 2, -1)}[where]
    # A digit of a count or a category, not a label (a line's first byte): another digit keeps the line valid.
    while data[position] not in b"0123456789" or data[position - 1] == ord("\n"):
        position += step
    data[position] = ord("1") if data[position] != ord("1") else ord("2")
    raw.write_bytes(bytes(data))
    os.utime(raw, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (raw.stat().st_size, raw.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    again = _run(_params(tmp_path), tmp_path / "raw").days[0]
    assert again.seconds > 0 and again.fingerprint != first.fingerprint, "converted again"


def test_pipeline_stops_on_bad_input_naming_the_file(tmp_path):
    write_days(tmp_path / "raw", days=1, rows_per_day=100, seed=0, compress=False)
    with (tmp_path / "raw" / "day_0").open("a") as handle:
        handle.write("1\t2\t3\n")
    with pytest.raises(Exception, match=r"day_0: 1 of 101 lines rejected"):
        _run(_params(tmp_path), tmp_path / "raw")


@pytest.mark.slow
def test_kedro_session_runs_ingestion_in_a_project_copy(project):
    bootstrap_project(project)
    with KedroSession.create(project_path=project) as session:
        session.run(pipeline_names=["ingestion"])
    report = json.loads((project / "data/02_intermediate/ingestion_report.json").read_text())
    assert [d["rows"] for d in report["days"]] == [20_000, 20_000, 20_000]
    assert all((project / d["parquet"]).exists() for d in report["days"])


@pytest.mark.slow
def test_users_point_ingestion_at_their_own_folder_with_params(project, tmp_path):
    write_days(tmp_path / "criteo", days=2, rows_per_day=500, seed=5, compress=False)
    bootstrap_project(project)
    with KedroSession.create(
        project_path=project, runtime_params={"ingestion": {"raw_dir": str(tmp_path / "criteo")}}
    ) as session:
        session.run(pipeline_names=["ingestion"])
    report = json.loads((project / "data/02_intermediate/ingestion_report.json").read_text())
    assert report["raw_dir"] == str(tmp_path / "criteo")
    assert [(d["day"], d["rows"]) for d in report["days"]] == [("day_0", 500), ("day_1", 500)]


@pytest.mark.slow
def test_a_missing_raw_folder_is_a_clear_error(project, tmp_path):
    bootstrap_project(project)
    with (
        pytest.raises(Exception, match=r"nowhere does not exist.*ingestion.raw_dir"),
        KedroSession.create(
            project_path=project, runtime_params={"ingestion": {"raw_dir": str(tmp_path / "nowhere")}}
        ) as session,
    ):
        session.run(pipeline_names=["ingestion"])


def test_one_big_file_becomes_days_of_rows_per_day_rows_in_file_order(tmp_path):
    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    write_day(tmp_path / "kaggle" / "train.txt", 3500, day=0, model=ClickModel(seed=3), chunk_rows=1000)
    whole = pq.read_table(convert_day(tmp_path / "kaggle" / "train.txt", tmp_path / "whole.parquet").parquet)
    report = _run(_params(tmp_path, rows_per_day=1000, block_size_mb=0.05), tmp_path / "kaggle")
    assert [(d.day, d.rows) for d in report.days] == [
        ("train_0000", 1000), ("train_0001", 1000), ("train_0002", 1000), ("train_0003", 500)
    ]  # fmt: skip
    parts = [pq.read_table(d.parquet) for d in report.days]
    assert pa.concat_tables(parts).equals(whole), "the same rows in the same order"
    assert all(d.source.path == str((tmp_path / "kaggle" / "train.txt").resolve()) for d in report.days)

    again = _run(_params(tmp_path, rows_per_day=1000), tmp_path / "kaggle")
    assert all(d.seconds == 0.0 for d in again.days), "split already: skipped"
    other = _run(_params(tmp_path, rows_per_day=2000), tmp_path / "kaggle")
    assert [d.rows for d in other.days] == [2000, 1500]
    folder = Path(other.days[0].parquet).parent
    assert sorted(p.name for p in folder.glob("*.parquet")) == ["train_0000.parquet", "train_0001.parquet"]


def test_ingestion_workers_give_the_same_report_and_days(tmp_path):
    write_days(tmp_path / "raw", days=3, rows_per_day=1200, seed=4)
    one = _run(_params(tmp_path / "one", workers=1), tmp_path / "raw")
    two = _run(_params(tmp_path / "two", workers=2), tmp_path / "raw")
    assert [(d.day, d.rows, d.fingerprint) for d in one.days] == [(d.day, d.rows, d.fingerprint) for d in two.days]

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.data.lineage import LineageError, check_days, day_lineage, parquet_fingerprint
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.data.synthetic import ClickModel, write_day


@pytest.fixture
def day(tmp_path):
    source = tmp_path / "raw" / "day_0"
    source.parent.mkdir()
    write_day(source, 2000, day=0, model=ClickModel(seed=4))
    return source, convert_day(source, tmp_path / "out" / "day_0.parquet").parquet


def test_converting_the_same_raw_file_again_gives_the_same_fingerprint(day, tmp_path):
    source, parquet = day
    again = convert_day(source, tmp_path / "again" / "day_0.parquet").parquet
    assert parquet_fingerprint(again) == parquet_fingerprint(parquet)
    record = day_lineage("day_0", parquet)
    assert record.rows == 2000 and record.source.path == str(source.resolve())
    assert record.source.size == source.stat().st_size


def test_a_changed_day_changes_its_fingerprint(day, tmp_path):
    _, parquet = day
    before = parquet_fingerprint(parquet)
    table = pq.read_table(parquet)
    labels = table.column("labels").to_numpy().copy()
    labels[7] = 1 - labels[7]  # one label flipped, same size and row count
    pq.write_table(table.set_column(0, "labels", pa.array(labels, pa.int8())), parquet)
    assert parquet_fingerprint(parquet) != before


def test_unchanged_days_pass_and_missing_or_changed_ones_are_named_with_the_fix(day, tmp_path):
    source, parquet = day
    record = day_lineage("day_0", parquet)
    check_days([record], "checkpoint X")

    parquet_path = tmp_path / "out" / "day_0.parquet"
    parquet_path.unlink()
    with pytest.raises(LineageError) as gone:
        check_days([record], "checkpoint X")
    message = str(gone.value)
    assert message.startswith("checkpoint X was made from data that is not on disk any more")
    assert f"day_0: {parquet_path} no longer exists" in message
    assert f"kedro run --pipelines=ingestion --params=ingestion.raw_dir={source.parent.resolve()}" in message
    convert_day(source, parquet_path)  # what that command does: the same raw file converted again
    check_days([record], "checkpoint X")

    with source.open("a") as handle:
        handle.write("\t".join(["1"] + [""] * 39) + "\n")
    convert_day(source, parquet_path)
    with pytest.raises(LineageError) as changed:
        check_days([record], "checkpoint X")
    message = str(changed.value)
    assert "has changed since (2,000 rows then, 2,001 now)" in message and "raw file" in message
    assert "cannot be restored" in message and "ingestion.raw_dir" not in message


def test_records_from_before_lineage_are_only_checked_for_existence(day):
    _, parquet = day
    check_days([SourceDay(day="day_0", parquet=parquet, rows=1)], "old checkpoint")
    with pytest.raises(LineageError, match="no longer exists"):
        check_days([SourceDay(day="day_0", parquet=parquet + ".gone", rows=1)], "old checkpoint")

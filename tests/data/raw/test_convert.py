"""Converting raw days to Parquet: exact values, every bad line kept with its line number."""

from __future__ import annotations

import csv
import errno
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.storage import DiskFullError
from criteo_dlrm.data.raw import IngestionError, convert_day, convert_or_reuse
from criteo_dlrm.data.synthetic import ClickModel, write_day
from tests.conftest import naive_parse_line
from tests.data.raw.samples import file_with_bad_lines, good_line, parquet_rows, write_labelled
from tests.faults import flip


@pytest.mark.parametrize("name", ["day_0.gz", "day_0"])
def test_generated_day_converts_exactly_as_python_parses_it(tmp_path, name):
    source = tmp_path / name
    write_day(source, 7_000, day=0, model=ClickModel(seed=2), chunk_rows=3000)
    # A small block size forces many blocks, so block boundaries are exercised.
    report = convert_day(source, tmp_path / "out" / "day_0.parquet", block_size=64 << 10)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(source, "rt") as handle:
        expected = [naive_parse_line(line) for line in handle]
    assert report.rows == 7_000 and report.rejected == 0 and report.rejects_file is None
    assert parquet_rows(report.parquet) == expected


def test_real_criteo_rows_convert_exactly(tmp_path, real_data):
    for source in sorted(real_data.glob("*.tsv")):
        report = convert_day(source, tmp_path / f"{source.stem}.parquet")
        expected = [naive_parse_line(line) for line in source.open()]
        assert report.rejected == 0
        assert parquet_rows(report.parquet) == expected, source.name


def test_crlf_and_missing_trailing_newline_are_accepted(tmp_path):
    lines = [good_line(seed) for seed in range(5)]
    source = tmp_path / "day_1"
    source.write_bytes(("\r\n".join(lines)).encode())
    report = convert_day(source, tmp_path / "day_1.parquet")
    assert parquet_rows(report.parquet) == [naive_parse_line(line) for line in lines]


def test_missing_values_stay_distinct_from_zero(tmp_path):
    fields = ["0", "", "0", *[""] * 11, "", "0", "00000000", *[""] * 23]
    source = tmp_path / "day_0"
    source.write_text("\t".join(fields) + "\n")
    row = parquet_rows(convert_day(source, tmp_path / "day_0.parquet").parquet)[0]
    assert row[1] is None and row[2] == 0
    assert row[14] is None and row[15] == 0 and row[16] == 0


def test_bad_lines_are_rejected_with_their_line_numbers_and_reasons(tmp_path):
    source = tmp_path / "day_3"
    lines, bad = file_with_bad_lines(source)
    with pytest.raises(IngestionError) as error:
        convert_day(source, tmp_path / "out" / "day_3.parquet")
    message = str(error.value)
    assert str(source) in message and "7 of 12 lines rejected" in message
    assert "line 2: 39 fields, expected 40" in message and "max_reject_fraction" in message
    assert not (tmp_path / "out" / "day_3.parquet").exists(), "no Parquet when the day fails"

    rejects = (tmp_path / "out" / "day_3.rejects.tsv").read_text().splitlines()
    assert rejects[0] == "file\tline\treason\ttext"
    numbers = [int(line.split("\t")[1]) for line in rejects[1:]]
    assert numbers == sorted(bad)
    reasons = {int(r.split("\t")[1]): r.split("\t")[2] for r in rejects[1:]}
    assert "label '2'" in reasons[4] and "DENSE_0 '12x'" in reasons[5]
    assert "SPARSE_25 '123456789'" in reasons[7] and "SPARSE_6 'zzzz'" in reasons[9]
    assert "41 fields" in reasons[10]


def test_bad_lines_within_the_allowed_share_keep_every_good_row(tmp_path):
    source = tmp_path / "day_3"
    lines, bad = file_with_bad_lines(source)
    report = convert_day(source, tmp_path / "day_3.parquet", max_reject_fraction=0.6)
    good = [naive_parse_line(line) for number, line in enumerate(lines, 1) if number not in bad]
    assert report.rejected == len(bad) and report.rows == len(good)
    assert parquet_rows(report.parquet) == good


def test_line_numbers_stay_right_across_blocks(tmp_path):
    lines = [good_line(seed) for seed in range(3000)]
    for number in (10, 1500, 2999):
        lines[number - 1] = "\t".join(lines[number - 1].split("\t")[:30])
    lines[2000 - 1] = "\t".join(["x", *lines[2000 - 1].split("\t")[1:]])
    source = tmp_path / "day_0"
    source.write_text("\n".join(lines) + "\n")
    report = convert_day(source, tmp_path / "day_0.parquet", max_reject_fraction=0.01, block_size=32 << 10)
    numbers = [int(line.split("\t")[1]) for line in open(report.rejects_file).read().splitlines()[1:]]
    assert numbers == [10, 1500, 2000, 2999]


def test_empty_file_is_a_clear_error(tmp_path):
    source = tmp_path / "day_0"
    source.write_text("")
    with pytest.raises(IngestionError, match="no valid Criteo row"):
        convert_day(source, tmp_path / "day_0.parquet")


def test_labels_are_integers_and_dense_keeps_negatives(tmp_path):
    source = tmp_path / "day_0"
    source.write_text("\t".join(["1", "-2", *["7"] * 12, *["a"] * 26]) + "\n")
    table = pq.read_table(convert_day(source, tmp_path / "d.parquet").parquet)
    assert table.column("labels").type == pa.int8()
    assert table.column("DENSE_0").to_pylist() == [-2]
    assert np.all(table.column("SPARSE_25").to_numpy() == 10)


def test_nineteen_digit_counts_do_not_depend_on_the_block_size(tmp_path):
    fields = good_line(1).split("\t")
    big = "\t".join([fields[0], "9223372036854775807", *fields[2:]])
    bad = "\t".join([fields[0], "12x", *fields[2:]])
    source = tmp_path / "day_0"
    source.write_text("\n".join([big, bad, *(good_line(seed) for seed in range(2, 400)), big]) + "\n")
    counts = set()
    for block_size in (1 << 10, 4 << 20):
        report = convert_day(source, tmp_path / f"{block_size}.parquet", max_reject_fraction=0.5, block_size=block_size)
        counts.add((report.rows, report.rejected))
        assert pq.read_table(report.parquet).column("DENSE_0").to_pylist()[0] == (1 << 63) - 1
    assert counts == {(400, 1)}


def test_bytes_that_are_not_utf8_reject_their_line_only(tmp_path):
    good = [good_line(seed).encode() for seed in range(6)]
    fields = good[0].split(b"\t")
    broken_dense = b"\t".join([fields[0], b"1\xff", *fields[2:]])
    broken_label = b"\t".join([b"\xfe", *fields[1:]])
    source = tmp_path / "day_0"
    source.write_bytes(b"\n".join([good[1], broken_dense, good[2], broken_label, *good[3:]]) + b"\n")
    report = convert_day(source, tmp_path / "day_0.parquet", max_reject_fraction=0.5)
    assert report.rows == 5 and report.rejected == 2
    rejects = open(report.rejects_file, encoding="utf-8").read().splitlines()[1:]
    assert [int(line.split("\t")[1]) for line in rejects] == [2, 4]
    assert "DENSE_0 '1\ufffd' is not an integer" in rejects[0]
    with pytest.raises(IngestionError, match="2 of 7 lines rejected"):
        convert_day(source, tmp_path / "strict.parquet")


def test_a_truncated_gzip_names_the_file_and_leaves_no_output(tmp_path):
    source = tmp_path / "day_0.gz"
    write_day(source, 20_000, day=0, model=ClickModel(seed=2))
    data = source.read_bytes()
    source.write_bytes(data[: len(data) * 2 // 3])
    out = tmp_path / "out"
    with pytest.raises(IngestionError) as error:
        convert_day(source, out / "day_0.parquet", block_size=64 << 10)
    message = str(error.value)
    assert str(source) in message and "rows converted" in message and "fetch it again" in message
    converted = int(message.split(" rows converted")[0].split("(")[-1].replace(",", ""))
    assert 0 < converted < 20_000
    assert sorted(p.name for p in out.iterdir()) == [], "no Parquet and no partial file"


def test_a_gzip_damaged_inside_names_the_file_and_leaves_no_output(tmp_path):
    """Bytes flipped in the middle of a .gz (its deflate blocks broken, not cut short): refused as damaged."""
    source = tmp_path / "day_0.gz"
    write_day(source, 20_000, day=0, model=ClickModel(seed=3))
    data = bytearray(source.read_bytes())
    for at in range(len(data) // 4, 3 * len(data) // 4, 1000):  # an invalid deflate block (not only a bad CRC)
        data[at] ^= 0xFF
    source.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(IngestionError) as error:
        convert_day(source, out / "day_0.parquet", block_size=64 << 10)
    assert str(source) in str(error.value) and "fetch it again" in str(error.value)
    assert sorted(p.name for p in out.iterdir()) == [], "no Parquet and no partial file"


def test_unlabelled_rows_keep_their_line_numbers_past_bad_lines(tmp_path):
    from criteo_dlrm.common.schema import FEATURE_COLUMNS, RawLayout
    from criteo_dlrm.data.raw import is_labelled

    lines = [good_line(seed).split("\t", 1)[1] for seed in range(2000)]  # 39 fields: no label
    for number in (3, 1200):
        lines[number - 1] = "\t".join(lines[number - 1].split("\t")[:20])
    source = tmp_path / "test_day"
    source.write_text("\n".join(lines) + "\n")
    assert not is_labelled(source) and is_labelled(write_labelled(tmp_path))
    layout = RawLayout(labelled=False, line_numbers=True)
    report = convert_day(source, tmp_path / "t.parquet", max_reject_fraction=0.01, block_size=16 << 10, layout=layout)
    table = pq.read_table(report.parquet)
    assert table.schema.names == [*FEATURE_COLUMNS, "line"]
    expected_lines = [n for n in range(1, 2001) if n not in (3, 1200)]
    assert table.column("line").to_pylist() == expected_lines
    expected = [naive_parse_line("0\t" + lines[n - 1])[1:] for n in expected_lines]
    assert list(zip(*(table.column(name).to_pylist() for name in FEATURE_COLUMNS), strict=True)) == expected


def test_an_empty_line_is_rejected_as_one_with_an_empty_text(tmp_path):
    source = tmp_path / "day_0"
    lines = [good_line(seed) + "\n" for seed in range(10)]
    lines.insert(4, "\n")
    source.write_text("".join(lines))
    report = convert_day(source, tmp_path / "day_0.parquet", max_reject_fraction=0.5)
    assert report.rows == 10 and report.rejected == 1
    with open(report.rejects_file, newline="") as handle:
        [header, row] = list(csv.reader(handle, delimiter="\t"))
    assert row[1:] == ["5", "empty line (no field has a value)", ""]


def test_ingestion_rebuilds_a_damaged_day_instead_of_calling_it_converted(converted_day, tmp_path):
    source, parquet, rows = converted_day
    destination = tmp_path / "day_0.parquet"
    convert_day(source, destination)
    flip(destination, destination.stat().st_size // 2, 3)  # inside the data pages
    convert_or_reuse(source, destination)
    assert pq.read_table(destination).to_pylist() == rows


def test_a_full_disk_is_reported_as_such_for_a_day_being_converted(converted_day, tmp_path, monkeypatch):
    import pyarrow.parquet

    source, _, _ = converted_day

    class FullWriter(pyarrow.parquet.ParquetWriter):
        def write_table(self, table, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("criteo_dlrm.data.raw.convert.pq.ParquetWriter", FullWriter)
    with pytest.raises(DiskFullError, match=rf"No space left on {tmp_path}.* while writing the Parquet of day_0"):
        convert_day(source, tmp_path / "day_0.parquet")
    assert not list(tmp_path.glob("*day_0*")), "nothing half-written is left"


def test_a_line_longer_than_a_block_names_the_line_and_the_setting(tmp_path):
    source = tmp_path / "day_0"
    write_day(source, 100, day=0, model=ClickModel(seed=2))
    lines = source.read_text().splitlines(keepends=True)
    lines.insert(60, "1" + "\t" * 39 + "a" * (3 << 20) + "\n")
    source.write_text("".join(lines))
    with pytest.raises(IngestionError, match=r"a line from line \d+ on is longer than one block .*block_size_mb=1\)"):
        convert_day(source, tmp_path / "day_0.parquet", block_size=1 << 20)

import gzip
import random
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.schema import COLUMNS, PARQUET_SCHEMA
from criteo_dlrm.data.raw import IngestionError, convert_day, find_day_files, parse_hex, parse_integers
from criteo_dlrm.data.raw.reader import LineTracker, csv_reader
from criteo_dlrm.data.raw.threads import WriteBehind, read_ahead
from criteo_dlrm.data.synthetic import ClickModel, write_day
from tests.conftest import naive_parse_line


def _rows(parquet) -> list[tuple]:
    table = pq.read_table(parquet)
    assert table.schema.equals(PARQUET_SCHEMA)
    return list(zip(*(table.column(name).to_pylist() for name in COLUMNS), strict=True))


def _good_line(seed: int = 0) -> str:
    rng = random.Random(seed)
    dense = [str(rng.randint(-3, 5000)) if rng.random() > 0.3 else "" for _ in range(13)]
    sparse = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.2 else "" for _ in range(26)]
    return "\t".join([str(rng.randint(0, 1)), *dense, *sparse])


def test_parse_hex_matches_python_int():
    rng = random.Random(0)
    texts = []
    for _ in range(5000):
        digits = rng.randint(1, 8)
        text = f"{rng.getrandbits(4 * digits):0{digits}x}"
        texts.append(text.upper() if rng.random() < 0.3 else text)
    parsed, bad = parse_hex(pa.array(texts))
    assert not bad.any()
    assert parsed.tolist() == [int(text, 16) for text in texts]


def test_parse_hex_flags_non_hex_and_too_long_values():
    parsed, bad = parse_hex(pa.array(["ffffffff", "0", "g1", "123456789", "", "é", None]))
    assert bad.tolist() == [False, False, True, True, True, True, False]
    assert parsed[:2].tolist() == [0xFFFFFFFF, 0]


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
    assert _rows(report.parquet) == expected


def test_real_criteo_rows_convert_exactly(tmp_path, real_data):
    for source in sorted(real_data.glob("*.tsv")):
        report = convert_day(source, tmp_path / f"{source.stem}.parquet")
        expected = [naive_parse_line(line) for line in source.open()]
        assert report.rejected == 0
        assert _rows(report.parquet) == expected, source.name


def test_crlf_and_missing_trailing_newline_are_accepted(tmp_path):
    lines = [_good_line(seed) for seed in range(5)]
    source = tmp_path / "day_1"
    source.write_bytes(("\r\n".join(lines)).encode())
    report = convert_day(source, tmp_path / "day_1.parquet")
    assert _rows(report.parquet) == [naive_parse_line(line) for line in lines]


def test_missing_values_stay_distinct_from_zero(tmp_path):
    fields = ["0", "", "0", *[""] * 11, "", "0", "00000000", *[""] * 23]
    source = tmp_path / "day_0"
    source.write_text("\t".join(fields) + "\n")
    row = _rows(convert_day(source, tmp_path / "day_0.parquet").parquet)[0]
    assert row[1] is None and row[2] == 0
    assert row[14] is None and row[15] == 0 and row[16] == 0


def _file_with_bad_lines(path):
    good = [_good_line(seed) for seed in range(8)]
    fields = good[0].split("\t")
    bad = {
        2: "\t".join(fields[:-1]),  # 39 fields
        4: "\t".join(["2", *fields[1:]]),  # label not 0/1
        5: "\t".join([fields[0], "12x", *fields[2:]]),  # count not an integer
        7: "\t".join([*fields[:-1], "123456789"]),  # 9 hex digits
        8: "",  # empty line
        9: "\t".join([*fields[:20], "zzzz", *fields[21:]]),  # not hex
        10: "\t".join([*fields, "extra"]),  # 41 fields
    }
    lines, good_iter = [], iter(good)
    for number in range(1, 13):
        lines.append(bad[number] if number in bad else next(good_iter))
    path.write_text("\n".join(lines) + "\n")
    return lines, bad


def test_bad_lines_are_rejected_with_their_line_numbers_and_reasons(tmp_path):
    source = tmp_path / "day_3"
    lines, bad = _file_with_bad_lines(source)
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
    lines, bad = _file_with_bad_lines(source)
    report = convert_day(source, tmp_path / "day_3.parquet", max_reject_fraction=0.6)
    good = [naive_parse_line(line) for number, line in enumerate(lines, 1) if number not in bad]
    assert report.rejected == len(bad) and report.rows == len(good)
    assert _rows(report.parquet) == good


def test_line_numbers_stay_right_across_blocks(tmp_path):
    lines = [_good_line(seed) for seed in range(3000)]
    for number in (10, 1500, 2999):
        lines[number - 1] = "\t".join(lines[number - 1].split("\t")[:30])
    lines[2000 - 1] = "\t".join(["x", *lines[2000 - 1].split("\t")[1:]])
    source = tmp_path / "day_0"
    source.write_text("\n".join(lines) + "\n")
    report = convert_day(source, tmp_path / "day_0.parquet", max_reject_fraction=0.01, block_size=32 << 10)
    numbers = [int(line.split("\t")[1]) for line in open(report.rejects_file).read().splitlines()[1:]]
    assert numbers == [10, 1500, 2000, 2999]


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


class _FailingWriter:
    def __init__(self):
        self.calls = 0

    def write_table(self, table):
        self.calls += 1
        raise OSError("disk full")


def test_a_failed_parquet_write_is_raised_instead_of_hanging():
    writer = _FailingWriter()
    behind = WriteBehind(writer)
    finished = threading.Event()

    def write_many():
        for _ in range(5):  # more than the queue holds: must not block on a dead thread
            behind.write(pa.table({"a": [1]}))
        finished.set()

    threading.Thread(target=write_many, daemon=True).start()
    assert finished.wait(timeout=10), "write() blocked after the writer thread failed"
    with pytest.raises(OSError, match="disk full"):
        behind.close()
    assert writer.calls == 1


def test_stopping_early_stops_the_reader_thread(tmp_path):
    source = tmp_path / "day_0"
    source.write_text("\n".join(_good_line(seed) for seed in range(3000)) + "\n")
    before = threading.active_count()
    with pa.OSFile(str(source), "rb") as stream:
        batches = read_ahead(csv_reader(stream, 16 << 10, LineTracker(), COLUMNS))
        next(batches)
        batches.close()  # the consumer gives up after one batch, as on a parse error
    assert threading.active_count() == before


def test_a_valid_integer_is_accepted_whatever_its_neighbours():
    largest, smallest = str((1 << 63) - 1), str(-(1 << 63))
    alone, alone_bad = parse_integers(pa.array([largest, smallest, "7"], pa.binary()))
    beside_bad, bad = parse_integers(pa.array([largest, smallest, "7", "12x"], pa.binary()))
    assert not alone_bad.any() and alone.to_pylist() == [(1 << 63) - 1, -(1 << 63), 7]
    assert bad.tolist() == [False, False, False, True]
    assert beside_bad.to_pylist() == [(1 << 63) - 1, -(1 << 63), 7, None]


@pytest.mark.parametrize("neighbour", ["5", "bad"])
def test_integers_follow_one_rule_decimal_within_int64(neighbour):
    cells = ["9223372036854775808", "0x10", "0X1f", "+5", " 5", "1e3", "007", "-0", None, neighbour]
    parsed, bad = parse_integers(pa.array(cells, pa.binary()))
    expected_bad = [True, True, True, True, True, True, False, False, False, neighbour == "bad"]
    assert bad.tolist() == expected_bad
    assert parsed.to_pylist()[6:9] == [7, 0, None]
    # Arrow's own cast takes a hex prefix when nothing else in the column fails: the rule still refuses it.
    assert parse_integers(pa.array(["0x10", "5"], pa.binary()))[1].tolist() == [True, False]


def test_nineteen_digit_counts_do_not_depend_on_the_block_size(tmp_path):
    fields = _good_line(1).split("\t")
    big = "\t".join([fields[0], "9223372036854775807", *fields[2:]])
    bad = "\t".join([fields[0], "12x", *fields[2:]])
    source = tmp_path / "day_0"
    source.write_text("\n".join([big, bad, *(_good_line(seed) for seed in range(2, 400)), big]) + "\n")
    counts = set()
    for block_size in (1 << 10, 4 << 20):
        report = convert_day(source, tmp_path / f"{block_size}.parquet", max_reject_fraction=0.5, block_size=block_size)
        counts.add((report.rows, report.rejected))
        assert pq.read_table(report.parquet).column("DENSE_0").to_pylist()[0] == (1 << 63) - 1
    assert counts == {(400, 1)}


def test_bytes_that_are_not_utf8_reject_their_line_only(tmp_path):
    good = [_good_line(seed).encode() for seed in range(6)]
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


@pytest.mark.parametrize("names", [("day_0", "day_0.gz"), ("train.txt", "train.tsv")])
def test_two_files_for_one_day_are_refused(tmp_path, names):
    for name in (*names, "day_1"):
        (tmp_path / name).write_text("")
    first, second = sorted(names)
    with pytest.raises(IngestionError, match=rf"{first} and {second} are both {first.split('.')[0]}"):
        find_day_files(tmp_path)


def test_unlabelled_rows_keep_their_line_numbers_past_bad_lines(tmp_path):
    from criteo_dlrm.common.schema import FEATURE_COLUMNS, RawLayout
    from criteo_dlrm.data.raw import is_labelled

    lines = [_good_line(seed).split("\t", 1)[1] for seed in range(2000)]  # 39 fields: no label
    for number in (3, 1200):
        lines[number - 1] = "\t".join(lines[number - 1].split("\t")[:20])
    source = tmp_path / "test_day"
    source.write_text("\n".join(lines) + "\n")
    assert not is_labelled(source) and is_labelled(_write_labelled(tmp_path))
    layout = RawLayout(labelled=False, line_numbers=True)
    report = convert_day(source, tmp_path / "t.parquet", max_reject_fraction=0.01, block_size=16 << 10, layout=layout)
    table = pq.read_table(report.parquet)
    assert table.schema.names == [*FEATURE_COLUMNS, "line"]
    expected_lines = [n for n in range(1, 2001) if n not in (3, 1200)]
    assert table.column("line").to_pylist() == expected_lines
    expected = [naive_parse_line("0\t" + lines[n - 1])[1:] for n in expected_lines]
    assert list(zip(*(table.column(name).to_pylist() for name in FEATURE_COLUMNS), strict=True)) == expected


def _write_labelled(tmp_path):
    path = tmp_path / "labelled_day"
    path.write_text(_good_line(1) + "\n")
    return path


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

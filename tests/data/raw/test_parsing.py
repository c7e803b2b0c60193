"""Parsing raw cells: hex categories and decimal counts, against Python's own int()."""

import random
import string

import pyarrow as pa
import pytest

from criteo_dlrm.common.schema import RawLayout
from criteo_dlrm.data.raw import parse_hex, parse_integers
from criteo_dlrm.data.raw.parsing import parse_batch, parse_block
from criteo_dlrm.data.raw.reader import LineTracker, csv_reader
from tests.data.raw.samples import good_line


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


def _python_hex(text: bytes | None) -> tuple[int, bool]:
    """Python's reading of a cell: ``(value, bad)``; 1-8 ASCII hex digits only (``int`` alone takes ``_``, spaces)."""
    if text is None:
        return 0, False
    digits = text.decode("latin-1")
    if not 1 <= len(digits) <= 8 or any(c not in string.hexdigits for c in digits):
        return 0, True
    return int(digits, 16), False


@pytest.mark.parametrize("word", [b"0123abCD", b"a1f"])
def test_every_byte_in_every_place_of_a_cell_is_read_as_python_reads_it(word):
    """All 256 bytes in each place of an 8-digit cell (the packed path, nulls between) and of a shorter one
    (the padded path), over more cells than one piece of the parse, against Python."""
    cells = []
    for place in range(len(word)):
        for byte in range(256):
            cell = bytearray(word)
            cell[place] = byte
            cells += [bytes(cell), None] if byte % 3 == 0 else [bytes(cell)]
    cells *= 9  # about 25,000 cells: several pieces of 16,384
    parsed, bad = parse_hex(pa.array(cells, pa.binary()))
    expected = [_python_hex(cell) for cell in cells]
    assert bad.tolist() == [flag for _, flag in expected]
    assert parsed.tolist() == [value for value, _ in expected]


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


# Cells a plain row may hold (typed from the bytes) and cells that send a block to pyarrow's reader (some are good
# rows too: a 9-digit count, a 3-digit category), with the lines that are not rows at all.
PLAIN_COUNTS = ["", "0", "-0", "-1", "007", "12345678", "-12345678", "99999999"]
OTHER_COUNTS = ["123456789", "-123456789", "-", "--1", "+5", " 1", "1 ", "1e3", "0x1f", "\u0663", "\x00", "1\r", "é"]
PLAIN_CATEGORIES = ["", "abcdef12", "ABCDEF12", "0000000f", "ffffffff"]
OTHER_CATEGORIES = ["abc", "1234567", "123456789", "zzzzzzzz", "abcdef1\r", "abcdef1/", "abcdef1:", "abcdef1g", "é"]
OTHER_LABELS = ["", "2", "01", " 1", "1.0"]


def _through_pyarrow(block: bytes, layout: RawLayout, first_line: int) -> tuple[pa.Table, list]:
    """The reference: pyarrow's reader splits the block into byte columns, ``parse_batch`` types or rejects each."""
    tracker = LineTracker()
    tracker.first_line = first_line
    typed, rejected = [], []
    for batch in csv_reader(pa.BufferReader(block), len(block) + 1, tracker, layout.raw_columns):
        rows, bad = parse_batch(batch)
        typed.append(rows)
        rejected += bad
    schema = RawLayout(layout.labelled).parquet_schema
    return pa.Table.from_batches(typed, schema=schema), rejected + tracker.malformed


def _block(rng: random.Random, labelled: bool, mutations: list) -> tuple[bytes, bool]:
    """50 generated lines with ``mutations`` applied: ``(block, plain)``, plain when every change keeps a plain row."""
    lines = [good_line(rng.randrange(1 << 30)).split("\t")[0 if labelled else 1 :] for _ in range(50)]
    first = 1 if labelled else 0
    plain = True
    for kind in mutations:
        line = lines[rng.randrange(len(lines))]
        if kind == "count":
            value = rng.choice(PLAIN_COUNTS + OTHER_COUNTS)
            line[first + rng.randrange(13)] = value
            plain &= value in PLAIN_COUNTS
        elif kind == "category":
            value = rng.choice(PLAIN_CATEGORIES + OTHER_CATEGORIES)
            line[first + 13 + rng.randrange(26)] = value
            plain &= value in PLAIN_CATEGORIES
        elif kind == "label" and labelled:
            line[0] = rng.choice(OTHER_LABELS)
            plain = False
        elif kind == "line":
            change = rng.choice(["merge", "split", "empty", "tabs", "crlf"])
            where = rng.randrange(len(line) - 1)
            if change == "merge":
                line[where : where + 2] = [line[where] + line[where + 1]]
            elif change == "split":
                line.insert(where, "")
            elif change == "empty":
                line[:] = [""]
            elif change == "tabs":
                line[:] = [""] * len(line)
            else:
                line[-1] += "\r"
            plain = False
    text = "".join("\t".join(line) + "\n" for line in lines)
    return text.encode("utf-8"), plain


@pytest.mark.parametrize(
    "layout", [RawLayout(), RawLayout(labelled=False), RawLayout(labelled=False, line_numbers=True)]
)
def test_a_block_typed_from_its_bytes_equals_pyarrow_s_reading_or_is_left_to_it(layout):
    """``parse_block`` types a block only when pyarrow's reader and ``parse_batch`` would keep every line, and then
    gives the same rows; plain blocks are typed (the fast path is taken), any other block is left to pyarrow."""
    rng = random.Random(7)
    typed_blocks = 0
    trials = 240
    for trial in range(trials):
        mutations = [rng.choice(["count", "category", "label", "line"]) for _ in range(trial % 3)]
        block, plain = _block(rng, layout.labelled, mutations)
        first_line = rng.randrange(1000)
        fast = parse_block(block, layout, first_line)
        expected, rejected = _through_pyarrow(block, layout, first_line)
        if plain:
            assert fast is not None, (mutations, block[:300])
        if fast is None:
            continue
        typed_blocks += 1
        assert rejected == [], (mutations, rejected[:3])
        assert fast.schema.equals(layout.parquet_schema)
        table = pa.Table.from_batches([fast])
        if layout.line_numbers:
            assert table.column("line").to_pylist() == list(range(first_line + 1, first_line + 51))
            table = table.drop_columns(["line"])
        assert table.equals(expected), mutations
        assert [column.null_count for column in table.columns] == [column.null_count for column in expected.columns]
    assert typed_blocks > trials // 3  # the unchanged blocks (a third) and the blocks changed only in plain cells


def test_the_real_criteo_rows_are_typed_from_their_bytes_as_pyarrow_reads_them(real_data):
    for path in sorted(real_data.glob("*.tsv")):
        block = path.read_bytes()
        fast = parse_block(block, RawLayout())
        assert fast is not None, path.name  # real rows are plain
        expected, rejected = _through_pyarrow(block, RawLayout(), 0)
        assert rejected == [] and pa.Table.from_batches([fast]).equals(expected), path.name

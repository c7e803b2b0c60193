"""Parsing raw cells: hex categories and decimal counts, against Python's own int()."""

import random
import string

import pyarrow as pa
import pytest

from criteo_dlrm.data.raw import parse_hex, parse_integers


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

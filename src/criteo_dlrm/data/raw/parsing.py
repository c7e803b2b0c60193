"""Parsing raw Criteo cells column-wise: labels, decimal counts and hex categories, with no Python per cell.

Every cell arrives as bytes (a block of pyarrow's CSV reader); labels, counts and hex categories are
validated and parsed with Arrow kernels and numpy. A row that fails is returned with the reason, never
dropped.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from criteo_dlrm.common.schema import DENSE_COLUMNS, LABEL_COLUMN, SPARSE_COLUMNS, RawLayout

_DECIMAL = r"^-?[0-9]+$"
EMPTY_LINE = "empty line (no field has a value)"


# Words parsed at a time: the temporaries of a piece (three of 128 KB) stay in a core's L2 cache; over a whole column
# every one of the parse's 40 steps went to memory and back (3x slower, measured on 1M words).
_HEX_PIECE = 1 << 14
_U = np.uint64
_ZEROS = int.from_bytes(b"00000000", "little")


def _parse_hex_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse 8 ASCII hex digits held in each little-endian uint64 (SWAR: all digits at once), a piece at a time.

    Returns ``(values, bad)``: int64 values (0 where bad); ``bad`` marks words with a byte that is not a hex digit.
    """
    values, bad = np.empty(len(words), dtype=np.int64), np.empty(len(words), dtype=bool)
    nibbles, first, second = (np.empty(min(_HEX_PIECE, len(words)), dtype=_U) for _ in range(3))
    for start in range(0, len(words), _HEX_PIECE):
        word = words[start : start + _HEX_PIECE]
        size = len(word)
        _parse_piece(word, nibbles[:size], first[:size], second[:size], bad[start : start + size])
        out = values[start : start + size].view(_U)
        _fold(nibbles[:size], first[:size], second[:size], out)
        out[bad[start : start + size]] = 0
    return values, bad


def _parse_piece(word: np.ndarray, nibbles: np.ndarray, first: np.ndarray, second: np.ndarray, bad: np.ndarray) -> None:
    """Each byte's digit value into ``nibbles``, and ``bad`` where a byte is not a hex digit (in place)."""
    ones = _U(0x0101010101010101)
    # '0'-'9' -> 0-9 from the low nibble; letters have bit 6 set and need 9 more ('a' = 0x61 -> 1 + 9).
    np.bitwise_and(np.right_shift(word, _U(6), out=first), ones, out=first)
    np.add(np.bitwise_and(word, _U(0x0F0F0F0F0F0F0F0F), out=nibbles), np.multiply(first, _U(9), out=first), out=nibbles)
    # Re-encode as lowercase hex and compare: only real hex digits survive the round trip.
    np.bitwise_and(
        np.right_shift(np.add(nibbles, _U(0x7676767676767676), out=first), _U(7), out=first), ones, out=first
    )
    np.add(np.add(np.multiply(first, _U(0x27), out=first), nibbles, out=first), _U(0x3030303030303030), out=first)
    np.not_equal(first, np.bitwise_or(word, _U(0x2020202020202020), out=second), out=bad)
    # Bytes below 0x20 would alias digits once lowercased (| 0x20), so they are refused explicitly; 'g'..'o' give
    # nibbles 16..24.
    np.bitwise_and(np.subtract(word, _U(0x2020202020202020), out=first), np.invert(word, out=second), out=first)
    np.bitwise_and(first, _U(0x8080808080808080), out=first)
    np.bitwise_or(first, np.bitwise_and(nibbles, _U(0x1010101010101010), out=second), out=first)
    np.logical_or(bad, first != 0, out=bad)


def _fold(nibbles: np.ndarray, first: np.ndarray, second: np.ndarray, out: np.ndarray) -> None:
    """Byte k holds digit k (most significant first): fold pairs, then quads, then halves, into ``out``."""
    for mask, shift in ((0x000F000F000F000F, 4), (0x000000FF000000FF, 8), (0xFFFF, 16)):
        np.left_shift(np.bitwise_and(nibbles, _U(mask), out=first), _U(shift), out=first)
        np.bitwise_and(np.right_shift(nibbles, _U(2 * shift), out=second), _U(mask), out=second)
        np.bitwise_or(first, second, out=out if shift == 16 else nibbles)


def parse_hex(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Parse 1-8 digit hex strings column-wise.

    Args:
        values: string or binary array; nulls are missing values.

    Returns:
        ``(parsed, bad)``: ``parsed`` int64 (0 where null or bad), ``bad`` bool, True where a non-null
        value is not 1-8 hex digits.
    """
    count = len(values)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset : values.offset + count + 1]
    lengths = np.diff(offsets)
    if np.array_equal(lengths, valid * np.int32(8)):
        # Criteo's usual case: every value has 8 digits, so the data buffer is a packed (valid, 8) array.
        words = np.frombuffer(values.buffers()[2], dtype="<u8", count=int(valid.sum()), offset=int(offsets[0]))
        if len(words) < count:  # the nulls' places hold "00000000": parsed as 0, not bad
            words, packed = np.full(count, _ZEROS, dtype="<u8"), words
            words[valid] = packed
        return _parse_hex_words(words)
    # Other lengths: right-align each value in 8 bytes, '0'-padded on the left, then parse those words.
    fits = ~valid | ((lengths >= 1) & (lengths <= 8))
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8) if values.buffers()[2] else np.zeros(0, np.uint8)
    data = np.concatenate([np.full(8, ord("0"), dtype=np.uint8), data])
    index = offsets[1:, None] + np.arange(8)  # +8 for the padding in front, -8 to end at the value's end
    padded = data[index]
    padded[np.arange(8)[None, :] < (8 - np.where(valid & fits, lengths, 8))[:, None]] = ord("0")
    parsed, bad = _parse_hex_words(np.ascontiguousarray(padded).view("<u8").ravel())
    bad = (bad | ~fits) & valid
    parsed[bad | ~valid] = 0
    return parsed, bad


def parse_integers(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Parse decimal integer cells (nulls stay null). Returns ``(int64 array, bad mask)``.

    One rule whatever the neighbouring cells: a cell is valid when it is ``-?[0-9]+`` and fits int64.
    The whole column is cast at once when every cell is valid (the usual case); otherwise the syntax is
    checked column-wise and only the few cells of 19 or more digits are range-checked one by one.

    Args:
        values: binary or string cells (binary: bytes that are not UTF-8 are bad cells, not an error).
    """
    if not _may_hold_hex_prefix(values):
        try:
            return pc.cast(values, pa.int64()), np.zeros(len(values), dtype=bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    ok = pc.fill_null(pc.match_substring_regex(values, _DECIMAL), True).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(ok & (lengths >= 19)):
        text = values[row].as_py()
        ok[row] = -(1 << 63) <= int(text) < (1 << 63)
    cleaned = pc.if_else(pa.array(ok), values, pa.scalar(None, values.type))
    return pc.cast(cleaned, pa.int64()), ~ok


def _may_hold_hex_prefix(values: pa.Array) -> bool:
    """Whether any byte is ``x`` or ``X``: Arrow's int64 cast also takes ``0x1f``, which is not a decimal count.

    A scan of the data buffer (a few ms per block); a stray ``x`` elsewhere only sends the column down
    the slower, equally correct path.
    """
    data = values.buffers()[2]
    return data is not None and bool(np.any((np.frombuffer(data, dtype=np.uint8) | 0x20) == ord("x")))


def _text(value: bytes | str | None) -> str:
    """A raw cell as text for messages and the rejects file (bytes that are not UTF-8 become U+FFFD)."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _empty_rows(batch: pa.RecordBatch) -> list[int]:
    """Rows with no value in any field: pyarrow reads an empty line as one (it cannot be told apart from a line
    of tabs only)."""
    candidates = np.flatnonzero(batch.column(0).is_null().to_numpy(zero_copy_only=False))
    for column in batch.columns[1:]:
        if not len(candidates):
            break
        candidates = candidates[column.is_null().to_numpy(zero_copy_only=False)[candidates]]
    return candidates.tolist()


def _raw_text(batch: pa.RecordBatch, row: int) -> str:
    return "\t".join(_text(column[row].as_py()) for column in batch.columns)


def parse_batch(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list[tuple[int, str, str]]]:
    """Validate and type one block of raw string columns.

    Args:
        batch: the 40 raw columns (or 39 without the label) as binary or string, named as in ``schema``.

    Returns:
        ``(typed, bad)``: the valid rows typed as ``RawLayout(labelled).parquet_schema`` and, for every other
        row, ``(row index in batch, reason, raw text)``.
    """
    count = batch.num_rows
    reasons: dict[int, str] = dict.fromkeys(_empty_rows(batch), EMPTY_LINE)
    labelled = LABEL_COLUMN in batch.schema.names
    arrays: list[pa.Array] = []
    if labelled:
        labels = batch.column(LABEL_COLUMN)
        is_one = pc.fill_null(pc.equal(labels, pa.scalar(b"1", labels.type)), False).to_numpy(zero_copy_only=False)
        is_zero = pc.fill_null(pc.equal(labels, pa.scalar(b"0", labels.type)), False).to_numpy(zero_copy_only=False)
        for row in np.flatnonzero(~(is_one | is_zero)):
            label = labels[row].as_py()
            reasons.setdefault(
                int(row), f"label {_text(label)!r} is not 0 or 1" if label is not None else "label is empty"
            )
        arrays.append(pa.array(is_one.astype(np.int8)))
    for name in DENSE_COLUMNS:
        column = batch.column(name)
        parsed, bad = parse_integers(column)
        for row in np.flatnonzero(bad):
            reasons.setdefault(int(row), f"{name} {_text(column[row].as_py())!r} is not an integer")
        arrays.append(parsed)
    for name in SPARSE_COLUMNS:
        column = batch.column(name)
        parsed, bad = parse_hex(column)
        for row in np.flatnonzero(bad):
            reasons.setdefault(int(row), f"{name} {_text(column[row].as_py())!r} is not 1-8 hex digits")
        arrays.append(pa.array(parsed, mask=column.is_null().to_numpy(zero_copy_only=False)))

    typed = pa.RecordBatch.from_arrays(arrays, schema=RawLayout(labelled).parquet_schema)
    if not reasons:
        return typed, []
    keep = np.ones(count, dtype=bool)
    keep[list(reasons)] = False
    bad_rows = [
        (row, reason, "" if reason == EMPTY_LINE else _raw_text(batch, row)) for row, reason in sorted(reasons.items())
    ]
    return typed.filter(pa.array(keep)), bad_rows

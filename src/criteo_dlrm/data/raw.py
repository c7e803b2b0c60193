"""Streaming conversion of raw Criteo TSV day files (plain or gzip) into typed Parquet.

The file is read block by block with pyarrow's CSV reader, every field as a string; labels, counts
and hex categories are then validated and parsed column-wise with Arrow kernels and numpy, so no
Python code runs per row or per cell. Rows that fail are never dropped silently: each one is
written to a rejects file with its line number and the reason.
"""

from __future__ import annotations

import csv
import hashlib
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from loguru import logger

from criteo_dlrm.data.lineage import made_from, source_metadata
from criteo_dlrm.errors import DataError
from criteo_dlrm.parallel import choose_workers, run_parallel
from criteo_dlrm.progress import progress_bar
from criteo_dlrm.schema import (
    DENSE_COLUMNS,
    LABEL_COLUMN,
    NUM_RAW_FIELDS,
    SPARSE_COLUMNS,
    RawLayout,
)

_DAY_FILE = re.compile(r"^(day_\d+|[A-Za-z0-9_.-]+\.(txt|tsv))(\.gz)?$")
_DECIMAL = r"^-?[0-9]+$"
_ROW_GROUP_ROWS = 1 << 18
TRAINING_LAYOUT = RawLayout()  # labelled, no line numbers
_MAX_REPORTED = 5


class IngestionError(DataError):
    """Raw input that cannot be converted; the message names the file and what to do."""


@dataclass(frozen=True)
class Reject:
    """One input line that was not converted."""

    line: int
    reason: str
    text: str


@dataclass
class DayReport:
    """What converting one day file produced."""

    source: str
    parquet: str
    rows: int
    rejected: int
    rejects_file: str | None
    input_bytes: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def day_name(path: Path) -> str:
    """``day_3.gz`` -> ``day_3``; ``train.txt`` -> ``train``."""
    name = path.name.removesuffix(".gz")
    return name.removesuffix(".txt").removesuffix(".tsv")


def day_sort_key(name: str) -> tuple[int, str]:
    """Sort ``day_2`` before ``day_10``; other names after the numbered days, alphabetically."""
    match = re.fullmatch(r"day_(\d+)", name)
    return (int(match.group(1)), name) if match else (1 << 30, name)


def find_day_files(raw_dir: str | os.PathLike) -> list[Path]:
    """Return the raw day files in ``raw_dir`` (``day_<N>``, ``day_<N>.gz``, ``*.txt``, ``*.tsv``), in day order.

    Raises:
        IngestionError: the folder is missing or holds no day file.
    """
    folder = Path(raw_dir)
    if not folder.is_dir():
        raise IngestionError(
            f"Raw data folder {folder} does not exist. Put Criteo day files (day_0.gz, day_1, ... or "
            f"train.txt) there, or point ingestion at your folder: "
            f"kedro run --pipelines=ingestion --params=ingestion.raw_dir=/path/to/criteo"
        )
    files = [p for p in folder.iterdir() if p.is_file() and _DAY_FILE.match(p.name)]
    if not files:
        raise IngestionError(
            f"Raw data folder {folder} holds no Criteo day file (expected day_<N>, day_<N>.gz, *.txt or "
            f"*.tsv). Regenerate the bundled sample with `python -m criteo_dlrm.data.synthetic "
            f"--output {folder}` or set --params=ingestion.raw_dir=/path/to/criteo"
        )
    by_day: dict[str, list[str]] = {}
    for path in files:
        by_day.setdefault(day_name(path), []).append(path.name)
    duplicates = {day: sorted(names) for day, names in by_day.items() if len(names) > 1}
    if duplicates:
        listed = "; ".join(f"{' and '.join(names)} are both {day}" for day, names in sorted(duplicates.items()))
        raise IngestionError(
            f"Raw data folder {folder} holds two files for one day ({listed}): one would overwrite the other's "
            "Parquet and the other day would be trained on twice. Keep one file per day (move the other away)."
        )
    return sorted(files, key=lambda p: day_sort_key(day_name(p)))


def parquet_folder(output_dir: str | os.PathLike, raw_dir: str | os.PathLike) -> Path:
    """Where the Parquet days of ``raw_dir`` go: ``<output_dir>/<raw folder name>-<hash of its full path>``.

    Each raw folder gets its own Parquet folder, so converting another folder never replaces the days an
    earlier metadata version or checkpoint was made from, and converting the same folder again finds its days.
    """
    folder = Path(raw_dir).resolve()
    return Path(output_dir) / f"{folder.name}-{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"


def _parse_hex_words(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse 8 ASCII hex digits held in each little-endian uint64 (SWAR: all digits at once).

    Returns ``(values, bad)``; ``bad`` marks words with a byte that is not a hex digit.
    """
    low, ones = np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(0x0101010101010101)
    # '0'-'9' -> 0-9 from the low nibble; letters have bit 6 set and need 9 more ('a' = 0x61 -> 1 + 9).
    nibbles = (words & low) + np.uint64(9) * ((words >> np.uint64(6)) & ones)
    # Re-encode as lowercase hex and compare: only real hex digits survive the round trip. Bytes below
    # 0x20 would alias digits once lowercased (| 0x20), so they are refused explicitly.
    above_nine = ((nibbles + np.uint64(0x7676767676767676)) >> np.uint64(7)) & ones
    encoded = nibbles + np.uint64(0x3030303030303030) + np.uint64(0x27) * above_nine
    below_space = (words - np.uint64(0x2020202020202020)) & ~words & np.uint64(0x8080808080808080)
    too_big = nibbles & np.uint64(0x1010101010101010)  # 'g'..'o' give nibbles 16..24
    bad = (encoded != (words | np.uint64(0x2020202020202020))) | ((below_space | too_big) != 0)
    # Byte k holds digit k (most significant first): fold pairs, then quads, then halves.
    pairs = ((nibbles & np.uint64(0x000F000F000F000F)) << np.uint64(4)) | (
        (nibbles >> np.uint64(8)) & np.uint64(0x000F000F000F000F)
    )
    quads = ((pairs & np.uint64(0x000000FF000000FF)) << np.uint64(8)) | (
        (pairs >> np.uint64(16)) & np.uint64(0x000000FF000000FF)
    )
    values = ((quads & np.uint64(0xFFFF)) << np.uint64(16)) | ((quads >> np.uint64(32)) & np.uint64(0xFFFF))
    values[bad] = 0
    return values.astype(np.int64), bad


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
    if np.array_equal(lengths, np.where(valid, 8, 0)):
        # Criteo's usual case: every value has 8 digits, so the data buffer is a packed (valid, 8) array.
        words = np.frombuffer(values.buffers()[2], dtype="<u8", count=int(valid.sum()), offset=int(offsets[0]))
        parsed, bad = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=bool)
        parsed[valid], bad[valid] = _parse_hex_words(words)
        return parsed, bad
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
    reasons: dict[int, str] = {}
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
    bad_rows = [(row, reason, _raw_text(batch, row)) for row, reason in sorted(reasons.items())]
    return typed.filter(pa.array(keep)), bad_rows


class _LineTracker:
    """Maps the reader's n-th well-formed row back to its physical line number.

    pyarrow reports the line of each row with the wrong number of fields; every other line is
    a row, so the n-th row sits at line ``n + 1 + (number of malformed lines before it)``.
    """

    def __init__(self) -> None:
        self.malformed: list[Reject] = []

    def handle(self, row: pa_csv.InvalidRow) -> str:
        self.malformed.append(
            Reject(row.number or 0, f"{row.actual_columns} fields, expected {row.expected_columns}", row.text)
        )
        return "skip"

    def lines(self, first_row: int, rows: np.ndarray) -> np.ndarray:
        lines = np.array([reject.line for reject in self.malformed], dtype=np.int64)
        rows_before = lines - 1 - np.arange(len(lines))
        return first_row + rows + 1 + np.searchsorted(rows_before, first_row + rows, side="right")


def _open(path: Path) -> tuple[pa.NativeFile, pa.NativeFile]:
    raw = pa.OSFile(str(path), "rb")
    stream = pa.CompressedInputStream(raw, "gzip") if path.name.endswith(".gz") else raw
    return raw, stream


def _in_background(work: Callable[[], None]) -> Callable[[], None]:
    """Run ``work`` in a thread; the returned ``join`` waits for it and re-raises its error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # re-raised by join
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return join


def _read_ahead(reader: pa_csv.CSVStreamingReader, depth: int = 2) -> Iterator[pa.RecordBatch]:
    """Yield the reader's batches while a background thread reads the next ones.

    pyarrow releases the GIL while it decompresses and splits text, so reading overlaps with our parsing
    and Parquet writing. The reader itself stays single-threaded: only then does it report line numbers.
    If the consumer stops early (an error while parsing), the reader thread is told to stop and joined.
    """
    batches: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in reader:
                if stop.is_set():
                    return
                batches.put(batch)
        finally:
            batches.put(None)

    join = _in_background(produce)
    finished = False
    try:
        while (batch := batches.get()) is not None:
            yield batch
        finished = True
    finally:
        if not finished:
            stop.set()
            while batches.get() is not None:  # unblock the reader's pending put, up to its final None
                pass
        join()


class _WriteBehind:
    """Writes Parquet row groups in a background thread, at most ``depth`` tables behind.

    A failed write is re-raised by ``close``; the thread keeps taking tables until then, so ``write``
    never waits on a thread that has stopped.
    """

    def __init__(self, writer: pq.ParquetWriter, depth: int = 1):
        self._tables: queue.Queue = queue.Queue(maxsize=depth)
        self._writer = writer
        self._join = _in_background(self._drain)

    def _drain(self) -> None:
        error: BaseException | None = None
        while (table := self._tables.get()) is not None:
            if error is None:
                try:
                    self._writer.write_table(table)
                except BaseException as failure:  # re-raised through close()
                    error = failure
        if error is not None:
            raise error

    def write(self, table: pa.Table) -> None:
        self._tables.put(table)

    def close(self) -> None:
        self._tables.put(None)
        self._join()


def _csv_reader(
    stream: pa.NativeFile, block_size: int, tracker: _LineTracker, columns: list[str]
) -> pa_csv.CSVStreamingReader:
    """All fields as bytes: parsed from their bytes, so a byte that is not UTF-8 rejects its line only."""
    column_types = dict.fromkeys(columns, pa.binary())
    return pa_csv.open_csv(
        stream,
        read_options=pa_csv.ReadOptions(column_names=columns, block_size=block_size, use_threads=False),
        parse_options=pa_csv.ParseOptions(
            delimiter="\t", quote_char=False, ignore_empty_lines=False, invalid_row_handler=tracker.handle
        ),
        convert_options=pa_csv.ConvertOptions(column_types=column_types, strings_can_be_null=True),
    )


class _PartWriter:
    """A ParquetWriter for one day's rows, or (``rows_per_file``) for a new file every that many rows.

    File k goes to ``path_of(k)``, opened on its first row; ``parts`` and ``rows`` say what was written.
    Call it with the schema to use it as a context manager.
    """

    def __init__(self, path_of: Callable[[int], Path], rows_per_file: int | None = None):
        self.path_of, self.rows_per_file = path_of, rows_per_file or float("inf")
        self.schema: pa.Schema | None = None
        self.parts: list[Path] = []
        self.rows: list[int] = []
        self._writer: pq.ParquetWriter | None = None

    def __call__(self, schema: pa.Schema) -> _PartWriter:
        self.schema = schema
        return self

    def write_table(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None or self.rows[-1] == self.rows_per_file:
                self._next()
            take = int(min(table.num_rows, self.rows_per_file - self.rows[-1]))
            self._writer.write_table(table.slice(0, take))
            self.rows[-1] += take
            table = table.slice(take)

    def _next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.parts.append(self.path_of(len(self.parts)))
        self.rows.append(0)
        self._writer = pq.ParquetWriter(self.parts[-1], self.schema)

    def __enter__(self) -> _PartWriter:
        return self

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()


def _stream_day(
    source: Path, parts: _PartWriter, block_size: int, progress: bool | None, layout: RawLayout
) -> tuple[int, list[Reject]]:
    """Parse ``source`` block by block into ``parts``; returns (rows written, rejects)."""
    tracker = _LineTracker()
    rejects: list[Reject] = []
    rows = rows_seen = pending_rows = 0
    pending: list[pa.RecordBatch] = []
    raw, stream = _open(source)
    bar = progress_bar(source.stat().st_size, source.name, "B", progress)
    try:
        with parts(layout.parquet_schema.with_metadata(source_metadata(source))) as parquet:
            writer = _WriteBehind(parquet)
            try:
                for batch in _read_ahead(_csv_reader(stream, block_size, tracker, layout.raw_columns)):
                    typed, bad = parse_batch(batch)
                    bad_rows = np.array([row for row, _, _ in bad], dtype=np.int64)
                    if bad:
                        lines = tracker.lines(rows_seen, bad_rows)
                        rejects += [
                            Reject(int(line), why, text) for line, (_, why, text) in zip(lines, bad, strict=True)
                        ]
                    if layout.line_numbers:
                        kept = np.setdiff1d(np.arange(batch.num_rows), bad_rows, assume_unique=True)
                        lines = pa.array(tracker.lines(rows_seen, kept))
                        typed = pa.RecordBatch.from_arrays([*typed.columns, lines], schema=layout.parquet_schema)
                    rows_seen += batch.num_rows
                    rows += typed.num_rows
                    pending.append(typed)
                    pending_rows += typed.num_rows
                    if pending_rows >= _ROW_GROUP_ROWS:
                        writer.write(pa.Table.from_batches(pending))
                        pending, pending_rows = [], 0
                    bar.update(raw.tell() - bar.n)
                    bar.set_postfix(rows=f"{rows:,}", refresh=False)
                if pending_rows:
                    writer.write(pa.Table.from_batches(pending))
            finally:
                writer.close()
    except pa.ArrowInvalid as error:
        if "Empty CSV file" in str(error):
            raise IngestionError(f"{source}: no valid Criteo row: the file is empty.") from error
        raise IngestionError(f"{source}: cannot be read as Criteo TSV: {error}") from error
    except OSError as error:  # a truncated or corrupt .gz, a failing disk
        raise IngestionError(
            f"{source}: reading failed after {rows_seen:,} lines ({rows:,} rows converted, {raw.tell():,} of "
            f"{source.stat().st_size:,} bytes read): {error}. The file is damaged or incomplete (an interrupted "
            "download?): fetch it again. No Parquet was written for this day."
        ) from error
    finally:
        bar.close()
        stream.close()
    return rows, sorted(rejects + tracker.malformed, key=lambda reject: reject.line)


def _check_rejects(source: Path, rows: int, rejects: list[Reject], rejects_path: Path, max_fraction: float) -> None:
    total = rows + len(rejects)
    if rows == 0:
        raise IngestionError(f"{source}: no valid Criteo row in {total:,} lines." + _describe(rejects, rejects_path))
    if len(rejects) > max_fraction * total:
        raise IngestionError(
            f"{source}: {len(rejects):,} of {total:,} lines rejected ({len(rejects) / total:.3%}), more than "
            f"ingestion.max_reject_fraction={max_fraction}."
            + _describe(rejects, rejects_path)
            + "\nFix the file, or accept a share of bad lines with "
            "`kedro run --params=ingestion.max_reject_fraction=0.001`."
        )


def convert_day(
    source: Path,
    destination: Path,
    *,
    layout: RawLayout = TRAINING_LAYOUT,
    **options,
) -> DayReport:
    """Convert one raw day file into one Parquet file, streaming.

    Memory stays bounded by ``block_size`` and one row group, whatever the file size. The Parquet file
    appears (atomically) only when the day converts within ``max_reject_fraction``.

    Args:
        source: ``day_<N>``, ``day_<N>.gz`` or a Kaggle ``train.txt``.
        destination: the Parquet file to write.
        layout: labelled (the default) or not, line numbers kept or not (see ``is_labelled``).
        options: ``max_reject_fraction`` (share of bad lines tolerated, default 0; above it the conversion
            fails), ``block_size`` (bytes of decompressed text parsed at a time, default 4 MB),
            ``progress`` (a progress bar; None: only on a terminal).

    Raises:
        IngestionError: too many bad lines, or no row at all; the message names the file, the count
            and the first bad lines, and the rejects file holds every one of them.
    """
    started = time.perf_counter()
    destination.parent.mkdir(parents=True, exist_ok=True)
    rejects_path = destination.with_name(destination.name.removesuffix(".parquet") + ".rejects.tsv")
    partial = destination.with_name(destination.name + ".partial")
    rows, rejects = _convert(source, _PartWriter(lambda _: partial), rejects_path, layout, **options)
    os.replace(partial, destination)
    report = DayReport(
        source=str(source),
        parquet=str(destination),
        rows=rows,
        rejected=len(rejects),
        rejects_file=str(rejects_path) if rejects else None,
        input_bytes=source.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
    )
    logger.info(
        "{}: {:,} rows -> {} ({:,} rejected) in {:.1f}s ({:,.0f} rows/s)",
        source.name,
        rows,
        destination,
        len(rejects),
        report.seconds,
        rows / max(report.seconds, 1e-9),
    )
    return report


def _convert(
    source: Path,
    parts: _PartWriter,
    rejects_path: Path,
    layout: RawLayout,
    *,
    max_reject_fraction: float = 0.0,
    block_size: int = 4 << 20,
    progress: bool | None = None,
) -> tuple[int, list[Reject]]:
    """Stream ``source`` into ``parts``, write its rejects and check their share; on any failure the
    partial files are deleted, so no output is left behind. Returns (rows written, rejects)."""
    rejects_path.unlink(missing_ok=True)
    try:
        rows, rejects = _stream_day(source, parts, block_size, progress, layout)
        if rejects:
            _write_rejects(rejects_path, source, rejects)
        _check_rejects(source, rows, rejects, rejects_path, max_reject_fraction)
    except BaseException:
        for part in parts.parts:
            part.unlink(missing_ok=True)
        raise
    return rows, rejects


def split_day(source: Path, output_dir: Path, rows_per_day: int, **options) -> list[DayReport]:
    """Convert one big raw file (Kaggle's ``train.txt``) into Parquet days of ``rows_per_day`` rows each,
    ``<name>_0000.parquet``, ``<name>_0001.parquet``, ..., in one streaming pass, rows in file order.

    Rejected lines (with their line numbers in the big file) go to ``<name>.rejects.tsv``; the days appear
    together, atomically, only when the file converts within ``max_reject_fraction``. ``options`` as for
    ``convert_day``.
    """
    started = time.perf_counter()
    output_dir.mkdir(parents=True, exist_ok=True)
    name = day_name(source)
    rejects_path = output_dir / f"{name}.rejects.tsv"
    writer = _PartWriter(lambda k: output_dir / f"{name}_{k:04d}.parquet.partial", rows_per_day)
    rows, rejects = _convert(source, writer, rejects_path, TRAINING_LAYOUT, **options)
    for stale in output_dir.glob(f"{name}_[0-9][0-9][0-9][0-9].parquet"):
        stale.unlink()  # days of an earlier split with another rows_per_day
    seconds = round(time.perf_counter() - started, 3)
    reports = []
    for index, (part, part_rows) in enumerate(zip(writer.parts, writer.rows, strict=True)):
        destination = part.with_name(part.name.removesuffix(".partial"))
        os.replace(part, destination)
        first = index == 0  # the rejects of the whole file are reported once
        reports.append(
            DayReport(str(source), str(destination), part_rows, len(rejects) if first else 0,
                      str(rejects_path) if rejects and first else None, source.stat().st_size if first else 0, seconds)
        )  # fmt: skip
    logger.info(
        "{}: {:,} rows -> {} days of up to {:,} rows in {}", source.name, rows, len(reports), rows_per_day, output_dir
    )
    return reports


def split_or_reuse(
    source: Path, output_dir: Path, rows_per_day: int, *, force: bool = False, **options
) -> list[DayReport]:
    """``split_day``, unless ``output_dir`` holds days split from ``source`` as it is now, ``rows_per_day`` each."""
    name = day_name(source)
    parts = sorted(output_dir.glob(f"{name}_[0-9][0-9][0-9][0-9].parquet"))
    rows = [pq.ParquetFile(part).metadata.num_rows for part in parts]
    if (
        not force
        and parts
        and all(made_from(part, source) for part in parts)
        and all(count == rows_per_day for count in rows[:-1])
        and 0 < rows[-1] <= rows_per_day
    ):
        logger.info("{}: already split into {} days in {}; skipped", source.name, len(parts), output_dir)
        return [
            DayReport(str(source), str(part), count, 0, None, 0, 0.0) for part, count in zip(parts, rows, strict=True)
        ]
    return split_day(source, output_dir, rows_per_day, **options)


def convert_or_reuse(
    source: Path,
    destination: Path,
    *,
    force: bool = False,
    layout: RawLayout = TRAINING_LAYOUT,
    **options,
) -> DayReport:
    """``convert_day``, unless ``destination`` was already made from ``source`` as it is now, in ``layout``.

    ``options`` go to ``convert_day`` (``max_reject_fraction``, ``block_size``, ``progress``).
    """
    if not force and _still_valid(destination, source, layout):
        rejects = destination.with_name(destination.name.removesuffix(".parquet") + ".rejects.tsv")
        report = DayReport(
            source=str(source),
            parquet=str(destination),
            rows=pq.ParquetFile(destination).metadata.num_rows,
            rejected=sum(1 for _ in rejects.open()) - 1 if rejects.exists() else 0,
            rejects_file=str(rejects) if rejects.exists() else None,
            input_bytes=source.stat().st_size,
            seconds=0.0,
        )
        logger.info("{}: already converted to {} ({:,} rows); skipped", source.name, destination, report.rows)
        return report
    return convert_day(source, destination, layout=layout, **options)


# Peak memory of one conversion: a 4 MB block, one 262,144-row group in flight, the interpreter and pyarrow.
CONVERSION_MEMORY = 1 << 30


def convert_days(
    pairs: list[tuple[Path, Path]],
    *,
    workers: int | None = None,
    layouts: list[RawLayout] | None = None,
    **options,
) -> list[DayReport]:
    """``convert_or_reuse`` for each ``(source, destination)``, whole days in parallel worker processes.

    Args:
        pairs: raw files and their Parquet destinations.
        workers: processes; None: one per core, bounded by free memory (``CONVERSION_MEMORY`` each).
        layouts: one per pair (default: labelled, no line numbers).
        options: for ``convert_or_reuse`` (``force``, ``max_reject_fraction``, ``block_size``), and
            ``rows_per_day``: split each file into days of that many rows (``split_day``).

    Returns:
        The reports in the order of ``pairs`` (a split file gives one per day it became); results are
        the same whatever the number of workers.

    Raises:
        IngestionError: the first day that fails, after the other workers stopped (no partial output).
    """
    # About 80 bytes of gzip (about 250 of plain text) per row: the size only decides the default worker count.
    rows_guess = sum(Path(source).stat().st_size // (80 if str(source).endswith(".gz") else 250) for source, _ in pairs)
    workers = choose_workers(workers, len(pairs), CONVERSION_MEMORY, rows_guess)
    convert = partial(_convert_task, progress=False if workers > 1 else None, **options)
    tasks = [(*pair, layout) for pair, layout in zip(pairs, layouts or [TRAINING_LAYOUT] * len(pairs), strict=True)]
    reports: list[list[DayReport]] = [[] for _ in pairs]
    started = time.perf_counter()
    with progress_bar(len(pairs), f"converting ({workers} workers)", "file") as bar:
        for index, converted in run_parallel(convert, tasks, workers):
            reports[index] = converted
            rows = sum(r.rows for done in reports for r in done)
            bar.set_postfix(
                rows=f"{rows:,}", rows_per_s=f"{rows / (time.perf_counter() - started):,.0f}", refresh=False
            )
            bar.update(1)
    return [report for converted in reports for report in converted]


def _convert_task(
    source: Path, destination: Path, layout: RawLayout, rows_per_day: int | None = None, **options
) -> list[DayReport]:
    if rows_per_day:
        return split_or_reuse(source, destination.parent, rows_per_day, **options)
    return [convert_or_reuse(source, destination, layout=layout, **options)]


def _still_valid(destination: Path, source: Path, layout: RawLayout) -> bool:
    if not destination.exists() or not made_from(destination, source):
        return False
    return pq.read_schema(destination).names == layout.parquet_schema.names


def is_labelled(source: Path) -> bool:
    """Whether a raw day file has labels: its first line has 40 fields (39: Criteo's unlabelled test files)."""
    with _open(source)[1] as stream:
        first = stream.read(1 << 16).split(b"\n", 1)[0]
    fields = first.rstrip(b"\r").count(b"\t") + 1
    if fields not in (NUM_RAW_FIELDS, NUM_RAW_FIELDS - 1):
        return True  # the line is bad either way; it is rejected with its field count
    return fields == NUM_RAW_FIELDS


def _describe(rejects: list[Reject], rejects_path: Path) -> str:
    if not rejects:
        return ""
    first = "\n".join(f"  line {r.line}: {r.reason}" for r in rejects[:_MAX_REPORTED])
    return f" First bad lines:\n{first}\nEvery rejected line is in {rejects_path}."


def _write_rejects(path: Path, source: Path, rejects: list[Reject]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(["file", "line", "reason", "text"])
        writer.writerows((str(source), r.line, r.reason, r.text) for r in rejects)

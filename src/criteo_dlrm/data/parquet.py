"""Typed Criteo Parquet days (ours, or the predecessor project's): written with page checksums, read back
verified, as numpy column batches.

A day ingestion writes carries a CRC32 checksum in every data page (verified on every read) and a sidecar
``<day>.parquet.fingerprint`` holding the fingerprint of its footer (``lineage.parquet_fingerprint``), which
covers what the pages cannot: row groups, offsets, statistics and the raw file it came from. A flipped bit
anywhere in the file is refused with the day's name, never read as other numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from criteo_dlrm.common.errors import DataError, Fix, Remedy
from criteo_dlrm.common.schema import COLUMNS, LABEL_COLUMN, PREDECESSOR_SPARSE_MISSING, check_parquet_schema
from criteo_dlrm.common.storage import write_bytes_atomically
from criteo_dlrm.data.lineage import FORMAT_KEY, PARQUET_FORMAT, parquet_fingerprint
from criteo_dlrm.data.source_days import SourceDay

BATCH_ROWS = 1 << 18
# How ingestion writes a day: a checksum in every page, so damage is found on read.
WRITE_OPTIONS = {"write_page_checksum": True}
FINGERPRINT_SUFFIX = ".fingerprint"


_CONVERT_AGAIN = Fix(pipelines="ingestion")
# The fix for a damaged day.
REINGEST = Remedy(f"Convert it again: `{_CONVERT_AGAIN}` (a damaged day is rebuilt from its raw file).", _CONVERT_AGAIN)


class MissingDataError(DataError, FileNotFoundError):
    """A Parquet day that an earlier run wrote is gone."""


class DamagedDayError(DataError):
    """A Parquet day whose pages or footer are not what ingestion wrote."""


def fingerprint_path(path: str | Path) -> Path:
    return Path(f"{path}{FINGERPRINT_SUFFIX}")


def seal_day(path: str | Path) -> str:
    """Record the fingerprint of a day just written (its sidecar); returns it."""
    fingerprint = parquet_fingerprint(path)
    write_bytes_atomically(fingerprint_path(path), fingerprint.encode())
    return fingerprint


def written_by_ingestion(day: pq.ParquetFile) -> bool:
    """Whether ``day`` carries this project's page checksums (and so must have a fingerprint sidecar)."""
    metadata = day.schema_arrow.metadata or {}
    return metadata.get(FORMAT_KEY.encode()) == str(PARQUET_FORMAT).encode()


def sealed(path: str | Path) -> bool:
    """Whether ingestion recorded the day's fingerprint (Parquet from other tools, or a copy, has none)."""
    return fingerprint_path(path).exists()


def _check_sealed(path: Path) -> None:
    sidecar = fingerprint_path(path)
    if sidecar.exists() and sidecar.read_text().strip() != parquet_fingerprint(path):
        raise DamagedDayError(
            f"{path}: its footer is not what ingestion wrote (damaged or edited). {REINGEST}", fix=REINGEST
        )


def open_day(path: str | Path, labelled: bool = True) -> pq.ParquetFile:
    """Open one day's Parquet after checking its footer and that it has the Criteo columns (``DataError``
    naming the file if not); reads through it verify every page's checksum.

    ``labelled=False`` accepts days without the label column (scoring's input).
    """
    path = Path(path)
    if not path.exists():
        raise MissingDataError(f"{path}: Parquet day not found. Run `{_CONVERT_AGAIN}` first.", fix=_CONVERT_AGAIN)
    try:
        day = pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as error:
        raise DamagedDayError(f"{path}: not a readable Parquet file ({error}). {REINGEST}", fix=REINGEST) from error
    _check_sealed(path)
    check_parquet_schema(day.schema_arrow, str(path), labelled)
    return day


def read_checked(path: str | Path, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` of the day ``path``; a page that fails its checksum or cannot be decoded is refused."""
    try:
        yield from batches
    except (OSError, pa.ArrowException) as error:
        raise DamagedDayError(f"{path}: a data page is damaged ({error}). {REINGEST}", fix=REINGEST) from error


def verify_day(path: str | Path) -> None:
    """Read every page of a day (checksums verified); raises ``DataError`` naming it when one is damaged.

    Costs one read of the file (about 0.1 s per million rows, benchmarks/integrity.py).
    """
    day = open_day(path, labelled=False)
    for _ in read_checked(path, day.iter_batches(batch_size=BATCH_ROWS)):
        pass


def _int64_parts(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None]:
    """An int64 column's values (anything where null) and its validity (None: no nulls), read from the
    Arrow buffers without a copy: 2-4x faster than ``fill_null`` + ``to_numpy``."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    validity, data = column.buffers()[:2]
    offset, rows = column.offset, len(column)
    values = np.frombuffer(data, dtype=np.int64, count=offset + rows)[offset:]
    if column.null_count == 0:
        return values, None
    present = np.unpackbits(np.frombuffer(validity, np.uint8), count=offset + rows, bitorder="little")[offset:]
    return values, present.view(bool)


def sparse_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """int64 ids with -1 for missing (our nulls and the predecessor's -1 alike)."""
    if column.type == pa.int64():
        values, present = _int64_parts(column)
        return values.copy() if present is None else np.where(present, values, PREDECESSOR_SPARSE_MISSING)
    return pc.fill_null(column.cast(pa.int64()), PREDECESSOR_SPARSE_MISSING).to_numpy(zero_copy_only=False)


def dense_values(column: pa.Array | pa.ChunkedArray, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """``(values, missing bool)``; missing values (nulls, and NaN in float columns) are 0 in ``values``."""
    if column.type == pa.int64():
        values, present = _int64_parts(column)
        if present is None:
            return values.astype(dtype), np.zeros(len(values), dtype=bool)
        return np.where(present, values, 0).astype(dtype, copy=False), ~present
    missing = column.is_null().to_numpy(zero_copy_only=False)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        missing |= np.isnan(values)
        values = np.where(missing, 0, values)
    return values.astype(dtype, copy=False), missing


@dataclass(frozen=True)
class DayRows:
    """Rows ``start`` to ``stop`` (excluded) of one Parquet day: a validation day's validation and test halves.

    Wherever days are read (``iter_batches``, ``count_rows``) a ``DayRows`` stands for those rows only.
    """

    path: str
    start: int
    stop: int

    def __str__(self) -> str:
        return f"{self.path} rows {self.start:,} to {self.stop:,}"


Day = str | Path | DayRows


def _day_batches(path: Day, columns: list[str], labelled: bool, batch_rows: int) -> Iterator[pa.RecordBatch]:
    if not isinstance(path, DayRows):
        day = open_day(path, labelled=labelled)
        yield from read_checked(path, day.iter_batches(batch_size=batch_rows, columns=columns))
        return
    day = open_day(path.path, labelled=labelled)
    # Only the row groups that hold the range are read; batches are cut to it.
    groups, position, first = [], 0, None
    for index in range(day.metadata.num_row_groups):
        rows = day.metadata.row_group(index).num_rows
        if position < path.stop and position + rows > path.start:
            groups.append(index)
            first = position if first is None else first
        position += rows
    position = first or 0
    for batch in read_checked(path.path, day.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns)):
        begin, end = max(path.start - position, 0), min(path.stop - position, len(batch))
        position += len(batch)
        if end > begin:
            yield batch.slice(begin, end - begin)


def iter_batches(
    paths: Sequence[Day], columns: Sequence[str] = COLUMNS, batch_rows: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream the given days (or parts of days, ``DayRows``) as record batches of at most ``batch_rows`` rows
    (``BATCH_ROWS`` unless given)."""
    for path in paths:
        yield from _day_batches(path, list(columns), LABEL_COLUMN in columns, batch_rows or BATCH_ROWS)


def count_rows(paths: Sequence[Day]) -> int:
    return sum(
        path.stop - path.start if isinstance(path, DayRows) else open_day(path, labelled=False).metadata.num_rows
        for path in paths
    )


def recorded_rows(day: SourceDay) -> Day:
    """The rows a lineage record (``lineage.day_lineage``) stands for: its ``row_range`` of the day, or all of it."""
    if day.row_range:
        start, stop = day.row_range
        return DayRows(str(day.parquet), int(start), int(stop))
    return str(day.parquet)

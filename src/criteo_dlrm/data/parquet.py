"""Reading typed Criteo Parquet days (ours, or the seed project's) as numpy column batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from criteo_dlrm.errors import DataError
from criteo_dlrm.schema import COLUMNS, LABEL_COLUMN, SEED_SPARSE_MISSING, check_parquet_schema

BATCH_ROWS = 1 << 18


class MissingDataError(DataError, FileNotFoundError):
    """A Parquet day that an earlier run wrote is gone."""


def open_day(path: str | Path, labelled: bool = True) -> pq.ParquetFile:
    """Open one day's Parquet after checking it has the Criteo columns (``DataError`` naming the file if not).

    ``labelled=False`` accepts days without the label column (scoring's input).
    """
    if not Path(path).exists():
        raise MissingDataError(f"{path}: Parquet day not found. Run `kedro run --pipelines=ingestion` first.")
    day = pq.ParquetFile(path)
    check_parquet_schema(day.schema_arrow, str(path), labelled)
    return day


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
    """int64 ids with -1 for missing (our nulls and the seed's -1 alike)."""
    if column.type == pa.int64():
        values, present = _int64_parts(column)
        return values.copy() if present is None else np.where(present, values, SEED_SPARSE_MISSING)
    return pc.fill_null(column.cast(pa.int64()), SEED_SPARSE_MISSING).to_numpy(zero_copy_only=False)


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


def iter_batches(paths: Sequence[str | Path], columns: Sequence[str] = COLUMNS) -> Iterator[pa.RecordBatch]:
    """Stream the given days as record batches of at most ``BATCH_ROWS`` rows."""
    for path in paths:
        yield from open_day(path, labelled=LABEL_COLUMN in columns).iter_batches(
            batch_size=BATCH_ROWS, columns=list(columns)
        )


def count_rows(paths: Sequence[str | Path]) -> int:
    return sum(open_day(path, labelled=False).metadata.num_rows for path in paths)

"""pyarrow's streaming CSV reader set up for Criteo TSV, and the map from its rows back to line numbers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from criteo_dlrm.data.raw.rejects import Reject


class LineTracker:
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


def csv_reader(
    stream: pa.NativeFile, block_size: int, tracker: LineTracker, columns: list[str]
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

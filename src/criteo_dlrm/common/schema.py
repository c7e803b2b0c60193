"""The Criteo click-log layout, defined once.

Raw rows are ``label \\t I1..I13 \\t C1..C26`` with empty fields for missing values. Typed Parquet keeps
the predecessor project's column names so its files load too.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from criteo_dlrm.common.errors import DataError, Fix

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_RAW_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

LABEL_COLUMN = "labels"
DENSE_COLUMNS = [f"DENSE_{i}" for i in range(NUM_DENSE)]
SPARSE_COLUMNS = [f"SPARSE_{i}" for i in range(NUM_SPARSE)]
COLUMNS = [LABEL_COLUMN, *DENSE_COLUMNS, *SPARSE_COLUMNS]
FEATURE_COLUMNS = [*DENSE_COLUMNS, *SPARSE_COLUMNS]
LINE_COLUMN = "line"

# Missing values are nulls in our Parquet. The predecessor's Parquet used 0 for dense and -1 for sparse;
# PREDECESSOR_SPARSE_MISSING is read as missing too so those files still load.
PREDECESSOR_SPARSE_MISSING = -1

PARQUET_SCHEMA = pa.schema(
    [pa.field(LABEL_COLUMN, pa.int8(), nullable=False)]
    + [pa.field(name, pa.int64()) for name in DENSE_COLUMNS]
    + [pa.field(name, pa.int64()) for name in SPARSE_COLUMNS]
)


@dataclass(frozen=True)
class RawLayout:
    """What a raw day file holds, and what its Parquet keeps.

    Training days are labelled (40 fields); Criteo's test files have no label (39 fields). Scoring keeps
    each row's line number in the raw file, so a prediction can be joined back to its input line.
    """

    labelled: bool = True
    line_numbers: bool = False

    @property
    def raw_columns(self) -> list[str]:
        return COLUMNS if self.labelled else FEATURE_COLUMNS

    @property
    def parquet_schema(self) -> pa.Schema:
        schema = PARQUET_SCHEMA if self.labelled else PARQUET_SCHEMA.remove(0)
        return schema.append(pa.field(LINE_COLUMN, pa.int64(), nullable=False)) if self.line_numbers else schema


# training.dense_transform: a dense count x becomes log1p(max(x + offset, 0)), then standardised with the training
# days' mean and deviation (a missing count: 0, the mean) or not (a missing count as x = 0).
# standardised: this project's; log_plus_3: MLPerf's and TorchRec's preprocessing, log(x + 3) with missing as 0.
DENSE_TRANSFORMS = {
    "standardised": {"offset": 0, "standardise": True},
    "log_plus_3": {"offset": 2, "standardise": False},
}


def check_parquet_schema(schema: pa.Schema, source: str, labelled: bool = True) -> None:
    """Raise ``DataError`` naming ``source`` when ``schema`` lacks a Criteo column or types it wrongly.

    Integer widths may differ (the predecessor wrote int32/float columns); anything non-numeric is refused.
    """
    expected = COLUMNS if labelled else FEATURE_COLUMNS
    missing = [name for name in expected if name not in schema.names]
    if missing:
        fix = Fix(pipelines="ingestion", params={"ingestion.force": True})
        raise DataError(
            f"{source}: not a Criteo day in ingestion's layout: missing columns {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}. Re-create it with `{fix}`.",
            fix=fix,
        )
    bad = [
        f"{name}: {schema.field(name).type}"
        for name in expected
        if not (pa.types.is_integer(schema.field(name).type) or pa.types.is_floating(schema.field(name).type))
    ]
    if bad:
        raise DataError(f"{source}: Criteo columns must be numeric, found {bad[:5]}.")

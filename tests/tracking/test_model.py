"""The checkpoint as an MLflow pyfunc model: raw fields in, the scoring pipeline's probabilities out."""

import gzip

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.schema import DENSE_COLUMNS, FEATURE_COLUMNS, SPARSE_COLUMNS
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.tracking.model import example_rows, signature, typed_rows
from tests.conftest import PROJECT_ROOT


def raw_frame(lines: list[str]) -> pd.DataFrame:
    """Raw click-log lines as the model's input: counts as numbers (NaN missing), categories as hex strings."""
    fields = [line.rstrip("\n").split("\t") for line in lines]
    frame = pd.DataFrame(
        {n: [float(f[1 + i]) if f[1 + i] else np.nan for f in fields] for i, n in enumerate(DENSE_COLUMNS)}
    )
    for i, name in enumerate(SPARSE_COLUMNS):
        frame[name] = [f[14 + i] or None for f in fields]
    return frame


def test_raw_fields_become_the_rows_ingestion_makes_of_the_same_lines(tmp_path):
    with gzip.open(PROJECT_ROOT / "data/01_raw/day_1.gz", "rt") as handle:
        lines = [next(handle) for _ in range(2_000)]
    (tmp_path / "day_9").write_text("".join(lines))
    ingested = pq.read_table(
        convert_day(tmp_path / "day_9", tmp_path / "day_9.parquet").parquet, columns=FEATURE_COLUMNS
    )
    converted = pa.Table.from_batches([typed_rows(raw_frame(lines))])
    assert converted.equals(ingested.cast(converted.schema))
    assert sum(converted.column(name).null_count for name in FEATURE_COLUMNS) > 1_000, "missing values kept missing"


def test_the_example_rows_round_trip_and_fit_the_signature(tmp_path):
    with gzip.open(PROJECT_ROOT / "data/01_raw/day_1.gz", "rt") as handle:
        lines = [next(handle) for _ in range(50)]
    (tmp_path / "day_9").write_text("".join(lines))
    parquet = convert_day(tmp_path / "day_9", tmp_path / "day_9.parquet").parquet
    example = example_rows(parquet, rows=50)
    assert pa.Table.from_batches([typed_rows(example)]).equals(pa.Table.from_batches([typed_rows(raw_frame(lines))]))
    inputs = signature().inputs
    assert inputs.input_names() == FEATURE_COLUMNS and not any(spec.required for spec in inputs.inputs)


def test_a_value_that_is_not_hexadecimal_is_refused_naming_its_column():
    frame = raw_frame(["\t".join(["0"] + [""] * 13 + ["zz"] + ["a"] * 25) + "\n"])
    with pytest.raises(ValueError, match="SPARSE_0: a category value is not a hexadecimal id"):
        typed_rows(frame)
    with pytest.raises(ValueError, match=r"the rows lack the columns \['DENSE_0'"):
        typed_rows(frame.drop(columns=["DENSE_0"]))


@pytest.mark.slow
def test_the_example_rows_are_read_without_reading_the_day(tmp_path):
    """example_rows read the whole validation day for its 5 rows: 0.7 GB of a run's peak with days of 2.7M rows
    (the largest part of it: the run was killed in a 2 GB memory group), 40 times that with a Criteo 1TB day."""
    import subprocess
    import sys

    from criteo_dlrm.data.synthetic import ClickModel, write_day

    write_day(tmp_path / "day_0", 1_000_000, day=0, model=ClickModel(seed=1))
    parquet = convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet").parquet
    script = (
        "import resource, sys\n"
        "from criteo_dlrm.tracking.model import example_rows\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "assert len(example_rows(sys.argv[1])) == 5\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    grown = int(subprocess.run([sys.executable, "-c", script, str(parquet)], capture_output=True, text=True,
                               check=True).stdout.split()[-1])  # fmt: skip
    assert grown < 40_000_000, f"{grown / 1e6:.0f} MB to read 5 rows of a 1M-row day"

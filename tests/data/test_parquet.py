"""Column conversion from Arrow: the buffer fast path must equal Arrow's own null handling."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.data.parquet import dense_values, iter_batches, sparse_values
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.data.synthetic import ClickModel, write_day
from tests.faults import flip


def _columns(seed: int) -> list[pa.Array | pa.ChunkedArray]:
    rng = np.random.default_rng(seed)
    values = rng.integers(-5, 1 << 40, 1_001)
    mask = rng.random(1_001) < 0.3
    with_nulls = pa.array(values, mask=mask, type=pa.int64())
    return [
        with_nulls,
        with_nulls.slice(13, 600),  # an offset that is not a multiple of 8 bits in the validity bitmap
        pa.array(values, type=pa.int64()),  # no validity buffer at all
        pa.chunked_array([with_nulls.slice(0, 500), with_nulls.slice(500)]),
        pa.array(values.astype(np.float64), mask=mask).cast(pa.float64()),  # the predecessor's float columns
    ]


@pytest.mark.parametrize("index", range(5))
def test_sparse_and_dense_values_match_arrow(index: int) -> None:
    column = _columns(0)[index]
    expected = [None if v is None else v for v in column.to_pylist()]
    sparse = sparse_values(column)
    assert sparse.tolist() == [-1 if v is None else int(v) for v in expected]
    values, missing = dense_values(column, np.float32)
    assert missing.tolist() == [v is None for v in expected]
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, np.array([0 if v is None else v for v in expected], dtype=np.float32))


@pytest.mark.parametrize(("start", "stop"), [(0, 2_500), (2_500, 5_000), (999, 1_001), (1_000, 4_000), (4_999, 5_000)])
def test_a_part_of_a_day_reads_exactly_those_rows_across_row_groups(tmp_path, start, stop, monkeypatch):

    from criteo_dlrm.data import parquet

    write_day(tmp_path / "day_0", 5_000, day=0, model=ClickModel(seed=1))
    path = convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet", progress=False).parquet
    whole = pq.read_table(path)
    # Row groups of 1,000 rows and batches of 700: a range starts and ends inside both.
    pq.write_table(whole, tmp_path / "groups.parquet", row_group_size=1_000)
    monkeypatch.setattr(parquet, "BATCH_ROWS", 700)
    part = parquet.DayRows(str(tmp_path / "groups.parquet"), start, stop)
    read = pa.Table.from_batches(list(parquet.iter_batches([part])))
    assert read.equals(whole.slice(start, stop - start).select(read.column_names))
    assert parquet.count_rows([part, path]) == stop - start + 5_000
    record = SourceDay(day="groups", parquet=str(tmp_path / "groups.parquet"), row_range=[start, stop])
    whole_day = SourceDay(day="day_0", parquet=str(path))
    assert parquet.recorded_rows(record) == part and parquet.recorded_rows(whole_day) == str(path)


def test_no_flipped_bit_anywhere_in_a_parquet_day_reads_back_as_other_numbers(converted_day, tmp_path):
    _, parquet, rows = converted_day
    rng = random.Random(0)
    size = parquet.stat().st_size
    refused = 0
    for trial in range(120):
        copy = tmp_path / f"flip_{trial}" / "day_0.parquet"
        copy.parent.mkdir()
        copy.write_bytes(parquet.read_bytes())
        Path(f"{copy}.fingerprint").write_bytes(Path(f"{parquet}.fingerprint").read_bytes())
        flip(copy, rng.randrange(size), rng.randrange(8))
        try:
            read = [row for batch in iter_batches([copy]) for row in batch.to_pylist()]
        except DataError as error:
            assert str(copy) in str(error), "the refusal names the day"
            refused += 1
            continue
        assert read == rows, f"trial {trial}: a flipped bit read back as other numbers"
    assert refused > 100, "nearly every flip lands in checked bytes"

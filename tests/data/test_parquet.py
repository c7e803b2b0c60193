"""Column conversion from Arrow: the buffer fast path must equal Arrow's own null handling."""

import numpy as np
import pyarrow as pa
import pytest

from criteo_dlrm.data.parquet import dense_values, sparse_values


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

"""Deterministic Criteo-format data with a planted click model.

Every row's true click probability is known, so tests and benchmarks can compare a model with the
best achievable AUC and log loss (the "oracle"). The generator streams: a day of any size is written
chunk by chunk, and each chunk is drawn from its own seed, so the same seed, day and chunk size
always give the same bytes.

Run ``python -m criteo_dlrm.data.synthetic --help`` for the command line.
"""

from __future__ import annotations

import argparse
import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from criteo_dlrm.common.schema import NUM_DENSE, NUM_SPARSE

# Cardinalities shaped like Criteo Kaggle's (from 3 to hundreds of thousands, capped at 300k).
VOCABULARY_SIZES = (
    1460, 583, 300_000, 200_000, 305, 24, 12_517, 633, 3, 93_145, 5_683, 250_000, 3_194,
    27, 14_992, 150_000, 10, 5_652, 2_173, 4, 280_000, 18, 15, 100_000, 105, 142_572,
)  # fmt: skip
SPARSE_MISSING_RATES = (
    0, 0, .03, .03, 0, .12, 0, 0, 0, .03, 0, .03, 0, 0, 0, .03, 0, 0, .44, .44, .03, .76, 0, .03, .44, .44,
)  # fmt: skip
DENSE_MISSING_RATES = (0.45, 0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.76, 0.22)
# log-normal location and scale of each count; I2 (index 1) is shifted so that it reaches -3, as in Criteo.
DENSE_LOG_MEAN = (0.7, 2.0, 2.5, 1.8, 8.0, 3.5, 1.5, 2.5, 3.5, 0.3, 1.0, 0.5, 1.5)
DENSE_LOG_STD = (1.2, 2.0, 1.5, 1.0, 2.0, 1.8, 1.4, 1.0, 1.3, 0.7, 0.9, 1.0, 1.2)
I2_SHIFT = 3
SAMPLE_SIZE = 200_000
SIDECAR_SUFFIX = ".click_probability.npy"
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass
class Sample:
    """Rows drawn from the click model."""

    labels: np.ndarray  # (N,) int8
    dense: np.ndarray  # (N, 13) int64
    dense_missing: np.ndarray  # (N, 13) bool
    sparse: np.ndarray  # (N, 26) uint32 hashed ids
    sparse_missing: np.ndarray  # (N, 26) bool
    probability: np.ndarray  # (N,) float32 true click probability


class ClickModel:
    """A planted click-through model over Criteo-like features.

    ``logit = bias + dense effects + per-category effects + low-rank interactions of category pairs``.
    All of its parameters come from ``seed``; ``bias`` is solved so that the mean probability is ``ctr``.
    """

    def __init__(self, seed: int = 0, ctr: float = 0.25, zipf_exponent: float = 1.1, interaction_pairs: int = 10):
        rng = np.random.default_rng([seed, 0x5EED])
        self.seed = seed
        self.dense_weights = rng.normal(0.0, 0.25, NUM_DENSE)
        self.rank_cdfs = []
        self.effects = []  # per feature: (vocabulary + 1,) effect per rank, last entry for missing
        self.id_salts = rng.integers(0, 2**32, NUM_SPARSE, dtype=np.uint64)
        for size in VOCABULARY_SIZES:
            weights = 1.0 / np.arange(1, size + 1) ** zipf_exponent
            self.rank_cdfs.append(np.cumsum(weights) / weights.sum())
            self.effects.append(rng.normal(0.0, rng.uniform(0.1, 0.45), size + 1))
        features = rng.permutation(NUM_SPARSE)
        self.pairs = [(int(features[i]), int(features[(i + 1) % NUM_SPARSE])) for i in range(interaction_pairs)]
        self.factors = {
            feature: rng.normal(0.0, 0.45, (VOCABULARY_SIZES[feature] + 1, 4))
            for pair in self.pairs
            for feature in pair
        }
        self.bias = 0.0
        logits = self._logits(*self._features(np.random.default_rng([seed, 0xB1A5]), SAMPLE_SIZE)[1:])
        low, high = -20.0, 20.0
        for _ in range(60):  # bisection on the bias for the requested base rate
            self.bias = (low + high) / 2
            if _sigmoid(logits + self.bias).mean() > ctr:
                high = self.bias
            else:
                low = self.bias

    def _features(self, rng: np.random.Generator, rows: int):
        counts = np.floor(np.exp(rng.normal(DENSE_LOG_MEAN, DENSE_LOG_STD, (rows, NUM_DENSE)))) - 1
        dense = np.maximum(counts, 0).astype(np.int64)
        dense[:, 1] -= I2_SHIFT
        dense_missing = rng.random((rows, NUM_DENSE)) < np.asarray(DENSE_MISSING_RATES)
        ranks = np.empty((rows, NUM_SPARSE), dtype=np.int64)
        for feature, cdf in enumerate(self.rank_cdfs):
            ranks[:, feature] = np.minimum(np.searchsorted(cdf, rng.random(rows)), len(cdf) - 1)
        sparse_missing = rng.random((rows, NUM_SPARSE)) < np.asarray(SPARSE_MISSING_RATES)
        return rng, dense, dense_missing, ranks, sparse_missing

    def _logits(self, dense, dense_missing, ranks, sparse_missing) -> np.ndarray:
        scaled = (np.log1p(np.maximum(dense, 0)) - np.asarray(DENSE_LOG_MEAN)) / np.asarray(DENSE_LOG_STD)
        logits = np.where(dense_missing, 0.0, scaled) @ self.dense_weights + self.bias
        # Missing categories use the extra last row of each effect table.
        ranks = np.where(sparse_missing, np.asarray(VOCABULARY_SIZES), ranks)
        for feature, effect in enumerate(self.effects):
            logits += effect[ranks[:, feature]]
        for left, right in self.pairs:
            logits += np.einsum("nk,nk->n", self.factors[left][ranks[:, left]], self.factors[right][ranks[:, right]])
        return logits

    def sample(self, rng: np.random.Generator, rows: int) -> Sample:
        """Draw ``rows`` rows and their labels."""
        rng, dense, dense_missing, ranks, sparse_missing = self._features(rng, rows)
        probability = _sigmoid(self._logits(dense, dense_missing, ranks, sparse_missing))
        labels = (rng.random(rows) < probability).astype(np.int8)
        # An odd multiplier makes rank -> id a bijection mod 2**32, so ids never collide within a feature.
        ids = (ranks.astype(np.uint64) * np.uint64(2654435761) + self.id_salts) % np.uint64(2**32)
        return Sample(
            labels, dense, dense_missing, ids.astype(np.uint32), sparse_missing, probability.astype(np.float32)
        )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def hex_strings(ids: np.ndarray, missing: np.ndarray) -> pa.Array:
    """Format uint32 ids as 8 lowercase hex digits, vectorised; ``missing`` rows become nulls."""
    as_bytes = ids.astype(">u4").view(np.uint8).reshape(-1, 4)
    digits = np.empty((len(ids), 8), dtype=np.uint8)
    digits[:, 0::2] = _HEX_DIGITS[as_bytes >> 4]
    digits[:, 1::2] = _HEX_DIGITS[as_bytes & 15]
    offsets = np.arange(0, 8 * len(ids) + 1, 8, dtype=np.int32)
    validity = pa.array(~missing).buffers()[1]
    return pa.Array.from_buffers(
        pa.string(), len(ids), [validity, pa.py_buffer(offsets), pa.py_buffer(digits)], null_count=int(missing.sum())
    )


def to_raw_table(sample: Sample) -> pa.Table:
    """The sample as the 40 raw Criteo string columns (label, I1..I13, C1..C26)."""
    columns = [pc.cast(pa.array(sample.labels), pa.string())]
    columns += [
        pc.cast(pa.array(sample.dense[:, i], mask=sample.dense_missing[:, i]), pa.string()) for i in range(NUM_DENSE)
    ]
    columns += [hex_strings(sample.sparse[:, i], sample.sparse_missing[:, i]) for i in range(NUM_SPARSE)]
    return pa.table(columns, names=[f"f{i}" for i in range(len(columns))])


def write_day(path: Path, rows: int, day: int, model: ClickModel, chunk_rows: int = 100_000) -> Path:
    """Write one raw day file (gzip when ``path`` ends in ``.gz``) and its true probabilities beside it.

    Memory is bounded by ``chunk_rows``. The probabilities go to ``<day>.click_probability.npy``.

    Returns:
        The sidecar file with the true click probability of each row, in file order.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = path.with_name(path.name.removesuffix(".gz") + SIDECAR_SUFFIX)
    probabilities = np.lib.format.open_memmap(sidecar, mode="w+", dtype=np.float32, shape=(rows,))
    options = pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as handle:
        for index, start in enumerate(range(0, rows, chunk_rows)):
            count = min(chunk_rows, rows - start)
            sample = model.sample(np.random.default_rng([model.seed, day, index]), count)
            probabilities[start : start + count] = sample.probability
            pa_csv.write_csv(to_raw_table(sample), handle, write_options=options)
    probabilities.flush()
    return sidecar


def write_days(folder: Path, days: int, rows_per_day: int, seed: int = 0, compress: bool = True) -> list[Path]:
    """Write ``day_0`` .. ``day_<days-1>`` (``.gz`` when ``compress``) into ``folder``."""
    model = ClickModel(seed)
    paths = []
    for day in range(days):
        path = Path(folder) / (f"day_{day}.gz" if compress else f"day_{day}")
        write_day(path, rows_per_day, day, model)
        paths.append(path)
    return paths


def read_probabilities(day_file: Path) -> np.ndarray | None:
    """The true click probabilities written beside a generated day file, or None for real data."""
    sidecar = day_file.with_name(day_file.name.removesuffix(".gz") + SIDECAR_SUFFIX)
    return np.load(sidecar) if sidecar.exists() else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("data/01_raw"), help="folder for day_<N>.gz files")
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--rows-per-day", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gzip", action="store_true", help="write plain day_<N> files")
    args = parser.parse_args(argv)
    for path in write_days(args.output, args.days, args.rows_per_day, args.seed, compress=not args.no_gzip):
        print(path)  # noqa: T201 - command-line output


if __name__ == "__main__":
    main()

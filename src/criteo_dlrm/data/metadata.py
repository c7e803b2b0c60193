"""Feature metadata in streaming passes: counts, capped vocabularies and dense statistics.

Memory grows with the number of distinct category values, never with the number of rows: each
batch is reduced to (value, count) pairs, and those pairs are merged whenever the buffered pairs
outgrow the merged ones, so the total merge work stays O(distinct values x log batches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from loguru import logger

from criteo_dlrm.common.errors import ConfigError, DataError, Fix
from criteo_dlrm.common.parallel import choose_workers, peak_rss_bytes, run_parallel
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import DENSE_COLUMNS, LABEL_COLUMN, SPARSE_COLUMNS
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.feature_metadata import (
    METADATA_FORMAT,
    RESERVED_ROWS,
    FeatureMetadata,
    FeatureVocabularies,
    vocabulary_digest,
)
from criteo_dlrm.data.parquet import count_rows, dense_values, iter_batches, sparse_values

# Buffered (value, count) pairs per feature before a merge: at most max(distinct values, this) pairs.
MERGE_FLOOR = 1 << 16


class ValueCounter:
    """Exact counts of values (int64, or float64 for the predecessor's float dense columns) over a stream, in
    memory proportional to the distinct values."""

    def __init__(self, dtype: type = np.int64) -> None:
        self.values = np.zeros(0, dtype=dtype)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, values: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count ``values`` (or, with ``counts``, distinct ``values`` seen that many times each)."""
        if counts is None:
            values, counts = np.unique(values, return_counts=True)
        self._pending.append((values.astype(self.values.dtype, copy=False), counts.astype(np.int64, copy=False)))
        self._pending_size += len(values)
        if self._pending_size > max(len(self.values), MERGE_FLOOR):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        values = np.concatenate([self.values, *(v for v, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        self.values, inverse = np.unique(values, return_inverse=True)
        self.counts = np.bincount(inverse, weights=counts, minlength=len(self.values)).astype(np.int64)
        self._pending, self._pending_size = [], 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values ascending, counts)``."""
        self._merge()
        return self.values, self.counts


def build_vocabulary(values: np.ndarray, counts: np.ndarray, min_frequency: int, cap: int) -> np.ndarray:
    """Values seen at least ``min_frequency`` times, most frequent first, at most ``cap`` of them.

    Ties are broken by the smaller value, so the vocabulary never depends on the input order.
    Entry ``i`` gets table index ``i + 2`` (``RESERVED_ROWS``): 0 is out of vocabulary, 1 missing.
    """
    keep = counts >= min_frequency
    values, counts = values[keep], counts[keep]
    order = np.lexsort((values, -counts))[:cap]
    return values[order]


# Dense values below this are counted in an array indexed by value (a bincount, grown to the largest value seen:
# most Criteo counts are small); the rest, and fractional values, through a ValueCounter.
_SMALL_DENSE = 1 << 18


class DenseStatistics:
    """Count, missing, min, max, and mean / std of ``log1p(max(x, 0))`` of one dense feature.

    Kept as the exact histogram of ``max(x, 0)`` (the features are integer counts), and summarised from it with
    ``math.log1p`` and ``math.fsum`` (correctly rounded sums): the statistics are the same bits whatever order or
    grouping the rows were counted in, so every counting engine (``compute_feature_metadata``'s workers,
    ``criteo_dlrm.spark``) gives the same ones.
    """

    def __init__(self) -> None:
        self.count = self.missing = 0
        self.low, self.high = np.inf, -np.inf
        self._small = np.zeros(0, dtype=np.int64)
        self._other = ValueCounter(np.float64)

    @classmethod
    def from_histogram(
        cls, values: np.ndarray, counts: np.ndarray, missing: int, low: float | None, high: float | None
    ) -> DenseStatistics:
        """Statistics counted elsewhere: the histogram of ``max(x, 0)``, the missing count, min and max."""
        statistics = cls()
        statistics._other.add(np.asarray(values, dtype=np.float64), np.asarray(counts, dtype=np.int64))
        statistics.count, statistics.missing = int(np.sum(counts)), int(missing)
        if statistics.count:
            statistics.low, statistics.high = float(low), float(high)
        return statistics

    def add(self, values: np.ndarray, missing: np.ndarray) -> None:
        present = values[~missing] if missing.any() else values
        self.count += len(present)
        self.missing += len(values) - len(present)
        if not len(present):
            return
        self.low, self.high = min(self.low, float(present.min())), max(self.high, float(present.max()))
        clipped = np.maximum(present, 0)
        small = (clipped < _SMALL_DENSE) & (clipped == np.floor(clipped))
        if not small.all():
            self._other.add(clipped[~small])
            clipped = clipped[small]
        counts = np.bincount(clipped.astype(np.int64), minlength=len(self._small))
        counts[: len(self._small)] += self._small
        self._small = counts

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(distinct values of max(x, 0) ascending, counts)``."""
        seen = np.flatnonzero(self._small)
        merged = ValueCounter(np.float64)
        merged.add(seen.astype(np.float64), self._small[seen])
        merged.add(*self._other.result())
        return merged.result()

    def summary(self) -> dict:
        values, counts = self.histogram()
        transformed = [math.log1p(value) for value in values.tolist()]
        counts = counts.tolist()
        mean = math.fsum(c * t for c, t in zip(counts, transformed, strict=True)) / self.count if self.count else 0.0
        squares = math.fsum(c * t * t for c, t in zip(counts, transformed, strict=True))
        variance = max(squares / self.count - mean * mean, 0.0) if self.count else 0.0
        return {
            "count": self.count,
            "missing": self.missing,
            "min": self.low if self.count else None,
            "max": self.high if self.count else None,
            "log1p_mean": mean,
            # A constant feature gets std 1 so that standardising never divides by zero.
            "log1p_std": math.sqrt(variance) if variance > 0 else 1.0,
        }


@dataclass
class SparseCounts:
    """What the metadata needs of one categorical feature's exact counts: distinct and missing values, the
    vocabulary (``build_vocabulary``'s rule; empty in modulus-hash mode) and the rows it covers."""

    distinct: int
    missing: int
    vocabulary: np.ndarray
    covered: int

    @classmethod
    def of(cls, values: np.ndarray, counts: np.ndarray, missing: int, min_frequency: int, cap: int | None):
        """From all of a feature's (value, count) pairs; ``cap`` None: modulus-hash mode (no vocabulary)."""
        if cap is None:
            return cls(len(values), missing, np.zeros(0, dtype=np.int64), int(counts.sum()))
        vocabulary = build_vocabulary(values, counts, min_frequency, cap)
        return cls(len(values), missing, vocabulary, int(counts[np.isin(values, vocabulary)].sum()))


class MismatchedVersionsError(DataError):
    """Two inputs that must come from one run (metadata and its vocabularies) come from two."""


def check_vocabularies(metadata: FeatureMetadata, vocabularies: FeatureVocabularies) -> None:
    """Refuse vocabularies that are not the ones ``metadata`` counted (its recorded sha256)."""
    if vocabulary_digest(vocabularies.arrays) != metadata.vocabulary_sha256:
        fix = Fix(pipelines="training", load_versions={"feature_metadata": "<v>", "feature_vocabularies": "<v>"})
        raise MismatchedVersionsError(
            f"feature_vocabularies version {vocabularies.version} are not the vocabularies this feature_metadata "
            f"counted (sha256 {metadata.vocabulary_sha256[:12]}...). Pin both to the same version: `{fix}`.",
            fix=fix,
        )


def _sparse_summary(name: str, counted: SparseCounts, rows: int, config: MetadataConfig) -> dict:
    if config.use_modulus_hash:
        table_size = config.modulus_hash_size or min(counted.distinct, config.cap(name)) + RESERVED_ROWS
    else:
        table_size = len(counted.vocabulary) + RESERVED_ROWS
    present = rows - counted.missing
    return {
        "rows": rows,
        "missing": counted.missing,
        "distinct": counted.distinct,
        "vocabulary_size": len(counted.vocabulary),
        "table_size": int(max(table_size, RESERVED_ROWS + 1)),
        "coverage": counted.covered / present if present else 0.0,
    }


def vocabulary_caps(config: MetadataConfig) -> dict[str, int | None]:
    """Each categorical feature's vocabulary cap; None in modulus-hash mode (no vocabulary is kept)."""
    return {name: None if config.use_modulus_hash else config.cap(name) for name in SPARSE_COLUMNS}


def count_group(
    train_paths: Sequence[str | Path],
    group: list[str],
    dense_group: list[str],
    with_label: bool,
    min_frequency: int,
    caps: dict[str, int | None],
) -> dict:
    """One pass over the training days reading only ``group``'s categorical columns, ``dense_group``'s dense
    ones and, ``with_label``, the label: each categorical feature's ``SparseCounts`` (from its exact value
    counts, which stay in this process), dense statistics, positives.

    Returns a picklable dict, so a worker process can count a group while others count theirs.
    """
    counters = {name: ValueCounter() for name in group}
    missing = dict.fromkeys(group, 0)
    dense = {name: DenseStatistics() for name in dense_group}
    positives = 0
    columns = ([LABEL_COLUMN] if with_label else []) + [*dense_group, *group]
    if not columns:
        raise ValueError("count_group needs at least one column")
    for batch in iter_batches(train_paths, columns):
        if with_label:
            positives += int(np.asarray(batch.column(LABEL_COLUMN)).astype(np.int64).sum())
        for name in dense_group:
            dense[name].add(*dense_values(batch.column(name)))
        for name in group:
            values = sparse_values(batch.column(name))
            present = values[values >= 0]
            missing[name] += len(values) - len(present)
            counters[name].add(present)
    return {
        "sparse": {
            name: SparseCounts.of(*counter.result(), missing[name], min_frequency, caps[name])
            for name, counter in counters.items()
        },
        "dense": dense,
        "positives": positives,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def count_clicks(train_paths: Sequence[str | Path]) -> int:
    """Clicks in the training days (a read of the label column only: about a fortieth of a pass)."""
    return sum(int(np.asarray(batch.column(LABEL_COLUMN)).sum()) for batch in iter_batches(train_paths, [LABEL_COLUMN]))


def feature_groups(features_per_pass: int, workers: int) -> list[tuple[list[str], list[str]]]:
    """``(categorical, dense)`` columns of each pass: the 26 categorical features in groups of at most
    ``features_per_pass``, and with several workers two groups per worker, so that a worker finishing early
    takes another (one group each left the slowest worker with half the job); the dense features are dealt
    over the same groups (a dense column costs about as much to read and summarise as a categorical one).

    Features are dealt round-robin so that every group mixes large and small vocabularies.
    """
    count = -(-len(SPARSE_COLUMNS) // features_per_pass)
    if workers > 1:
        count = max(count, min(2 * workers, len(SPARSE_COLUMNS)))
    return [(list(SPARSE_COLUMNS[start::count]), list(DENSE_COLUMNS[start::count])) for start in range(count)]


# Per worker: the exact counts of its group (16 bytes per distinct value) and their merge; a guess for
# choosing the number of workers by free memory. Criteo 1TB needs a few features per pass (README).
COUNTING_MEMORY = 2 << 30
# Cores one counting pass keeps busy by itself (pyarrow decodes its columns on every core: 92% of 2 cores,
# measured by benchmarks/preprocessing.py): by default one worker per that many cores.
COUNTING_CORES = 2


def effective_config(config: MetadataConfig, rows: int, clicks: int) -> MetadataConfig:
    """``config`` with the min_frequency the training rows' click rate asks for (``min_expected_clicks``)."""
    min_frequency = config.effective_min_frequency(clicks / rows)
    if min_frequency == config.min_frequency:
        return config
    logger.info(
        "CTR {:.4f} ({:,} clicks in {:,} training rows): min_frequency {} instead of {}, so that a value comes "
        "with about {:g} clicks (metadata.min_expected_clicks / CTR)",
        clicks / rows, clicks, rows, min_frequency, config.min_frequency, config.min_expected_clicks,
    )  # fmt: skip
    return replace(config, min_frequency=min_frequency)


def check_training_paths(train_paths: Sequence[str | Path]) -> None:
    if not train_paths:
        raise ConfigError("No training day: set metadata.validation_days so that at least one day is left to train on.")


def no_rows_error(train_paths: Sequence[str | Path]) -> DataError:
    return DataError(f"The training days {list(map(str, train_paths))} hold no rows.")


def assemble_metadata(
    rows: int,
    positives: int,
    sparse: dict[str, SparseCounts],
    dense: dict[str, DenseStatistics],
    config: MetadataConfig,
) -> tuple[FeatureMetadata, dict[str, np.ndarray]]:
    """``feature_metadata`` and the vocabularies from what a counting engine counted (the same whichever)."""
    vocabularies = {name: sparse[name].vocabulary for name in SPARSE_COLUMNS}
    metadata = FeatureMetadata(
        format=METADATA_FORMAT,
        encoding="modulus_hash" if config.use_modulus_hash else "vocabulary",
        rows=rows,
        positives=positives,
        click_rate=positives / rows,
        min_frequency=config.min_frequency,
        dense={name: dense[name].summary() for name in DENSE_COLUMNS},
        sparse={name: _sparse_summary(name, sparse[name], rows, config) for name in SPARSE_COLUMNS},
        vocabulary_sha256=vocabulary_digest(vocabularies),
    )
    return metadata, vocabularies


def compute_feature_metadata(
    train_paths: Sequence[str | Path], config: MetadataConfig, progress: bool | None = None
) -> tuple[FeatureMetadata, dict[str, np.ndarray]]:
    """Streaming passes over the training days, one per group of features, in ``config.workers`` processes.

    Each pass reads only its columns from Parquet and keeps exact counts for its features only, so peak
    memory per worker follows the distinct values of at most ``features_per_pass`` features, never the
    number of rows. The result does not depend on the grouping or the number of workers (nor on the engine:
    ``criteo_dlrm.spark.metadata`` counts the same with Spark).

    Returns:
        ``(metadata, vocabularies)``: ``metadata`` the label, dense and sparse statistics and table sizes
        (``to_dict``: the catalog's stored form); ``vocabularies`` maps each sparse feature to its int64 values, most frequent first
        (empty arrays in modulus-hash mode).
    """
    check_training_paths(train_paths)
    total_rows = count_rows(train_paths)
    if total_rows == 0:
        raise no_rows_error(train_paths)
    config = effective_config(config, total_rows, count_clicks(train_paths))
    workers = choose_workers(config.workers, len(SPARSE_COLUMNS), COUNTING_MEMORY, total_rows, COUNTING_CORES)
    paths = list(map(str, train_paths))
    groups = feature_groups(config.features_per_pass, workers)
    caps = vocabulary_caps(config)
    tasks = [
        (paths, group, dense_group, index == 0, config.min_frequency, {name: caps[name] for name in group})
        for index, (group, dense_group) in enumerate(groups)
    ]
    sparse, dense, positives, peaks = {}, {}, 0, []
    with progress_bar(len(tasks), f"feature metadata ({workers} workers)", "pass", progress) as bar:
        for _, counted in run_parallel(count_group, tasks, min(workers, len(tasks)), preload=WORKER_MODULES):
            positives += counted["positives"]
            dense.update(counted["dense"])
            sparse.update(counted["sparse"])
            peaks.append(counted["peak_rss_bytes"])
            bar.update(1)
    logger.info(
        "feature metadata counted in {} passes by {} workers; peak memory per worker process: {} MB",
        len(tasks), workers, ", ".join(f"{peak >> 20:,}" for peak in peaks),
    )  # fmt: skip
    return assemble_metadata(total_rows, positives, sparse, dense, config)

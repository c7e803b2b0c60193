"""Feature metadata in one streaming pass: counts, capped vocabularies and dense statistics.

Memory grows with the number of distinct category values, never with the number of rows: each
batch is reduced to (value, count) pairs, and those pairs are merged whenever the buffered pairs
outgrow the merged ones, so the total merge work stays O(distinct values x log batches).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from criteo_dlrm.data.parquet import count_rows, dense_values, iter_batches, sparse_values
from criteo_dlrm.progress import progress_bar
from criteo_dlrm.schema import DENSE_COLUMNS, LABEL_COLUMN, SPARSE_COLUMNS

METADATA_FORMAT = 1


@dataclass
class MetadataSettings:
    """How vocabularies are built (``parameters_metadata.yml``)."""

    min_frequency: int = 1
    max_vocabulary_size: int = 1_000_000
    vocabulary_size_overrides: dict[str, int] = field(default_factory=dict)
    use_modulus_hash: bool = False
    modulus_hash_size: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.min_frequency < 1:
            problems.append(f"metadata.min_frequency must be >= 1, got {self.min_frequency}")
        if self.max_vocabulary_size < 1:
            problems.append(f"metadata.max_vocabulary_size must be >= 1, got {self.max_vocabulary_size}")
        for name, size in self.vocabulary_size_overrides.items():
            if name not in SPARSE_COLUMNS:
                problems.append(
                    f"metadata.vocabulary_size_overrides: unknown feature {name!r} (use SPARSE_0 .. SPARSE_25)"
                )
            elif size < 1:
                problems.append(f"metadata.vocabulary_size_overrides.{name} must be >= 1, got {size}")
        if self.modulus_hash_size is not None and self.modulus_hash_size < 2:
            problems.append(f"metadata.modulus_hash_size must be >= 2 (or null), got {self.modulus_hash_size}")
        if problems:
            raise ValueError("Invalid metadata parameters:\n  " + "\n  ".join(problems))

    def cap(self, feature: str) -> int:
        return int(self.vocabulary_size_overrides.get(feature, self.max_vocabulary_size))


@dataclass
class FeatureVocabularies:
    """The vocabularies of one ``feature_metadata`` version: ``{SPARSE_i: int64 values, most frequent first}``."""

    arrays: dict[str, np.ndarray]
    version: str | None = None


class ValueCounter:
    """Exact counts of int64 values over a stream, in memory proportional to the distinct values."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, values: np.ndarray) -> None:
        unique, counts = np.unique(values, return_counts=True)
        self._pending.append((unique, counts))
        self._pending_size += len(unique)
        if self._pending_size > max(len(self.values), 1 << 20):
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
    Entry ``i`` gets table index ``i + 1``; index 0 is missing or out of vocabulary.
    """
    keep = counts >= min_frequency
    values, counts = values[keep], counts[keep]
    order = np.lexsort((values, -counts))[:cap]
    return values[order]


def _dense_summary(count: int, missing: int, low: float, high: float, total: float, squares: float) -> dict:
    mean = total / count if count else 0.0
    variance = max(squares / count - mean * mean, 0.0) if count else 0.0
    return {
        "count": count,
        "missing": missing,
        "min": None if not count else low,
        "max": None if not count else high,
        "log1p_mean": mean,
        # A constant feature gets std 1 so that standardising never divides by zero.
        "log1p_std": float(np.sqrt(variance)) if variance > 0 else 1.0,
    }


def vocabulary_digest(vocabularies: dict[str, np.ndarray]) -> str:
    """sha256 of the vocabularies, to tie a checkpoint to the exact vocabularies it was trained with."""
    digest = hashlib.sha256()
    for name in sorted(vocabularies):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(vocabularies[name], dtype=np.int64).tobytes())
    return digest.hexdigest()


def compute_feature_metadata(
    train_paths: Sequence[str | Path], settings: MetadataSettings, progress: bool | None = None
) -> tuple[dict, dict[str, np.ndarray]]:
    """One streaming pass over the training days.

    Returns:
        ``(metadata, vocabularies)``: ``metadata`` is JSON-ready (label, dense and sparse statistics,
        table sizes); ``vocabularies`` maps each sparse feature to its int64 values, most frequent first
        (empty arrays in modulus-hash mode).
    """
    if not train_paths:
        raise ValueError("No training day: set metadata.validation_days so that at least one day is left to train on.")
    total_rows = count_rows(train_paths)
    if total_rows == 0:
        raise ValueError(f"The training days {list(map(str, train_paths))} hold no rows.")
    counters = {name: ValueCounter() for name in SPARSE_COLUMNS}
    missing = dict.fromkeys(SPARSE_COLUMNS, 0)
    dense = {name: [0, 0, np.inf, -np.inf, 0.0, 0.0] for name in DENSE_COLUMNS}
    rows = positives = 0
    with progress_bar(total_rows, "feature metadata", "rows", progress) as bar:
        for batch in iter_batches(train_paths):
            rows += batch.num_rows
            positives += int(np.asarray(batch.column(LABEL_COLUMN)).astype(np.int64).sum())
            for name in SPARSE_COLUMNS:
                values = sparse_values(batch.column(name))
                present = values[values >= 0]
                missing[name] += len(values) - len(present)
                counters[name].add(present)
            for name in DENSE_COLUMNS:
                values, is_missing = dense_values(batch.column(name))
                present = values[~is_missing]
                transformed = np.log1p(np.maximum(present, 0))
                stats = dense[name]
                stats[0] += len(present)
                stats[1] += int(is_missing.sum())
                if len(present):
                    stats[2] = min(stats[2], float(present.min()))
                    stats[3] = max(stats[3], float(present.max()))
                stats[4] += float(transformed.sum())
                stats[5] += float(np.square(transformed).sum())
            bar.update(batch.num_rows)

    vocabularies: dict[str, np.ndarray] = {}
    sparse = {}
    for name in SPARSE_COLUMNS:
        values, counts = counters[name].result()
        if settings.use_modulus_hash:
            vocabulary = np.zeros(0, dtype=np.int64)
            table_size = settings.modulus_hash_size or min(len(values), settings.cap(name)) + 1
            covered = int(counts.sum())
        else:
            vocabulary = build_vocabulary(values, counts, settings.min_frequency, settings.cap(name))
            table_size = len(vocabulary) + 1
            covered = int(counts[np.isin(values, vocabulary)].sum())
        vocabularies[name] = vocabulary
        present = rows - missing[name]
        sparse[name] = {
            "rows": rows,
            "missing": missing[name],
            "distinct": len(values),
            "vocabulary_size": len(vocabulary),
            "table_size": int(max(table_size, 2)),
            "coverage": covered / present if present else 0.0,
        }
    metadata = {
        "format": METADATA_FORMAT,
        "encoding": "modulus_hash" if settings.use_modulus_hash else "vocabulary",
        "label": {"rows": rows, "positives": positives, "ctr": positives / rows},
        "dense": {name: _dense_summary(*dense[name]) for name in DENSE_COLUMNS},
        "sparse": sparse,
        "vocabulary_sha256": vocabulary_digest(vocabularies),
    }
    return metadata, vocabularies

"""What the metadata pipeline counted and every later stage reads: ``feature_metadata`` as a record with fields,
the vocabularies beside it, and the table rows the encoding reserves.

A leaf module: the counting engines (``data.metadata``, ``spark.metadata``), the encoder and the lineage all
import it, and it imports none of them. The stored form (the catalog's JSON) is read and written only through
``FeatureMetadata.from_dict`` and ``to_dict``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from criteo_dlrm.common.records import typed
from criteo_dlrm.common.schema import DENSE_COLUMNS, SPARSE_COLUMNS
from criteo_dlrm.data.source_days import SourceDays

# Table rows of each categorical feature: a value the vocabulary does not hold, a missing value (a row of
# its own: in click logs a missing value has an effect of its own, while rare values average out), then the
# vocabulary, most frequent first. feature_metadata of format 1 (and the checkpoints made with it) kept
# missing and unseen values together in row 0, the vocabulary from row 1.
OUT_OF_VOCABULARY_ROW = 0
MISSING_ROW = 1
RESERVED_ROWS = 2
# 2: each table has a row for missing values of its own (``MISSING_ROW``); 1: missing and unseen values shared
# row 0.
METADATA_FORMAT = 2
# Written by the catalog's JSON dataset beside the content (its digest), not part of the record.
_DATASET_KEYS = ("content_sha256",)
# The fields the stored form keeps in its ``label``, by their names there.
_LABEL_KEYS = {"rows": "rows", "positives": "positives", "click_rate": "ctr"}


@dataclass(frozen=True)
class FeatureMetadata:
    """What one metadata pass counted over the training days.

    ``dense`` and ``sparse`` hold each feature's statistics as counted (dense: ``count``, ``missing``, ``min``,
    ``max``, ``log1p_mean``, ``log1p_std``; sparse: ``rows``, ``missing``, ``distinct``, ``vocabulary_size``,
    ``table_size``, ``coverage``), keyed by column name. ``source_days`` (the days split into training,
    validation and test), ``parameters`` (the metadata settings), ``counted_in`` (the version a rerun reused
    it from unchanged) and ``counted_because`` (why the latest version was not reused, when there was one) are set
    by the metadata pipeline; None where it was made before them.
    """

    encoding: str  # "vocabulary" or "modulus_hash"
    rows: int  # training rows counted
    click_rate: float  # the training rows'
    dense: Mapping[str, Mapping]
    sparse: Mapping[str, Mapping]
    vocabulary_sha256: str
    format: int = METADATA_FORMAT
    positives: int | None = None  # clicks among the rows (None: stored before it was)
    min_frequency: int | None = None  # the threshold applied, after the small-data rule (None: stored before)
    source_days: SourceDays | None = None
    parameters: dict | None = None
    counted_in: str | None = None
    counted_because: str | None = None
    # Keys of the stored form this version does not know, kept so that reading and writing loses nothing.
    other: Mapping = field(default_factory=dict)

    @classmethod
    def from_dict(cls, stored: Mapping) -> FeatureMetadata:
        """The record of the catalog's stored form (format 1 when it names none); a record is returned as it is."""
        if isinstance(stored, FeatureMetadata):
            return stored
        values = {key: value for key, value in stored.items() if key not in _DATASET_KEYS}
        label = values.pop("label")
        names = {f.name for f in fields(cls)} - {"other", *_LABEL_KEYS}
        known = {"format": 1, **{name: value for name, value in values.items() if name in names}}  # 1: named none
        counts = {name: label[key] for name, key in _LABEL_KEYS.items() if key in label}
        others = {key: value for key, value in values.items() if key not in names}
        return cls(**typed(cls, known), **counts, other=others)

    def to_dict(self) -> dict:
        """The stored form: what ``from_dict`` reads (the optional keys only when set)."""
        label = {"rows": self.rows, "positives": self.positives, "ctr": self.click_rate}
        stored = {
            "format": self.format,
            "encoding": self.encoding,
            "label": {key: value for key, value in label.items() if value is not None},
            "min_frequency": self.min_frequency,
            "dense": {name: dict(values) for name, values in self.dense.items()},
            "sparse": {name: dict(values) for name, values in self.sparse.items()},
            "vocabulary_sha256": self.vocabulary_sha256,
            **self.other,
        }
        days = self.source_days.to_dict() if self.source_days is not None else None
        optional = {"source_days": days, "parameters": self.parameters, "counted_in": self.counted_in,
                    "counted_because": self.counted_because}  # fmt: skip
        stored = {**stored, **optional}
        return {key: value for key, value in stored.items() if value is not None or key in self.other}

    @property
    def table_sizes(self) -> list[int]:
        """Each categorical feature's table size, in column order (``SPARSE_COLUMNS``), whatever order the
        stored form lists them in."""
        return [int(self.sparse[name]["table_size"]) for name in SPARSE_COLUMNS]

    @property
    def uses_modulus_hash(self) -> bool:
        return self.encoding == "modulus_hash"

    @property
    def has_missing_row(self) -> bool:
        """Format 2 on: missing values have a table row of their own; format 1: they share row 0 with unseen ones."""
        return self.format >= 2

    @property
    def dense_means(self) -> np.ndarray:
        return np.array([self.dense[name]["log1p_mean"] for name in DENSE_COLUMNS])

    @property
    def dense_stds(self) -> np.ndarray:
        return np.array([self.dense[name]["log1p_std"] for name in DENSE_COLUMNS])

    def counting_version(self, version: str | None) -> str | None:
        """The version that counted this content: ``version`` (the one it was loaded from), or the earlier one a
        rerun reused it from unchanged. Rows encoded from it and runs trained on it carry this one, so a rerun
        of the same command reuses and resumes them."""
        return self.counted_in or version


@dataclass
class FeatureVocabularies:
    """The vocabularies of one ``feature_metadata`` version: ``{SPARSE_i: int64 values, most frequent first}``."""

    arrays: dict[str, np.ndarray]
    version: str | None = None


def vocabulary_digest(vocabularies: dict[str, np.ndarray]) -> str:
    """sha256 of the vocabularies, to tie a checkpoint to the exact vocabularies it was trained with."""
    digest = hashlib.sha256()
    for name in sorted(vocabularies):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(vocabularies[name], dtype=np.int64).tobytes())
    return digest.hexdigest()

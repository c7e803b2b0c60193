import dataclasses
import json

import numpy as np

from criteo_dlrm.common.schema import DENSE_COLUMNS, SPARSE_COLUMNS
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.source_days import SourceDay


def _stored(**changes) -> dict:
    """feature_metadata as the catalog stores it, written out by hand (format 2, every optional key)."""
    stored = {
        "format": 2,
        "encoding": "vocabulary",
        "label": {"rows": 1000, "positives": 250, "ctr": 0.25},
        "min_frequency": 3,
        "dense": {
            name: {"count": 900, "missing": 100, "log1p_mean": i / 10, "log1p_std": 1 + i}
            for i, name in enumerate(DENSE_COLUMNS)
        },
        "sparse": {
            name: {"distinct": 40, "vocabulary_size": 30, "table_size": 32 + i} for i, name in enumerate(SPARSE_COLUMNS)
        },
        "vocabulary_sha256": "ab" * 32,
        "source_days": {"train": [{"day": "day_0"}], "validation": [], "test": []},
        "parameters": {"min_frequency": 3},
        "counted_in": "2026-01-01T00.00.00.000Z",
    }
    return {**stored, **changes}


def test_the_stored_form_reads_into_fields_and_writes_back_unchanged():
    stored = _stored()
    metadata = FeatureMetadata.from_dict(json.loads(json.dumps(stored)))
    assert (metadata.rows, metadata.positives, metadata.click_rate, metadata.min_frequency) == (1000, 250, 0.25, 3)
    assert metadata.table_sizes == [32 + i for i in range(26)] and not metadata.uses_modulus_hash
    assert np.array_equal(metadata.dense_means, np.arange(13) / 10) and np.array_equal(
        metadata.dense_stds, 1 + np.arange(13)
    )
    assert metadata.has_missing_row and metadata.source_days.train == [SourceDay(day="day_0")]
    assert metadata.to_dict() == stored
    assert FeatureMetadata.from_dict(metadata.to_dict()) == metadata


def test_an_earlier_format_keeps_what_it_lacks_lacking_and_a_key_this_version_does_not_know():
    stored = _stored(label={"rows": 1000, "ctr": 0.25}, future_key=[1, 2])
    for key in ("format", "min_frequency", "source_days", "parameters", "counted_in"):
        del stored[key]
    metadata = FeatureMetadata.from_dict(stored)
    assert metadata.format == 1 and not metadata.has_missing_row  # missing values share row 0 with unseen ones
    assert metadata.positives is None and metadata.min_frequency is None and metadata.source_days is None
    assert metadata.to_dict() == {**stored, "format": 1}


def test_the_catalogs_digest_is_not_part_of_the_record():
    metadata = FeatureMetadata.from_dict({**_stored(), "content_sha256": "cd" * 32})
    assert "content_sha256" not in metadata.to_dict() and metadata == FeatureMetadata.from_dict(_stored())


def test_table_sizes_come_in_column_order_whatever_order_the_stored_form_lists_them_in():
    listed_backwards = {name: {"table_size": 2 + i} for i, name in reversed(list(enumerate(SPARSE_COLUMNS)))}
    assert list(listed_backwards) != SPARSE_COLUMNS
    assert FeatureMetadata.from_dict(_stored(sparse=listed_backwards)).table_sizes == [2 + i for i in range(26)]


def test_the_version_that_counted_it_is_the_one_a_rerun_reused_it_from_else_the_one_it_was_loaded_from():
    metadata = FeatureMetadata.from_dict(_stored())
    assert metadata.counting_version("2026-02-02T00.00.00.000Z") == "2026-01-01T00.00.00.000Z"
    assert dataclasses.replace(metadata, counted_in=None).counting_version("v2") == "v2"

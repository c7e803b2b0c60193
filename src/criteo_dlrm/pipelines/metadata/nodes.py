"""Metadata nodes: thin adapters over ``criteo_dlrm.data.splits`` and ``criteo_dlrm.data.metadata``."""

from __future__ import annotations

from loguru import logger

from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.data.metadata import FeatureMetadata, FeatureVocabularies, compute_feature_metadata
from criteo_dlrm.data.splits import split_days


def compute_metadata(ingestion_report: dict, metadata: dict) -> tuple[dict, FeatureVocabularies]:
    """Compute ``feature_metadata`` and ``feature_vocabularies`` from the training days."""
    config = MetadataConfig.from_dict(metadata, "metadata.")
    train, validation, test = split_days(ingestion_report["days"], config)
    # test: what evaluation reports on, never used to choose or calibrate the model (empty: the validation rows).
    source_days = {"train": train, "validation": validation, "test": test}
    feature_metadata, vocabularies = compute_feature_metadata([day["parquet"] for day in train], config)
    feature_metadata["source_days"] = source_days
    feature_metadata["parameters"] = config.to_dict()
    typed = FeatureMetadata(feature_metadata)
    tables = typed.table_sizes
    logger.info(
        "feature metadata: {:,} training rows, CTR {:.4f}, {} tables with {:,} rows in all (largest {:,})",
        typed.rows,
        typed.click_rate,
        len(tables),
        sum(tables),
        max(tables),
    )
    return feature_metadata, FeatureVocabularies(vocabularies)

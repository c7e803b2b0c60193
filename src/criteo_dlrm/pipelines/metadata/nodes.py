"""Metadata nodes: thin adapters over ``criteo_dlrm.data.splits`` and ``criteo_dlrm.data.metadata``."""

from __future__ import annotations

from loguru import logger

from criteo_dlrm.config import MetadataConfig, PreprocessingConfig
from criteo_dlrm.data.metadata import FeatureMetadata, FeatureVocabularies, compute_feature_metadata
from criteo_dlrm.data.splits import split_days


def compute_metadata(ingestion_report: dict, metadata: dict, preprocessing: dict) -> tuple[dict, FeatureVocabularies]:
    """Compute ``feature_metadata`` and ``feature_vocabularies`` from the training days (on Spark with
    ``preprocessing.engine: spark``: the same results)."""
    config = MetadataConfig.from_dict(metadata, "metadata.")
    engine = PreprocessingConfig.from_dict(preprocessing, "preprocessing.").engine
    train, validation, test = split_days(ingestion_report["days"], config)
    # test: what evaluation reports on, never used to choose or calibrate the model (empty: the validation rows).
    source_days = {"train": train, "validation": validation, "test": test}
    if engine == "spark":
        from criteo_dlrm.spark.metadata import count_on_spark as compute
    else:
        compute = compute_feature_metadata
    feature_metadata, vocabularies = compute([day["parquet"] for day in train], config)
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

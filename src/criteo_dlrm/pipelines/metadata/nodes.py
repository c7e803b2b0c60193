"""Metadata nodes: thin adapters over ``criteo_dlrm.data.metadata``."""

from __future__ import annotations

from loguru import logger

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.data.lineage import check_days, day_lineage
from criteo_dlrm.data.metadata import FeatureVocabularies, MetadataSettings, compute_feature_metadata


def split_days(
    days: list[dict], validation_days: list[str] | None, train_days: list[str] | None
) -> tuple[list[dict], list[dict]]:
    """Split the ingested days into training and validation days (default: the last day validates).

    Raises:
        ConfigError: an unknown day name, a day that both trains and validates, or no day left to train on.
    """
    names = [day["day"] for day in days]
    validation = list(validation_days) if validation_days else names[-1:]
    train = list(train_days) if train_days else [name for name in names if name not in validation]
    unknown = [name for name in validation + train if name not in names]
    if unknown:
        raise ConfigError(f"metadata: unknown day(s) {unknown}; the ingested days are {names}.")
    overlap = sorted(set(train) & set(validation))
    if overlap:
        raise ConfigError(
            f"metadata: {overlap} would both train and validate. Change metadata.train_days or metadata.validation_days."
        )
    if not train:
        raise ConfigError(
            f"metadata: no training day is left (days {names}, validation {validation}). Ingest at least two days "
            "(split Kaggle's train.txt into day files, see the README) or set metadata.validation_days."
        )
    by_name = {day["day"]: day for day in days}
    return [by_name[name] for name in train], [by_name[name] for name in validation]


def compute_metadata(ingestion_report: dict, metadata: dict) -> tuple[dict, FeatureVocabularies]:
    """Compute ``feature_metadata`` and ``feature_vocabularies`` from the training days."""
    settings = MetadataSettings(
        min_frequency=metadata["min_frequency"],
        small_data_rows=metadata["small_data_rows"],
        max_vocabulary_size=metadata["max_vocabulary_size"],
        vocabulary_size_overrides=dict(metadata.get("vocabulary_size_overrides") or {}),
        use_modulus_hash=metadata["use_modulus_hash"],
        modulus_hash_size=metadata.get("modulus_hash_size"),
        features_per_pass=metadata.get("features_per_pass", 26),
        workers=metadata.get("workers"),
    )
    train, validation = split_days(
        ingestion_report["days"], metadata.get("validation_days"), metadata.get("train_days")
    )
    check_days(train + validation, "ingestion_report")
    source_days = {
        "train": [day_lineage(day["day"], day["parquet"]) for day in train],
        "validation": [
            {**day_lineage(day["day"], day["parquet"]), "click_probability": day.get("click_probability")}
            for day in validation
        ],
    }
    feature_metadata, vocabularies = compute_feature_metadata([day["parquet"] for day in train], settings)
    feature_metadata["source_days"] = source_days
    feature_metadata["parameters"] = {key: metadata.get(key) for key in sorted(metadata)}
    tables = [feature_metadata["sparse"][name]["table_size"] for name in feature_metadata["sparse"]]
    logger.info(
        "feature metadata: {:,} training rows, CTR {:.4f}, {} tables with {:,} rows in all (largest {:,})",
        feature_metadata["label"]["rows"],
        feature_metadata["label"]["ctr"],
        len(tables),
        sum(tables),
        max(tables),
    )
    return feature_metadata, FeatureVocabularies(vocabularies)

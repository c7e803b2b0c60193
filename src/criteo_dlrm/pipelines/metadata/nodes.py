"""Metadata nodes: thin adapters over ``criteo_dlrm.data.metadata``."""

from __future__ import annotations

from loguru import logger

from criteo_dlrm.common.commands import kedro_run
from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.config.metadata import check_day_names
from criteo_dlrm.data.lineage import check_days, day_lineage
from criteo_dlrm.data.metadata import FeatureVocabularies, compute_feature_metadata


def split_days(days: list[dict], config: MetadataConfig) -> tuple[list[dict], list[dict]]:
    """Split the ingested days into training and validation days (default: the last day validates).

    Raises:
        ConfigError: an unknown day name, or no day left to train on.
    """
    names = [day["day"] for day in days]
    check_day_names(config, names)
    validation = list(config.validation_days) if config.validation_days else names[-1:]
    train = list(config.train_days) if config.train_days else [name for name in names if name not in validation]
    if not train and len(days) == 1:
        # One big file (Kaggle's train.txt has no day structure): split it into 7 days, as Kaggle's 7 days.
        rows_per_day = -(-days[0].get("rows", 7) // 7)
        raise ConfigError(
            f"metadata: the only ingested day, {names[0]}, would validate and none would train. Split the file "
            f"into days: `{kedro_run(params={'ingestion.rows_per_day': rows_per_day})}` (7 days of {rows_per_day:,} "
            "rows; the last one validates)."
        )
    if not train:
        raise ConfigError(
            f"metadata: no training day is left (days {names}, validation {validation}): leave at least one day "
            "out of metadata.validation_days."
        )
    by_name = {day["day"]: day for day in days}
    return [by_name[name] for name in train], [by_name[name] for name in validation]


def compute_metadata(ingestion_report: dict, metadata: dict) -> tuple[dict, FeatureVocabularies]:
    """Compute ``feature_metadata`` and ``feature_vocabularies`` from the training days."""
    config = MetadataConfig.from_dict(metadata, "metadata.")
    train, validation = split_days(ingestion_report["days"], config)
    check_days(train + validation, "ingestion_report")
    source_days = {
        "train": [day_lineage(day["day"], day["parquet"]) for day in train],
        "validation": [
            {**day_lineage(day["day"], day["parquet"]), "click_probability": day.get("click_probability")}
            for day in validation
        ],
    }
    feature_metadata, vocabularies = compute_feature_metadata([day["parquet"] for day in train], config)
    feature_metadata["source_days"] = source_days
    feature_metadata["parameters"] = config.to_dict()
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

"""Metadata nodes: thin adapters over ``criteo_dlrm.data.splits`` and ``criteo_dlrm.data.metadata``."""

from __future__ import annotations

from dataclasses import replace

from loguru import logger

from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.data.feature_metadata import FeatureMetadata, FeatureVocabularies
from criteo_dlrm.data.metadata import MismatchedVersionsError, check_vocabularies
from criteo_dlrm.data.source_days import IngestionReport, SourceDays
from criteo_dlrm.data.splits import split_days
from criteo_dlrm.datasets import Previous
from criteo_dlrm.spark.engines import preprocessing_engine


def compute_metadata(
    ingestion_report: IngestionReport,
    metadata: dict,
    preprocessing: dict,
    previous_feature_metadata: Previous | None = None,
    previous_feature_vocabularies: Previous | None = None,
) -> tuple[FeatureMetadata, FeatureVocabularies]:
    """Compute ``feature_metadata`` and ``feature_vocabularies`` from the training days (on Spark with
    ``preprocessing.engine: spark``: the same results), unless the latest versions were counted from the same
    days (by content) with the same parameters: those are reused, nothing is counted, and the copy names the
    version that counted them (``counted_in``), so rows encoded from them and a run trained on them are reused
    and resumed as theirs."""
    config = MetadataConfig.from_dict(metadata, "metadata.")
    engine = preprocessing_engine(preprocessing)
    # test: what evaluation reports on, never used to choose or calibrate the model (empty: the validation rows).
    source_days = split_days(ingestion_report.days, config)
    reused, why = _reusable(previous_feature_metadata, previous_feature_vocabularies, source_days, config)
    if reused is not None:
        return reused
    counted, vocabularies = engine.count_metadata([day.parquet for day in source_days.train], config)
    counted = replace(counted, source_days=source_days, parameters=config.to_dict(), counted_because=why)
    tables = counted.table_sizes
    logger.info(
        "feature metadata: {:,} training rows, CTR {:.4f}, {} tables with {:,} rows in all (largest {:,})",
        counted.rows,
        counted.click_rate,
        len(tables),
        sum(tables),
        max(tables),
    )
    return counted, FeatureVocabularies(vocabularies)


def _reusable(
    metadata: Previous | None, vocabularies: Previous | None, source_days: SourceDays, config: MetadataConfig
) -> tuple[tuple[FeatureMetadata, FeatureVocabularies] | None, str | None]:
    """The latest metadata and vocabularies, when they belong together and were counted from ``source_days``
    with ``config``'s parameters (and None); else None and why not, in a few words (None when there was no
    version to compare; said in the log and the run's summary)."""
    if metadata is None or vocabularies is None:
        return None, None
    stored: FeatureMetadata = metadata.value
    parameters, then = config.to_dict(), stored.parameters or {}
    why = None
    if stored.source_days != source_days:
        why = f"version {metadata.version} was counted from other days"
    elif stored.parameters != parameters:
        changed = sorted(
            f"metadata.{key}" for key in parameters.keys() | then.keys() if then.get(key) != parameters.get(key)
        )  # fmt: skip
        why = f"version {metadata.version} was counted with other {', '.join(changed)}"
    else:
        try:
            check_vocabularies(stored, vocabularies.value)
        except MismatchedVersionsError:
            why = f"version {metadata.version}'s vocabularies are not its own"
    if why:
        logger.info("feature metadata: counting afresh ({})", why)
        return None, why
    counted_in = stored.counted_in or metadata.version
    logger.info(
        "feature metadata: reused version {} (counted in {} from the same days and parameters); nothing counted",
        metadata.version,
        counted_in,
    )
    kept = replace(stored, counted_in=counted_in, counted_because=None)
    return (kept, FeatureVocabularies(vocabularies.value.arrays)), None

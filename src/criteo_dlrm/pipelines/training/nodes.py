"""Training nodes: thin adapters from parameters and catalog data to ``criteo_dlrm.engine``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loguru import logger

from criteo_dlrm.common.errors import Fix
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.encoding import EncodedDays, FeatureEncoder
from criteo_dlrm.data.feature_metadata import FeatureMetadata, FeatureVocabularies
from criteo_dlrm.data.lineage import LineageError, check_days, encoded_lineage
from criteo_dlrm.data.metadata import check_vocabularies
from criteo_dlrm.data.parquet import recorded_rows
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.datasets import Previous
from criteo_dlrm.engine.trained.reports import TrainingSummary
from criteo_dlrm.spark.engines import preprocessing_engine

if TYPE_CHECKING:  # torch: imported by the run that trains
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint
else:  # the name the annotation reads at run time (Kedro reads every node's type hints)
    Checkpoint = Any


def encode_features(
    feature_metadata: FeatureMetadata, feature_vocabularies: FeatureVocabularies, training: dict, preprocessing: dict
) -> tuple[EncodedDays, EncodedDays]:
    """The training and validation days, to be encoded with this metadata version's vocabularies (in
    ``training.encoding_workers`` processes, or with ``preprocessing.engine: spark`` one Spark task per day).

    The encoding itself happens as the catalog stores them (``EncodedArraysDataset`` writes the rows
    straight to disk, or reuses rows already encoded from the same lineage), so the days never have to
    fit in memory.

    Raises:
        LineageError: a day this metadata version counted is gone or has changed (before any work).
        MismatchedVersionsError: the vocabularies are not the ones this metadata counted.
    """
    config = TrainingConfig.from_dict(training, "training.")
    engine = preprocessing_engine(preprocessing)
    metadata = feature_metadata
    days = metadata.source_days
    check_days(days.train + days.validation, f"feature_metadata version {feature_vocabularies.version}")
    check_vocabularies(metadata, feature_vocabularies)
    encoder = FeatureEncoder.from_metadata(metadata, feature_vocabularies.arrays, config.dense_transform)
    train, validation = (
        EncodedDays(
            encoder,
            [recorded_rows(day) for day in days.split(split)],
            encoded_lineage(
                metadata,
                metadata.counting_version(feature_vocabularies.version),
                days.split(split),
                config.dense_transform,
            ),
            config.encoding_workers,
            shuffle=split == "train",  # stored shuffled: the training loader reads them in large chunks
            run=engine.run,
        )
        for split in ("train", "validation")
    )
    logger.info("{:,} training and {:,} validation rows to encode", len(train), len(validation))
    return train, validation


def _check_encoded(features: EncodedArrays, expected: dict, name: str) -> None:
    """Refuse rows encoded from other days or vocabularies than the metadata this run trains with."""

    def describe(lineage: dict | None) -> str:
        if lineage is None:
            return "unrecorded data"
        days = ", ".join(f"{day['day']} ({day['fingerprint']})" for day in lineage["days"])
        transform = f", dense_transform {lineage['dense_transform']}" if "dense_transform" in lineage else ""
        return f"feature_metadata version {lineage['metadata_version']} on {days}{transform}"

    if features.lineage != expected:
        fix = Fix(pipelines="training")
        raise LineageError(
            f"{name} were encoded with {describe(features.lineage)}, but this run trains with "
            f"{describe(expected)}. Encode them again: `{fix}`.",
            fix=fix,
        )


def train_dlrm(
    train_features: EncodedArrays,
    validation_features: EncodedArrays,
    feature_metadata: FeatureMetadata,
    feature_vocabularies: FeatureVocabularies,
    training: dict,
    run_version: str,
    previous_training_summary: Previous | None = None,
    previous_dlrm_checkpoint: Previous | None = None,
) -> tuple[Checkpoint, TrainingSummary]:
    """Train on ``train_features``, validate on the whole of ``validation_features`` (``engine.training.recipe``); or,
    when the latest finished run (``previous_*``, one version) trained with the same settings on the same rows, reuse
    it.

    Returns:
        ``(dlrm_checkpoint, training_summary)``.

    Raises:
        LineageError: the encoded rows are not the ones this metadata version describes.
        ConfigError: every problem of ``params:training`` at once (names, types, ranges).
    """
    from criteo_dlrm.engine.training.recipe import FinishedRun, run_training  # torch: imported by the run that trains

    config = TrainingConfig.from_dict(training, prefix="training.")
    metadata = feature_metadata
    days = metadata.source_days
    for features, split in ((train_features, "train"), (validation_features, "validation")):
        expected = encoded_lineage(
            metadata, metadata.counting_version(feature_vocabularies.version), days.split(split), config.dense_transform
        )
        _check_encoded(features, expected, f"{split}_features")
    previous = None
    if previous_training_summary and previous_dlrm_checkpoint:
        if previous_training_summary.version == previous_dlrm_checkpoint.version:  # one run's outputs
            previous = FinishedRun(
                previous_training_summary.version, previous_training_summary.value, previous_dlrm_checkpoint.value
            )  # the summary a TrainingSummary, the checkpoint a function that reads its Checkpoint
    return run_training(
        config,
        train_features,
        validation_features,
        metadata,
        feature_vocabularies.arrays,
        run_version,
        feature_vocabularies.version,
        previous,
    )

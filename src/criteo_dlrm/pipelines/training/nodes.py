"""Training nodes: thin adapters from parameters and catalog data to ``criteo_dlrm.engine``."""

from __future__ import annotations

from pathlib import Path

import torch
from loguru import logger

from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import EncodedArrays, EncodedDays, FeatureEncoder
from criteo_dlrm.data.lineage import LineageError, check_days, encoded_lineage
from criteo_dlrm.data.metadata import FeatureVocabularies
from criteo_dlrm.engine.checkpoint import fingerprint, training_checkpoint
from criteo_dlrm.engine.device import compile_model, configure_backends, resolve_device
from criteo_dlrm.engine.loop import Trainer, TrainingSettings
from criteo_dlrm.engine.profiling import ProfilerSettings
from criteo_dlrm.errors import ConfigError
from criteo_dlrm.models import DLRM, DLRMConfig
from criteo_dlrm.schema import NUM_SPARSE

# Parameters that change neither the data order nor the arithmetic: a run may resume across them.
_NOT_IN_FINGERPRINT = (
    "resume", "profiler", "log_every_steps", "tensorboard_dir", "in_progress_dir", "num_threads", "encoding_workers"
)  # fmt: skip


def encode_features(
    feature_metadata: dict, feature_vocabularies: FeatureVocabularies, training: dict
) -> tuple[EncodedDays, EncodedDays]:
    """The training and validation days, to be encoded with this metadata version's vocabularies.

    The encoding itself happens as the catalog stores them (``EncodedArraysDataset`` writes the rows
    straight to disk, or reuses rows already encoded from the same lineage), so the days never have to
    fit in memory.

    Raises:
        LineageError: a day this metadata version counted is gone or has changed (before any work).
    """
    days = feature_metadata["source_days"]
    check_days(days["train"] + days["validation"], f"feature_metadata version {feature_vocabularies.version}")
    encoder = FeatureEncoder.from_metadata(feature_metadata, feature_vocabularies.arrays)
    train, validation = (
        EncodedDays(
            encoder,
            [day["parquet"] for day in days[split]],
            encoded_lineage(feature_metadata, feature_vocabularies.version, days[split]),
            training.get("encoding_workers"),
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
        return f"feature_metadata version {lineage['metadata_version']} on {days}"

    if features.lineage != expected:
        raise LineageError(
            f"{name} were encoded with {describe(features.lineage)}, but this run trains with "
            f"{describe(expected)}. Encode them again: `kedro run --pipelines=training`."
        )


def model_config(training: dict, feature_metadata: dict) -> DLRMConfig:
    """The DLRM's sizes: table sizes from the metadata, everything else from ``params:training``."""
    sizes = training["sparse_embedding_sizes"]
    dims = [int(sizes)] * NUM_SPARSE if isinstance(sizes, int) else [int(s) for s in sizes]
    return DLRMConfig(
        table_sizes=[stats["table_size"] for stats in feature_metadata["sparse"].values()],
        embedding_dims=dims,
        dense_hidden_sizes=list(training["dense_mlp"]["hidden_layer_sizes"]),
        dense_output_size=int(training["dense_mlp"]["output_size"]),
        prediction_hidden_sizes=list(training["prediction_hidden_sizes"]),
        interaction=training["interaction"],
        dcn_layers=int(training["dcn"]["num_layers"]),
        dcn_rank=int(training["dcn"]["low_rank"]),
    )


def training_settings(training: dict) -> TrainingSettings:
    stopping = training["early_stopping"]
    return TrainingSettings(
        num_epochs=training["num_epochs"],
        batch_size_train=training["batch_size"]["train"],
        batch_size_validation=training["batch_size"]["validation"],
        learning_rate=training["learning_rate"],
        embedding_optimizer=training["embedding_optimizer"],
        embedding_learning_rate=training["embedding_learning_rate"],
        warmup_steps=training["warmup_steps"],
        decay=training["decay"],
        max_steps=training.get("max_steps"),
        validate_every_steps=training["validate_every_steps"] or 0,
        checkpoint_every_steps=training.get("checkpoint_every_steps") or 0,
        early_stopping_patience=stopping["patience"],
        early_stopping_min_delta=stopping["min_delta"],
        log_every_steps=training["log_every_steps"],
        phase_timing=training.get("phase_timing", True),
        seed=training["seed"],
        precision=training["precision"],
        profiler=ProfilerSettings(**training["profiler"]),
    )


def train_dlrm(
    train_features: EncodedArrays,
    validation_features: EncodedArrays,
    feature_metadata: dict,
    feature_vocabularies: FeatureVocabularies,
    training: dict,
    run_version: str,
) -> tuple[dict, dict]:
    """Train on ``train_features``, validate on the whole of ``validation_features``.

    Returns:
        ``(dlrm_checkpoint, training_summary)``: the best checkpoint (weights, optimiser state, step,
        configuration, parameters, metadata version and encoder) and a JSON summary of the run.
    """
    if len(train_features) == 0 or len(validation_features) == 0:
        raise ConfigError(
            "Training needs rows in both the training and the validation days (see feature_metadata.source_days)."
        )
    days = feature_metadata["source_days"]
    for features, split in ((train_features, "train"), (validation_features, "validation")):
        expected = encoded_lineage(feature_metadata, feature_vocabularies.version, days[split])
        _check_encoded(features, expected, f"{split}_features")
    config, settings = model_config(training, feature_metadata), training_settings(training)
    device = resolve_device(training["device"], "training.device")
    backends = configure_backends(device, training["allow_tf32"], training.get("num_threads"))
    torch.manual_seed(settings.seed)
    model = DLRM(config, sparse_gradients=settings.sparse_gradients).to(device)
    if training["compile"]:
        compile_model(model, training["compile_mode"])
    run_fingerprint = fingerprint(
        {k: v for k, v in training.items() if k not in _NOT_IN_FINGERPRINT},
        feature_metadata["vocabulary_sha256"],
        train_features.lineage,
        validation_features.lineage,  # validating on other days is another run, never resumed into
    )
    run_dir = Path(training["tensorboard_dir"]) / run_version
    resume_path = Path(training["in_progress_dir"]) / f"dlrm_{run_fingerprint}.pt" if training["resume"] else None
    pin = device.type == "cuda"
    trainer = Trainer(
        model,
        settings,
        BatchLoader(train_features, settings.batch_size_train, shuffle=True, seed=settings.seed, pin_memory=pin),
        BatchLoader(validation_features, settings.batch_size_validation, pin_memory=pin),
        device,
        run_dir,
        resume_path=resume_path,
        fingerprint=run_fingerprint,
        tensorboard=True,
    )
    run_dir = trainer.run_dir  # a resumed run keeps writing to the folder it started in
    logger.info(
        "training on {} ({}), {:,} parameters, run folder {}",
        device,
        backends,
        sum(p.numel() for p in model.parameters()),
        run_dir,
    )
    result = trainer.fit()
    if resume_path is not None:
        resume_path.unlink(missing_ok=True)  # finished: nothing left to resume
    encoder = FeatureEncoder.from_metadata(feature_metadata, feature_vocabularies.arrays)
    trained_with = {
        "version": feature_vocabularies.version,
        "vocabulary_sha256": feature_metadata["vocabulary_sha256"],
        "train_ctr": feature_metadata["label"]["ctr"],
        "source_days": feature_metadata["source_days"],
    }
    run = {"run_version": run_version, "tensorboard_run": str(run_dir)}
    checkpoint = training_checkpoint(result, config.to_dict(), training, trained_with, encoder.state_dict(), run)
    summary = {
        **run,
        "device": str(device),
        "steps": result.steps,
        "best_step": result.best_step,
        "stopped_early": result.stopped_early,
        "samples_per_second": result.samples_per_second,
        "best_validation": result.best_metrics,
        "history": result.history,
        "metadata_version": feature_vocabularies.version,
        "source_days": days,
    }
    return checkpoint, summary

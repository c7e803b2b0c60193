"""A whole training run, from a configuration and encoded rows to a checkpoint and a summary.

``run_training`` is the one entry point: it runs in this process, or (``distributed.nproc_per_node`` > 1)
starts that many processes through torch.distributed's elastic launcher (``engine.distributed``), each of
which calls ``train_process``. Whatever runs it (the Kedro node, a benchmark, ``torchrun``), a run is
the same: seeding, device, model, loaders, the ``Trainer``, and the checkpoint assembled from its result.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.locks import exclusive
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import EncodedArrays, FeatureEncoder, check_index_range
from criteo_dlrm.engine.calibration import Calibration, describe, fit_calibration
from criteo_dlrm.engine.checkpoint import CHECKPOINT_FORMAT, fingerprint, library_versions, model_from_checkpoint
from criteo_dlrm.engine.device import resolve_device
from criteo_dlrm.engine.distributed import launch
from criteo_dlrm.engine.job import TrainingJob
from criteo_dlrm.engine.loop import TrainingResult
from criteo_dlrm.engine.metrics import log_loss
from criteo_dlrm.engine.process import train_process
from criteo_dlrm.engine.scoring import calibrated, predict
from criteo_dlrm.engine.sharding import check_fused_optimizer, check_replicated_memory, require_torchrec

# Settings that change neither the data order nor the arithmetic: a run may resume across them (the
# number of processes included: every process count sees the same global batches in the same order).
NOT_IN_FINGERPRINT = (
    "resume", "profiler", "log_every_steps", "tensorboard_dir", "in_progress_dir", "num_threads",
    "encoding_workers", "distributed", "calibration",
)  # fmt: skip


def run_training(
    config: TrainingConfig,
    train: EncodedArrays,
    validation: EncodedArrays,
    metadata: dict,
    vocabularies: dict[str, np.ndarray] | None,
    run_version: str,
    metadata_version: str | None = None,
) -> tuple[dict, dict]:
    """Train on ``train``, validate on the whole of ``validation``.

    Args:
        config: the run's configuration.
        train, validation: encoded rows (stored ones are memory-mapped and travel to worker processes by folder).
        metadata: the ``feature_metadata`` they were encoded with (table sizes, vocabulary digest, days).
        vocabularies: its vocabularies (None in modulus-hash mode), kept in the checkpoint for scoring.
        run_version: names the TensorBoard run folder and is recorded in the checkpoint.
        metadata_version: the metadata's catalog version, recorded in the checkpoint.

    Returns:
        ``(checkpoint, summary)``: the best checkpoint (weights, optimiser state, step, configuration,
        metadata version and encoder) and a JSON summary of the run.
    """
    if len(train) == 0 or len(validation) == 0:
        raise ConfigError("Training needs rows in both the training and the validation days.")
    table_sizes = [metadata["sparse"][name]["table_size"] for name in SPARSE_COLUMNS]
    check_index_range(train, table_sizes, "the training rows")
    check_index_range(validation, table_sizes, "the validation rows")
    initial_ctr = metadata["label"]["ctr"] if 0 < metadata["label"]["ctr"] < 1 else None
    model_config = config.model_config(table_sizes, initial_ctr)  # impossible sizes fail before any process starts
    check_replicated_memory(config, model_config)
    device = resolve_device(config.device, "training.device")
    if config.embedding_backend == "torchrec":
        require_torchrec()
        check_fused_optimizer(config, device.type)
    settings = {k: v for k, v in config.to_dict().items() if k not in NOT_IN_FINGERPRINT}
    job = TrainingJob(
        config=config.to_dict(),
        train=str(train.folder) if train.folder is not None else train,
        validation=str(validation.folder) if validation.folder is not None else validation,
        table_sizes=table_sizes,
        # Validating on other days is another run, never resumed into.
        fingerprint=fingerprint(settings, metadata["vocabulary_sha256"], train.lineage, validation.lineage),
        run_version=run_version,
        initial_ctr=initial_ctr,
    )
    # Two runs of the same settings on the same data would share (and overwrite) one in-progress checkpoint.
    with exclusive(job.resume_path, "the in-progress checkpoint") if job.resume_path else contextlib.nullcontext():
        if config.launches_processes and not dist.is_initialized():
            outcome = launch(job, config.distributed)
        else:
            outcome = train_process(job)
    result = outcome.result
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    trained_with = {
        "version": metadata_version,
        "vocabulary_sha256": metadata["vocabulary_sha256"],
        "train_ctr": metadata["label"]["ctr"],
        "source_days": metadata.get("source_days"),
    }
    run = {"run_version": run_version, "tensorboard_run": outcome.run_dir}
    in_progress = job.resume_path
    checkpoint = training_checkpoint(
        result, model_config.to_dict(), config.to_dict(), trained_with, encoder.state_dict(), run
    )
    # Here, once, whatever ran the training (one process, the launcher's, a resumed run): the kept model's
    # logits on the validation rows.
    checkpoint["calibration"] = calibrate(checkpoint, validation, config, device)
    summary = {
        **run,
        "device": outcome.device,
        "processes": outcome.processes,
        "embeddings": outcome.embeddings,
        "steps": result.steps,
        "best_step": result.best_step,
        "stopped_early": result.stopped_early,
        "samples_per_second": result.samples_per_second,
        "best_validation": result.best_metrics,
        "calibration": {key: value for key, value in checkpoint["calibration"].items() if not key.startswith("knots")},
        "history": result.history,
        "metadata_version": metadata_version,
        "source_days": metadata.get("source_days"),
        # Removed once the checkpoint is stored (``finish_run``): until then a rerun resumes from it.
        "in_progress_checkpoint": str(in_progress) if in_progress is not None else None,
    }
    return checkpoint, summary


def calibrate(checkpoint: dict, validation: EncodedArrays, config: TrainingConfig, device: torch.device) -> dict:
    """Fit ``config.calibration`` on the checkpoint's model's logits for the validation rows (``engine.calibration``).

    Returns:
        the calibration's state, with the validation log loss before and after (``validation_log_loss``).
    """
    model = model_from_checkpoint(checkpoint).to(device)
    loader = BatchLoader(validation, config.batch_size.validation)
    scores = predict(model, loader, device, config.precision, output="logit")
    labels = np.asarray(validation.labels)
    state = fit_calibration(labels, scores, config.calibration)
    scores = scores.astype(np.float32)  # the logits as scoring and evaluation hold them
    raw = log_loss(labels, calibrated(Calibration(None), scores))  # the model's own output, as evaluation's "raw"
    after = log_loss(labels, calibrated(Calibration(state), scores))
    state["validation_log_loss"] = {"raw": raw, "calibrated": after}
    logger.info("calibration: {}; validation log loss {:.5f} -> {:.5f}", describe(state), raw, after)
    return state


def finish_run(summary: dict) -> None:
    """Delete a finished run's in-progress checkpoint: call it once the run's checkpoint is stored."""
    path = summary.get("in_progress_checkpoint")
    if path:
        Path(path).unlink(missing_ok=True)


def training_checkpoint(
    result: TrainingResult,
    model_config: dict,
    parameters: dict,
    metadata: dict,
    encoder_state: dict,
    run: dict,
) -> dict[str, Any]:
    """The checkpoint of a finished run: its best weights and everything needed to resume, reproduce or score.

    Args:
        result: what ``Trainer.fit`` returned.
        model_config: ``DLRMConfig.to_dict()``.
        parameters: the training parameters as run (overrides included).
        metadata: which feature metadata it was trained with (version, vocabulary sha256, train CTR, days).
        encoder_state: ``FeatureEncoder.state_dict()``, so scoring uses the exact training vocabularies.
        run: ``run_version`` and ``tensorboard_run``.
    """
    return {
        "format": CHECKPOINT_FORMAT,
        "model_state": result.best_model_state,
        "optimizer_state": result.best_optimizer_state,
        "step": result.best_step,
        "epoch": result.best_epoch,
        "model_config": model_config,
        "training_parameters": parameters,
        "metadata": metadata,
        "encoder": encoder_state,
        "best_validation": result.best_metrics,
        "history": result.history,
        **run,
        "library_versions": library_versions(),
        "created": datetime.now(UTC).isoformat(),
    }

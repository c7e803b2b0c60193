"""A whole training run, from a configuration and encoded rows to a checkpoint and a summary.

``run_training`` is the one entry point: it runs in this process, or (``distributed.nproc_per_node`` > 1)
starts that many processes through torch.distributed's elastic launcher (``engine.distributed``), each of
which calls ``train_process``. Whatever runs it (the Kedro node, a benchmark, ``torchrun``), a run is
the same: seeding, device, model, loaders, the ``Trainer``, and the checkpoint assembled from its result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import EncodedArrays, FeatureEncoder, open_encoded
from criteo_dlrm.engine.checkpoint import CHECKPOINT_FORMAT, fingerprint, library_versions, save_atomically
from criteo_dlrm.engine.config import TrainingConfig
from criteo_dlrm.engine.device import compile_model, configure_backends, resolve_device
from criteo_dlrm.engine.loop import Trainer, TrainingResult
from criteo_dlrm.engine.sharding import (
    check_replicated_memory,
    embedding_bytes,
    log_plan,
    require_torchrec,
    shard_model,
)
from criteo_dlrm.models import DLRM

# Settings that change neither the data order nor the arithmetic: a run may resume across them (the
# number of processes included: every process count sees the same global batches in the same order).
NOT_IN_FINGERPRINT = (
    "resume", "profiler", "log_every_steps", "tensorboard_dir", "in_progress_dir", "num_threads",
    "encoding_workers", "distributed",
)  # fmt: skip


@dataclass
class TrainingJob:
    """Everything a training process needs, picklable: stored rows travel as their folder, not their bytes."""

    config: dict
    train: EncodedArrays | str
    validation: EncodedArrays | str
    table_sizes: list[int]
    fingerprint: str
    run_version: str

    @property
    def run_dir(self) -> Path:
        return Path(self.config["tensorboard_dir"]) / self.run_version

    @property
    def resume_path(self) -> Path | None:
        if not self.config["resume"]:
            return None
        return Path(self.config["in_progress_dir"]) / f"dlrm_{self.fingerprint}.pt"


@dataclass
class TrainingOutcome:
    result: TrainingResult
    run_dir: str
    device: str
    backends: dict
    processes: int
    embeddings: dict  # where the tables lived: the backend, and TorchRec's plan


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
    model_config = config.model_config(table_sizes)  # impossible sizes fail before any process starts
    check_replicated_memory(config, model_config)
    if config.embedding_backend == "torchrec":
        require_torchrec()
    settings = {k: v for k, v in config.to_dict().items() if k not in NOT_IN_FINGERPRINT}
    job = TrainingJob(
        config=config.to_dict(),
        train=_portable(train),
        validation=_portable(validation),
        table_sizes=table_sizes,
        # Validating on other days is another run, never resumed into.
        fingerprint=fingerprint(settings, metadata["vocabulary_sha256"], train.lineage, validation.lineage),
        run_version=run_version,
    )
    if config.launches_processes and not dist.is_initialized():
        from criteo_dlrm.engine.distributed import launch

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
    checkpoint = training_checkpoint(
        result, model_config.to_dict(), config.to_dict(), trained_with, encoder.state_dict(), run
    )
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
        "history": result.history,
        "metadata_version": metadata_version,
        "source_days": metadata.get("source_days"),
    }
    return checkpoint, summary


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


def _portable(arrays: EncodedArrays) -> EncodedArrays | str:
    return str(arrays.folder) if arrays.folder is not None else arrays


def _rows(source: EncodedArrays | str) -> EncodedArrays:
    return open_encoded(Path(source)) if isinstance(source, str) else source


def train_process(job: TrainingJob, device: torch.device | None = None) -> TrainingOutcome:
    """One process's part of a run: all of it alone, or its rank's share in a process group."""
    config = TrainingConfig.from_dict(job.config)
    device = device or resolve_device(config.device, "device")
    # TorchRec shards over a process group, even a group of one.
    own_group = config.embedding_backend == "torchrec" and not dist.is_initialized()
    if own_group:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        return _train(job, config, device)
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(job: TrainingJob, config: TrainingConfig, device: torch.device) -> TrainingOutcome:
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    backends = configure_backends(device, config.allow_tf32, config.num_threads)
    torch.manual_seed(config.seed)  # the same initial weights in every process
    model_config = config.model_config(job.table_sizes)
    sharded = None
    if config.embedding_backend == "torchrec":
        sharded = shard_model(model_config, config, device, SPARSE_COLUMNS)
        model = sharded.module
        embeddings = sharded.summary()
    else:
        model = DLRM(model_config, sparse_gradients=config.sparse_gradients).to(device)
        replicated = embedding_bytes(model_config.table_sizes, model_config.embedding_dims, config.embedding_optimizer)
        embeddings = {"backend": "torch", "bytes_per_process": replicated}
    if config.compile:
        compile_model(model, config.compile_mode)
    pin = device.type == "cuda"
    batches = config.batch_size
    train_loader = BatchLoader(
        _rows(job.train),
        batches.train,
        shuffle=True,
        seed=config.seed,
        pin_memory=pin,
        rank=rank,
        world_size=world_size,
    )
    validation_loader = BatchLoader(_rows(job.validation), batches.validation, pin_memory=pin)
    trainer = Trainer(
        model,
        config,
        train_loader,
        validation_loader,
        device,
        job.run_dir,
        resume_path=job.resume_path,
        fingerprint=job.fingerprint,
        tensorboard=True,
        sharded=sharded,
    )
    if trainer.is_main:
        if sharded is not None:
            log_plan(sharded)
        logger.info(
            "training on {} ({}), {} process(es), {:,} parameters, run folder {}",
            device, backends, world_size, _parameter_count(model, model_config), trainer.run_dir,
        )  # fmt: skip
    result = trainer.fit()
    if job.resume_path is not None and trainer.is_main:
        job.resume_path.unlink(missing_ok=True)  # finished: nothing left to resume
    return TrainingOutcome(result, str(trainer.run_dir), str(device), backends, world_size, embeddings)


def _parameter_count(model: DLRM, model_config) -> int:
    tables = sum(rows * dim for rows, dim in zip(model_config.table_sizes, model_config.embedding_dims, strict=True))
    return tables + sum(p.numel() for p in model.dense_parameters())


def save_outcome(outcome: TrainingOutcome, path: Path) -> None:
    """Rank 0 hands its outcome to the launching process through a file (weights can be gigabytes)."""
    save_atomically({"outcome": outcome, "pid": os.getpid()}, path)

"""One training process's part of a run: all of it alone, or its rank's share in a process group.

Seeding, the device's switches, the model (and its parallel mode), the loaders over the stored rows, and the
``Trainer``. The in-progress checkpoint is left in place: it is removed only once the finished run's
checkpoint is safely stored (``hooks.ProjectHooks``), so a crash in between loses nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.device import compile_model, configure_backends, resolve_device
from criteo_dlrm.engine.job import TrainingJob, TrainingOutcome
from criteo_dlrm.engine.loop import Trainer
from criteo_dlrm.engine.modes import parallel_mode
from criteo_dlrm.engine.sharding import embedding_bytes, log_plan, shard_model
from criteo_dlrm.models import DLRM
from criteo_dlrm.models.dlrm import DLRMConfig


def train_process(job: TrainingJob, device: torch.device | None = None) -> TrainingOutcome:
    """Train ``job`` in this process (alone, or as its rank of the initialised process group)."""
    config = TrainingConfig.from_dict(job.config)
    device = device or resolve_device(config.device, "training.device")
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
    model_config = config.model_config(job.table_sizes, job.initial_ctr)
    if config.embedding_backend == "torchrec":
        model = shard_model(model_config, config, device, SPARSE_COLUMNS)
        embeddings = model.summary()
        module = model.module
    else:
        model = module = DLRM(model_config, sparse_gradients=config.sparse_gradients).to(device)
        replicated = embedding_bytes(
            model_config.table_sizes, model_config.sparse_embedding_sizes, config.embedding_optimizer
        )
        embeddings = {"backend": "torch", "bytes_per_process": replicated}
    if config.compile:
        compile_model(module, config.compile_mode)
    mode = parallel_mode(model, config, device)
    pin = device.type == "cuda"
    train_loader = BatchLoader(
        job.rows("train"),
        config.batch_size.train,
        shuffle=True,
        seed=config.seed,
        pin_memory=pin,
        rank=rank,
        world_size=world_size,
    )
    validation_loader = BatchLoader(job.rows("validation"), config.batch_size.validation, pin_memory=pin)
    trainer = Trainer(
        mode,
        config,
        train_loader,
        validation_loader,
        job.run_dir,
        resume_path=job.resume_path,
        fingerprint=job.fingerprint,
        tensorboard=True,
    )
    if trainer.is_main:
        if embeddings["backend"] == "torchrec":
            log_plan(model)
        logger.info(
            "training on {} ({}), {} process(es), {:,} parameters, run folder {}",
            device, backends, world_size, _parameter_count(module, model_config), trainer.run_dir,
        )  # fmt: skip
    result = trainer.fit()
    return TrainingOutcome(result, str(trainer.run_dir), str(device), backends, world_size, embeddings)


def _parameter_count(model: DLRM, model_config: DLRMConfig) -> int:
    tables = sum(
        rows * dim for rows, dim in zip(model_config.table_sizes, model_config.sparse_embedding_sizes, strict=True)
    )
    return tables + sum(p.numel() for p in model.dense_parameters())

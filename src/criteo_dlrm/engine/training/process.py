"""One training process's part of a run: all of it alone, or its rank's share in a process group.

Seeding, the device's switches, the parallel mode (which builds its model), the loaders over the stored rows,
and the ``Trainer``. The in-progress checkpoint is left in place: it is removed only once the finished run's
checkpoint is safely stored (``hooks.InProgressCheckpointHooks``), so a crash in between loses nothing.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.config.evaluation import PRECISIONS
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.device import configure_backends, resolve_device
from criteo_dlrm.engine.parallel.modes import build_mode, placement_class
from criteo_dlrm.engine.training.job import TrainingJob, TrainingOutcome
from criteo_dlrm.engine.training.loop import Trainer
from criteo_dlrm.engine.training.precision import choose_precision
from criteo_dlrm.engine.training.run_state import resumed_precision


def train_process(job: TrainingJob, device: torch.device | None = None) -> TrainingOutcome:
    """Train ``job`` in this process (alone, or as its rank of the initialised process group)."""
    config = job.config
    device = device or resolve_device(config.device, "training.device")
    with placement_class(config).process_group(device):
        # In a frame of its own, ended (or its error's frames cleared) before a group opened here is destroyed: the
        # model holds it (``engine.parallel.group.destroy_group``).
        return _train_in_group(job, device)


def _train_in_group(job: TrainingJob, device: torch.device) -> TrainingOutcome:
    """The precision, the mode, the loaders and the Trainer's run: this process's part of ``job``."""
    config = job.config
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    backends = configure_backends(device, config.allow_tf32, config.num_threads)
    model_config = config.model_config(job.table_sizes, job.initial_ctr)
    # After the threads: the probes use them.
    precision, why, speedup = choose_precision(config, model_config, device)
    kept = resumed_precision(job.resume_path, job.fingerprint) if config.precision == "auto" else None
    if kept in PRECISIONS and kept != precision:  # the probe's cache or the thread count changed since
        why = f"kept from the in-progress checkpoint, trained in {kept} (auto would choose {precision} now: {why})"
        precision = kept
    if world_size > 1:  # rank 0's choice in every process (each measured its own CPU share)
        chosen = [precision, why, speedup]
        dist.broadcast_object_list(chosen, src=0)
        precision, why, speedup = chosen
    backends |= {"precision": precision} | ({"precision_auto": why} if config.precision == "auto" else {})
    if speedup is not None:
        backends["precision_bf16_step_speedup"] = round(speedup, 3)
    config = dataclasses.replace(config, precision=precision)
    torch.manual_seed(config.seed)  # the same initial weights in every process
    mode = build_mode(model_config, config, device)
    pin = device.type == "cuda"
    train_loader = BatchLoader(
        job.rows("train"),
        config.batch_size.train,
        shuffle=True,
        seed=config.seed,
        pin_memory=pin,
        rank=rank,
        world_size=world_size,
        reading_threads=config.reading_threads,
    )
    validation_loader = BatchLoader(job.rows("validation"), config.batch_size.validation, pin_memory=pin)
    trainer = Trainer(
        mode,
        config,
        train_loader,
        validation_loader,
        job.run_dir,
        resume_path=job.resume_path,
        best_path=job.best_path,
        fingerprint=job.fingerprint,
        tensorboard=True,
        backends=backends,
    )
    if trainer.is_main:
        mode.placement.describe()
        logger.info(
            "training on {} ({}), {} process(es), {:,} parameters, {} lookups a row{}, run folder {}",
            device, backends, world_size, mode.parameter_count(), mode.model.config.lookups_per_row,
            " (multi-hot)" if mode.model.config.multi_hot_sizes else "", trainer.run_dir,
        )  # fmt: skip
    result = trainer.fit()
    return TrainingOutcome(result, str(trainer.run_dir), str(device), backends, world_size, mode.placement.summary())

"""How a run spreads over processes: one object per parallel mode, so the training loop knows none of them.

- ``SingleProcess``: the whole model here; the dense and embedding optimisers of the config.
- ``DataParallel``: N processes with a replica each. The dense layers under ``DistributedDataParallel``
  (backward all-reduces their gradients in buckets as it runs); the sparse embedding gradients left out of
  DDP and all-gathered after backward (DDP's own sparse path is gloo-only and crashed once in our tests).
- ``Sharded``: TorchRec shards the tables across the processes (``engine.parallel.sharding``); their fused optimiser
  runs inside backward, the dense layers are data-parallel; every process writes its own shards of the state
  (``engine.trained.sharded_checkpoint``), nothing is gathered.

Each mode owns building its model (``build``: the DLRM, or TorchRec's sharded one) and describing it (summary,
parameter count), wrapping it, its optimisers, the loss weight and gradient exchange, learning rates, state
(written from the live tensors, and restored), and how predictions over a validation set are gathered and their
metrics computed once. The modes share parts, not a base class: ``Optimizers`` (the optimisers by name and their
rates: ``engine.parallel.optimizers``) and, in the multi-process modes, ``InGroup`` (averages, and predictions gathered
to rank 0 in row order: ``engine.parallel.group``). ``ParallelMode`` lists what the loop and the step call.
``mode_class`` is the one place the backend and the process count choose a mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.device import Runtime, compile_model
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.parallel.group import InGroup, all_gather_row_sets, predict_alone
from criteo_dlrm.engine.parallel.optimizers import Optimizers, summed_rows
from criteo_dlrm.engine.parallel.sharding import (
    ShardedDLRM,
    check_fused_optimizer,
    log_plan,
    require_torchrec,
    shard_model,
)
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.models.dlrm import DLRM, DLRMConfig


@dataclass(frozen=True)
class SavedState:
    """What a mode hands the in-progress checkpoint (``engine.training.run_state``) to write, from its live tensors:
    ``entries`` for the checkpoint's file, and a sharded mode's ``shards`` (this process's tensors, written by every
    process into a folder beside the file; None for a mode that keeps every table in every process)."""

    entries: dict
    shards: dict[str, torch.Tensor] | None = None


@runtime_checkable
class ParallelMode(Protocol):
    """What the loop (``engine.training.loop``), the step (``engine.training.step``), the in-progress checkpoint
    (``engine.training.run_state``) and the process (``engine.training.process``) call on a parallel mode:
    ``SingleProcess``, ``DataParallel`` and ``Sharded`` are the three, ``mode_class`` chooses one."""

    model: DLRM  # evaluation and state read it
    train_model: nn.Module  # the training forward pass runs through it (DDP, TorchRec's DMP, the model)
    device: torch.device
    runtime: Runtime  # the device, the precision and the group's backend
    world_size: int

    @property
    def is_main(self) -> bool: ...

    def summary(self) -> dict: ...
    def describe(self) -> None: ...
    def parameter_count(self) -> int: ...
    def set_learning_rates(self, factor: float) -> None: ...
    def learning_rates(self) -> dict[str, float]: ...
    def zero_grad(self) -> None: ...
    def loss_weight(self, global_rows: int) -> float: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> None: ...
    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor: ...
    def weights_finite(self) -> bool: ...
    def saved_state(self) -> SavedState | None: ...
    def restore_state(self, values: dict, folder: Path | None) -> None: ...
    def predict(self, loader: BatchLoader) -> np.ndarray | None: ...
    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict: ...


def built_dlrm(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> DLRM:
    """The DLRM of ``model_config`` (with the current torch seed) on ``device``, its dense layers compiled when
    ``config.compile``: the model of the modes that hold every table."""
    model = DLRM(model_config, sparse_gradients=config.sparse_gradients).to(device)
    if config.compile:
        compile_model(model, config.compile_mode)
    return model


def tables_in_every_process(model: DLRM, config: TrainingConfig) -> dict:
    """Where the tables live, for the run's summary, when every process holds all of them."""
    sizes = model.config
    return {
        "backend": "torch",
        "bytes_per_process": embedding_bytes(
            sizes.table_sizes, sizes.sparse_embedding_sizes, config.embedding_optimizer
        ),
    }


def parameter_count(model: DLRM) -> int:
    """Every table's values and every dense parameter (the tables counted whole, wherever they live)."""
    config = model.config
    tables = sum(rows * dim for rows, dim in zip(config.table_sizes, config.sparse_embedding_sizes, strict=True))
    return tables + sum(p.numel() for p in model.dense_parameters())


def weights_finite(model: DLRM) -> bool:
    """Whether every weight this process holds is finite."""
    return all(all_finite(t) for t in model.state_dict().values() if t.is_floating_point())


class SingleProcess:
    """The whole model in this process, its optimisers (``Optimizers``), validation here.

    Attributes:
        model: the DLRM (evaluation and state read it).
        train_model: what the training forward pass runs through (the model itself here).
        optimizers: the dense layers' and the tables' optimisers.
    """

    rank, world_size = 0, 1

    def __init__(self, model: DLRM, config: TrainingConfig, device: torch.device):
        self.model, self.config, self.device = model, config, device
        self.train_model: nn.Module = model
        # A group of one (torchrun with one process) still names its backend: where predictions are gathered.
        self.runtime = Runtime(device, config.precision, dist.get_backend() if dist.is_initialized() else None)
        self.optimizers = Optimizers(model, config)

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """What this mode needs of the settings and the machine, refused with the fix before any work (by the
        preflight checks, the recipe before it starts a process, and ``build``): here, nothing.

        Raises:
            ConfigError: a setting this mode cannot run with on ``device``.
        """

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> SingleProcess:
        """The mode with its model (``built_dlrm``)."""
        return cls(built_dlrm(model_config, config, device), config, device)

    @staticmethod
    def process_group(device: torch.device) -> contextlib.AbstractContextManager:
        """What the mode needs around a run in this process: nothing."""
        return contextlib.nullcontext()

    @property
    def is_main(self) -> bool:
        return True

    def summary(self) -> dict:
        return tables_in_every_process(self.model, self.config)

    def describe(self) -> None:
        """Nothing beyond the summary's line."""

    def parameter_count(self) -> int:
        return parameter_count(self.model)

    def set_learning_rates(self, factor: float) -> None:
        self.optimizers.scale(factor)

    def learning_rates(self) -> dict[str, float]:
        return self.optimizers.rates()

    def zero_grad(self) -> None:
        self.optimizers.zero_grad()

    def loss_weight(self, global_rows: int) -> float:
        """What the summed loss of this process's rows is multiplied by: the mean over the global batch."""
        return 1.0 / global_rows

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizers.step()

    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def weights_finite(self) -> bool:
        return weights_finite(self.model)

    def saved_state(self) -> SavedState:
        """The model's and the optimisers' live state (nothing copied)."""
        return SavedState({"model_state": self.model.state_dict(), "optimizer_state": self.optimizers.state_dict()})

    def restore_state(self, values: dict, folder: Path | None) -> None:
        """Put a checkpoint's state (as ``saved_state`` handed it out, loaded again) into the model and the
        optimisers."""
        self.model.load_state_dict(values["model_state"])
        self.optimizers.load_state_dict(values["optimizer_state"])

    def predict(self, loader: BatchLoader) -> np.ndarray:
        """Probabilities for every row of ``loader``, in row order."""
        return predict_alone(self.model, loader, self.runtime)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        """``binary_metrics`` of the validation rows."""
        return binary_metrics(labels, probabilities)


class DataParallel:
    """A replica in every process of the group: DDP for the dense layers, sparse gradients all-gathered,
    validation and averages over the group (``InGroup``)."""

    def __init__(self, model: DLRM, config: TrainingConfig, device: torch.device):
        self.model, self.config, self.device = model, config, device
        self.group = InGroup()
        self.rank, self.world_size = self.group.rank, self.group.world_size
        self.runtime = Runtime(device, config.precision, self.group.backend)
        self.optimizers = Optimizers(model, config)
        self.sparse_parameters = model.embedding_parameters() if config.sparse_gradients else []
        names = {id(p): name for name, p in model.named_parameters()}
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [names[id(p)] for p in self.sparse_parameters]
        )
        # The model's buffers are constants (table offsets, columns): nothing to broadcast before every forward pass.
        self.train_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )

    check = SingleProcess.check  # a replica needs what one process needs
    process_group = SingleProcess.process_group  # the launcher started the group

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> DataParallel:
        """The mode with its replica (``built_dlrm``, the same seed in every process)."""
        return cls(built_dlrm(model_config, config, device), config, device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def summary(self) -> dict:
        return tables_in_every_process(self.model, self.config)

    def describe(self) -> None:
        """Nothing beyond the summary's line."""

    def parameter_count(self) -> int:
        return parameter_count(self.model)

    def set_learning_rates(self, factor: float) -> None:
        self.optimizers.scale(factor)

    def learning_rates(self) -> dict[str, float]:
        return self.optimizers.rates()

    def zero_grad(self) -> None:
        self.optimizers.zero_grad()

    def loss_weight(self, global_rows: int) -> float:
        # DDP averages the processes' gradients: weighting by world_size makes that the global batch's mean.
        return self.world_size / global_rows

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.exchange_sparse_gradients()

    def exchange_sparse_gradients(self) -> None:
        """Average the sparse embedding gradients over the processes, as DDP averages the dense ones.

        Each process's gradient (``summed_rows``: one entry per touched row) is all-gathered as indices and
        values, padded to the longest, so it works on gloo and nccl alike; the optimiser sums duplicates.
        """
        summed = [summed_rows(parameter.grad) for parameter in self.sparse_parameters]  # a wait each (data-sized)
        gathered = all_gather_row_sets(self.world_size, summed) if summed else []  # one wait for every row count
        for parameter, (indices, values) in zip(self.sparse_parameters, gathered, strict=True):
            parameter.grad = torch.sparse_coo_tensor(
                torch.cat(indices).unsqueeze(0),
                torch.cat(values) / self.world_size,
                parameter.grad.shape,
                check_invariants=False,  # built from valid indices just above
            )

    def step(self) -> None:
        self.optimizers.step()

    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        return self.group.mean(values)

    def weights_finite(self) -> bool:
        return weights_finite(self.model)  # every replica holds the same weights

    def saved_state(self) -> SavedState | None:
        """Rank 0's state, as one process's (None on the others): every replica holds the same weights."""
        if not self.is_main:
            return None
        return SavedState({"model_state": self.model.state_dict(), "optimizer_state": self.optimizers.state_dict()})

    def restore_state(self, values: dict, folder: Path | None) -> None:
        self.model.load_state_dict(values["model_state"])
        self.optimizers.load_state_dict(values["optimizer_state"])

    def predict(self, loader: BatchLoader) -> np.ndarray | None:
        """Probabilities for every row of ``loader``, in row order, on rank 0 (None on the others)."""
        return self.group.predict(self.model, loader, self.runtime)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        """``binary_metrics`` of the validation rows, known to every process (``MetricError`` in every one)."""
        return self.group.metrics(labels, probabilities)


class Sharded:
    """Tables sharded by TorchRec across the group (a group of one too), their optimiser fused into backward; the
    dense layers data-parallel; validation and averages over the group (``InGroup``)."""

    def __init__(self, sharded: ShardedDLRM, config: TrainingConfig, device: torch.device):
        self.sharded, self.config, self.device = sharded, config, device
        self.model, self.train_model = sharded.module, sharded.model
        self.group = InGroup()
        self.rank, self.world_size = self.group.rank, self.group.world_size
        self.runtime = Runtime(device, config.precision, self.group.backend)
        self.optimizers = Optimizers(self.model, config)  # the dense layers' (the tables' is fused)

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """TorchRec installed, and FBGEMM's fused kernel for ``training.embedding_optimizer`` on ``device``."""
        require_torchrec()
        check_fused_optimizer(config, device.type)

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> Sharded:
        """The model with TorchRec tables, sharded over the process group (``engine.parallel.sharding.shard_model``)."""
        cls.check(config, device)
        sharded = shard_model(model_config, config, device, SPARSE_COLUMNS)
        if config.compile:
            compile_model(sharded.module, config.compile_mode)
        return cls(sharded, config, device)

    @staticmethod
    @contextlib.contextmanager
    def process_group(device: torch.device) -> Iterator[None]:
        """TorchRec shards over a process group: one of this process alone when none was started."""
        if dist.is_initialized():
            yield
            return
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
        )
        try:
            yield
        finally:
            dist.destroy_process_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def summary(self) -> dict:
        return self.sharded.summary()

    def describe(self) -> None:
        log_plan(self.sharded)

    def parameter_count(self) -> int:
        return parameter_count(self.model)

    def set_learning_rates(self, factor: float) -> None:
        self.optimizers.scale(factor)
        self.sharded.set_learning_rate(self.config.embedding_learning_rate * factor)

    def learning_rates(self) -> dict[str, float]:
        fused = self.sharded.model.fused_optimizer.param_groups[0]["lr"]
        return {**self.optimizers.rates(), "embedding_learning_rate": fused}

    def zero_grad(self) -> None:
        self.optimizers.zero_grad()

    def loss_weight(self, global_rows: int) -> float:
        # Each process's loss is its own rows' mean: DDP averages the dense gradients over the processes and
        # TorchRec's all-to-all backward divides the tables' (summed over the processes) by their number
        # (``torchrec.distributed.comm_ops`` gradient division, on by default), so both are the global mean's.
        return self.world_size / global_rows

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # the tables' optimiser steps inside it

    def step(self) -> None:
        self.optimizers.step()

    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        return self.group.mean(values)

    def weights_finite(self) -> bool:
        """This process's shards and the dense layers finite in every process (the same answer in each)."""
        # On the run's device: NCCL serves CUDA tensors only (a CPU one fails as the Trainer is built, resume on).
        finite = torch.tensor([float(weights_finite(self.model))], device=self.device)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return bool(finite.item())

    def saved_state(self) -> SavedState:
        """This process's own shards (every process writes its own: ``engine.trained.sharded_checkpoint``), nothing
        gathered; the dense optimiser's settings in the file."""
        dense = self.optimizers["dense"].state_dict()
        return SavedState({"dense_param_groups": dense["param_groups"]}, self.sharded.tensors(dense))

    def restore_state(self, values: dict, folder: Path | None) -> None:
        """Put a checkpoint's state into the shards and the dense optimiser: from ``folder``, the state folder its
        file names, or from the file itself (written gathered, before the state was sharded on disk)."""
        if "sharded_state" not in values:  # written gathered, before the state was sharded on disk
            self.sharded.load_model_state(values["model_state"])
            self.sharded.load_optimizer_state(values["optimizer_state"]["fused_embeddings"])
            self.optimizers.load_state_dict(values["optimizer_state"])
            return
        dense = self.sharded.read_tensors(folder, values["sharded_state"]["digests"])
        self.optimizers["dense"].load_state_dict({"state": dense, "param_groups": values["dense_param_groups"]})

    def predict(self, loader: BatchLoader) -> np.ndarray | None:
        """Probabilities for every row of ``loader``, in row order, on rank 0 (None on the others)."""
        return self.group.predict(self.model, loader, self.runtime)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        """``binary_metrics`` of the validation rows, known to every process (``MetricError`` in every one)."""
        return self.group.metrics(labels, probabilities)


# Values per piece of the finiteness check of the weights: ``isfinite`` makes temporaries of about twice a
# tensor's bytes, which for a table of gigabytes would be a second table in memory.
_FINITE_PIECE = 1 << 22


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` (this process's shards of a sharded one) is finite, checked piece by
    piece (no temporary the size of the tensor)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(tensor, ShardedTensor):
        return all(all_finite(shard.tensor) for shard in tensor.local_shards())
    flat = tensor.detach().reshape(-1)
    return all(bool(torch.isfinite(piece).all()) for piece in flat.split(_FINITE_PIECE))


Mode = SingleProcess | DataParallel | Sharded  # the three ``ParallelMode``s, each built by its class


def mode_class(config: TrainingConfig) -> type[Mode]:
    """The parallel mode of a run of ``config`` in this process: TorchRec's sharded tables
    (``embedding_backend: torchrec``), a replica in a process group of more than one, or alone. The one place a
    backend or a process count chooses the code that runs."""
    if config.sharded_tables:
        return Sharded
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return DataParallel
    return SingleProcess


def build_mode(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> Mode:
    """``mode_class(config)`` with its model built; a sharded one needs a process group (its ``process_group``)."""
    return mode_class(config).build(model_config, config, device)

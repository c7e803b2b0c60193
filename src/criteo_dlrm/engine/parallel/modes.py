"""How a run spreads over processes: a ``Mode`` built from two parts, so the training loop knows no mode by name.

- **Where the tables live** (the placement):
  - ``Replicated``: every table in every process, the DLRM and its optimisers. In a group of more than one, the
    dense layers run under ``DistributedDataParallel`` (backward all-reduces their gradients in buckets as it runs);
    the sparse embedding gradients are left out of DDP and all-gathered after backward (DDP's own sparse path is
    gloo-only and crashed once in our tests).
  - ``ShardedTables``: TorchRec shards the tables across the processes (``engine.parallel.sharding``); their fused
    optimiser runs inside backward, the dense layers are data-parallel; every process writes its own shards of the
    state (``engine.trained.sharded_checkpoint``), nothing is gathered.
- **The processes it runs in** (``engine.parallel.group.Group``): this one alone, or its rank of the process group;
  averages, answers every process agrees on, and predictions gathered to rank 0 in row order with the metrics
  computed once.

A placement builds its model (``build``), describes it (summary, the plan), owns its optimisers
(``engine.parallel.optimizers.Optimizers``, the fused one's rate too) and what follows backward (the gradients' exchange), and hands out and restores its
state (written from the live tensors). The loop and the step call the part that does the work: ``mode.optimizers``,
``mode.placement``, ``mode.group``. ``placement_class`` is the one place the backend chooses the code that runs;
the process count chooses nothing but the group.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from loguru import logger
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine.device import Runtime, compile_model
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.parallel.group import Group, all_gather_row_sets, destroy_group
from criteo_dlrm.engine.parallel.optimizers import Optimizers, summed_rows
from criteo_dlrm.engine.parallel.sharding import (
    ShardedDLRM,
    check_fused_optimizer,
    require_torchrec,
    shard_model,
)
from criteo_dlrm.engine.trained.checkpoint import Weights
from criteo_dlrm.models.dlrm import DLRM, DLRMConfig


@dataclass(frozen=True)
class SavedState:
    """What a placement hands the in-progress checkpoint (``engine.training.run_state``) to write, from its live
    tensors: ``weights`` for the checkpoint's file (a sharded placement's without its state folder: written with
    it), and a sharded placement's ``shards`` (this process's tensors, written by every process into a folder beside
    the file; None where every process holds every table)."""

    weights: Weights
    shards: dict[str, torch.Tensor] | None = None


# torch 2.13 renamed DDP's broadcast_buffers (the old name a FutureWarning in every process's log); older torch has
# only the old one. Off, either syncs the buffers at most once, when DDP is built.
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)


def built_dlrm(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> DLRM:
    """The DLRM of ``model_config`` (with the current torch seed) on ``device``, its dense layers compiled when
    ``config.compile``: the model of the replicated placement."""
    model = DLRM(model_config, sparse_gradients=config.sparse_gradients).to(device)
    if config.compile:
        compile_model(model, config.compile_mode)
    return model


class Replicated:
    """Every table in every process: the DLRM and its optimisers; with ``data_parallel`` (by default in a group of
    more than one process) its dense layers under DDP and the tables' sparse gradients all-gathered after backward.

    Attributes:
        model: the DLRM (evaluation and state read it).
        train_model: what the training forward pass runs through (DDP around the model, or the model itself).
        optimizers: the dense layers' and the tables' optimisers.
    """

    def __init__(
        self, model: DLRM, config: TrainingConfig, device: torch.device, group: Group, data_parallel: bool | None = None
    ):
        self.model, self.config, self.group = model, config, group
        data_parallel = group.world_size > 1 if data_parallel is None else data_parallel
        self.optimizers = Optimizers(model, config)
        self.train_model: nn.Module = model
        self.sparse_parameters = model.embedding_parameters() if data_parallel and config.sparse_gradients else []
        if data_parallel:
            names = {id(p): name for name, p in model.named_parameters()}
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                model, [names[id(p)] for p in self.sparse_parameters]
            )
            # The model's buffers are constants (table offsets, columns): nothing to broadcast before every forward.
            self.train_model = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, **_NO_BUFFER_SYNC
            )

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """What this placement needs of the settings and the machine, refused with the fix before any work (by the
        preflight checks, the recipe before it starts a process, and ``build``): here, nothing.

        Raises:
            ConfigError: a setting this placement cannot run with on ``device``.
        """

    @staticmethod
    def process_group(device: torch.device) -> contextlib.AbstractContextManager:
        """What the placement needs around a run in this process: nothing (a launcher starts any group)."""
        return contextlib.nullcontext()

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device, group: Group) -> Replicated:
        """The placement with its model (``built_dlrm``, the same seed in every process), data-parallel in a group of
        more than one."""
        return cls(built_dlrm(model_config, config, device), config, device, group)

    def summary(self) -> dict:
        """Where the tables live, for the run's summary: all of them in every process."""
        sizes = self.model.config
        return {
            "backend": "torch",
            "bytes_per_process": embedding_bytes(
                sizes.table_sizes, sizes.sparse_embedding_sizes, self.config.embedding_optimizer
            ),
        }

    def describe(self) -> None:
        """Nothing beyond the summary's line."""

    def exchange_gradients(self) -> None:
        """After backward (which DDP's buckets averaged the dense gradients in): average the sparse embedding
        gradients over the processes, as DDP averages the dense ones; nothing alone or with dense tables.

        Each process's gradient (``summed_rows``: one entry per touched row) is all-gathered as indices and
        values, padded to the longest, so it works on gloo and nccl alike; the optimiser sums duplicates.
        """
        if not self.sparse_parameters:
            return
        world_size = self.group.world_size
        summed = [summed_rows(parameter.grad) for parameter in self.sparse_parameters]  # a wait each (data-sized)
        gathered = all_gather_row_sets(world_size, summed)  # one wait for every row count
        for parameter, (indices, values) in zip(self.sparse_parameters, gathered, strict=True):
            parameter.grad = torch.sparse_coo_tensor(
                torch.cat(indices).unsqueeze(0),
                torch.cat(values) / world_size,
                parameter.grad.shape,
                check_invariants=False,  # built from valid indices just above
            )

    def saved_state(self) -> SavedState | None:
        """The model's and the optimisers' live state (nothing copied), on rank 0 alone (None on the others):
        every replica holds the same weights."""
        if not self.group.is_main:
            return None
        return SavedState(Weights(model_state=self.model.state_dict(), optimizer_state=self.optimizers.state_dict()))

    def restore_state(self, weights: Weights) -> None:
        """Put a checkpoint's state (as ``saved_state`` handed it out, loaded again) into the model and the
        optimisers."""
        self.model.load_state_dict(weights.model_state)
        self.optimizers.load_state_dict(weights.optimizer_state)


class ShardedTables:
    """Tables sharded by TorchRec across the group (a group of one too), their optimiser fused into backward; the
    dense layers data-parallel.

    Attributes:
        sharded: TorchRec's model, its plan and its state (``engine.parallel.sharding.ShardedDLRM``).
        model: the DLRM inside it; ``train_model``: TorchRec's ``DistributedModelParallel``.
        optimizers: the dense layers' (the tables' fused one scaled with them).
    """

    def __init__(self, sharded: ShardedDLRM, config: TrainingConfig):
        self.sharded = sharded
        self.model, self.train_model = sharded.module, sharded.model
        self.optimizers = Optimizers(self.model, config, fused=sharded.model.fused_optimizer)

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """TorchRec installed, and FBGEMM's fused kernel for ``training.embedding_optimizer`` on ``device``."""
        require_torchrec()
        check_fused_optimizer(config, device.type)

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
            destroy_group()

    @classmethod
    def build(
        cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device, group: Group
    ) -> ShardedTables:
        """The model with TorchRec tables, sharded over the process group (``engine.parallel.sharding.shard_model``)."""
        cls.check(config, device)
        sharded = shard_model(model_config, config, device, SPARSE_COLUMNS)
        if config.compile:
            compile_model(sharded.module, config.compile_mode)
        return cls(sharded, config)

    def summary(self) -> dict:
        """Where the tables live: each table's shards and ranks, and the bytes each process holds."""
        return {"backend": "torchrec", "tables": self.sharded.plan, "bytes_per_rank": self.sharded.bytes_per_rank}

    def describe(self) -> None:
        """The sharding plan, in the log: each table's rows, sharding and ranks, and each process's bytes."""
        lines = [
            f"{t['table']:<10} {t['rows']:>12,} x {t['dim']:<4} {t['sharding_type']:<18} ranks {t['ranks']}"
            for t in self.sharded.plan
        ]
        per_rank = ", ".join(f"rank {r}: {b / 1e6:,.1f} MB" for r, b in enumerate(self.sharded.bytes_per_rank))
        logger.info("TorchRec sharding plan (tables + optimiser state {}):\n  {}", per_rank, "\n  ".join(lines))

    def exchange_gradients(self) -> None:
        """Nothing after backward: TorchRec's all-to-all carried the tables' gradients and their fused optimiser
        stepped inside it; DDP averaged the dense ones."""

    def saved_state(self) -> SavedState:
        """This process's own shards (every process writes its own: ``engine.trained.sharded_checkpoint``), nothing
        gathered; the dense optimiser's settings in the file."""
        dense = self.optimizers["dense"].state_dict()
        return SavedState(Weights(dense_param_groups=dense["param_groups"]), self.sharded.tensors(dense))

    def restore_state(self, weights: Weights) -> None:
        """Put a checkpoint's state into the shards and the dense optimiser: from the state folder its file names
        (``weights.sharded_state.path``, set as the file was read), or from the file itself (written gathered, before
        the state was sharded on disk)."""
        if not weights.sharded:  # written gathered, before the state was sharded on disk
            self.sharded.load_model_state(weights.model_state)
            self.sharded.load_optimizer_state(weights.optimizer_state["fused_embeddings"])
            self.optimizers.load_state_dict(weights.optimizer_state)
            return
        folder = weights.sharded_state
        dense = self.sharded.read_tensors(Path(folder.path), folder.digests)
        self.optimizers["dense"].load_state_dict({"state": dense, "param_groups": weights.dense_param_groups})


Placement = Replicated | ShardedTables


def placement_class(config: TrainingConfig) -> type[Placement]:
    """Where a run of ``config`` keeps its tables: sharded by TorchRec (``embedding_backend: torchrec``) or in every
    process. The one place the backend chooses the code that runs."""
    return ShardedTables if config.embedding_backend.sharded else Replicated


class Mode:
    """A run's parallel mode in this process, built from its parts: where the tables live (``placement``), the
    processes it runs in (``group``) and how it computes (``runtime``: the device, the precision, the group's
    backend). The step and the loop call the parts (``optimizers``, ``placement``, ``group``); what needs two parts
    is here.

    Attributes:
        model: the DLRM (evaluation and state read it); ``train_model``: what the training forward pass runs through.
        optimizers: the placement's optimisers.
        is_main: whether this process is rank 0 (it writes, logs and holds the gathered predictions).
    """

    def __init__(self, placement: Placement, group: Group, device: torch.device, precision: str):
        self.placement, self.group = placement, group
        self.runtime = Runtime(device, precision, group.backend)
        self.model, self.train_model, self.optimizers = placement.model, placement.train_model, placement.optimizers
        self.device, self.world_size, self.is_main = device, group.world_size, group.is_main

    def loss_weight(self, global_rows: int) -> float:
        """What the summed loss of this process's rows is multiplied by, so the gradients are the global batch's
        mean: DDP averages the dense gradients over the processes, the sparse exchange divides the tables' sums by
        their number, and TorchRec's all-to-all backward divides the sharded tables' (``torchrec.distributed.comm_ops``
        gradient division, on by default)."""
        return self.world_size / global_rows

    def weights_finite(self) -> bool:
        """Whether every weight is finite in every process (this process's shards, or its replica), the same answer
        in each."""
        return self.group.all_true(weights_finite(self.model), self.device)

    def parameter_count(self) -> int:
        """Every table's values and every dense parameter (the tables counted whole, wherever they live)."""
        config = self.model.config
        tables = sum(rows * dim for rows, dim in zip(config.table_sizes, config.sparse_embedding_sizes, strict=True))
        return tables + sum(p.numel() for p in self.model.dense_parameters())


def build_mode(
    model_config: DLRMConfig, config: TrainingConfig, device: torch.device, group: Group | None = None
) -> Mode:
    """The mode of a run of ``config`` in this process (in the initialised process group, or alone; ``group`` to
    choose), its placement's model built; a sharded one needs a process group (``ShardedTables.process_group``)."""
    group = group if group is not None else Group()
    placement = placement_class(config).build(model_config, config, device, group)
    return Mode(placement, group, device, config.precision)


def mode_around(model: DLRM, config: TrainingConfig, device: torch.device, data_parallel: bool | None = None) -> Mode:
    """A replicated mode around a DLRM already built (the benchmarks' steps), in the process group if one was started:
    data-parallel in a group of more than one unless ``data_parallel`` says otherwise (False: every process steps on
    its own share, no gradient leaves it)."""
    group = Group()
    return Mode(Replicated(model, config, device, group, data_parallel), group, device, config.precision)


def weights_finite(model: DLRM) -> bool:
    """Whether every weight this process holds is finite."""
    return all(all_finite(t) for t in model.state_dict().values() if t.is_floating_point())


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

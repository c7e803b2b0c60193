"""How a run spreads over processes: one object per parallel mode, so the training loop knows none of them.

- ``SingleProcess``: the whole model here; the dense and embedding optimisers of the config.
- ``DataParallel``: N processes with a replica each. The dense layers under ``DistributedDataParallel``
  (backward all-reduces their gradients in buckets as it runs); the sparse embedding gradients left out of
  DDP and all-gathered after backward (DDP's own sparse path is gloo-only and crashed once in our tests).
- ``Sharded``: TorchRec shards the tables across the processes (``engine.sharding``); their fused optimiser
  runs inside backward, the dense layers are data-parallel; every process writes its own shards of the state
  (``engine.sharded_checkpoint``), nothing is gathered.

Each mode owns building its model (``build``: the DLRM, or TorchRec's sharded one) and describing it (summary,
parameter count), wrapping it, its optimisers, the loss weight and gradient exchange, learning rates, state
(written from the live tensors, and restored), and how predictions over a validation set are gathered and their
metrics computed once (``Alone``, or ``InGroup`` for the multi-process modes: parts they hold, not inherit).
``ParallelMode`` lists what the loop and the step call. ``mode_class`` is the one place the backend and the process
count choose a mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import DENSE_OPTIMIZERS, TrainingConfig
from criteo_dlrm.data.batches import BatchLoader, rank_order
from criteo_dlrm.engine.device import Runtime, compile_model
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.metrics import MetricError, binary_metrics
from criteo_dlrm.engine.progress import ProgressFiles
from criteo_dlrm.engine.scoring import predict
from criteo_dlrm.engine.sharding import ShardedDLRM, check_fused_optimizer, log_plan, require_torchrec, shard_model
from criteo_dlrm.models.dlrm import DLRM, DLRMConfig


def build_optimizers(model: DLRM, config: TrainingConfig) -> dict[str, torch.optim.Optimizer]:
    """The dense layers' optimiser (``config.dense_optimizer``: Adam, Adagrad or SGD); the embeddings' from
    ``config.embedding_optimizer`` (its ``torch.optim`` class in ``EMBEDDING_OPTIMIZERS``; with TorchRec the
    tables' is fused into backward instead)."""
    if config.optimizer.whole_model:  # the predecessor's way: Adam over every table row, every step
        return {"dense": torch.optim.Adam(model.parameters(), lr=config.learning_rate)}
    dense = getattr(torch.optim, DENSE_OPTIMIZERS[config.dense_optimizer])
    optimizers = {"dense": dense(model.dense_parameters(), **config.dense_optimizer_args())}
    if config.embedding_backend == "torch":
        embeddings = getattr(torch.optim, config.optimizer.torch)
        optimizers["embeddings"] = embeddings(model.embedding_parameters(), **config.embedding_optimizer_args())
    return optimizers


@runtime_checkable
class ParallelMode(Protocol):
    """What the loop (``engine.loop``), the step (``engine.step``), the in-progress checkpoint
    (``engine.run_state``) and the process (``engine.process``) call on a parallel mode: ``SingleProcess``,
    ``DataParallel`` and ``Sharded`` are the three, ``mode_class`` chooses one."""

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
    def save_state(self, files: ProgressFiles, values: dict, improved: bool) -> None: ...
    def restore_state(self, values: dict, files: ProgressFiles) -> None: ...
    def predict(self, loader: BatchLoader) -> np.ndarray | None: ...
    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict: ...


class Alone:
    """Validation and averages in one process: the process's own predictions and metrics."""

    rank, world_size = 0, 1

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def predict(self, model: DLRM, loader: BatchLoader, runtime: Runtime) -> np.ndarray | None:
        """Probabilities for every row of ``loader``, in row order; on a GPU they stay there, where the metrics
        are computed."""
        return predict(model, loader, runtime, on_device=runtime.device.type == "cuda")

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        return binary_metrics(labels, probabilities)


class InGroup(Alone):
    """Validation and averages over the initialised process group, shared by the multi-process modes: each
    process scores its share of the rows, rank 0 gathers them and computes the metrics, every process gets them."""

    def __init__(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values
        dist.all_reduce(values)
        return values / self.world_size

    def predict(self, model: DLRM, loader: BatchLoader, runtime: Runtime) -> np.ndarray | None:
        """Each process scores its share of every global batch of N x ``batch_size`` rows, so all run the same
        number of forward passes (a sharded model's all-to-all needs every process), and the shares are gathered
        to rank 0 alone and put back in row order there: the same array, so the same metrics, as one process
        (None on the other ranks)."""
        if self.world_size == 1:
            return super().predict(model, loader, runtime)
        arrays = loader.arrays
        batch_size = loader.batch_size * self.world_size
        mine = BatchLoader(arrays, batch_size, rank=self.rank, world_size=self.world_size)
        # NCCL gathers on the GPU: the probabilities stay there, and rank 0 computes the metrics where they are.
        on_device = runtime.backend == "nccl"
        local = predict(model, mine, runtime, on_device=on_device)
        pieces = gather_rows_to_main(self.world_size, self.rank, local if on_device else torch.from_numpy(local))
        if pieces is None:
            return None
        return rank_order(pieces if on_device else [p.numpy() for p in pieces], len(arrays), batch_size)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        """Computed once (on rank 0) and known to every process.

        Raises:
            MetricError: in every process, when the metrics are undefined.
        """
        if self.world_size == 1:
            return super().metrics(labels, probabilities)
        outcome: list = [None]
        if self.rank == 0:
            try:
                outcome = [super().metrics(labels, probabilities)]
            except MetricError as error:
                outcome = [str(error)]
        dist.broadcast_object_list(outcome, src=0)  # a small dict (or the error's message), not the predictions
        if isinstance(outcome[0], str):
            raise MetricError(outcome[0])
        return outcome[0]


class SingleProcess:
    """The whole model in this process.

    Attributes:
        model: the DLRM (evaluation and state read it).
        train_model: what the training forward pass runs through (the model itself here).
        optimizers: by name (``dense``, and ``embeddings`` unless dense Adam covers everything).
    """

    def __init__(self, model: DLRM, config: TrainingConfig, device: torch.device):
        self.model, self.config, self.device = model, config, device
        self.train_model: nn.Module = model
        self.group = self._group()
        self.rank, self.world_size = self.group.rank, self.group.world_size
        backend = dist.get_backend() if self.world_size > 1 or dist.is_initialized() else None
        self.runtime = Runtime(device, config.precision, backend)
        self.optimizers = build_optimizers(model, config)
        self.base_rates = {name: [g["lr"] for g in opt.param_groups] for name, opt in self.optimizers.items()}

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """What this mode needs of the settings and the machine, refused with the fix before any work (by the
        preflight checks, the recipe before it starts a process, and ``build``): here, nothing.

        Raises:
            ConfigError: a setting this mode cannot run with on ``device``.
        """

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> SingleProcess:
        """The mode with its model: built from ``model_config`` (with the current torch seed), on ``device``,
        its dense layers compiled when ``config.compile``."""
        model = DLRM(model_config, sparse_gradients=config.sparse_gradients).to(device)
        if config.compile:
            compile_model(model, config.compile_mode)
        return cls(model, config, device)

    @staticmethod
    def process_group(device: torch.device) -> contextlib.AbstractContextManager:
        """What the mode needs around a run in this process: nothing; TorchRec a group (of one, if none)."""
        return contextlib.nullcontext()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @staticmethod
    def _group() -> Alone:
        """Where validation and averages run: this process alone."""
        return Alone()

    def summary(self) -> dict:
        """Where the tables live, for the run's summary: every table in every process here."""
        config = self.model.config
        return {
            "backend": "torch",
            "bytes_per_process": embedding_bytes(
                config.table_sizes, config.sparse_embedding_sizes, self.config.embedding_optimizer
            ),
        }

    def describe(self) -> None:
        """Log what the summary holds beyond one line (TorchRec's plan)."""

    def parameter_count(self) -> int:
        """Every table's values and every dense parameter (the tables counted whole, wherever they live)."""
        config = self.model.config
        tables = sum(rows * dim for rows, dim in zip(config.table_sizes, config.sparse_embedding_sizes, strict=True))
        return tables + sum(p.numel() for p in self.model.dense_parameters())

    # -- a step --------------------------------------------------------------------------------------
    def set_learning_rates(self, factor: float) -> None:
        """Every optimiser at its base rate times ``factor`` (warm-up and decay)."""
        for name, optimizer in self.optimizers.items():
            for group, base in zip(optimizer.param_groups, self.base_rates[name], strict=True):
                group["lr"] = base * factor

    def learning_rates(self) -> dict[str, float]:
        """The current rates, for the logs: ``learning_rate`` and ``embedding_learning_rate``."""
        rates = {"learning_rate": self.optimizers["dense"].param_groups[0]["lr"]}
        if "embeddings" in self.optimizers:
            rates["embedding_learning_rate"] = self.optimizers["embeddings"].param_groups[0]["lr"]
        return rates

    def zero_grad(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def loss_weight(self, global_rows: int) -> float:
        """What the summed loss of this process's rows is multiplied by: the mean over the global batch."""
        return 1.0 / global_rows

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.step()

    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        return self.group.mean(values)

    # -- state ---------------------------------------------------------------------------------------
    def weights_finite(self) -> bool:
        """Whether every weight is finite (the same answer in every process)."""
        return all(all_finite(t) for t in self.model.state_dict().values() if t.is_floating_point())

    def save_state(self, files: ProgressFiles, values: dict, improved: bool) -> None:
        """Write the in-progress checkpoint (and the best model when ``improved``): ``values`` (the loop's
        bookkeeping) with the model's and the optimisers' state. Every process calls it."""
        model_state, optimizer_state = self.state()
        if self.is_main:
            files.save({**values, "model_state": model_state, "optimizer_state": optimizer_state}, improved)

    def restore_state(self, values: dict, files: ProgressFiles) -> None:
        """Put a checkpoint's state (as ``save_state`` wrote it, loaded from ``files``) into the model and the
        optimisers."""
        self.restore(values["model_state"], values["optimizer_state"])

    def state(self) -> tuple[dict | None, dict | None]:
        """The model's and the optimisers' state to write: the live tensors themselves, not copies (written at
        once, before the next step changes them). Every process calls it; only rank 0 gets the state (the
        others None): a replica's is rank 0's, a sharded run gathers to rank 0."""
        return self.model.state_dict(), {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}

    def restore(self, model_state: dict, optimizer_state: dict) -> None:
        self.model.load_state_dict(model_state)
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(optimizer_state[name])

    # -- validation ----------------------------------------------------------------------------------
    def predict(self, loader: BatchLoader) -> np.ndarray | None:
        """Probabilities for every row of ``loader``, in row order (on rank 0; None on the others)."""
        return self.group.predict(self.model, loader, self.runtime)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> dict:
        """``binary_metrics`` of the validation rows, known to every process (``MetricError`` in every one)."""
        return self.group.metrics(labels, probabilities)


class DataParallel(SingleProcess):
    """A replica in every process of the group: DDP for the dense layers, sparse gradients all-gathered."""

    _group = staticmethod(InGroup)

    def __init__(self, model: DLRM, config: TrainingConfig, device: torch.device):
        super().__init__(model, config, device)
        self.sparse_parameters = model.embedding_parameters() if config.sparse_gradients else []
        names = {id(p): name for name, p in model.named_parameters()}
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [names[id(p)] for p in self.sparse_parameters]
        )
        self.train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def state(self) -> tuple[dict | None, dict | None]:
        # Only rank 0 writes state; every replica holds the same weights.
        return super().state() if self.is_main else (None, None)

    def loss_weight(self, global_rows: int) -> float:
        # DDP averages the processes' gradients: weighting by world_size makes that the global batch's mean.
        return self.world_size / global_rows

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self.exchange_sparse_gradients()

    def exchange_sparse_gradients(self) -> None:
        """Average the sparse embedding gradients over the processes, as DDP averages the dense ones.

        Each process's gradient (coalesced: one entry per touched row) is all-gathered as indices and
        values, padded to the longest, so it works on gloo and nccl alike; the optimiser sums duplicates.
        """
        for parameter in self.sparse_parameters:
            gradient = parameter.grad.coalesce()
            indices, values = all_gather_rows(self.world_size, gradient.indices()[0], gradient.values())
            parameter.grad = torch.sparse_coo_tensor(
                torch.cat(indices).unsqueeze(0),
                torch.cat(values) / self.world_size,
                gradient.shape,
                check_invariants=False,  # built from valid indices just above
            )


class Sharded(SingleProcess):
    """Tables sharded by TorchRec across the group (a group of one too); their optimiser is fused into backward."""

    _group = staticmethod(InGroup)

    def __init__(self, sharded: ShardedDLRM, config: TrainingConfig, device: torch.device):
        self.sharded = sharded
        super().__init__(sharded.module, config, device)
        self.train_model = sharded.model

    @staticmethod
    def check(config: TrainingConfig, device: torch.device) -> None:
        """TorchRec installed, and FBGEMM's fused kernel for ``training.embedding_optimizer`` on ``device``."""
        require_torchrec()
        check_fused_optimizer(config, device.type)

    @classmethod
    def build(cls, model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> Sharded:
        """The model with TorchRec tables, sharded over the process group (``engine.sharding.shard_model``)."""
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

    def summary(self) -> dict:
        return self.sharded.summary()

    def describe(self) -> None:
        log_plan(self.sharded)

    def set_learning_rates(self, factor: float) -> None:
        super().set_learning_rates(factor)
        self.sharded.set_learning_rate(self.config.embedding_learning_rate * factor)

    def learning_rates(self) -> dict[str, float]:
        rates = super().learning_rates()
        rates["embedding_learning_rate"] = self.sharded.model.fused_optimizer.param_groups[0]["lr"]
        return rates

    def loss_weight(self, global_rows: int) -> float:
        # Each process's loss is its own rows' mean: DDP averages the dense gradients over the processes and
        # TorchRec's all-to-all backward divides the tables' (summed over the processes) by their number
        # (``torchrec.distributed.comm_ops`` gradient division, on by default), so both are the global mean's.
        return self.world_size / global_rows

    def weights_finite(self) -> bool:
        finite = torch.tensor([float(super().weights_finite())])  # this process's shards and the dense layers
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return bool(finite.item())

    def save_state(self, files: ProgressFiles, values: dict, improved: bool) -> None:
        """Every process writes its own shards (``engine.sharded_checkpoint``): nothing is gathered."""
        dense = self.optimizers["dense"].state_dict()
        files.save_sharded({**values, "dense_param_groups": dense["param_groups"]}, self.sharded.tensors(dense),
                           improved)  # fmt: skip

    def restore_state(self, values: dict, files: ProgressFiles) -> None:
        if "sharded_state" not in values:  # written gathered, before the state was sharded on disk
            super().restore_state(values, files)
            return
        folder, digests = files.state_folder(values), values["sharded_state"]["digests"]
        dense = self.sharded.read_tensors(folder, digests)
        self.optimizers["dense"].load_state_dict({"state": dense, "param_groups": values["dense_param_groups"]})

    def restore(self, model_state: dict, optimizer_state: dict) -> None:
        self.sharded.load_model_state(model_state)
        self.sharded.load_optimizer_state(optimizer_state["fused_embeddings"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(optimizer_state[name])


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


def all_gather_rows(world_size: int, *tensors: torch.Tensor) -> list[list[torch.Tensor]]:
    """Every process's ``tensors`` (each with the same number of rows, any number per process), in rank
    order: the row counts are gathered first, then each tensor padded to the longest, trimmed again."""
    count = torch.tensor([len(tensors[0])], device=tensors[0].device)
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count)
    gathered = []
    for tensor in tensors:
        padded = tensor.new_zeros((int(max(counts)), *tensor.shape[1:]))
        padded[: len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(parts, padded)
        gathered.append([part[: int(n)] for part, n in zip(parts, counts, strict=True)])
    return gathered


def gather_rows_to_main(world_size: int, rank: int, tensor: torch.Tensor) -> list[torch.Tensor] | None:
    """Every process's ``tensor`` (any number of rows each), in rank order, on rank 0 only (None elsewhere): the
    row counts all-gathered first (so every process pads to the longest), the padded tensors gathered to rank 0."""
    count = torch.tensor([len(tensor)], device=tensor.device)
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count)
    padded = tensor.new_zeros((int(max(counts)), *tensor.shape[1:]))
    padded[: len(tensor)] = tensor
    parts = [torch.empty_like(padded) for _ in range(world_size)] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    if rank != 0:
        return None
    return [part[: int(n)] for part, n in zip(parts, counts, strict=True)]


def mode_class(config: TrainingConfig) -> type[SingleProcess]:
    """The parallel mode of a run of ``config`` in this process: TorchRec's sharded tables
    (``embedding_backend: torchrec``), a replica in a process group of more than one, or alone. The one place a
    backend or a process count chooses the code that runs."""
    if config.embedding_backend == "torchrec":
        return Sharded
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return DataParallel
    return SingleProcess


def build_mode(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> SingleProcess:
    """``mode_class(config)`` with its model built; a sharded one needs a process group (its ``process_group``)."""
    return mode_class(config).build(model_config, config, device)

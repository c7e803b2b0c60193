"""Embedding tables sharded across processes by TorchRec (``embedding_backend: torchrec``).

TorchRec's planner places every table (table-wise, column-wise, row-wise on CUDA, ...) within each
process's memory, ``DistributedModelParallel`` shards the ``TorchRecEmbeddings`` accordingly (an all-to-all
brings each process the pooled embeddings of its own rows) and wraps the dense layers in DDP, and FBGEMM's
fused optimiser updates the tables inside backward. ``ShardedDLRM`` is what the training loop needs from all
that: the model to train, and checkpoint state gathered to (and restored from) the ``torch`` backend's layout,
so a sharded run's checkpoint is an ordinary one.

Gathering puts every table in rank 0's CPU memory once per saved checkpoint: fine while the tables fit in
one machine's RAM (Criteo 1TB's MLPerf tables at 128 dims: about 100 GB); beyond that, a sharded format
(torch.distributed.checkpoint) is the next step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.commands import current_invocation, kedro_run
from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.parallel import available_memory
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.models.dlrm import DLRM, DLRMConfig
from criteo_dlrm.models.torchrec_embeddings import TABLE_PREFIX, TorchRecEmbeddings, grouped_tables, split_tables

INSTALL_HINT = (
    "Install the torchrec extra (README, 'Sharded embedding tables'): on CPU "
    "`pip install fbgemm-gpu-cpu==1.8.0 && pip install --no-deps torchrec==1.8.0 && pip install -e '.[torchrec]'` "
    "(for torch 2.13)"
)
# Optimiser state in floats per embedding value (dense_adam: two moments and a dense gradient), and per row.
STATE_PER_VALUE = {"rowwise_adagrad": 0, "adagrad": 1, "sgd": 0, "sparse_adam": 2, "dense_adam": 3}
STATE_PER_ROW = {"rowwise_adagrad": 1}


def require_torchrec() -> None:
    """Raises ConfigError naming the install command when TorchRec or FBGEMM is missing."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            f"embedding_backend: torchrec needs TorchRec and FBGEMM ({error}). {INSTALL_HINT}."
        ) from error


def sharding_types(device_type: str) -> list[str]:
    """The sharding types the planner may choose with fused kernels (row-wise kinds need CUDA)."""
    cpu = ["table_wise", "column_wise", "table_column_wise"]
    return cpu + (["row_wise", "table_row_wise"] if device_type == "cuda" else [])


def fused_optimizers(device_type: str) -> list[str]:
    """The embedding optimisers FBGEMM has a fused kernel for on ``device_type`` (``cpu`` or ``cuda``)."""
    return sorted(["rowwise_adagrad", "adagrad", "sgd", *(["sparse_adam"] if device_type == "cuda" else [])])


ROWWISE_ADAGRAD_LEARNING_RATE = 0.05


def check_fused_optimizer(config: TrainingConfig, device_type: str) -> None:
    """With TorchRec, refuse an embedding optimiser FBGEMM lacks on this device, naming the command that works
    (before any process starts: inside the workers it would surface after the launch)."""
    if config.embedding_backend != "torchrec" or config.embedding_optimizer in fused_optimizers(device_type):
        return
    params = {"training.embedding_backend": "torchrec", "training.embedding_optimizer": "rowwise_adagrad"}
    if "training.embedding_learning_rate" not in current_invocation().params:
        # Adagrad's usual rate (docs/torchrec.md), not the default's, which is SparseAdam's.
        params["training.embedding_learning_rate"] = ROWWISE_ADAGRAD_LEARNING_RATE
    raise ConfigError(
        f"training.embedding_optimizer {config.embedding_optimizer!r} has no fused TorchRec kernel on {device_type}: "
        f"use one of {fused_optimizers(device_type)} with embedding_backend: torchrec (rowwise_adagrad is "
        f"TorchRec's usual one): `{kedro_run(params=params)}`."
    )


def embedding_bytes(table_sizes: list[int], dims: list[int], optimizer: str) -> int:
    """Bytes of fp32 embedding weights and their optimiser state for these tables."""
    values = sum(rows * dim for rows, dim in zip(table_sizes, dims, strict=True))
    rows = sum(table_sizes)
    return 4 * (values * (1 + STATE_PER_VALUE[optimizer]) + rows * STATE_PER_ROW.get(optimizer, 0))


def check_replicated_memory(config: TrainingConfig, model_config: DLRMConfig) -> None:
    """The torch backend keeps every table in every process: refuse a run whose tables exceed the set budget."""
    budget = config.sharding.memory_per_process_gb
    if config.embedding_backend != "torch" or budget is None:
        return
    needed = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, config.embedding_optimizer)
    if needed > budget * 1e9:
        raise ConfigError(
            f"The embedding tables and their {config.embedding_optimizer} state need {needed / 1e9:.2f} GB in every "
            f"process with embedding_backend: torch, more than sharding.memory_per_process_gb ({budget} GB). "
            "Use embedding_backend: torchrec (with embedding_optimizer: rowwise_adagrad), which shards the tables "
            "across the processes, or lower sparse_embedding_sizes / raise metadata.min_frequency."
        )


TABLE_SETTINGS = "metadata.max_vocabulary_size, metadata.min_frequency, training.sparse_embedding_sizes"


def check_table_memory(
    config: TrainingConfig, metadata: dict, device: torch.device, settings: str = TABLE_SETTINGS
) -> None:
    """Refuse, before encoding or training, tables (and their optimiser state) that cannot fit: in the set
    budget, or else in this machine's free memory (CPU: every process on it holds a replica with the torch
    backend) or in the GPU's memory. ``settings``: what shrinks them, for the message."""
    model_config = config.model_config([metadata["sparse"][name]["table_size"] for name in metadata["sparse"]])
    check_replicated_memory(config, model_config)
    if config.embedding_backend != "torch" or config.sharding.memory_per_process_gb is not None:
        return
    needed = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, config.embedding_optimizer)
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[1], f"{torch.cuda.get_device_name(device)}'s memory"
    else:
        needed *= config.distributed.nproc_per_node
        available, where = available_memory(), "this machine's free memory"
    if needed > available:
        raise ConfigError(
            f"The embedding tables and their {config.embedding_optimizer} state need {needed / 1e9:,.1f} GB "
            f"({config.distributed.nproc_per_node} process(es) with embedding_backend: torch), more than {where} "
            f"({available / 1e9:,.1f} GB). Shrink the tables ({settings}) or shard them across processes with "
            "embedding_backend: torchrec."
        )


@dataclass
class ShardedDLRM:
    """A DLRM whose tables TorchRec sharded across the process group.

    Attributes:
        model: the ``DistributedModelParallel`` to train with (its forward runs the input all-to-all).
        module: the DLRM inside it (for evaluation, which every process must run in step).
        plan: per table: sharding type, ranks and shards; ``bytes_per_rank``: weights + optimiser state.
    """

    model: Any
    module: DLRM
    plan: list[dict]
    bytes_per_rank: list[int]
    names: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"backend": "torchrec", "tables": self.plan, "bytes_per_rank": self.bytes_per_rank}

    # -- state in the torch backend's layout -----------------------------------------------------
    def model_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state, tables gathered, in the torch backend's layout on rank 0 (None on the
        others). Every process must call it."""
        full = _gather(self.model.state_dict())
        if full is None:
            return None
        config = self.module.config
        tables = {f: full.pop(_table_key(name)) for f, name in enumerate(self.names)}
        return {**full, **grouped_tables(tables, config)}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a torch-layout state (a checkpoint's ``model_state``) into this process's shards."""
        state = dict(state)
        tables = split_tables(state, self.module.config)
        for g in range(len(self.module.embeddings.groups)):
            state.pop(f"embeddings.{g}.weight.weight")
        state.update({_table_key(name): tables[f] for f, name in enumerate(self.names)})
        _scatter(self.model.state_dict(), state, strict=True)

    def optimizer_state(self) -> dict[str, torch.Tensor] | None:
        """The fused embedding optimiser's state, gathered to rank 0 (keyed ``table weight/state name``)."""
        return _gather(_flat_state(self.model.fused_optimizer.state_dict()["state"]))

    def load_optimizer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore ``optimizer_state``; state saved under another sharding plan (its shapes differ) is
        skipped with a warning: the tables keep their weights, the optimiser starts afresh."""
        _scatter(_flat_state(self.model.fused_optimizer.state_dict()["state"]), state, strict=False)

    def set_learning_rate(self, rate: float) -> None:
        """The fused optimiser's learning rate from the next backward on (warm-up and decay)."""
        optimizer = self.model.fused_optimizer
        for group in optimizer.param_groups:
            group["lr"] = rate
        optimizer.step()  # a fused optimiser's step only hands the rate to its kernels: the update ran in backward


def shard_model(
    model_config: DLRMConfig, config: TrainingConfig, device: torch.device, names: list[str]
) -> ShardedDLRM:
    """Build the DLRM with TorchRec tables and shard it over the initialised process group.

    The dense layers are initialised from the current torch seed (the same in every process); each process
    allocates and initialises only its own shards of the tables.

    Raises:
        ConfigError: TorchRec missing, an optimiser FBGEMM lacks on this device, or no plan fits the memory.
    """
    require_torchrec()
    import torchrec.optim as fused
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, PlannerError, TopologyFactory, TrainerConfig
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    optimizers = {"rowwise_adagrad": fused.RowWiseAdagrad, "adagrad": fused.Adagrad, "sgd": fused.SGD}
    if device.type == "cuda":
        optimizers["sparse_adam"] = fused.Adam
    check_fused_optimizer(config, device.type)
    module = DLRM(model_config, embeddings=TorchRecEmbeddings(model_config, names, device="meta"))
    apply_optimizer_in_backward(
        optimizers[config.embedding_optimizer],
        module.embeddings.collection.parameters(),
        {"lr": config.embedding_learning_rate},
    )
    world_size = dist.get_world_size()
    budget = config.sharding.memory_per_process_gb
    capacity = (
        {} if budget is None else {"hbm_cap_bytes" if device.type == "cuda" else "ddr_cap_bytes": int(budget * 1e9)}
    )
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=world_size, **capacity),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    # Fused kernels only (the optimiser runs in backward), so only the sharding types that have one (not
    # data_parallel); column shards down to 4 values wide, so even a 16-wide table can be split when it does
    # not fit one process.
    allowed = [config.sharding.type] if config.sharding.type else sharding_types(device.type)
    constraints = {
        name: ParameterConstraints(sharding_types=allowed, compute_kernels=["fused"], min_partition=4) for name in names
    }
    forced = [config.sharding.type] if config.sharding.type else None
    sharders = [EmbeddingBagCollectionSharder()]
    planner = EmbeddingShardingPlanner(
        topology=topology,
        constraints=constraints,
        storage_reservation=FixedPercentageStorageReservation(percentage=0.15),  # the heuristic's own margin
    )
    try:
        plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
    except PlannerError as error:
        raise ConfigError(
            f"TorchRec's planner found no placement of the tables on {world_size} process(es)"
            f"{'' if budget is None else f' within sharding.memory_per_process_gb {budget} GB'}"
            f"{'' if forced is None else f' with sharding.type {forced[0]}'}: raise the budget, add processes, "
            f"or allow another sharding type. TorchRec says:\n  "
            + "\n  ".join(line.strip() for line in str(error).splitlines()[:8] if line.strip())
        ) from error
    model = DistributedModelParallel(module, device=device, plan=plan, sharders=sharders)
    tables, bytes_per_rank = _describe_plan(plan, model_config, names, world_size, config.embedding_optimizer)
    return ShardedDLRM(model, module, tables, bytes_per_rank, list(names))


def _describe_plan(plan, model_config: DLRMConfig, names: list[str], world_size: int, optimizer: str):
    """Per table: sharding type and shards (rank, offsets, sizes); per rank: bytes of weights + optimiser state."""
    (module_plan,) = plan.plan.values()
    tables, bytes_per_rank = [], [0] * world_size
    for f, name in enumerate(names):
        sharding = module_plan[name]
        shards = []
        for shard in sharding.sharding_spec.shards:
            rank = shard.placement.rank()
            rows, columns = shard.shard_sizes
            shards.append({"rank": rank, "offsets": list(shard.shard_offsets), "sizes": [rows, columns]})
            bytes_per_rank[rank] += embedding_bytes([rows], [columns], optimizer)
        tables.append(
            {
                "table": name,
                "rows": model_config.table_sizes[f],
                "dim": model_config.sparse_embedding_sizes[f],
                "sharding_type": sharding.sharding_type,
                "ranks": sorted({s["rank"] for s in shards}),
                "shards": shards,
            }
        )
    return tables, bytes_per_rank


def log_plan(sharded: ShardedDLRM) -> None:
    lines = [
        f"{t['table']:<10} {t['rows']:>12,} x {t['dim']:<4} {t['sharding_type']:<18} ranks {t['ranks']}"
        for t in sharded.plan
    ]
    per_rank = ", ".join(f"rank {r}: {b / 1e6:,.1f} MB" for r, b in enumerate(sharded.bytes_per_rank))
    logger.info("TorchRec sharding plan (tables + optimiser state {}):\n  {}", per_rank, "\n  ".join(lines))


# -- gathering and scattering sharded state ----------------------------------------------------------
def _table_key(name: str) -> str:
    return f"{TABLE_PREFIX}{name}.weight"


def _flat_state(state: dict) -> dict:
    """``{param: {state name: tensor}}`` -> ``{"param/state name": tensor}``."""
    return {f"{param}/{name}": value for param, values in state.items() for name, value in values.items()}


def _pieces(value: Any) -> tuple[list[tuple[list[int], torch.Tensor]], list[int]]:
    """This process's parts of ``value`` as (offsets, CPU tensor), and the whole tensor's size."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(value, ShardedTensor):
        parts = [(list(s.metadata.shard_offsets), s.tensor.detach().cpu()) for s in value.local_shards()]
        with warnings.catch_warnings():  # TorchRec's state dicts are ShardedTensors, whatever torch prefers now
            warnings.simplefilter("ignore", FutureWarning)
            return parts, list(value.size())
    return [([0] * value.dim(), value.detach().cpu())], list(value.shape)


def _gather(state: dict) -> dict[str, torch.Tensor] | None:
    """Whole tensors on rank 0 (None elsewhere), one key at a time so rank 0 holds one table's parts at most
    twice. Keys may differ between processes (an optimiser only holds state for its own tables)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    keys: list[list[str]] = [None] * world_size  # type: ignore[list-item]
    dist.all_gather_object(keys, sorted(state))
    full = {}
    for key in sorted(set().union(*keys)):
        mine = _pieces(state[key]) if key in state else ([], None)
        received = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, received, dst=0)
        if rank != 0:
            continue
        size = next(size for _, size in received if size is not None)
        dtype = next(part.dtype for parts, _ in received for _, part in parts)
        whole = torch.empty(size, dtype=dtype)
        for parts, _ in received:
            for offsets, part in parts:
                whole[_region(offsets, part.shape)] = part
        full[key] = whole
    return full if rank == 0 else None


def _scatter(current: dict, full: dict[str, torch.Tensor], strict: bool) -> None:
    """Copy each whole tensor's region into this process's parts of ``current`` (which share storage with the
    model or the optimiser)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    for key, value in current.items():
        size = list(value.size())
        if key not in full or list(full[key].shape) != size:
            if strict:
                raise ValueError(f"checkpoint has no {key} of size {size}")
            logger.warning("optimiser state {} was saved under another sharding plan; it starts afresh", key)
            continue
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                region = _region(shard.metadata.shard_offsets, shard.tensor.shape)
                shard.tensor.copy_(full[key][region])
        else:
            value.copy_(full[key])


def _region(offsets: list[int], shape: torch.Size) -> tuple[slice, ...]:
    return tuple(slice(start, start + length) for start, length in zip(offsets, shape, strict=True))

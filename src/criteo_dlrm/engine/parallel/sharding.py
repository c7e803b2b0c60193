"""Embedding tables sharded across processes by TorchRec (``embedding_backend: torchrec``).

TorchRec's planner places every table (table-wise, column-wise, row-wise on CUDA, ...) within each
process's memory, ``DistributedModelParallel`` shards the ``TorchRecEmbeddings`` accordingly (an all-to-all
brings each process the pooled embeddings of its own rows) and wraps the dense layers in DDP, and FBGEMM's
fused optimiser updates the tables inside backward. ``ShardedDLRM`` is what the training loop needs from all
that: the model to train, and its state as every process writes it (its own shards,
``engine.trained.sharded_checkpoint``) and reads it back (resharded); a finished run's checkpoint is read into the
``torch`` backend's model (``engine.trained.checkpoint``). Here too: the refusals before any process starts (TorchRec
missing, an optimiser without a fused kernel on the device). ``model_state``/``optimizer_state`` gather the tables to
rank 0 (``engine.parallel.sharded_state``): a view for tests and one-process inspection, not how state is written.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from criteo_dlrm.common.errors import ConfigError, Fix
from criteo_dlrm.config.training import EMBEDDING_OPTIMIZERS, TrainingConfig
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.parallel.sharded_state import flat_state, gather_state, scatter_state
from criteo_dlrm.models.dlrm import DLRM, DLRMConfig
from criteo_dlrm.models.torchrec_embeddings import TorchRecEmbeddings, grouped_tables, per_table_state, table_key

INSTALL_HINT = (
    "Install the torchrec extra (docs/torchrec.md, 'Install'): on CPU "
    "`pip install fbgemm-gpu-cpu==1.8.0 && pip install --no-deps torchrec==1.8.0 && pip install -e '.[torchrec]'` "
    "(for torch 2.13)"
)


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
    return sorted(name for name, optimizer in EMBEDDING_OPTIMIZERS.items() if device_type in optimizer.fused_devices)


ROWWISE_ADAGRAD_LEARNING_RATE = 0.05


def check_fused_optimizer(config: TrainingConfig, device_type: str) -> None:
    """With TorchRec, refuse an embedding optimiser FBGEMM lacks on this device, naming the command that works
    (before any process starts: inside the workers it would surface after the launch)."""
    if not config.embedding_backend.sharded or config.embedding_optimizer in fused_optimizers(device_type):
        return
    fix = Fix(
        params={"training.embedding_backend": "torchrec", "training.embedding_optimizer": "rowwise_adagrad"},
        # Adagrad's usual rate (docs/torchrec.md), not the default's, which is SparseAdam's; the user's if given.
        defaults={"training.embedding_learning_rate": ROWWISE_ADAGRAD_LEARNING_RATE},
    )
    raise ConfigError(
        f"training.embedding_optimizer {config.embedding_optimizer!r} has no fused TorchRec kernel on {device_type}: "
        f"use one of {fused_optimizers(device_type)} with embedding_backend: torchrec (rowwise_adagrad is "
        f"TorchRec's usual one): `{fix}`.",
        fix=fix,
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

    # -- state in the torch backend's layout -----------------------------------------------------
    def model_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model's state, tables gathered, in the torch backend's layout on rank 0 (None on the
        others). Every process must call it."""
        full = gather_state(self.model.state_dict())
        return None if full is None else _grouped(full, self.module.config, self.names)

    # -- state on disk, sharded (engine.trained.sharded_checkpoint) -----------------------------------------
    def tensors(self, dense_optimizer: dict) -> dict[str, torch.Tensor]:
        """What every process writes, its own shards: the model (``model/<key>``), the fused optimiser's state
        (``fused/<table weight>/<state name>``) and the dense optimiser's (``dense/<index>/<name>``, the same in
        every process: written once)."""
        fused = flat_state(self.model.fused_optimizer.state_dict()["state"])
        return {
            **{f"model/{key}": value for key, value in self.model.state_dict().items()},
            **{f"fused/{key}": value for key, value in fused.items()},
            **{
                f"dense/{index}/{name}": value
                for index, values in dense_optimizer["state"].items()
                for name, value in values.items()
                if isinstance(value, torch.Tensor)
            },
        }

    def read_tensors(self, folder, digests: dict[str, str]) -> dict[int, dict[str, torch.Tensor]]:
        """Load ``tensors`` back in place from ``folder`` (resharded); returns the dense optimiser's state."""
        from criteo_dlrm.engine.trained.sharded_checkpoint import read_state  # torch's DCP: 0.5 s to import

        dense = read_state(self.tensors({"state": {}}), folder, digests, allocate="dense/")
        return _dense_state(dense)

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a torch-layout state (a checkpoint's ``model_state``) into this process's shards."""
        scatter_state(self.model.state_dict(), per_table_state(state, self.module.config, self.names), strict=True)

    def optimizer_state(self) -> dict[str, torch.Tensor] | None:
        """The fused embedding optimiser's state, gathered to rank 0 (keyed ``table weight/state name``)."""
        return gather_state(flat_state(self.model.fused_optimizer.state_dict()["state"]))

    def load_optimizer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore ``optimizer_state``; state saved under another sharding plan (its shapes differ) is
        skipped with a warning: the tables keep their weights, the optimiser starts afresh."""
        scatter_state(flat_state(self.model.fused_optimizer.state_dict()["state"]), state, strict=False)


def _grouped(state: dict[str, torch.Tensor], config: DLRMConfig, names: list[str]) -> dict[str, torch.Tensor]:
    """A whole model's state with TorchRec's per-feature tables (``names``' order) -> the torch backend's layout."""
    state = dict(state)
    tables = {f: state.pop(table_key(name)) for f, name in enumerate(names)}
    return {**state, **grouped_tables(tables, config)}


def _dense_state(tensors: dict[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    """``{"dense/<index>/<name>": tensor}`` -> an optimiser's ``state`` (``{index: {name: tensor}}``)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, index, name = key.split("/", 2)
        state.setdefault(int(index), {})[name] = value
    return state


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
    from torchrec.distributed import DistributedModelParallel, comm_ops
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, PlannerError, TopologyFactory, TrainerConfig
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    # TorchRec's tables are ShardedTensors, which torch says it deprecates whenever one's state is read (each
    # in-progress checkpoint): TorchRec's choice, nothing a user of this project can act on.
    warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor")
    # The tables' gradients are averaged over the processes (their all-to-all backward divides by the number):
    # with each process's loss its own rows' mean (``modes.Mode.loss_weight``) that is the global batch's.
    comm_ops.set_gradient_division(True)
    module = DLRM(model_config, embeddings=TorchRecEmbeddings(model_config, names, device="meta"))
    apply_optimizer_in_backward(
        getattr(fused, config.optimizer.fused),
        module.embeddings.collection.parameters(),
        config.embedding_optimizer_args(),
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
    # Each table's lookups a row (its multi-hot size), for the planner's estimate of the lookups' cost.
    pooling = model_config.multi_hot_sizes or [1] * len(names)
    constraints = {
        name: ParameterConstraints(
            sharding_types=allowed, compute_kernels=["fused"], min_partition=4, pooling_factors=[float(pooling[f])]
        )
        for f, name in enumerate(names)
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

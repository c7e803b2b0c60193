"""What the embedding tables and their optimiser state take in memory, and the refusals when they cannot fit.

The torch backend keeps every table in every process (a replica each); TorchRec's planner does its own
accounting per shard (``engine.sharding``) from the same per-value and per-row state sizes
(``config.training.EMBEDDING_OPTIMIZERS``).
"""

from __future__ import annotations

import torch

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.parallel import available_memory
from criteo_dlrm.config.training import EMBEDDING_OPTIMIZERS, TrainingConfig
from criteo_dlrm.models.dlrm import DLRMConfig


def embedding_bytes(table_sizes: list[int], dims: list[int], optimizer: str) -> int:
    """Bytes of fp32 embedding weights and their optimiser state for these tables."""
    values = sum(rows * dim for rows, dim in zip(table_sizes, dims, strict=True))
    state = EMBEDDING_OPTIMIZERS[optimizer]
    return 4 * (values * (1 + state.state_per_value) + sum(table_sizes) * state.state_per_row)


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
    config: TrainingConfig, table_sizes: list[int], device: torch.device, settings: str = TABLE_SETTINGS
) -> None:
    """Refuse, before encoding or training, tables (and their optimiser state) that cannot fit: in the set
    budget, or else in this machine's free memory (CPU: every process on it holds a replica with the torch
    backend) or in the GPU's memory. ``settings``: what shrinks them, for the message."""
    model_config = config.model_config(table_sizes)
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

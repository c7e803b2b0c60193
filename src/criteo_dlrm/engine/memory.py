"""What the embedding tables and their optimiser state take in memory, and the refusals when they cannot fit.

The torch backend keeps every table in every process (a replica each); TorchRec's planner does its own
accounting per shard (``engine.parallel.sharding``) from the same per-value and per-row state sizes
(``config.training.EMBEDDING_OPTIMIZERS``).
"""

from __future__ import annotations

import dataclasses

import psutil
import torch
from loguru import logger

from criteo_dlrm.common.errors import ConfigError, Fix
from criteo_dlrm.common.memory import memory_room
from criteo_dlrm.common.schema import NUM_SPARSE
from criteo_dlrm.config.training import EMBEDDING_OPTIMIZERS, TrainingConfig
from criteo_dlrm.data.batches import CHUNK_ROWS, WINDOW_CHUNKS
from criteo_dlrm.models.shapes import DLRMConfig


def embedding_bytes(table_sizes: list[int], dims: list[int], optimizer: str) -> int:
    """Bytes of fp32 embedding weights and their optimiser state for these tables."""
    values = sum(rows * dim for rows, dim in zip(table_sizes, dims, strict=True))
    state = EMBEDDING_OPTIMIZERS[optimizer]
    return 4 * (values * (1 + state.state_per_value) + sum(table_sizes) * state.state_per_row)


def check_replicated_memory(config: TrainingConfig, model_config: DLRMConfig) -> None:
    """The torch backend keeps every table in every process: refuse a run whose tables exceed the set budget."""
    budget = config.sharding.memory_per_process_gb
    if config.embedding_backend.sharded or budget is None:
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

# What a training process adds once it trains, besides its tables, dense layers, batches, windows and validation
# (counted by part below): torch's thread pools and kernels' buffers, the TensorBoard writer, the calibration and
# the plots. Measured (the bundled sample, AMD EPYC, 2 threads): the process's own memory (RssAnon) grew 300 MB from
# the table check to training's peak with a training batch of 256 rows, 350 MB with 4,096 and 910 MB with 32,768;
# the parts below count 190, 280 and 920 MB of it.
TRAINING_WORK_BYTES = 150_000_000
# Each further process of a multi-process run: Python, torch and the loader before its tables (a torchrun worker).
PROCESS_OVERHEAD_BYTES = 750_000_000
# A row of a loader window as read: the dense values (float32), each table's id in at most 4 bytes, the label
# (Criteo 1TB's rows measured 135 MB a window of 1,048,576: 129 bytes).
WINDOW_BYTES_PER_ROW = 160


def own_memory_bytes() -> int:
    """This process's own memory now (resident, less what it shares with other processes: file pages)."""
    info = psutil.Process().memory_info()
    return max(info.rss - info.shared, 0)


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a model holds per row and in all, counted on a copy of it with tables of two rows (costs nothing)."""

    dense: int  # values of the dense layers
    activations: float  # values of every module's output, per row
    lookups: int  # looked-up embedding values, per row


def _shape(model_config: DLRMConfig) -> _Shape:
    from criteo_dlrm.models.dlrm import DLRM

    small = DLRM(dataclasses.replace(model_config, table_sizes=[2] * len(model_config.table_sizes)))
    embedding = {id(p) for p in small.embedding_parameters()}
    dense = sum(p.numel() for p in small.parameters() if id(p) not in embedding)
    outputs = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for m in small.modules()]
    rows = 2
    with torch.no_grad():
        small(torch.zeros(rows, 13), torch.zeros(rows, len(model_config.table_sizes), dtype=torch.long))
    for hook in hooks:
        hook.remove()
    per_row = sum(o.numel() for out in outputs for o in (out if isinstance(out, list | tuple) else [out])) / rows
    return _Shape(dense, per_row, sum(model_config.sparse_embedding_sizes))  # one looked-up row a table and row


def run_memory_bytes(
    config: TrainingConfig,
    model_config: DLRMConfig,
    tables: int,
    train_rows: int | None = None,
    validation_rows: int = 0,
) -> dict[str, int]:
    """What a CPU training run adds to this process's memory at its peak, by part: every process's replica of the
    tables and their optimiser state (the in-progress and best checkpoints are written from them, never copied),
    and its dense layers (weights, gradients, Adam's moments); a training batch's work (activations and the
    tables' gradients for its lookups; the global batch, split between the processes); a validation batch's
    activations in each process; the loader's windows (two with ``prefetch_batches``, of at most ``train_rows``
    rows); the validation's predictions and metrics; ``TRAINING_WORK_BYTES`` in each process; and each further
    process's start. Measured against the bundled sample's runs (``TRAINING_WORK_BYTES``)."""
    shape = _shape(model_config)
    processes = config.distributed.nproc_per_node
    batch = config.batch_size
    window_rows = WINDOW_CHUNKS * CHUNK_ROWS if train_rows is None else min(train_rows, WINDOW_CHUNKS * CHUNK_ROWS)
    validated = batch.validation if not validation_rows else min(batch.validation, validation_rows)
    parts = {
        f"tables and their optimiser state ({processes} process(es))": processes * tables,
        "dense layers (weights, gradients, Adam's moments)": processes * 4 * 4 * shape.dense,
        "a training batch (activations, the tables' gradients)": int(
            4 * batch.train * (shape.activations + 2 * shape.lookups)
        ),
        "a validation batch's activations": int(processes * 4 * validated * shape.activations),
        "the loader's windows": (2 if config.prefetch_batches else 1) * window_rows * WINDOW_BYTES_PER_ROW,
        f"the validation's predictions and metrics ({validation_rows:,} rows)": (
            VALIDATION_BYTES_PER_ROW * validation_rows
        ),
        "training's own work (threads, kernels' buffers, TensorBoard, plots)": processes * TRAINING_WORK_BYTES,
    }
    if processes > 1:
        parts[f"{processes - 1} further process(es)"] = (processes - 1) * PROCESS_OVERHEAD_BYTES
    return parts


# On a GPU the validation's predictions stay there and its exact metrics are computed there
# (``engine.trained.metrics.binary_metrics_torch``): at its peak, per row, the float32 probabilities and their copy
# while the batches' outputs are joined (8 bytes), the labels (float32 and bool: 5), one class's scores picked, sorted
# and their sort's int64 order (16); the log loss's float64 terms are taken in pieces. MLPerf's 89M validation rows: 2.6
# GB.
VALIDATION_BYTES_PER_ROW = 32
# The CUDA caching allocator's rounding (blocks of 512 B, segments of 2 MB and more) and the fragmentation of what
# it keeps: a margin on everything counted, not measured here.
ALLOCATOR_MARGIN = 0.10


def gpu_memory_bytes(
    config: TrainingConfig, model_config: DLRMConfig, tables: int, validation_rows: int = 0
) -> dict[str, int]:
    """What a torch-backend training process holds on its GPU, by part: the tables and their optimiser state; the
    dense layers' weights, gradients and Adam's two moments (four copies); a training batch's activations and
    their gradients, and the tables' sparse gradients (values and the optimiser's coalesced copy) for the batch;
    a validation batch's activations; the validation set's predictions and metrics (``validation_rows`` of them,
    ``VALIDATION_BYTES_PER_ROW``); and the caching allocator's margin on all of it. The dense layers and the
    activations (every module's output, per row) are counted on a copy of the model with tables of two rows,
    which costs nothing."""
    shape = _shape(model_config)
    dense, per_row, lookups = shape.dense, shape.activations, shape.lookups
    batch = config.batch_size
    parts = {
        "tables and their optimiser state": tables,
        "dense layers (weights, gradients, Adam's moments)": 4 * 4 * dense,
        "a training batch (activations, their gradients, the tables' gradients)": int(
            4 * batch.train * (2 * per_row + 2 * lookups)
        ),
        "a validation batch's activations": int(4 * batch.validation * per_row),
        f"the validation's predictions and metrics ({validation_rows:,} rows)": (
            VALIDATION_BYTES_PER_ROW * validation_rows
        ),
    }
    return {**parts, "the caching allocator's margin": int(ALLOCATOR_MARGIN * sum(parts.values()))}


# Per row a training batch looks up: its int64 id with the multi-hot draws' temporaries (32 bytes), and its row of
# the tables' sparse gradient (one row per lookup, float32), twice: the gradient and its rows summed.
LOOKUP_ID_BYTES = 32


def lookup_bytes(config: TrainingConfig) -> int:
    """Bytes a training batch's lookups take at once (``LOOKUP_ID_BYTES``; 8 bytes a value of each looked-up row):
    26 a row, or ``multi_hot_sizes`` summed (MLPerf's 214)."""
    model_config = config.model_config([2] * NUM_SPARSE)
    hots = model_config.multi_hot_sizes or [1] * NUM_SPARSE
    per_row = sum(
        int(k) * (LOOKUP_ID_BYTES + 8 * dim) for k, dim in zip(hots, model_config.sparse_embedding_sizes, strict=True)
    )
    return config.batch_size.train * per_row


def check_lookup_memory(config: TrainingConfig, device: torch.device) -> None:
    """Refuse, before any node runs (the table sizes are not needed), a training batch whose lookups cannot fit
    (``lookup_bytes``) in the GPU's free memory or this process's room on the CPU: a multi-hot size of 1e9 grew the
    process until the kernel killed it, with no message."""
    needed = lookup_bytes(config)
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[0], f"{torch.cuda.get_device_name(device)}'s free memory"
    else:
        room = memory_room()
        available, where = room.available + own_memory_bytes(), room.where
    if needed > available:
        lookups = sum(config.multi_hot_sizes) if config.multi_hot_sizes else NUM_SPARSE
        per_row = needed // config.batch_size.train
        # A batch that takes half the room, where one row fits at all (else only smaller multi-hot sizes help).
        fits = available // (2 * per_row)
        fix = Fix(params={"training.batch_size.train": int(fits)}) if fits >= 1 else ()
        raise ConfigError(
            f"A training batch of {config.batch_size.train:,} rows looks up {lookups:,} table rows a row "
            f"(training.multi_hot_sizes): its ids and the tables' gradients for them need {needed / 1e9:,.1f} GB, "
            f"more than {where} ({available / 1e9:,.1f} GB). Lower training.multi_hot_sizes (MLPerf's sum to 214) "
            "or training.sparse_embedding_sizes" + (f" or use `{fix}`." if fix else "."),
            fix=fix,
        )


def check_table_memory(
    config: TrainingConfig,
    table_sizes: list[int],
    device: torch.device,
    settings: str = TABLE_SETTINGS,
    validation_rows: int = 0,
    train_rows: int | None = None,
) -> None:
    """Refuse, before encoding or training, a run whose tables (and their optimiser state) cannot fit with what
    training holds besides: in the set budget, or else in the GPU's free memory (``gpu_memory_bytes``), or on the
    CPU in the room this process has (the smallest of its memory cgroup's, its ancestors' and the machine's: a
    batch job's limit, not the node's), this process's own memory now and what the run adds
    (``run_memory_bytes``). ``settings``: what shrinks the tables; ``validation_rows``: the rows validated at most;
    ``train_rows``: the training rows (they bound a loader window; None: a whole window). With
    ``training.memory_check: false`` a run that does not fit is logged with the count and goes on."""
    model_config = config.model_config(table_sizes)
    check_replicated_memory(config, model_config)
    if config.embedding_backend.sharded or config.sharding.memory_per_process_gb is not None:
        return
    tables = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, config.embedding_optimizer)
    if device.type == "cuda":
        parts = gpu_memory_bytes(config, model_config, tables, validation_rows)
        needed, available = sum(parts.values()), torch.cuda.mem_get_info(device)[0]
        where, left, counted_where = f"{torch.cuda.get_device_name(device)}'s free memory", "GB left", "on each GPU"
    else:
        own = own_memory_bytes()
        parts = {"this process now (Python, torch, Kedro, MLflow)": own}
        parts.update(run_memory_bytes(config, model_config, tables, train_rows, validation_rows))
        room = memory_room()
        # This process is already out of the room: it is counted as a part, and given back to the room.
        needed, available, where = sum(parts.values()), room.available + own, room.where
        left, counted_where = "GB left, this process included", "in all"
    if needed <= available:
        return
    counted = (
        f"{needed / 1e9:,.1f} GB {counted_where} ("
        + ", ".join(f"{name} {size / 1e9:,.2f} GB" for name, size in parts.items())
        + ")"
    )
    message = (
        f"The embedding tables and their {config.embedding_optimizer} state with what training holds besides need "
        f"{counted}, more than {where} ({available / 1e9:,.1f} {left})."
    )
    if not config.memory_check:
        logger.warning("{} training.memory_check is false: training anyway.", message)
        return
    fix = Fix(params={"training.memory_check": False})
    raise ConfigError(
        f"{message} Shrink the tables ({settings}) or the batches (training.batch_size), or shard the tables across "
        f"processes with embedding_backend: torchrec. Where the count is wrong for this machine, `{fix}` trains "
        "anyway (a run that does not fit is then ended by the kernel, without a message).",
        fix=fix,
    )

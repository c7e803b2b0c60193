"""``training.precision: auto``, decided by the run's own step, on a CPU and on a GPU.

A CPU's bf16 matmul rate (``device.cpu_matmul_rates``), or a GPU's having bf16, says whether bf16 can help at all;
whether it helps this
run depends on the run's shapes: on the default model (batch 256, small layers) bf16's casts and the embedding
work outweigh its faster matmuls (0.91x fp32 on an AMX CPU whose matmuls run 7.8x), on a wide one it trains 2x
fp32. On an H200 the Kaggle-like model trained 0.79-0.93x fp32 in bf16: its step is the tables' lookups and their
optimiser, and bf16 adds casts. So where bf16 could help, a few steps of this run's own model and batch size are
timed in both precisions on the run's device, and bf16 is chosen only where its step is at least ``STEP_SPEEDUP``
times fp32's. The rates are kept per CPU (or GPU), torch, threads and step shape in ``STEP_CACHE``: the next run
of the same shape measures nothing.
"""

from __future__ import annotations

import dataclasses
import json
import time

import torch

from criteo_dlrm.config.evaluation import PRECISIONS
from criteo_dlrm.config.training import EmbeddingBackend, TrainingConfig
from criteo_dlrm.data.batches import Batch
from criteo_dlrm.engine.device import PROBE_CACHE, cached_rates, machine_key, resolve_precision
from criteo_dlrm.models.shapes import DLRMConfig

# bf16 where this run's step measured at least this many times as fast as in fp32 (bf16 rounds the activations:
# a step that is not faster is not worth it; the margin is above the probe's noise, a few percent).
STEP_SPEEDUP = 1.1
# Where the step rates are kept (beside the matmul probe's).
STEP_CACHE = PROBE_CACHE.with_name("step_probe.json")
# Each precision's timing: a warm-up, then ``PROBE_ROUNDS`` rounds of steps, alternating the precisions, for
# ``PROBE_SECONDS`` in all (each round at least ``PROBE_MIN_STEPS``).
PROBE_WARMUP_STEPS = 3
PROBE_ROUNDS = 3
PROBE_SECONDS = 0.6
PROBE_MIN_STEPS = 2
# Rows of each table in the probe's model: a step's cost is its lookups', not its tables' rows.
PROBE_TABLE_ROWS = 100_000


def step_key(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> str:
    """What decides a step's speed: the CPU (or the GPU), torch, the threads, the model's layers and the batch, the
    optimisers."""
    shape = dataclasses.asdict(model_config)
    shape.pop("table_sizes")
    shape.pop("initial_ctr", None)
    step = {"batch": config.batch_size.train, "dense_optimizer": config.dense_optimizer,
            "embedding_optimizer": config.embedding_optimizer, "model": shape}  # fmt: skip
    machine = machine_key() if device.type == "cpu" else f"{torch.cuda.get_device_name(device)} | {machine_key()}"
    return f"{machine} | {json.dumps(step, sort_keys=True)}"


def probe_config(config: TrainingConfig) -> TrainingConfig:
    """The settings the probe's steps run with: this run's, in one process, the tables on the torch backend
    (TorchRec's fused kernels are not timed; its dense layers, where bf16 acts, are the same), not compiled."""
    probe = dataclasses.replace(config, compile=False, phase_timing=False, embedding_weight_decay=0.0)
    if probe.embedding_backend.sharded:
        probe = dataclasses.replace(probe, embedding_backend=EmbeddingBackend.TORCH, embedding_optimizer="adagrad")
    return probe


def measure_step_rates(
    model_config: DLRMConfig, config: TrainingConfig, device: torch.device | None = None
) -> dict[str, float]:
    """Training rows per second of this run's step on ``device``, in fp32 and in bf16: the model as configured (its
    tables cut to ``PROBE_TABLE_ROWS`` rows), a batch of the run's size, ``PROBE_SECONDS`` of steps each after a
    warm-up, in rounds that alternate the precisions (each one's best round), in this process's threads. On a GPU
    each round waits for the device's work before it is timed and after."""
    from criteo_dlrm.engine.parallel.group import Group
    from criteo_dlrm.engine.parallel.modes import build_mode
    from criteo_dlrm.engine.training.step import TrainStep

    device = device if device is not None else torch.device("cpu")

    small = dataclasses.replace(model_config, table_sizes=[min(s, PROBE_TABLE_ROWS) for s in model_config.table_sizes])
    rows = config.batch_size.train
    generator = torch.Generator().manual_seed(0)
    batch = Batch(
        (torch.rand(rows, generator=generator) < 0.25).float(),
        torch.randn(rows, model_config.dense_in_features, generator=generator),
        torch.stack([torch.randint(0, size, (rows,), generator=generator) for size in small.table_sizes], dim=1),
    ).to(device)  # on the device once, as the loader's prefetch hands the run's steps their batches
    cuda = device.type == "cuda"
    # The run's random state as it was (the weights, dropout's draws), the GPU's too.
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type=device.type):
        steps = {}
        for precision in PRECISIONS:
            settings = dataclasses.replace(probe_config(config), precision=precision)
            torch.manual_seed(0)
            steps[precision] = TrainStep(build_mode(small, settings, device, Group(alone=True)), settings)
            for _ in range(PROBE_WARMUP_STEPS):
                steps[precision](batch, 0, 1)
        # Rounds that alternate the precisions, each precision's best kept: a busy moment of the machine (or
        # bf16's kernels still being prepared) lowers one round, not the choice.
        rates = dict.fromkeys(PRECISIONS, 0.0)
        for _ in range(PROBE_ROUNDS):
            for precision, step in steps.items():
                if cuda:
                    torch.cuda.synchronize(device)
                count, start = 0, time.perf_counter()
                while count < PROBE_MIN_STEPS or time.perf_counter() - start < PROBE_SECONDS / PROBE_ROUNDS:
                    step(batch, 0, 1)
                    count += 1
                if cuda:
                    torch.cuda.synchronize(device)
                rates[precision] = max(rates[precision], count * rows / (time.perf_counter() - start))
    return rates


def step_rates(model_config: DLRMConfig, config: TrainingConfig, device: torch.device) -> dict[str, float]:
    """``measure_step_rates``, kept in ``STEP_CACHE`` for the next runs of the same step on this CPU or GPU."""
    return cached_rates(
        STEP_CACHE,
        step_key(model_config, config, device),
        lambda: measure_step_rates(model_config, config, device),
        "this run's step rates",
    )


def choose_precision(
    config: TrainingConfig, model_config: DLRMConfig, device: torch.device
) -> tuple[str, str, float | None]:
    """``(precision, why, bf16's step speed-up)`` for this run: as set; with ``auto`` fp32 where
    ``device.resolve_precision`` says bf16 cannot help (a GPU without bf16, a CPU whose matmuls are not faster in
    bf16), else bf16 where this run's own step measured at least ``STEP_SPEEDUP`` times as fast in bf16 on its
    device (the speed-up None where not measured)."""
    precision, why = resolve_precision(config.precision, device)
    if config.precision != "auto" or precision != "bf16":
        return precision, why, None
    rates = step_rates(model_config, config, device)
    speedup = rates["bf16"] / rates["fp32"]
    chosen = "bf16" if speedup >= STEP_SPEEDUP else "fp32"
    return (
        chosen,
        (
            f"this run's step trains {speedup:.2f}x as fast in bf16 ({rates['bf16']:,.0f} against {rates['fp32']:,.0f} "
            f"rows/s; bf16 from {STEP_SPEEDUP}x), {why}"
        ),
        speedup,
    )

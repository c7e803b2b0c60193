"""Embedding backends compared: ``torch`` (every process holds every table) vs ``torchrec`` (sharded), in one run.

    python -m benchmarks.sharding [--processes 1,2] [--device cpu] [--steps 30] [--rows 200000]
    python -m benchmarks.sharding --device cuda --processes 1 --sharding row_wise   # on a GPU machine

Part 1, throughput at the Kaggle-like configuration of ``benchmarks/training.py`` (26 tables sized like
Kaggle's, capped at 100,000 rows; 16-dim embeddings; MLPs 512-256-64-16 and 512-256; global batch 2048): each
backend on 1 and 2 processes, launched by torch.distributed's elastic launcher (gloo on CPU, nccl on CUDA),
each process running the project loop's own step (``Trainer.train_step``) with the backend's usual embedding
optimiser (torch: sparse_adam, the project default; torchrec: FBGEMM's fused row-wise Adagrad). Prints
samples/s, step time, the planner's sharding types, the table + optimiser memory per process and the
process's peak RSS.

Part 2, a table larger than the memory budget: the same model with one table of ``--big-rows`` rows and a
``--budget-gb`` per-process budget (``sharding.memory_per_process_gb``). The torch backend refuses (it would
replicate the table in every process); TorchRec's planner splits it across the processes and trains.
"""

from __future__ import annotations

import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import elastic_launch

from benchmarks.distributed import join_process_group, seconds_per_step
from benchmarks.harness import Arguments, Table, describe_machine
from benchmarks.training import CONFIGURATIONS, spec_batch, spec_config, synthetic_arrays
from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.stored import open_encoded, write_encoded
from criteo_dlrm.engine.memory import check_replicated_memory
from criteo_dlrm.engine.parallel.group import destroy_group
from criteo_dlrm.engine.parallel.modes import build_mode
from criteo_dlrm.engine.training.distributed import launch_config
from criteo_dlrm.engine.training.step import TrainStep

OPTIMIZERS = {"torch": "sparse_adam", "torchrec": "rowwise_adagrad"}


def _config(backend: str, batch: int, device: str, sharding: dict) -> TrainingConfig:
    return TrainingConfig.from_dict(
        {
            "embedding_backend": backend,
            "embedding_optimizer": OPTIMIZERS[backend],
            "embedding_learning_rate": 0.003 if backend == "torch" else 0.02,
            "batch_size": {"train": batch},
            "device": device,
            "sharding": sharding
            if backend == "torchrec"
            else {"memory_per_process_gb": sharding.get("memory_per_process_gb")},
        }
    )


def _measure(folder: str, tables: list[int], backend: str, batch: int, steps: int, device_kind: str, sharding: dict):
    """One process of a measurement (rank 0's result is kept)."""
    device = join_process_group(device_kind)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = _config(backend, batch, str(device), sharding)
    model_config = spec_config({**CONFIGURATIONS["kaggle-like"], "tables": tables})
    torch.manual_seed(0)
    mode = build_mode(model_config, config, device)
    summary = mode.placement.summary()
    if backend == "torchrec":
        memory = max(summary["bytes_per_rank"])
        types = sorted({t["sharding_type"] for t in summary["tables"]})
    else:
        memory, types = summary["bytes_per_process"], ["replicated"]
    arrays = open_encoded(Path(folder))
    loader = BatchLoader(arrays, batch, shuffle=True, pin_memory=device.type == "cuda", rank=rank, world_size=world)
    batches = (b for epoch in range(1000) for b in loader.batches(epoch=epoch))
    seconds = seconds_per_step(TrainStep(mode, config), batches, steps)
    del mode  # its model's DDP before the group it holds (engine.parallel.group.destroy_group)
    destroy_group()
    return {
        "samples_per_second": batch / seconds,
        "step_ms": 1000 * seconds,
        "types": types,
        "memory": memory,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _run(folder: str, tables: list[int], backend: str, processes: int, args, sharding: dict) -> dict | str:
    """Rank 0's measurement, or why the run could not start."""
    if backend == "torch":
        config = _config(backend, args.batch, args.device, sharding)
        try:
            check_replicated_memory(config, spec_config({**CONFIGURATIONS["kaggle-like"], "tables": tables}))
        except ConfigError as error:
            return "refused: " + str(error).split(" in every process")[0].split("need ")[-1] + " per process"
    try:
        launch = launch_config(processes, Path(folder) / "launcher")  # removed with the benchmark's folder
        measure = elastic_launch(launch, _measure)
        return measure(folder, tables, backend, args.batch, args.steps, args.device, sharding)[0]
    except Exception as error:  # noqa: BLE001 - a planner refusal inside a worker: report it in the table
        return f"failed: {'no plan fits the budget' if 'planner' in str(error).lower() else type(error).__name__}"


def _row(backend: str, processes: int, result: dict | str, base: float | None) -> list:
    if isinstance(result, str):
        return [backend, processes, result, *[""] * 5]
    ratio = f"{result['samples_per_second'] / base:.2f}x" if base else ""
    return [backend, processes, f"{result['samples_per_second']:,.0f}", ratio, f"{result['step_ms']:.1f}",
            ", ".join(result["types"]), f"{result['memory'] / 1e6:,.0f}", f"{result['peak_rss'] / 1e6:,.0f}"]  # fmt: skip


def _table() -> Table:
    return Table("backend", "processes", "samples/s", "x torch, 1 process", "step ms", "sharding",
                 "tables + optimiser MB per process", "peak RSS MB (rank 0)", align="lrrrrlrr")  # fmt: skip


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--processes", "1", "--steps", "3", "--rows", "10000", "--skip-budget"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=spec_batch(CONFIGURATIONS["kaggle-like"]))
    parser.add_argument("--sharding", default=None, help="force a sharding type for torchrec (e.g. row_wise on CUDA)")
    parser.add_argument("--big-rows", type=int, default=10_000_000)
    parser.add_argument("--budget-gb", type=float, default=0.5)
    parser.add_argument("--skip-budget", action="store_true")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]
    tables = CONFIGURATIONS["kaggle-like"]["tables"]
    big_tables = [args.big_rows, *tables[1:]]
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    forced = {"type": args.sharding} if args.sharding else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (("kaggle", tables), ("big", big_tables)):
            write_encoded(synthetic_arrays(args.rows, sizes), Path(tmp) / name)  # digests included
        results = {
            (backend, processes): _run(str(Path(tmp) / "kaggle"), tables, backend, processes, args, forced)
            for backend in ("torch", "torchrec")
            for processes in counts
        }
        print()
        describe_machine()
        print(f"Kaggle-like DLRM, global batch {args.batch:,}, {args.steps} steps each, {device}\n")
        table = _table()
        base = results[("torch", counts[0])]
        base_rate = base["samples_per_second"] if isinstance(base, dict) else None
        for (backend, processes), result in results.items():
            table.row(*_row(backend, processes, result, base_rate))
        if args.skip_budget:
            return
        budget = {**forced, "memory_per_process_gb": args.budget_gb}
        big = {
            (backend, processes): _run(str(Path(tmp) / "big"), big_tables, backend, processes, args, budget)
            for backend in ("torch", "torchrec")
            for processes in counts
        }
        print(
            f"\nOne table of {args.big_rows:,} rows x 16 ({args.big_rows * 64 / 1e9:.2f} GB of fp32 weights), "
            f"budget {args.budget_gb} GB per process (sharding.memory_per_process_gb)\n"
        )
        table = _table()
        for (backend, processes), result in big.items():
            table.row(*_row(backend, processes, result, None))


if __name__ == "__main__":
    main()

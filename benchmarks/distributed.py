"""Data-parallel training throughput: 1..N processes on torch.distributed, in one run.

    python -m benchmarks.distributed [--processes 1,2] [--device cpu] [--steps 40] [--rows 200000]
    python -m benchmarks.distributed --processes 1,2,4,8 --device cuda --batch 16384   # on a GPU machine

At the Kaggle-like configuration of ``benchmarks/training.py`` (26 tables sized like Kaggle's, capped at
100,000 rows; 16-dim embeddings; MLPs 512-256-64-16 and 512-256; global batch 2048), each process count is
launched through torch.distributed's elastic launcher (gloo on CPU, nccl on CUDA), and every process runs
the project loop's own step (``Trainer.train_step`` under DistributedDataParallel) on its share of each
global batch. For each count it prints:

- samples/s: global batch rows per second (all processes together), the loader included;
- step ms: one optimisation step, gradients all-reduced (dense and sparse embedding gradients);
- step ms without sync: the same steps with no gradient exchange at all (each process's replica outside DDP,
  and no all-gather of the sparse embedding gradients);
- communication share: 1 - (without sync / with sync), the part of a step spent on communication that
  the backward pass does not hide. With 1 process there is nothing to all-reduce.

On CPU every process gets cores / processes threads, so on a 2-core machine 2 processes split the same
two cores: expect overhead, not speed-up. The figures that matter are from one GPU per process.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import elastic_launch

from benchmarks.harness import Arguments, Table, describe_machine
from benchmarks.training import CONFIGURATIONS, spec_batch, spec_config, spec_training, synthetic_arrays
from criteo_dlrm.data.batches import Batch, BatchLoader
from criteo_dlrm.data.stored import open_encoded, write_encoded
from criteo_dlrm.engine.parallel.modes import mode_around
from criteo_dlrm.engine.training.distributed import launch_config
from criteo_dlrm.engine.training.step import TrainStep
from criteo_dlrm.models import DLRM


def join_process_group(device_kind: str) -> torch.device:
    """In a process the elastic launcher started: its device (one GPU each on CUDA, else its share of the
    cores) and the process group joined (nccl on CUDA, gloo on CPU)."""
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = device_kind == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return device


def seconds_per_step(step: TrainStep, batches: Iterator[Batch], steps: int) -> float:
    """The project's training step (``engine.training.step.TrainStep``) timed over ``steps`` steps after 3 warm-up
    steps, every process in step."""
    cuda = step.mode.device.type == "cuda"
    for _ in range(3):
        step(next(batches), 0, 1)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step(next(batches), 0, 1)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / steps


def _measure(folder: str, batch: int, steps: int, device_kind: str) -> dict:
    """One process of a measurement (rank 0's result is kept)."""
    device = join_process_group(device_kind)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = CONFIGURATIONS["kaggle-like"]
    model = DLRM(spec_config(spec)).to(device)
    config = spec_training(spec, batch_size={"train": batch}, device=str(device))
    arrays = open_encoded(Path(folder))
    loader = BatchLoader(arrays, batch, shuffle=True, pin_memory=device.type == "cuda", rank=rank, world_size=world)
    batches = (b for epoch in range(1000) for b in loader.batches(epoch=epoch))
    synced = seconds_per_step(TrainStep(mode_around(model, config, device), config), batches, steps)
    alone = mode_around(model, config, device, data_parallel=False)  # no gradient leaves a process
    unsynced = seconds_per_step(TrainStep(alone, config), batches, steps)
    dist.destroy_process_group()
    return {"samples_per_second": batch / synced, "step_ms": 1000 * synced, "no_sync_ms": 1000 * unsynced}


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--processes", "1", "--steps", "3", "--rows", "10000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=spec_batch(CONFIGURATIONS["kaggle-like"]))
    args = parser.parse_args()
    spec = CONFIGURATIONS["kaggle-like"]
    with tempfile.TemporaryDirectory() as tmp:
        arrays = synthetic_arrays(args.rows, spec["tables"])
        write_encoded(arrays, Path(tmp))  # stored as training stores rows: digests included
        results = {}
        for processes in (int(p) for p in args.processes.split(",")):
            launch = launch_config(processes, Path(tmp) / "launcher")  # removed with the folder
            results[processes] = elastic_launch(launch, _measure)(tmp, args.batch, args.steps, args.device)[0]
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    print()
    describe_machine()
    print(f"Kaggle-like DLRM, global batch {args.batch:,}, {args.steps} steps each, {device}\n")
    table = Table("processes", "samples/s", "x 1 process", "step ms", "step ms without sync", "communication share",
                  align="rrrrrr")  # fmt: skip
    base = results[min(results)]["samples_per_second"]
    for processes, result in results.items():
        share = max(0.0, 1 - result["no_sync_ms"] / result["step_ms"]) if processes > 1 else 0.0
        rate = result["samples_per_second"]
        table.row(processes, f"{rate:,.0f}", f"{rate / base:.2f}x", f"{result['step_ms']:.1f}",
                  f"{result['no_sync_ms']:.1f}", f"{share:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()

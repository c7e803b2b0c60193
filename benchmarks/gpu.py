"""GPU training throughput and memory: bf16 / TF32 / torch.compile on and off, batch sizes up to 64k.

Criteo-Kaggle-sized tables (uncapped: 33.8M rows of 16 floats), dense MLP 512-256-64-16, top MLP
512-256, Adam + SparseAdam. Batches come from pinned host memory through the project's loader and are copied on a
side stream two batches ahead (``Prefetcher``, as training does), phases untimed (no synchronisation within a step),
so the figure is the GPU's unless the input is slower. Exits with a message when no CUDA device is present.
``benchmarks/gpu_smoke.py`` checks every CUDA path first.

    python -m benchmarks.gpu [--batches 2048 8192 32768 65536] [--steps 50] [--compile-mode default]
"""

from __future__ import annotations

import itertools
import sys
import time

import torch

from benchmarks.harness import Arguments, Table
from benchmarks.training import (
    KAGGLE_CARDINALITIES,
    KAGGLE_LIKE,
    flops_per_sample,
    spec_config,
    spec_training,
    synthetic_arrays,
    training_step,
)
from criteo_dlrm.data.batches import BatchLoader, Prefetcher
from criteo_dlrm.engine.device import compile_model, configure_backends
from criteo_dlrm.models import DLRM


def measure(
    batch: int, bf16: bool, tf32: bool, compiled: bool, steps: int, arrays, compile_mode: str
) -> tuple[float, float]:
    device = torch.device("cuda")
    configure_backends(device, allow_tf32=tf32, num_threads=None)
    torch.manual_seed(0)
    model = DLRM(spec_config(KAGGLE_LIKE)).to(device)
    if compiled:
        compile_model(model, compile_mode)
    config = spec_training(
        KAGGLE_LIKE, precision="bf16" if bf16 else "fp32", batch_size={"train": batch}, phase_timing=False
    )
    train = training_step(model, config, device, arrays)
    loader = BatchLoader(arrays, batch, shuffle=True, pin_memory=True)
    batches = Prefetcher(itertools.chain.from_iterable(loader.batches(epoch=e) for e in itertools.count()), 2, device)

    def step() -> int:
        b = next(batches)  # already on the device, copied on the side stream
        train(b)
        return len(b)

    for _ in range(10 if compiled else 3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, rows = time.perf_counter(), 0
    for _ in range(steps):
        rows += step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    batches.close()
    return rows / seconds, torch.cuda.max_memory_allocated() / 2**30


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--batches", "256", "--steps", "2", "--rows", "10000", "--skip-compile"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--batches", type=int, nargs="+", default=[2048, 8192, 32768, 65536])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument(
        "--compile-mode",
        default="max-autotune-no-cudagraphs",
        help="torch.compile's mode (default: autotuned, minutes)",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("No CUDA device: this benchmark needs a GPU (see benchmarks/training.py for the CPU one).")
    arrays = synthetic_arrays(args.rows, KAGGLE_CARDINALITIES)
    config = spec_config(KAGGLE_LIKE)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {flops_per_sample(config) / 1e6:.2f} MFLOP/sample\n"
    )
    table = Table("batch", "bf16", "TF32", "compile", "samples/s", "peak GPU memory (GiB)", align="rlllrr")
    for batch in args.batches:
        for bf16, tf32, compiled in [
            (False, False, False),
            (False, True, False),
            (True, True, False),
            (True, True, True),
        ]:
            if compiled and args.skip_compile:
                continue
            rate, memory = measure(batch, bf16, tf32, compiled, args.steps, arrays, args.compile_mode)
            table.row(f"{batch:,}", bf16, tf32, compiled, f"{rate:,.0f}", f"{memory:.2f}")


if __name__ == "__main__":
    main()

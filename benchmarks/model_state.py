"""What the model's state costs as it grows, in one run: a training process's peak memory against its tables,
the in-progress checkpoint's write and resume seconds per GB, and exact validation metrics' rows/s against
numpy sorting the same float32 scores once.

Each table size trains in a child process of its own (its peak memory is its own): 26 tables of 32 values,
SparseAdam (twice the tables in state), resume on, two validations; ``base`` is the child's memory before the
model exists (Python, torch, the rows).

    python benchmarks/model_state.py [--table-gb 0.25 1 4] [--metric-rows 10000000 89137319]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine import progress
from criteo_dlrm.engine.loop import Trainer
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.metrics import binary_metrics
from criteo_dlrm.engine.modes import build_mode

from threads import cpu_model
from training import matmul_gflops, synthetic_arrays

DIM = 32


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(table_gb: float, folder: Path) -> dict:
    """Train tables of ``table_gb`` for 16 steps with a validation every 8, then resume the run in a new
    Trainer: peak memory, seconds per in-progress write and for the resume."""
    rows = max(int(table_gb * 1e9 / (26 * DIM * 4)), 16)
    train, validation = synthetic_arrays(8192, [rows] * 26), synthetic_arrays(4096, [rows] * 26, seed=1)
    config = TrainingConfig.from_dict(
        {
            "dense_mlp": {"hidden_layer_sizes": [64], "output_size": DIM},
            "sparse_embedding_sizes": DIM,
            "prediction_hidden_sizes": [64],
            "batch_size": {"train": 512, "validation": 4096},
            "max_steps": 16,
            "validate_every_steps": 8,
            "prefetch_batches": 0,
            "in_progress_dir": str(folder),
        }
    )
    model_config = config.model_config([rows] * 26, 0.25)
    writes = []
    save = progress.ProgressFiles.save

    def timed(self, values, improved):
        start = time.perf_counter()
        save(self, values, improved)
        writes.append(time.perf_counter() - start)

    progress.ProgressFiles.save = timed
    base = _rss()

    def trainer() -> Trainer:
        torch.manual_seed(0)
        mode = build_mode(model_config, config, torch.device("cpu"))
        return Trainer(
            mode,
            config,
            BatchLoader(train, 512, shuffle=True, seed=0),
            BatchLoader(validation, 4096),
            folder / "run",
            resume_path=folder / "dlrm_x.pt",
            fingerprint="x",
        )

    trainer().fit()
    peak = _rss()
    start = time.perf_counter()
    resumed = trainer()
    resume = time.perf_counter() - start
    assert resumed.step == 16
    state = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, "sparse_adam")
    file_gb = (folder / "dlrm_x.pt").stat().st_size / 1e9
    return {
        "tables": state / 3,
        "state": state,
        "base": base,
        "peak": peak,
        "write_s_per_gb": max(writes[1:]) / file_gb,  # a validation's write (the first is of the untrained state)
        "resume_s_per_gb": resume / file_gb,
    }


def metrics_rate(rows: int, repeats: int = 3) -> dict:
    """Exact metrics (AUC, log loss, ...) on ``rows`` float32 scores at a 3% click rate, best of ``repeats``."""
    rng = np.random.default_rng(0)
    labels = rng.random(rows) < 0.03
    scores = (rng.random(rows, dtype=np.float32) * 0.2 + labels * 0.05).astype(np.float32)
    sort = metrics = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.sort(scores)
        sort = min(sort, time.perf_counter() - start)
        start = time.perf_counter()
        binary_metrics(labels, scores)
        metrics = min(metrics, time.perf_counter() - start)
    return {"rows": rows, "sort": sort, "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, nargs="+", default=[0.25, 1.0, 4.0])
    parser.add_argument("--metric-rows", type=int, nargs="+", default=[10_000_000, 89_137_319])
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, Path(args.folder))))
        return
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    fp32, bf16 = matmul_gflops(), matmul_gflops(dtype=torch.bfloat16)
    print(f"matmul 2048x2048: fp32 {fp32:,.0f} GFLOP/s, bf16 {bf16:,.0f} GFLOP/s\n")
    print("| tables GB | tables + SparseAdam state GB | peak over base GB | peak / state | write s/GB | resume s/GB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for gb in args.table_gb:
        with tempfile.TemporaryDirectory() as folder:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(gb), "--folder", folder],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
        m = json.loads(out.stdout.strip().splitlines()[-1])
        grown = (m["peak"] - m["base"]) / 1e9
        print(
            f"| {m['tables'] / 1e9:.2f} | {m['state'] / 1e9:.2f} | {grown:.2f} | {grown / (m['state'] / 1e9):.2f} "
            f"| {m['write_s_per_gb']:.2f} | {m['resume_s_per_gb']:.2f} |"
        )
    print("\n| rows | numpy sort of the float32 scores s | exact metrics s | rows/s | ratio to the sort |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in args.metric_rows:
        m = metrics_rate(rows)
        print(
            f"| {rows:,} | {m['sort']:.3f} | {m['metrics']:.3f} | {rows / m['metrics'] / 1e6:,.1f}M "
            f"| {m['metrics'] / m['sort']:.2f} |"
        )


if __name__ == "__main__":
    main()

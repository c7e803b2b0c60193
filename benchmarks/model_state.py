"""What the model's state costs as it grows, in one run: a training process's peak memory against its tables,
the in-progress checkpoint's write and resume seconds per GB, and exact validation metrics' rows/s against
numpy sorting the same float32 scores once.

Each table size trains in child processes of its own (their peak memory is their own): 26 tables of 32 values,
resume on, two validations, with the torch backend (SparseAdam: twice the tables in state; a replica in each
process) and TorchRec (row-wise Adagrad, tables sharded table-wise), in 1 and 2 processes over gloo; ``base`` is a
child's memory before the model exists (Python, torch, the rows).

    python -m benchmarks.model_state [--table-gb 0.25 1 4] [--runs torch:1 torch:2 torchrec:1 torchrec:2]
                                     [--metric-rows 10000000 89137319]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.harness import Arguments, Table, child_command, describe_machine
from benchmarks.training import synthetic_arrays
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.parallel.group import destroy_group
from criteo_dlrm.engine.parallel.modes import build_mode
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.engine.training.loop import Trainer

DIM = 32


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


OPTIMIZER = {"torch": "sparse_adam", "torchrec": "rowwise_adagrad"}  # each backend's usual on the CPU


def child(table_gb: float, folder: Path, backend: str = "torch", rank: int = 0, world: int = 1) -> dict:
    """Train tables of ``table_gb`` for 16 steps with a validation every 8, then resume the run in a new
    Trainer: this process's peak memory, seconds per in-progress write and for the resume, per GB it wrote.
    ``world`` > 1 (or TorchRec): one of ``world`` processes in a gloo group through a file in ``folder``."""
    if world > 1 or backend == "torchrec":
        dist.init_process_group("gloo", init_method=f"file://{folder}/group", rank=rank, world_size=world)
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
            "embedding_backend": backend,
            "embedding_optimizer": OPTIMIZER[backend],
            **({"sharding": {"type": "table_wise"}} if backend == "torchrec" else {}),
        }
    )
    model_config = config.model_config([rows] * 26, 0.25)
    writes = []
    base = _rss()

    def trainer() -> Trainer:
        torch.manual_seed(0)
        mode = build_mode(model_config, config, torch.device("cpu"))
        loader = BatchLoader(train, 512, shuffle=True, seed=0, rank=rank, world_size=world)
        built = Trainer(mode, config, loader, BatchLoader(validation, 4096), folder / "run",
                        resume_path=folder / "dlrm_x.pt", fingerprint="x")  # fmt: skip
        save = built.in_progress.save

        def timed(state, improved=False):
            start = time.perf_counter()
            save(state, improved)
            writes.append(time.perf_counter() - start)

        built.in_progress.save = timed
        return built

    first = trainer()
    first.fit()
    if backend == "torchrec":
        state = first.mode.placement.sharded.bytes_per_rank[rank]
        tables = state * DIM * 4 / (DIM * 4 + 4)  # row-wise Adagrad: one value a row
        [shards] = folder.glob("dlrm_x.state-*")
        written = sum(path.stat().st_size for path in shards.glob(f"part-*/__{rank}_*.distcp"))
    else:
        state = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, "sparse_adam")
        tables = state / 3
        written = (folder / "dlrm_x.pt").stat().st_size if rank == 0 else 0
    del first
    peak = _rss()
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    resumed = trainer()
    resume = time.perf_counter() - start
    assert resumed.step == 16
    del resumed  # its model's DDP before the group it holds (engine.parallel.group.destroy_group)
    if dist.is_initialized():
        destroy_group()
    return {
        "tables": tables,
        "state": state,
        "base": base,
        "peak": peak,
        "write_s": max(writes[1:]),  # a validation's write (the first is of the untrained state)
        "resume_s": resume,
        "written": written,
    }


def run_children(table_gb: float, backend: str, processes: int) -> list[dict]:
    """``processes`` children training together; each one's figures."""
    with tempfile.TemporaryDirectory() as folder:
        children = [
            subprocess.Popen(
                [
                    *child_command(__spec__.name),
                    "--child",
                    str(table_gb),
                    "--folder",
                    folder,
                    "--backend",
                    backend,
                    "--rank",
                    str(rank),
                    "--world",
                    str(processes),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for rank in range(processes)
        ]
        outputs = [child.communicate()[0] for child in children]
        if any(child.returncode for child in children):
            raise SystemExit(f"a {backend} child with {table_gb} GB of tables in {processes} process(es) failed")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


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


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--table-gb", "0.01", "--runs", "torch:1", "torchrec:2", "--metric-rows", "100000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--table-gb", type=float, nargs="+", default=[0.25, 1.0, 4.0])
    parser.add_argument("--metric-rows", type=int, nargs="+", default=[10_000_000, 89_137_319])
    parser.add_argument("--runs", nargs="*", default=["torch:1", "torch:2", "torchrec:1", "torchrec:2"],
                        help="backend:processes (default: both backends in 1 and 2 processes; none given: only the "
                        "metrics)")  # fmt: skip
    parser.add_argument("--max-replica-gb", type=float, default=8.0,
                        help="skip the torch backend's 2-process runs over this many GB of tables + state per "
                        "process (each holds a replica)")  # fmt: skip
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, Path(args.folder), args.backend, args.rank, args.world)))
        return
    describe_machine()
    if args.runs:
        print("Per process (the largest of the processes): tables, tables + optimiser state (torch: SparseAdam, a")
        print("replica in each process; TorchRec: row-wise Adagrad, its own tables), peak memory over the process's")
        print("memory before the model, and the in-progress checkpoint's write and resume seconds per GB the process")
        print("wrote (torch: rank 0 writes the one file; TorchRec: each process its own shards).\n")
        table = Table("backend", "processes", "tables GB", "tables + state GB", "peak over base GB", "peak / state",
                      "write s/GB", "resume s/GB")  # fmt: skip
        for run in args.runs:
            backend, processes = run.split(":")[0], int(run.split(":")[1])
            if backend == "torchrec" and importlib.util.find_spec("torchrec") is None:
                table.row(
                    backend, processes, "not run: the torchrec extra is not installed (docs/torchrec.md)", *[""] * 5
                )
                continue
            for gb in args.table_gb:
                if backend == "torch" and processes > 1 and 3 * gb > args.max_replica_gb:
                    continue
                ranks = run_children(gb, backend, processes)
                grown = max((m["peak"] - m["base"]) / 1e9 for m in ranks)
                state = max(m["state"] for m in ranks) / 1e9
                writers = [m for m in ranks if m["written"]]
                write = max(m["write_s"] / (m["written"] / 1e9) for m in writers)
                resume = max(m["resume_s"] / (m["written"] / 1e9) for m in writers)
                tables = max(m["tables"] for m in ranks) / 1e9
                table.row(backend, processes, f"{tables:.2f}", f"{state:.2f}", f"{grown:.2f}", f"{grown / state:.2f}",
                          f"{write:.2f}", f"{resume:.2f}")  # fmt: skip
        print()
    table = Table("rows", "numpy sort of the float32 scores s", "exact metrics s", "rows/s", "ratio to the sort",
                  align="rrrrr")  # fmt: skip
    for rows in args.metric_rows:
        m = metrics_rate(rows)
        table.row(f"{rows:,}", f"{m['sort']:.3f}", f"{m['metrics']:.3f}", f"{rows / m['metrics'] / 1e6:,.1f}M",
                  f"{m['metrics'] / m['sort']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

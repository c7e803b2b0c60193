"""The MLPerf-shaped model on this CPU, in one run: training samples/s in fp32 and bf16 and their share of the
matmul-bound limit, and what multi-hot features cost the input.

The model is `conf/mlperf/`'s (128-dim embeddings, 214 multi-hot lookups a row, bottom MLP 512-256-128, DCN-v2
with 3 layers of rank 512 (xavier_normal), top MLP 1024-1024-512-256, Adagrad for the dense layers and the tables,
eps 1e-8), its tables capped at --max-table-rows (MLPerf's 204M rows are 104.5 GB), on the torch backend in one
process, at --batch rows a step (MLPerf's: 65,536 over 8 GPUs). The limit: the machine's 2048^3 matmul rate over
the model's matmul FLOPs a row (forward and backward: 3 x 2 x its linear layers' multiply-adds).

    python -m benchmarks.recipes [--rows 100000] [--batch 2048] [--steps 10] [--max-table-rows 100000]
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import yaml
from torch import nn

from benchmarks.harness import Arguments, Table, describe_machine
from benchmarks.training import _cycle, synthetic_arrays, train_rate, training_step
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.models import DLRM
from criteo_dlrm.models.multi_hot import MultiHot

# MLPerf's table sizes (its reference's --num_embeddings_per_feature).
MLPERF_TABLES = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976,
    14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]  # fmt: skip
RECIPE = Path(__file__).resolve().parents[1] / "conf" / "mlperf" / "parameters.yml"


def recipe_config(batch: int, precision: str) -> TrainingConfig:
    """conf/mlperf's training section on the torch backend in one process, at ``batch`` rows a step."""
    training = yaml.safe_load(RECIPE.read_text())["training"]
    training |= {"embedding_backend": "torch", "distributed": {"nproc_per_node": 1}, "precision": precision,
                 "batch_size": {"train": batch, "validation": batch}}  # fmt: skip
    return TrainingConfig.from_dict(training)


def matmul_flops_per_row(model: nn.Module) -> float:
    """Forward and backward matmul FLOPs of one row: 3 x 2 x every linear layer's multiply-adds."""
    return 3 * 2 * sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))


def expansion_rate(arrays, tables: list[int], sizes: list[int] | None, batch: int) -> float:
    """Rows/s of the loader's batches, each expanded to its multi-hot ids when ``sizes`` (the model's first step)."""
    expand = MultiHot(tables, sizes) if sizes else None
    loader = BatchLoader(arrays, batch, shuffle=True)
    start, rows = time.perf_counter(), 0
    for batch_rows in loader.batches(epoch=0):
        if expand is not None:
            expand(batch_rows.sparse)
        rows += len(batch_rows)
    return rows / (time.perf_counter() - start)


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000", "--batch", "256", "--steps", "2", "--max-table-rows", "2000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per precision")
    parser.add_argument("--max-table-rows", type=int, default=100_000)
    args = parser.parse_args()

    tables = [min(rows, args.max_table_rows) for rows in MLPERF_TABLES]
    arrays = synthetic_arrays(args.rows, tables)
    fp32, bf16 = describe_machine()

    sizes = recipe_config(args.batch, "fp32").multi_hot_sizes
    print(f"Input: the loader's batches of {args.batch:,} rows, alone and expanded to multi-hot ids.\n")
    table = Table("input", "rows/s")
    single = expansion_rate(arrays, tables, None, args.batch)
    multi = expansion_rate(arrays, tables, sizes, args.batch)
    table.row("loader, single-hot (26 ids a row)", f"{single:,.0f}")
    table.row(f"loader + multi-hot expansion ({sum(sizes)} ids a row)", f"{multi:,.0f} ({multi / single:.2f}x)")
    print()

    print(f"Training: MLPerf's model, tables capped at {args.max_table_rows:,} rows ({sum(tables):,} rows), one "
          f"process, {args.batch:,} rows a step, {args.steps} timed steps.\n")  # fmt: skip
    table = Table("precision", "samples/s", "matmul GFLOP/s reached", "matmul limit samples/s", "share of the limit")
    for precision, rate in (("fp32", fp32), ("bf16", bf16)):
        config = recipe_config(args.batch, precision)
        torch.manual_seed(0)
        model = DLRM(config.model_config(tables, 0.03), sparse_gradients=config.sparse_gradients)
        flops = matmul_flops_per_row(model)
        step = training_step(model, config, torch.device("cpu"), arrays)
        samples = train_rate(model, step, _cycle(BatchLoader(arrays, args.batch, shuffle=True)), 2, args.steps)
        limit = rate * 1e9 / flops
        table.row(
            precision, f"{samples:,.0f}", f"{samples * flops / 1e9:,.0f}", f"{limit:,.0f}", f"{samples / limit:.0%}"
        )


if __name__ == "__main__":
    main()

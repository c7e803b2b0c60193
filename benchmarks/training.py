"""Training throughput on CPU: our DLRM against the predecessor's design, in one run.

Measures, at the default configuration and at a Criteo-Kaggle-like one (26 tables sized like Kaggle's,
capped at 100,000 rows; 16-dim embeddings; dense MLP 512-256-64-16; top MLP 512-256; batch 2048):
  - the batch loader alone,
  - our training step end to end (loader included) in fp32 with the default optimisers, with sparse SGD,
    and with bf16 autocast + torch.compile,
  - the predecessor's design (outer-product interaction, per-row Dataset + default collate, dense Adam),
and the machine's fp32 matmul rate, to print the share of the matmul-bound limit reached.

    python -m benchmarks.training [--rows 200000] [--skip-compile] [--max-table-rows 100000]
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from benchmarks.harness import Arguments, Table, describe_machine
from benchmarks.predecessor import PredecessorDLRM, predecessor_loader
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.engine.device import compile_model
from criteo_dlrm.engine.parallel.modes import mode_around
from criteo_dlrm.engine.training.step import TrainStep
from criteo_dlrm.models import DLRM, DLRMConfig

KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
    10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
# The models measured, in parameters_training.yml's names (built as training builds them), the paper's
# interaction (dot), as every figure here was measured.
KAGGLE_LIKE_MODEL = {
    "sparse_embedding_sizes": 16,
    "dense_mlp": {"hidden_layer_sizes": [512, 256, 64], "output_size": 16},
    "prediction_hidden_sizes": [512, 256],
    "interaction": "dot",
}
KAGGLE_LIKE = {"tables": KAGGLE_CARDINALITIES, "training": KAGGLE_LIKE_MODEL}
CONFIGURATIONS = {
    "default": {
        "tables": [min(c, 100_000) for c in KAGGLE_CARDINALITIES],
        "training": {
            "sparse_embedding_sizes": 16,
            "dense_mlp": {"hidden_layer_sizes": [64], "output_size": 16},
            "prediction_hidden_sizes": [128, 64],
            "interaction": "dot",
            "batch_size": {"train": 256},
        },
    },
    "kaggle-like": {
        "tables": [min(c, 100_000) for c in KAGGLE_CARDINALITIES],
        "training": {**KAGGLE_LIKE_MODEL, "batch_size": {"train": 2048}},
    },
}


def spec_training(spec: dict, **training) -> TrainingConfig:
    """The spec's ``training`` section with ``training`` (top-level YAML names) replacing its values."""
    return TrainingConfig.from_dict({**spec["training"], **training})


def spec_config(spec: dict) -> DLRMConfig:
    return spec_training(spec).model_config(spec["tables"])


def spec_batch(spec: dict) -> int:
    return spec_training(spec).batch_size.train


def training_step(model: nn.Module, config: TrainingConfig, device: torch.device, arrays: EncodedArrays):
    """The project loop's own optimisation step (``engine.training.step.TrainStep``: learning-rate schedule, forward,
    BCE with logits, backward, both optimisers), for a model already on ``device``."""
    step = TrainStep(mode_around(model, config, device), config)
    return lambda batch: step(batch, 0, 1)


def synthetic_arrays(rows: int, tables: list[int], seed: int = 0) -> EncodedArrays:
    """Zipf-distributed indices (a few hot rows, a long tail), like encoded Criteo."""
    rng = np.random.default_rng(seed)
    sparse = np.stack([np.minimum(rng.zipf(1.2, rows), size) - 1 for size in tables], axis=1).astype(np.int32)
    return EncodedArrays(
        (rng.random(rows) < 0.25).astype(np.float32), rng.standard_normal((rows, 13)).astype(np.float32), sparse
    )


def flops_per_sample(config: DLRMConfig) -> float:
    """Forward + backward (3x forward) multiply-adds x 2 of the MLPs and the dot interaction."""
    sizes = [13, *config.dense_mlp.hidden_layer_sizes, config.dense_mlp.output_size]
    macs = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    top = [config.interaction_size, *config.prediction_hidden_sizes, 1]
    macs += sum(a * b for a, b in zip(top[:-1], top[1:], strict=True))
    macs += config.num_features**2 * config.dense_mlp.output_size
    return 3 * 2 * macs


def loader_rate(arrays: EncodedArrays, batch: int) -> float:
    loader = BatchLoader(arrays, batch, shuffle=True)
    start = time.perf_counter()
    rows = sum(len(b) for b in loader.batches(epoch=0))
    return rows / (time.perf_counter() - start)


def train_rate(model: nn.Module, step, batches, warmup: int, steps: int, rows=len) -> float:
    for _ in range(warmup):
        step(next(batches))
    seen, start = 0, time.perf_counter()
    for _ in range(steps):
        batch = next(batches)  # the loader's time counts: end to end
        step(batch)
        seen += rows(batch)
    return seen / (time.perf_counter() - start)


def ours(arrays: EncodedArrays, spec: dict, optimizer: str, precision: str, compiled: bool, steps: int) -> float:
    torch.manual_seed(0)
    settings = spec_training(
        spec,
        embedding_optimizer=optimizer,
        embedding_learning_rate=0.01 if optimizer == "sgd" else 1e-3,
        precision=precision,
    )
    model = DLRM(spec_config(spec), sparse_gradients=settings.sparse_gradients)
    if compiled:
        compile_model(model)
    step = training_step(model, settings, torch.device("cpu"), arrays)
    batches = _cycle(BatchLoader(arrays, settings.batch_size.train, shuffle=True))
    return train_rate(model, step, batches, warmup=5 if compiled else 2, steps=steps)


def predecessor(arrays: EncodedArrays, spec: dict, steps: int) -> float:
    torch.manual_seed(0)
    config = spec_config(spec)
    dense = [*config.dense_mlp.hidden_layer_sizes, config.dense_mlp.output_size]
    model = PredecessorDLRM(spec["tables"], config.sparse_embedding_sizes[0], dense, config.prediction_hidden_sizes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_function = nn.BCELoss()

    def step(batch):
        labels, dense, sparse = batch
        optimizer.zero_grad()
        loss_function(model(dense, sparse), labels).backward()
        optimizer.step()

    def batches():
        while True:
            yield from predecessor_loader(arrays, spec_batch(spec))

    warmup = 1 if steps > 1 else 0  # one step of 2,048 per-row rows takes 30 s on 2 cores: no warm-up for one
    return train_rate(model, step, batches(), warmup=warmup, steps=steps, rows=lambda batch: len(batch[0]))


def _cycle(loader: BatchLoader):
    epoch = 0
    while True:
        yield from loader.batches(epoch=epoch)
        epoch += 1


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000", "--steps", "3", "--skip-compile", "--predecessor-steps", "1", "--max-table-rows", "2000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per measurement (ours)")
    parser.add_argument(
        "--predecessor-steps", type=int, default=2, help="timed steps for the predecessor's design (slow)"
    )
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument(
        "--max-table-rows", type=int, default=100_000, help="cap on each table's rows (Kaggle's, capped at 100,000)"
    )
    args = parser.parse_args()

    gflops, _ = describe_machine()
    for name, spec in CONFIGURATIONS.items():
        spec = {**spec, "tables": [min(rows, args.max_table_rows) for rows in spec["tables"]]}
        arrays = synthetic_arrays(args.rows, spec["tables"])
        config = spec_config(spec)
        limit = gflops * 1e9 / flops_per_sample(config)
        rows = {"loader alone": loader_rate(arrays, spec_batch(spec))}
        steps = args.steps if name == "kaggle-like" else args.steps * 4
        rows["ours, fp32, Adam + SparseAdam (default)"] = ours(arrays, spec, "sparse_adam", "fp32", False, steps)
        rows["ours, fp32, Adam + sparse SGD"] = ours(arrays, spec, "sgd", "fp32", False, steps)
        rows["ours, fp32, Adam over whole tables (the predecessor's optimiser)"] = ours(
            arrays, spec, "dense_adam", "fp32", False, max(steps // 4, 5)
        )
        rows["ours, bf16 autocast, SparseAdam"] = ours(arrays, spec, "sparse_adam", "bf16", False, steps)
        if not args.skip_compile:  # the MLPs compiled (the embeddings and the interaction stay eager)
            rows["ours, fp32 + torch.compile, SparseAdam"] = ours(arrays, spec, "sparse_adam", "fp32", True, steps)
            rows["ours, bf16 autocast + torch.compile, SparseAdam"] = ours(
                arrays, spec, "sparse_adam", "bf16", True, steps
            )
        rows["the predecessor's design (outer product, per-row Dataset)"] = predecessor(
            arrays, spec, args.predecessor_steps
        )
        baseline = rows["the predecessor's design (outer product, per-row Dataset)"]
        print(
            f"## {name}: batch {spec_batch(spec)}, {flops_per_sample(config) / 1e6:.2f} MFLOP/sample, matmul-bound limit {limit:,.0f} samples/s\n"
        )
        table = Table("measurement", "samples/s", "x predecessor", "share of matmul limit")
        for label, rate in rows.items():
            share = "" if label == "loader alone" else f"{rate / limit:.0%}"
            table.row(label, f"{rate:,.0f}", f"{rate / baseline:,.1f}", share)
        print()


if __name__ == "__main__":
    main()

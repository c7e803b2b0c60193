"""Reference models for benchmarks/quality.py.

A hashed logistic regression: the classic CTR baseline our DLRM must beat on the same rows. The planted click
model's own form with learned parameters: how far a learner that knows the truth's structure gets on them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from criteo_dlrm.common.schema import NUM_SPARSE
from criteo_dlrm.data.batches import Batch, BatchLoader
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.engine.trained.scoring import predict

HASH_BUCKETS = 1 << 22


class PermutationLoader(BatchLoader):
    """The training loader before chunks, the shuffle's baseline: a permutation of all rows per epoch (8 bytes a
    row), each batch gathered from its rows, sorted, wherever they are."""

    def batches(self, epoch: int = 0, start: int = 0):
        if not self.shuffle:
            yield from super().batches(epoch, start)
            return
        rows = len(self.arrays)
        order = np.random.default_rng([self.seed, epoch]).permutation(rows)
        for begin in range(start * self.batch_size, rows, self.batch_size):
            take = np.sort(order[begin : begin + self.batch_size])
            if self.world_size > 1:
                take = np.array_split(take, self.world_size)[self.rank]
            yield Batch(
                torch.from_numpy(np.asarray(self.arrays.labels[take], dtype=np.float32)),
                torch.from_numpy(np.asarray(self.arrays.dense[take])),
                torch.from_numpy(np.asarray(self.arrays.sparse[take]).astype(np.int64)),
                global_rows=min(self.batch_size, rows - begin),
            )


def hash_features(raw_sparse: np.ndarray, buckets: int = HASH_BUCKETS) -> np.ndarray:
    """(N, 26) raw ids (-1 missing) -> (N, 26) buckets of one shared table, feature and value hashed together."""
    features = np.arange(NUM_SPARSE, dtype=np.uint64)
    mixed = (raw_sparse.astype(np.int64).astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    mixed ^= features * np.uint64(0xC2B2AE3D27D4EB4F)
    mixed ^= mixed >> np.uint64(29)
    return (mixed % np.uint64(buckets)).astype(np.int64)


class HashedLogisticRegression(nn.Module):
    """logit = bias + w . dense + sum over features of one weight per hashed (feature, value)."""

    def __init__(self, buckets: int = HASH_BUCKETS):
        super().__init__()
        self.weights = nn.Embedding(buckets, 1, sparse=True)
        nn.init.zeros_(self.weights.weight)
        self.dense = nn.Linear(13, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.dense(dense).squeeze(1) + self.weights(sparse).sum(dim=(1, 2))


def train_logistic_regression(
    train: EncodedArrays, validation: EncodedArrays, epochs: int = 5, batch: int = 512, seed: int = 0, lr: float = 0.05
) -> dict:
    """Adagrad on the hashed weights, Adam on the dense ones; the best epoch by validation log loss."""
    torch.manual_seed(seed)
    model = HashedLogisticRegression()
    sparse_opt = torch.optim.Adagrad(model.weights.parameters(), lr=lr)
    return best_epoch(
        model, sparse_opt, torch.optim.Adam(model.dense.parameters(), lr=1e-2), train, validation, epochs, batch, seed
    )


def best_epoch(
    model: nn.Module,
    sparse_opt: torch.optim.Optimizer,
    dense_opt: torch.optim.Optimizer,
    train: EncodedArrays,
    validation: EncodedArrays,
    epochs: int,
    batch: int,
    seed: int,
) -> dict:
    """Train up to ``epochs`` epochs; the validation metrics of the best epoch by log loss (training stops at
    the first worse one)."""
    loss_function = nn.BCEWithLogitsLoss()
    loader = BatchLoader(train, batch, shuffle=True, seed=seed)
    best = None
    for epoch in range(epochs):
        model.train()
        for b in loader.batches(epoch=epoch):
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss_function(model(b.dense, b.sparse), b.labels).backward()
            sparse_opt.step()
            dense_opt.step()
        metrics = binary_metrics(validation.labels, predict(model, BatchLoader(validation, 16384)))
        if best is None or metrics.log_loss < best["log_loss"]:
            best = {**metrics.to_dict(), "epoch": epoch}  # a row of the benchmark's tables
        else:
            break
    return best


class PlantedFormModel(nn.Module):
    """The planted click model's own form with learned parameters: the most a learner can know in advance.

    ``logit = w . dense + b + sum of one effect per (feature, value) + <u_a, v_b> for each planted pair (a, b)``,
    the factors of rank ``rank``; the tables indexed like the DLRM's (missing and out-of-vocabulary values share
    row 0, where the truth gives missing values an effect of their own).
    """

    def __init__(self, table_sizes: list[int], pairs: list[tuple[int, int]], rank: int = 4):
        super().__init__()
        self.register_buffer("offsets", torch.tensor(np.cumsum([0, *table_sizes[:-1]]), dtype=torch.long))
        self.effects = nn.Embedding(sum(table_sizes), 1, sparse=True)
        nn.init.zeros_(self.effects.weight)
        self.factors = nn.Embedding(sum(table_sizes), rank, sparse=True)
        nn.init.normal_(self.factors.weight, 0.0, 0.01)
        self.dense = nn.Linear(13, 1)
        self.left, self.right = (list(side) for side in zip(*pairs, strict=True))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        rows = sparse.long() + self.offsets
        factors = self.factors(rows)
        crosses = (factors[:, self.left] * factors[:, self.right]).sum(dim=(1, 2))
        return self.dense(dense).squeeze(1) + self.effects(rows).sum(dim=(1, 2)) + crosses


def train_planted_form(
    train: EncodedArrays,
    validation: EncodedArrays,
    table_sizes: list[int],
    pairs: list[tuple[int, int]],
    optimizer: str = "sparse_adam",
    lr: float = 0.003,
    epochs: int = 6,
    batch: int = 256,
    seed: int = 0,
) -> dict:
    """Adam 0.001 on the dense weights and ``optimizer`` (sparse_adam or adagrad) at ``lr`` on the tables, as
    the DLRM trains; the best epoch by validation log loss."""
    torch.manual_seed(seed)
    model = PlantedFormModel(table_sizes, pairs)
    tables = [model.effects.weight, model.factors.weight]
    sparse_opt = (
        torch.optim.SparseAdam(tables, lr=lr) if optimizer == "sparse_adam" else torch.optim.Adagrad(tables, lr=lr)
    )
    return best_epoch(
        model, sparse_opt, torch.optim.Adam(model.dense.parameters(), lr=1e-3), train, validation, epochs, batch, seed
    )

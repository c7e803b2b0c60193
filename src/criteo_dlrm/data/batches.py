"""Batches cut from columnar arrays: one numpy gather per batch, no per-row Python, no collate."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from criteo_dlrm.data.encoding import EncodedArrays


@dataclass
class Batch:
    labels: torch.Tensor  # (B,) float32
    dense: torch.Tensor  # (B, 13) float32
    sparse: torch.Tensor  # (B, 26) int64 table indices
    global_rows: int | None = None  # rows of the whole global batch this one is a share of (None: this batch)

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        tensors = (t.to(device, non_blocking=non_blocking) for t in (self.labels, self.dense, self.sparse))
        return Batch(*tensors, global_rows=self.global_rows)

    def pin_memory(self) -> Batch:
        return Batch(*(t.pin_memory() for t in (self.labels, self.dense, self.sparse)), global_rows=self.global_rows)

    def __len__(self) -> int:
        return len(self.labels)


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The row order of one epoch: a permutation drawn from (seed, epoch), so a resumed run sees the same."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


class BatchLoader:
    """Iterates over ``arrays`` (in memory or memory-mapped) in batches of ``batch_size`` rows.

    Args:
        arrays: encoded rows.
        batch_size: rows per batch; the last batch of an epoch may be smaller.
        shuffle: a new permutation each epoch from ``seed``; else file order.
        seed: the shuffling seed.
        pin_memory: page-lock batches so that copies to a GPU can be asynchronous.
        rank, world_size: data-parallel training: every process draws the same global batches of
            ``batch_size`` rows (the same order as one process) and takes its ``rank``-th part of each, so
            every row is used once per epoch across the processes.
    """

    def __init__(
        self,
        arrays: EncodedArrays,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        pin_memory: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.arrays, self.batch_size, self.shuffle, self.seed, self.pin = arrays, batch_size, shuffle, seed, pin_memory
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return -(-len(self.arrays) // self.batch_size)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """Batches ``start``, ``start + 1``, ... of epoch ``epoch``."""
        rows = len(self.arrays)
        order = epoch_order(rows, self.seed, epoch) if self.shuffle else None
        for begin in range(start * self.batch_size, rows, self.batch_size):
            end = min(begin + self.batch_size, rows)
            # Index arrays make numpy copy the rows (memory-mapped sources are read-only). Shuffled rows are
            # sorted within the batch: the same rows, read with better locality.
            take = np.arange(begin, end) if order is None else np.sort(order[begin:end])
            if self.world_size > 1:
                take = np.array_split(take, self.world_size)[self.rank]
            batch = Batch(
                torch.from_numpy(self.arrays.labels[take].astype(np.float32, copy=False)),
                torch.from_numpy(self.arrays.dense[take]),
                torch.from_numpy(self.arrays.sparse[take].astype(np.int64)),
                global_rows=end - begin,
            )
            yield batch.pin_memory() if self.pin else batch

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

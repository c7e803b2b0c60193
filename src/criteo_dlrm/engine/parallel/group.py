"""The processes a run trains in, one part of every parallel mode (``engine.parallel.modes``): this process alone,
or its rank of the initialised process group. Averages, an answer every process agrees on, and validation: every
process scores its share of the rows, rank 0 gathers them back into row order and computes the metrics once, every
process gets them; and the all-gathers they are built on (rows of any count per process, padded to the longest)."""

from __future__ import annotations

import gc
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist

from criteo_dlrm.data.batches import BatchLoader, rank_order
from criteo_dlrm.engine.device import Runtime
from criteo_dlrm.engine.trained.metrics import MetricError, binary_metrics
from criteo_dlrm.engine.trained.reports import Metrics
from criteo_dlrm.engine.trained.scoring import predict
from criteo_dlrm.models.dlrm import DLRM


def destroy_group() -> None:
    """Destroy the default process group once nothing else holds it: the frames an error is leaving (a model under DDP,
    whose reducer holds the group) are cleared and any cycle collected first. The group's last reference dropped with
    the interpreter's lock held (a DDP freed after ``destroy_process_group``) waits for the group's worker threads,
    which may need that lock to free a tensor: a deadlock seen in the stack of a hung GPU smoke dry run. Call it in a
    ``finally``, from a frame that has not itself held the model."""
    failure = sys.exc_info()[1]
    if failure is not None:
        traceback.clear_frames(failure.__traceback__)  # their lines stay for the report; the frames still running stay
    gc.collect()
    dist.destroy_process_group()


def predict_alone(model: DLRM, loader: BatchLoader, runtime: Runtime) -> np.ndarray:
    """Probabilities for every row of ``loader``, in row order, scored in this process; on a GPU they stay there,
    where the metrics are computed."""
    return predict(model, loader, runtime, on_device=runtime.device.type == "cuda")


class Group:
    """The processes of a run: this one alone (rank 0 of 1, no backend), or its rank of the initialised process group
    (a group of one too: torchrun with one process, TorchRec's group of this process). Averages, answers every
    process agrees on, and validation over them: every process scores its share of the rows, rank 0 gathers them and
    computes the metrics, every process gets them.

    Args:
        alone: this process alone even inside a process group (the precision probe's steps).
    """

    def __init__(self, alone: bool = False) -> None:
        joined = not alone and dist.is_available() and dist.is_initialized()
        self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if joined else (0, 1)
        self.backend: str | None = dist.get_backend() if joined else None

    @property
    def is_main(self) -> bool:
        """Whether this process is rank 0: the one that writes, logs and holds the gathered predictions."""
        return self.rank == 0

    def all_true(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` holds in every process of the group (the same answer in each), reduced as a tensor on
        ``device``: NCCL serves CUDA tensors only (a host one fails as the Trainer is built, resume on)."""
        if self.backend is None:
            return flag
        value = torch.tensor([float(flag)], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item())

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values
        dist.all_reduce(values)
        return values / self.world_size

    def predict(self, model: DLRM, loader: BatchLoader, runtime: Runtime) -> np.ndarray | None:
        """Each process scores its share of every global batch of N x ``batch_size`` rows, so all run the same
        number of forward passes (a sharded model's all-to-all needs every process), and the shares are gathered
        to rank 0 alone and put back in row order there: the same array, so the same metrics, as one process
        (None on the other ranks)."""
        if self.world_size == 1:
            return predict_alone(model, loader, runtime)
        arrays = loader.arrays
        batch_size = loader.batch_size * self.world_size
        mine = BatchLoader(arrays, batch_size, rank=self.rank, world_size=self.world_size)
        # NCCL gathers on the GPU: the probabilities stay there, and rank 0 computes the metrics where they are.
        on_device = runtime.backend == "nccl"
        local = predict(model, mine, runtime, on_device=on_device)
        pieces = gather_rows_to_main(self.world_size, self.rank, local if on_device else torch.from_numpy(local))
        if pieces is None:
            return None
        return rank_order(pieces if on_device else [p.numpy() for p in pieces], len(arrays), batch_size)

    def metrics(self, labels: np.ndarray, probabilities: np.ndarray | None) -> Metrics:
        """Computed once (on rank 0) and known to every process.

        Raises:
            MetricError: in every process, when the metrics are undefined.
        """
        if self.world_size == 1:
            return binary_metrics(labels, probabilities)
        outcome: list = [None]
        if self.rank == 0:
            try:
                outcome = [binary_metrics(labels, probabilities)]
            except MetricError as error:
                outcome = [str(error)]
        dist.broadcast_object_list(outcome, src=0)  # a small dict (or the error's message), not the predictions
        if isinstance(outcome[0], str):
            raise MetricError(outcome[0])
        return outcome[0]


def all_gather_rows(world_size: int, *tensors: torch.Tensor) -> list[list[torch.Tensor]]:
    """Every process's ``tensors`` (each with the same number of rows, any number per process), in rank
    order: the row counts are gathered first, then each tensor padded to the longest, trimmed again."""
    [gathered] = all_gather_row_sets(world_size, [tensors])
    return gathered


def all_gather_row_sets(world_size: int, sets: list[tuple[torch.Tensor, ...]]) -> list[list[list[torch.Tensor]]]:
    """``all_gather_rows`` of each set of tensors (the tensors of a set with the same number of rows), the row
    counts of every set gathered in one all-gather and read back once: on a GPU the host waits for the device once,
    not once per count."""
    count = torch.zeros(len(sets), dtype=torch.long, device=sets[0][0].device)
    for s, tensors in enumerate(sets):
        count[s] = len(tensors[0])  # filled on the device: a list copied from host memory would make a GPU wait
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count)
    by_rank = torch.stack(counts).tolist()  # [rank][set]
    gathered = []
    for s, tensors in enumerate(sets):
        rows = [by_rank[rank][s] for rank in range(world_size)]
        parts_of_set = []
        for tensor in tensors:
            padded = tensor.new_zeros((max(rows), *tensor.shape[1:]))
            padded[: len(tensor)] = tensor
            parts = [torch.empty_like(padded) for _ in range(world_size)]
            dist.all_gather(parts, padded)
            parts_of_set.append([part[:n] for part, n in zip(parts, rows, strict=True)])
        gathered.append(parts_of_set)
    return gathered


def gather_rows_to_main(world_size: int, rank: int, tensor: torch.Tensor) -> list[torch.Tensor] | None:
    """Every process's ``tensor`` (any number of rows each), in rank order, on rank 0 only (None elsewhere): the
    row counts all-gathered first (so every process pads to the longest), the padded tensors gathered to rank 0."""
    count = torch.full((1,), len(tensor), device=tensor.device)
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count)
    rows = torch.cat(counts).tolist()  # read back once
    padded = tensor.new_zeros((max(rows), *tensor.shape[1:]))
    padded[: len(tensor)] = tensor
    parts = [torch.empty_like(padded) for _ in range(world_size)] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    if rank != 0:
        return None
    return [part[:n] for part, n in zip(parts, rows, strict=True)]

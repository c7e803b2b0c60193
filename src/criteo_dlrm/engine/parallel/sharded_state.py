"""Sharded state to and from whole tensors: TorchRec's ``ShardedTensor`` shards gathered to rank 0, and a
whole tensor's regions copied back into each process's shards, so a sharded run's checkpoint holds the same
tensors as the torch backend's (``engine.parallel.sharding.ShardedDLRM``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from loguru import logger


def flat_state(state: dict) -> dict:
    """``{param: {state name: tensor}}`` -> ``{"param/state name": tensor}``."""
    return {f"{param}/{name}": value for param, values in state.items() for name, value in values.items()}


def _pieces(value: Any) -> tuple[list[tuple[list[int], torch.Tensor]], list[int]]:
    """This process's parts of ``value`` as (offsets, CPU tensor), and the whole tensor's size."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(value, ShardedTensor):
        parts = [(list(s.metadata.shard_offsets), s.tensor.detach().cpu()) for s in value.local_shards()]
        with warnings.catch_warnings():  # TorchRec's state dicts are ShardedTensors, whatever torch prefers now
            warnings.simplefilter("ignore", FutureWarning)
            return parts, list(value.size())
    return [([0] * value.dim(), value.detach().cpu())], list(value.shape)


def gather_state(state: dict) -> dict[str, torch.Tensor] | None:
    """Whole tensors on rank 0 (None elsewhere), one key at a time so rank 0 holds one table's parts at most
    twice. Keys may differ between processes (an optimiser only holds state for its own tables)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    keys: list[list[str]] = [None] * world_size  # type: ignore[list-item]
    dist.all_gather_object(keys, sorted(state))
    full = {}
    for key in sorted(set().union(*keys)):
        mine = _pieces(state[key]) if key in state else ([], None)
        received = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, received, dst=0)
        if rank != 0:
            continue
        size = next(size for _, size in received if size is not None)
        dtype = next(part.dtype for parts, _ in received for _, part in parts)
        whole = torch.empty(size, dtype=dtype)
        for parts, _ in received:
            for offsets, part in parts:
                whole[_region(offsets, part.shape)] = part
        full[key] = whole
    return full if rank == 0 else None


def scatter_state(current: dict, full: dict[str, torch.Tensor], strict: bool) -> None:
    """Copy each whole tensor's region into this process's parts of ``current`` (which share storage with the
    model or the optimiser)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    for key, value in current.items():
        size = list(value.size())
        if key not in full or list(full[key].shape) != size:
            if strict:
                raise ValueError(f"checkpoint has no {key} of size {size}")
            logger.warning("optimiser state {} was saved under another sharding plan; it starts afresh", key)
            continue
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                region = _region(shard.metadata.shard_offsets, shard.tensor.shape)
                shard.tensor.copy_(full[key][region])
        else:
            value.copy_(full[key])


def _region(offsets: list[int], shape: torch.Size) -> tuple[slice, ...]:
    return tuple(slice(start, start + length) for start, length in zip(offsets, shape, strict=True))

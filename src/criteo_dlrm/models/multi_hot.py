"""Multi-hot categorical features, as MLPerf's DLRM-DCNv2 trains on Criteo 1TB ("multi-hot variant").

Each single-hot value ``v`` of a feature with ``k`` lookups becomes ``k`` ids of its table, sum-pooled by the
model: ``v`` itself first, then ``k - 1`` ids drawn uniformly from the table's rows, the same ids for the same
value every time (a fixed function of the seed, the feature, the position and the value). MLPerf's reference
draws them into a table of ``rows x (k - 1)`` ids per feature with numpy's seeded generator (40M rows x 99 ids
for one of its features: 16 GB in every process) or materialises the expanded dataset (3.8 TB). Here the ids are
computed where they are used, from the value alone: nothing per row is stored, the encoded rows stay single-hot,
and every model (training, evaluation, scoring, the exports) expands its input itself. The draws are not numpy's:
the same rule, other random ids.

The function: two keyed rounds of a 32-bit integer hash (Wellons' ``lowbias32`` shape, multipliers below 2^31 so
that every int64 product stays below 2^63: no overflow on any device), then ``(h * rows) >> 32`` for an id of the
table (Lemire's multiply-shift: a row is drawn with probability within rows / 2^32 of 1 / rows, 1% for a
40M-row table).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MASK = 0xFFFFFFFF
MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)  # odd, below 2^31


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit mix of ``x`` (int64 in [0, 2^32)): xor-shift, multiply, xor-shift, multiply, xor-shift."""
    x = x ^ (x >> 16)
    x = x * MULTIPLIERS[0] & MASK
    x = x ^ (x >> 15)
    x = x * MULTIPLIERS[1] & MASK
    return x ^ (x >> 16)


class MultiHot(nn.Module):
    """(B, 26) single-hot table indices -> per feature its (B, k) ids (``sizes[f]`` of them, the value first).

    Args:
        table_sizes: rows per table (each below 2^31).
        sizes: lookups per feature (MLPerf's: 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1).
        seed: the draws' seed; the same seed gives the same ids on every process and device.
    """

    def __init__(self, table_sizes: list[int], sizes: list[int], seed: int = 0):
        super().__init__()
        self.sizes = list(sizes)
        extra = sum(size - 1 for size in sizes)
        # Two round keys per extra id (each position of each feature draws with keys of its own).
        keys = np.random.default_rng(seed).integers(0, 2**32, size=(2, extra), dtype=np.int64)
        rows = np.repeat(np.asarray(table_sizes, dtype=np.int64), [size - 1 for size in sizes])
        self.register_buffer("keys", torch.from_numpy(keys), persistent=False)
        self.register_buffer("rows", torch.from_numpy(rows), persistent=False)
        columns = [f for f, size in enumerate(sizes) for _ in range(size - 1)]
        self.register_buffer("columns", torch.tensor(columns, dtype=torch.long), persistent=False)

    def extra_ids(self, sparse: torch.Tensor) -> torch.Tensor:
        """sparse: (B, 26) -> (B, sum(k - 1)) the drawn ids, feature by feature, each feature's in position order."""
        values = sparse.index_select(1, self.columns).long()  # (B, E): each extra id's own value, below 2^31
        mixed = _hash32(_hash32(values ^ self.keys[0]) ^ self.keys[1])
        return mixed * self.rows >> 32  # < 2^32 * 2^31: no overflow

    def forward(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """sparse: (B, 26) table indices -> per feature (B, k_f) ids, the value first."""
        extra = self.extra_ids(sparse).split([size - 1 for size in self.sizes], dim=1)
        return [
            torch.cat([sparse[:, f : f + 1].long(), drawn], dim=1) if size > 1 else sparse[:, f : f + 1].long()
            for f, (size, drawn) in enumerate(zip(self.sizes, extra, strict=True))
        ]

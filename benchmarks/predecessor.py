"""The predecessor project's model (the lecture trainer this project replaced; and data path DESIGN.md section 2), rebuilt as a baseline for benchmarks.

Kept faithful where it costs time: 26 separate embedding lookups with a modulus hash in Python, the
L x L outer product of all vectors fed to the prediction MLP, a sigmoid output with BCELoss, dense Adam
over every parameter, and a per-row ``Dataset`` batched by the default collate.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from criteo_dlrm.data.stored import EncodedArrays


class SeedRowDataset(Dataset):
    """One ``__getitem__`` per row, as the predecessor did."""

    def __init__(self, arrays: EncodedArrays):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, index: int):
        return (
            torch.tensor(self.arrays.labels[index]),
            torch.from_numpy(np.array(self.arrays.dense[index])),
            torch.from_numpy(np.array(self.arrays.sparse[index], dtype=np.int64)),
        )


class PredecessorDLRM(nn.Module):
    def __init__(self, table_sizes: list[int], dim: int, dense_sizes: list[int], prediction_sizes: list[int]):
        super().__init__()
        self.table_sizes = table_sizes
        layers, sizes = [], [13, *dense_sizes]
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.dense_mlp = nn.Sequential(*layers)
        self.embeddings = nn.ModuleList(nn.Embedding(size, dim) for size in table_sizes)
        length = dense_sizes[-1] + dim * len(table_sizes)
        layers, sizes = [], [length * length, *prediction_sizes]
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.prediction_mlp = nn.Sequential(*layers, nn.Linear(sizes[-1], 1), nn.Sigmoid())

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        vectors = [self.dense_mlp(dense)]
        for feature, table in enumerate(self.embeddings):
            vectors.append(table((sparse[:, feature] + 1) % self.table_sizes[feature]))
        v = torch.cat(vectors, dim=1)  # (B, L)
        outer = torch.bmm(v.unsqueeze(2), v.unsqueeze(1)).flatten(1)  # (B, L * L)
        return self.prediction_mlp(outer).squeeze(1)


def predecessor_loader(arrays: EncodedArrays, batch_size: int) -> DataLoader:
    return DataLoader(SeedRowDataset(arrays), batch_size=batch_size, shuffle=True)

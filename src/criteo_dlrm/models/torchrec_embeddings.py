"""The ``torchrec`` embedding backend: the DLRM's 26 tables as one TorchRec ``EmbeddingBagCollection``.

A Criteo row has one index per feature, a bag of one (with sum pooling, a plain lookup), or with multi-hot
features (``config.multi_hot_sizes``) a bag of each feature's ids: the model's maths is the ``torch`` backend's. The collection is what ``DistributedModelParallel`` shards
(``engine.parallel.sharding``). TorchRec is an optional extra: it is imported only when this module is used.

Checkpoints always hold the ``torch`` backend's layout (one fused table per embedding size), so evaluation,
scoring and export never need TorchRec; ``grouped_tables`` and ``split_tables`` convert between the two.
"""

from __future__ import annotations

import torch
from torch import nn

from criteo_dlrm.models.dlrm import DLRMConfig, embedding_groups

TABLE_PREFIX = "embeddings.collection.embedding_bags."  # then the table's name and ".weight"


class TorchRecEmbeddings(nn.Module):
    """One TorchRec table per feature, looked up and returned in ``embedding_groups`` order.

    Args:
        config: the model's sizes.
        names: one table name per feature (shown in the sharding plan).
        device: where the tables live; ``meta`` lets ``DistributedModelParallel`` allocate each process's shards only.
    """

    def __init__(self, config: DLRMConfig, names: list[str], device: torch.device | str = "meta"):
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

        self.groups = embedding_groups(config)
        self.dims = [config.sparse_embedding_sizes[group[0]] for group in self.groups]
        self.order = [f for group in self.groups for f in group]  # features in the order of the output
        self.names = list(names)
        self.register_buffer("columns", torch.tensor(self.order), persistent=False)
        # Tables initialise uniformly in +-1/sqrt(rows), as the torch backend's (TorchRec's default bounds).
        self.collection = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=names[f],
                    embedding_dim=config.sparse_embedding_sizes[f],
                    num_embeddings=config.table_sizes[f],
                    feature_names=[names[f]],
                    pooling=PoolingType.SUM,
                )
                for f in self.order
            ],
            device=torch.device(device),
        )

    def forward(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """sparse: (B, 26) table indices -> one (B, T_g, dim_g) tensor per group of ``embedding_groups``."""
        batch = sparse.shape[0]
        values = sparse.index_select(1, self.columns.to(sparse.device)).t().reshape(-1)  # (26 * B,) key-major
        lengths = torch.ones(len(self.order) * batch, dtype=torch.int32, device=sparse.device)
        return self._pooled(values, lengths, batch)

    def bags(self, ids: list[torch.Tensor]) -> list[torch.Tensor]:
        """ids: per feature (B, k_f) ids of its table -> one (B, T_g, dim_g) tensor of bag sums per group."""
        batch, device = ids[0].shape[0], ids[0].device
        values = torch.cat([ids[f].reshape(-1) for f in self.order])  # each key's bags in row order
        lengths = torch.cat(
            [torch.full((batch,), ids[f].shape[1], dtype=torch.int32, device=device) for f in self.order]
        )
        return self._pooled(values, lengths, batch)

    def _pooled(self, values: torch.Tensor, lengths: torch.Tensor, batch: int) -> list[torch.Tensor]:
        from torchrec import KeyedJaggedTensor

        features = KeyedJaggedTensor(keys=[self.names[f] for f in self.order], values=values, lengths=lengths)
        # A sharded collection returns its keys grouped by sharding, not in input order: select them by name.
        by_name = self.collection(features).to_dict()
        pooled = torch.cat([by_name[self.names[f]] for f in self.order], dim=1)  # (B, sum of dims), input order
        widths = [len(group) * dim for group, dim in zip(self.groups, self.dims, strict=True)]
        return [
            part.reshape(batch, len(group), dim)
            for part, group, dim in zip(pooled.split(widths, dim=1), self.groups, self.dims, strict=True)
        ]


def table_key(name: str) -> str:
    """The state-dict key of a table in a ``DLRM`` with ``TorchRecEmbeddings``."""
    return f"{TABLE_PREFIX}{name}.weight"


def grouped_key(group: int) -> str:
    """The state-dict key of the torch backend's concatenated table of embedding size group ``group``."""
    return f"embeddings.{group}.weight.weight"


def grouped_tables(tables: dict[int, torch.Tensor], config: DLRMConfig) -> dict[str, torch.Tensor]:
    """Per-feature tables ``{feature: (rows, dim)}`` -> the torch backend's state entries (one per size)."""
    return {grouped_key(g): torch.cat([tables[f] for f in group]) for g, group in enumerate(embedding_groups(config))}


def split_tables(state: dict[str, torch.Tensor], config: DLRMConfig) -> dict[int, torch.Tensor]:
    """The torch backend's state entries -> per-feature tables ``{feature: (rows, dim)}`` (views)."""
    tables = {}
    for g, group in enumerate(embedding_groups(config)):
        parts = state[grouped_key(g)].split([config.table_sizes[f] for f in group])
        tables.update(zip(group, parts, strict=True))
    return tables


def per_table_state(state: dict[str, torch.Tensor], config: DLRMConfig, names: list[str]) -> dict[str, torch.Tensor]:
    """A torch-backend model's state with its concatenated tables replaced by TorchRec's per-feature ones
    (``table_key(names[f])``), views of the same rows: copying into them writes the concatenated tables."""
    tables = split_tables(state, config)
    grouped = {grouped_key(g) for g in range(len(embedding_groups(config)))}
    return {
        **{key: value for key, value in state.items() if key not in grouped},
        **{table_key(name): tables[f] for f, name in enumerate(names)},
    }

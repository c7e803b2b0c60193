"""DLRM (Naumov et al., 2019) for Criteo: dense MLP, embeddings, dot interaction, prediction MLP.

``interaction: dot_cat`` also feeds the embeddings themselves to the prediction MLP beside the dot products,
so each category value has a first-order effect of its own (as the ``cat`` and DCN interactions have); the
paper's ``dot`` reaches a value only through its products with the other vectors.

The model returns logits; the loss is ``BCEWithLogitsLoss`` and a sigmoid is applied only where
probabilities are reported. Embedding tables that share a dimension live in one fused table with
per-feature row offsets, so a batch needs one lookup per dimension instead of 26.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.models.shapes import DCN, CatShape, DCNShape, DenseMLP, DLRMConfig, DotCatShape, DotShape

__all__ = ["DCN", "DLRM", "INTERACTIONS", "ConfigError", "DLRMConfig", "DenseMLP"]


class MLP(nn.Sequential):
    """``nn.Sequential`` with a forward of this package's own: ``torch.compile`` (``Module.compile``) skips the
    frames of torch's built-in modules, so a plain ``nn.Sequential`` compiled that way captures no graph and runs
    eagerly. The layers and their state-dict keys are the ``nn.Sequential``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x)
        return x


def mlp(sizes: list[int], final_activation: bool, dropout: float = 0.0) -> MLP:
    """Linear layers between consecutive ``sizes`` with ReLU in between (and after the last if asked), and
    ``dropout`` after each hidden ReLU when it is above 0."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
            if dropout > 0 and i < len(sizes) - 2:
                layers.append(nn.Dropout(dropout))
    return MLP(*layers)


class LowRankCrossNet(nn.Module):
    """DCN-v2's cross network in low-rank form (Wang et al., 2021; TorchRec's ``LowRankCrossNet``).

    Layer l: ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``, with V_l: size -> rank, W_l: rank -> size,
    so each layer adds explicit feature crosses of one more order at O(size x rank) cost.
    """

    def __init__(self, size: int, num_layers: int, rank: int, init: str = "torch"):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(size, rank, bias=False) for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(rank, size) for _ in range(num_layers))
        if init == "xavier_normal":
            with torch.no_grad():
                for down, up in zip(self.down, self.up, strict=True):
                    nn.init.xavier_normal_(down.weight)
                    nn.init.xavier_normal_(up.weight)
                    up.bias.zero_()

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        """x0: (B, size) -> (B, size)."""
        x = x0
        for down, up in zip(self.down, self.up, strict=True):
            x = x0 * up(down(x)) + x
        return x


class Interaction(nn.Module):
    """How the dense output meets the embeddings: ``forward(x, embedded)``, x: (B, D) the dense MLP's output,
    embedded: per embedding group (B, T_g, D_g) -> (B, output_size). One class per ``interaction`` setting
    (``INTERACTIONS``), its size rules inherited from ``models.shapes`` (``INTERACTION_SHAPES``, read without
    torch); a new interaction is one more class in each."""


class Cat(Interaction, CatShape):
    """The dense output and every embedding side by side; the prediction MLP finds the crosses."""

    def __init__(self, config: DLRMConfig):
        super().__init__()

    def forward(self, x: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([e.flatten(1) for e in embedded], dim=1)  # (B, sum T_g * D_g), grouped order
        return torch.cat([x, flat], dim=1)  # (B, D + sum T_g * D_g)


class DCNv2(Cat, DCNShape):
    """``Cat``'s vector through DCN-v2's low-rank cross network (``training.dcn``)."""

    def __init__(self, config: DLRMConfig):
        super().__init__(config)
        dcn = config.dcn
        self.cross = LowRankCrossNet(self.output_size(config), dcn.num_layers, dcn.low_rank, dcn.init)

    def forward(self, x: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        return self.cross(super().forward(x, embedded))


class PairwiseDots(torch.autograd.Function):
    """The dot products of every pair of a row's vectors, ``(B, N, D) -> (B, N(N-1)/2)``, with a backward of one
    batched product: the gradient of ``V V^T``'s upper triangle ``G`` is ``(G + G^T) V``. Autograd's own backward of
    the same forward (``bmm`` then ``index_select``) scatters ``G`` into zeros, then runs two batched products and
    adds them: the interaction's forward and backward took 22-29% less CPU time with this one (2,048 rows of 27 x 16,
    one thread, fp32 and bf16 autocast; benchmarks.md). The same gradient within rounding (one product, not two)."""

    @staticmethod
    def forward(ctx, vectors: torch.Tensor, upper: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
        dots = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, N, N); in bf16 under autocast
        ctx.save_for_backward(vectors, upper, lower)
        return dots.flatten(1).index_select(1, upper)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        vectors, upper, lower = ctx.saved_tensors
        rows, count = vectors.shape[0], vectors.shape[1]
        symmetric = grad.new_zeros(rows, count * count)  # G + G^T: G's entries at (i, j) and at (j, i)
        symmetric.index_copy_(1, upper, grad).index_copy_(1, lower, grad)
        low = vectors.to(grad.dtype)  # the forward's product ran in the gradient's dtype (bf16 under autocast)
        return torch.bmm(symmetric.view(rows, count, count), low).to(vectors.dtype), None, None


class Dot(Interaction, DotShape):
    """The paper's: the dense output and the 351 dot products of every pair of the 27 vectors."""

    def __init__(self, config: DLRMConfig):
        super().__init__()
        # Upper triangle without the diagonal, as positions in the flattened (27 x 27) product: one
        # index_select is cheaper forward and backward than indexing rows and columns separately. ``mirrored``:
        # the same pairs' positions across the diagonal, for the backward.
        rows, cols = torch.triu_indices(config.num_features, config.num_features, offset=1)
        self.register_buffer("pairs", rows * config.num_features + cols, persistent=False)
        self.register_buffer("mirrored", cols * config.num_features + rows, persistent=False)

    def forward(self, x: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        vectors = torch.cat([x.unsqueeze(1), *embedded], dim=1)  # (B, 27, D)
        if self.training and torch.is_grad_enabled() and vectors.requires_grad:
            pairs = PairwiseDots.apply(vectors, self.pairs, self.mirrored)
        else:  # evaluation, scoring and exports (an evaluated module, traced with gradients on): plain operations
            dots = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, 27, 27)
            pairs = dots.flatten(1).index_select(1, self.pairs)  # (B, 351) upper triangle, no diagonal
        return torch.cat([x, pairs], dim=1)  # (B, D + 351)


class DotCat(Dot, DotCatShape):
    """``Dot``'s products and the embeddings themselves: each value a first-order effect of its own."""

    def forward(self, x: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        own = [e.flatten(1) for e in embedded]  # per group (B, T_g * D)
        return torch.cat([super().forward(x, embedded), *own], dim=1)  # (B, D + 351 + 26 * D)


# ``training.interaction``'s values.
INTERACTIONS: dict[str, type[Interaction]] = {"dot": Dot, "dot_cat": DotCat, "cat": Cat, "dcn": DCNv2}


class FusedEmbedding(nn.Module):
    """Several embedding tables of one dimension stored as one, with per-table row offsets."""

    def __init__(self, table_sizes: list[int], dim: int, sparse: bool):
        super().__init__()
        offsets = torch.tensor([0, *table_sizes[:-1]], dtype=torch.long).cumsum(0)
        self.register_buffer("offsets", offsets, persistent=False)
        self.weight = nn.Embedding(sum(table_sizes), dim, sparse=sparse)
        self._bag_starts: dict[tuple, torch.Tensor] = {}  # multi-hot bags' starts by (sizes, device): ``_starts``
        # DLRM's initialisation: uniform in +-1/sqrt(rows) per table, so large tables start near zero.
        with torch.no_grad():
            for start, rows in zip(offsets.tolist(), table_sizes, strict=True):
                bound = 1.0 / math.sqrt(rows)
                self.weight.weight[start : start + rows].uniform_(-bound, bound)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """indices: (B, T) int -> (B, T, dim)."""
        return self.weight(indices + self.offsets)

    def bags(self, ids: list[torch.Tensor]) -> torch.Tensor:
        """ids: per table (B, k_t) ids of its rows -> (B, T, dim), each table's k_t rows summed.

        One ``embedding_bag`` for every table (no (B, sum k_t, dim) intermediate: 214 rows of 128 values a row at
        MLPerf's sizes); an exported graph looks the rows up and sums them instead, per table, which ONNX runs
        as one gather and one sum (its ``embedding_bag`` is a loop over the bags: 25 ms a row in onnxruntime)."""
        if torch.compiler.is_exporting():
            return torch.stack([self.weight(part + self.offsets[t]).sum(1) for t, part in enumerate(ids)], dim=1)
        batch, sizes = ids[0].shape[0], tuple(part.shape[1] for part in ids)
        flat = torch.cat([part + self.offsets[t] for t, part in enumerate(ids)], dim=1)  # (B, L)
        bag_starts = torch.arange(batch, device=flat.device).unsqueeze(1) * flat.shape[1] + self._starts(sizes, flat)
        pooled = F.embedding_bag(
            flat.reshape(-1), self.weight.weight, bag_starts.reshape(-1), mode="sum", sparse=self.weight.sparse
        )
        return pooled.reshape(batch, len(ids), -1)

    def _starts(self, sizes: tuple[int, ...], flat: torch.Tensor) -> torch.Tensor:
        """(T,) where each table's ids start in a row of ``flat``, made once per bag sizes and device: made on
        every forward pass, a GPU would wait for the copy from host memory each time."""
        key = (sizes, flat.device)
        if key not in self._bag_starts:
            self._bag_starts[key] = torch.tensor([0, *sizes[:-1]], device=flat.device).cumsum(0)
        return self._bag_starts[key]


def embedding_groups(config: DLRMConfig) -> list[list[int]]:
    """Features grouped by embedding size (sizes ascending, features in order within a group). 'dot' needs one
    size, so its single group keeps feature order; for 'cat'/'dcn' the grouped order is a fixed permutation of
    the MLP's inputs. Every embedding backend returns its vectors in this order."""
    dims = sorted(set(config.sparse_embedding_sizes))
    return [[f for f, d in enumerate(config.sparse_embedding_sizes) if d == dim] for dim in dims]


class GroupedTables(nn.ModuleList):
    """The ``torch`` embedding backend: one ``FusedEmbedding`` per embedding size (one lookup per size; multi-hot
    bags sum-pooled in one ``embedding_bag`` per size)."""

    def __init__(self, config: DLRMConfig, sparse_gradients: bool):
        self.groups = embedding_groups(config)
        super().__init__(
            FusedEmbedding(
                [config.table_sizes[f] for f in group], config.sparse_embedding_sizes[group[0]], sparse_gradients
            )
            for group in self.groups
        )
        # Each group's columns as a tensor on the model's device (indexing with the Python list copied it from host
        # memory on every forward pass: a GPU waited for it each time); not stored in the state.
        for g, group in enumerate(self.groups):
            self.register_buffer(f"columns_{g}", torch.tensor(group, dtype=torch.long), persistent=False)

    def forward(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """sparse: (B, 26) table indices -> one (B, T_g, dim_g) tensor per group of ``embedding_groups``."""
        return [table(sparse.index_select(1, getattr(self, f"columns_{g}"))) for g, table in enumerate(self)]

    def bags(self, ids: list[torch.Tensor]) -> list[torch.Tensor]:
        """ids: per feature (B, k_f) ids of its table -> one (B, T_g, dim_g) tensor of bag sums per group."""
        return [table.bags([ids[f] for f in group]) for table, group in zip(self, self.groups, strict=True)]


class DLRM(nn.Module):
    """The paper's DLRM; ``forward(dense, sparse)`` returns logits.

    Args:
        config: sizes and interaction.
        sparse_gradients: embeddings produce sparse gradients (for SparseAdam, Adagrad, SGD).
        embeddings: another embedding backend (``TorchRecEmbeddings``), any module mapping (B, 26) indices
            to one (B, T_g, dim_g) tensor per group of ``embedding_groups`` (and, for multi-hot features, its
            ``bags`` each feature's (B, k_f) ids to their sums); None: ``GroupedTables``.
    """

    def __init__(self, config: DLRMConfig, sparse_gradients: bool = True, embeddings: nn.Module | None = None):
        super().__init__()
        self.config = config
        self.dense_mlp = mlp(
            [config.dense_in_features, *config.dense_mlp.hidden_layer_sizes, config.dense_mlp.output_size],
            final_activation=True,
        )
        self.embeddings = GroupedTables(config, sparse_gradients) if embeddings is None else embeddings
        self.multi_hot = config.multi_hot()  # no state: a fixed function of the indices (or None: single-hot)
        self.interaction = INTERACTIONS[config.interaction](config)
        # The cross network's weights keep the names they were stored under before interactions were modules.
        self.register_state_dict_post_hook(_store_former_names)
        self.register_load_state_dict_pre_hook(_load_former_names)
        self.prediction_mlp = mlp(
            [config.interaction_size, *config.prediction_hidden_sizes, 1],
            final_activation=False,
            dropout=config.prediction_dropout,
        )
        if config.initial_ctr is not None:
            # At a 3% click rate a 0.5 start spends the first steps learning the base rate.
            with torch.no_grad():
                self.prediction_mlp[-1].bias.fill_(math.log(config.initial_ctr / (1.0 - config.initial_ctr)))

    def embed(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """sparse: (B, 26) table indices -> one (B, T_g, dim_g) tensor per embedding group (each feature's bag
        summed, with multi-hot features)."""
        if self.multi_hot is None:
            return self.embeddings(sparse)
        return self.embeddings.bags(self.multi_hot(sparse))

    def interact(self, x: torch.Tensor, embedded: list[torch.Tensor]) -> torch.Tensor:
        """x: (B, D) dense output; embedded: per group (B, T_g, D_g) -> (B, interaction_size)."""
        return self.interaction(x, embedded)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """dense: (B, 13) float; sparse: (B, 26) int -> logits (B,)."""
        x = self.dense_mlp(dense)  # (B, D)
        embedded = self.embed(sparse)
        return self.prediction_mlp(self.interact(x, embedded)).squeeze(1)  # (B,)

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.embeddings.parameters())

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("embeddings.")]


_STORED_PREFIX, _MODULE_PREFIX = "cross.", "interaction.cross."


def _store_former_names(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """``interaction.cross.*`` stored as ``cross.*``: checkpoints (torch, sharded) keep one set of names."""
    for key in [k for k in state if k.startswith(prefix + _MODULE_PREFIX)]:
        state[prefix + _STORED_PREFIX + key[len(prefix + _MODULE_PREFIX) :]] = state.pop(key)


def _load_former_names(module: nn.Module, state: dict, prefix: str, *args) -> None:
    for key in [k for k in state if k.startswith(prefix + _STORED_PREFIX)]:
        state[prefix + _MODULE_PREFIX + key[len(prefix + _STORED_PREFIX) :]] = state.pop(key)

"""The shapes of the model's parts that the training settings name (``training.dense_mlp``, ``training.dcn``): plain
records, so the settings are read and checked without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DenseMLP:
    """The bottom MLP over the 13 dense features (``training.dense_mlp``)."""

    hidden_layer_sizes: list[int] = field(default_factory=lambda: [64])
    output_size: int = 32


@dataclass
class DCN:
    """DCN-v2's low-rank cross network (``training.dcn``, with ``interaction: dcn``)."""

    num_layers: int = 3
    low_rank: int = 64
    # The cross layers' initial weights: torch's default for nn.Linear, or xavier_normal with zero biases (MLPerf's
    # reference, TorchRec's LowRankCrossNet).
    init: str = "torch"


DCN_INITS = ("torch", "xavier_normal")

"""The model's settings as records: its sizes (``DLRMConfig``), the shapes of the parts the training settings name
(``training.dense_mlp``, ``training.dcn``) and each interaction's size rules. No torch: the settings are read and
checked, and a run's memory counted, before anything imports it (``kedro catalog``, an encode-only run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import NUM_DENSE

if TYPE_CHECKING:
    from criteo_dlrm.models.multi_hot import MultiHot


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


# DLRMConfig's names before they became the YAML's (checkpoints of format 1 hold them).
_FORMER_NAMES = {"embedding_dims": "sparse_embedding_sizes"}
# Fields a format-1 checkpoint may lack (added while it was current), at the value that built such a model.
_FORMAT_1_ADDED = {"prediction_dropout": 0.0, "dcn_layers": 3, "dcn_rank": 64}
# Fields added since, at the value that built the models of checkpoints written before them.
_ADDED = {"multi_hot_sizes": None}


@dataclass(kw_only=True)
class DLRMConfig:
    """Sizes of the model, named as in ``parameters_training.yml``. ``table_sizes`` come from
    ``feature_metadata``; ``sparse_embedding_sizes`` has one size per table; ``initial_ctr`` (the training
    data's click rate) starts the output bias at its logit, so the untrained model predicts the prior.

    No defaults of its own: the YAML's are ``TrainingConfig``'s (build one with ``TrainingConfig.model_config``),
    and a checkpoint holds every field (``from_dict`` maps the former formats)."""

    table_sizes: list[int]
    sparse_embedding_sizes: list[int]
    dense_mlp: DenseMLP
    prediction_hidden_sizes: list[int]
    prediction_dropout: float
    interaction: str
    dcn: DCN
    # Lookups per feature, sum-pooled (MLPerf's multi-hot Criteo, ``models.multi_hot``); None: one each.
    multi_hot_sizes: list[int] | None
    dense_in_features: int = NUM_DENSE
    initial_ctr: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dense_mlp, dict):
            self.dense_mlp = DenseMLP(**self.dense_mlp)
        if isinstance(self.dcn, dict):
            self.dcn = DCN(**self.dcn)
        problems = []
        if len(self.sparse_embedding_sizes) != len(self.table_sizes):
            problems.append(
                f"sparse_embedding_sizes has {len(self.sparse_embedding_sizes)} entries for {len(self.table_sizes)} "
                "features: give one number for all, or one per feature"
            )
        if self.interaction not in INTERACTION_SHAPES:
            problems.append(f"interaction must be one of {tuple(INTERACTION_SHAPES)}, got {self.interaction!r}")
        else:
            problems += INTERACTION_SHAPES[self.interaction].problems(self)
        output = self.dense_mlp.output_size
        sizes = [
            *self.dense_mlp.hidden_layer_sizes,
            output,
            *self.prediction_hidden_sizes,
            *self.sparse_embedding_sizes,
        ]
        if any(int(size) < 1 for size in sizes):
            problems.append(f"layer and embedding sizes must be positive, got {sizes}")
        if any(int(size) < 1 for size in self.table_sizes):
            problems.append("every table needs at least one row (check feature_metadata)")
        if self.multi_hot_sizes is not None and (
            len(self.multi_hot_sizes) != len(self.table_sizes) or any(int(k) < 1 for k in self.multi_hot_sizes)
        ):
            problems.append(
                f"multi_hot_sizes must be {len(self.table_sizes)} lookup counts of at least 1 (one per feature), got "
                f"{self.multi_hot_sizes}"
            )
        if not 0.0 <= self.prediction_dropout < 1.0:
            problems.append(f"prediction_dropout must be in [0, 1), got {self.prediction_dropout}")
        if self.initial_ctr is not None and not 0.0 < self.initial_ctr < 1.0:
            problems.append(f"initial_ctr must be in (0, 1), got {self.initial_ctr}")
        if problems:
            raise ConfigError("Invalid DLRM settings:\n  " + "\n  ".join(problems))

    @classmethod
    def from_dict(cls, values: dict) -> DLRMConfig:
        """From ``to_dict()``'s output, or a checkpoint's ``model_config`` of either format."""
        values = {**_ADDED, **{_FORMER_NAMES.get(key, key): value for key, value in values.items()}}
        if "dense_hidden_sizes" in values:  # format 1: flat names, and fields added later at their first values
            values = {**_FORMAT_1_ADDED, **values}
            values["dense_mlp"] = {
                "hidden_layer_sizes": values.pop("dense_hidden_sizes"),
                "output_size": values.pop("dense_output_size"),
            }
            values["dcn"] = {"num_layers": values.pop("dcn_layers"), "low_rank": values.pop("dcn_rank")}
        return cls(**values)

    @property
    def lookups_per_row(self) -> int:
        """Table rows one Criteo row looks up: one per feature, or the multi-hot sizes summed."""
        return sum(self.multi_hot_sizes) if self.multi_hot_sizes else len(self.table_sizes)

    def multi_hot(self) -> MultiHot | None:
        """The expansion of single-hot indices into each feature's bag of ids, or None (single-hot)."""
        from criteo_dlrm.models.multi_hot import MultiHot  # torch

        return MultiHot(self.table_sizes, self.multi_hot_sizes) if self.multi_hot_sizes else None

    @property
    def num_features(self) -> int:
        """Vectors that interact: the dense output and one per table."""
        return 1 + len(self.table_sizes)

    @property
    def interaction_size(self) -> int:
        """Width of the interaction's output: the prediction MLP's input."""
        return INTERACTION_SHAPES[self.interaction].output_size(self)

    def to_dict(self) -> dict:
        return asdict(self)


class InteractionShape:
    """What an ``interaction`` setting asks of the model's sizes, and the width of what it hands the prediction
    MLP: the rules the settings are checked by (without torch). ``models.dlrm``'s interaction of each name is a
    module that inherits its rules from here."""

    @staticmethod
    def problems(config: DLRMConfig) -> list[str]:
        """What in ``config`` this interaction cannot work with (empty: nothing)."""
        return []

    @staticmethod
    def output_size(config: DLRMConfig) -> int:
        return config.dense_mlp.output_size + sum(config.sparse_embedding_sizes)


class CatShape(InteractionShape):
    """``cat``: the dense output and every embedding side by side."""


class DCNShape(CatShape):
    """``dcn``: ``cat``'s vector through DCN-v2's cross network."""

    @staticmethod
    def problems(config: DLRMConfig) -> list[str]:
        dcn, found = config.dcn, []
        if dcn.num_layers < 1 or dcn.low_rank < 1:
            found.append(f"dcn.num_layers and dcn.low_rank must be >= 1, got {dcn.num_layers}, {dcn.low_rank}")
        if dcn.init not in DCN_INITS:
            found.append(f"dcn.init must be one of {DCN_INITS}, got {dcn.init!r}")
        return found


class DotShape(InteractionShape):
    """``dot``: the dense output and the dot products of every pair of vectors."""

    @staticmethod
    def problems(config: DLRMConfig) -> list[str]:
        output = config.dense_mlp.output_size
        if all(size == output for size in config.sparse_embedding_sizes):
            return []
        return [
            f"interaction '{config.interaction}' needs every embedding size equal to dense_mlp.output_size "
            f"({output}), got sparse_embedding_sizes {sorted(set(config.sparse_embedding_sizes))}: make them "
            "equal, or use interaction 'cat'"
        ]

    @staticmethod
    def output_size(config: DLRMConfig) -> int:
        return config.dense_mlp.output_size + config.num_features * (config.num_features - 1) // 2


class DotCatShape(DotShape):
    """``dot_cat``: ``dot``'s products and the embeddings themselves."""

    @staticmethod
    def output_size(config: DLRMConfig) -> int:
        return DotShape.output_size(config) + sum(config.sparse_embedding_sizes)


# ``training.interaction``'s values.
INTERACTION_SHAPES: dict[str, type[InteractionShape]] = {
    "dot": DotShape,
    "dot_cat": DotCatShape,
    "cat": CatShape,
    "dcn": DCNShape,
}

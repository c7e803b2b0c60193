"""One typed configuration for a training run, whose field names are the keys of ``parameters_training.yml``.

``TrainingConfig.from_dict`` builds it from ``params:training`` (or any part of it: missing keys keep the
defaults, which are the project's defaults, checked against ``conf/base`` by a test) and reports every
problem at once: unknown keys, wrong types (``num_epochs: abc``) and values out of range.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import NUM_SPARSE
from criteo_dlrm.engine.profiling import ProfilerSettings
from criteo_dlrm.models.dlrm import DLRMConfig

EMBEDDING_OPTIMIZERS = ("sparse_adam", "adagrad", "sgd", "dense_adam", "rowwise_adagrad")
EMBEDDING_BACKENDS = ("torch", "torchrec")
# What TorchRec's planner may be forced to (row-wise and table-row-wise need CUDA).
SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise")
DECAYS = ("none", "linear", "cosine")
PRECISIONS = ("fp32", "bf16")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class DenseMLP:
    hidden_layer_sizes: list[int] = field(default_factory=lambda: [64])
    output_size: int = 16


@dataclass
class DCN:
    num_layers: int = 3
    low_rank: int = 64


@dataclass
class BatchSize:
    train: int = 256  # the global batch: with N processes each takes about train / N rows of it
    validation: int = 16384


@dataclass
class EarlyStopping:
    patience: int = 2
    min_delta: float = 0.0


@dataclass
class Distributed:
    """Data-parallel training on torch.distributed (``nproc_per_node`` > 1, or launched by ``torchrun``)."""

    nproc_per_node: int = 1
    nnodes: int = 1  # > 1: this run writes the job and waits while torchrun runs it on every node
    backend: str = "auto"  # auto: nccl on CUDA, gloo on CPU
    max_restarts: int = 0  # elastic restarts of the whole group after a worker fails
    master_port: int | None = None  # null: a free port (single node)


@dataclass
class Sharding:
    """Where the embedding tables live (``embedding_backend: torchrec`` shards them across the processes)."""

    type: str | None = None  # torchrec: force one sharding type for every table; null: the planner chooses
    memory_per_process_gb: float | None = None  # per-process budget for tables + optimiser state; null: the device's


@dataclass
class TrainingConfig:
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    allow_tf32: bool = True
    compile: bool = False
    compile_mode: str = "default"
    num_threads: int | None = None
    encoding_workers: int | None = None
    dense_mlp: DenseMLP = field(default_factory=DenseMLP)
    sparse_embedding_sizes: int | list[int] = 16
    prediction_hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])
    prediction_dropout: float = 0.0
    interaction: str = "dot"
    dcn: DCN = field(default_factory=DCN)
    learning_rate: float = 0.001
    embedding_backend: str = "torch"
    sharding: Sharding = field(default_factory=Sharding)
    embedding_optimizer: str = "sparse_adam"
    embedding_learning_rate: float = 0.003
    embedding_weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "none"
    batch_size: BatchSize = field(default_factory=BatchSize)
    num_epochs: int = 3
    max_steps: int | None = None
    validations_per_epoch: int = 4
    validate_every_steps: int = 0  # > 0: overrides validations_per_epoch
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    log_every_steps: int = 20
    phase_timing: bool = True
    resume: bool = True
    checkpoint_every_steps: int = 0
    in_progress_dir: str = "data/06_models/in_progress"
    tensorboard_dir: str = "data/08_reporting/tensorboard"
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    distributed: Distributed = field(default_factory=Distributed)

    @classmethod
    def from_dict(cls, values: dict, prefix: str = "") -> TrainingConfig:
        """Build and check; ``prefix`` (e.g. ``training.``) is put before field names in the messages.

        Raises:
            ConfigError: listing every unknown key, wrong type and out-of-range value.
        """
        problems: list[str] = []
        config = _build(cls, values, prefix, problems)  # a value of the wrong type keeps its default here
        problems += config.problems(prefix)
        if problems:
            raise ConfigError("Invalid training configuration:\n  " + "\n  ".join(problems))
        return config

    def to_dict(self) -> dict:
        return asdict(self)

    def problems(self, prefix: str = "") -> list[str]:
        """Values out of range (types are checked by ``from_dict``)."""
        problems = []

        def need(ok: bool, name: str, message: str) -> None:
            if not ok:
                problems.append(f"{prefix}{name} {message}, got {_value(self, name)!r}")

        need(
            self.embedding_optimizer in EMBEDDING_OPTIMIZERS,
            "embedding_optimizer",
            f"must be one of {EMBEDDING_OPTIMIZERS}",
        )
        need(self.decay in DECAYS, "decay", f"must be one of {DECAYS}")
        need(self.embedding_backend in EMBEDDING_BACKENDS, "embedding_backend", f"must be one of {EMBEDDING_BACKENDS}")
        need(
            self.sharding.type is None or self.sharding.type in SHARDING_TYPES,
            "sharding.type",
            f"must be null or one of {SHARDING_TYPES}",
        )
        budget = self.sharding.memory_per_process_gb
        need(budget is None or budget > 0, "sharding.memory_per_process_gb", "must be positive (or null)")
        torchrec = self.embedding_backend == "torchrec"
        need(
            torchrec or self.embedding_optimizer != "rowwise_adagrad",
            "embedding_optimizer",
            "rowwise_adagrad is TorchRec's fused optimiser: use it with embedding_backend: torchrec (or use adagrad)",
        )
        need(
            not torchrec or self.embedding_optimizer != "dense_adam",
            "embedding_optimizer",
            "dense_adam has no fused TorchRec kernel: use rowwise_adagrad with embedding_backend: torchrec",
        )
        need(
            torchrec or self.sharding.type is None,
            "sharding.type",
            "only applies to embedding_backend: torchrec (the torch backend keeps every table in every process)",
        )
        need(self.precision in PRECISIONS, "precision", f"must be one of {PRECISIONS}")
        need(self.distributed.backend in BACKENDS, "distributed.backend", f"must be one of {BACKENDS}")
        for name in ("num_epochs", "batch_size.train", "batch_size.validation", "log_every_steps", "validations_per_epoch",
                     "distributed.nproc_per_node", "distributed.nnodes", "early_stopping.patience"):  # fmt: skip
            need(_value(self, name) >= 1, name, "must be >= 1")
        for name in ("learning_rate", "embedding_learning_rate"):
            need(_value(self, name) > 0, name, "must be positive")
        need(self.embedding_weight_decay >= 0, "embedding_weight_decay", "must be >= 0 (0: off)")
        for name in ("warmup_steps", "validate_every_steps", "checkpoint_every_steps", "distributed.max_restarts"):
            need(_value(self, name) >= 0, name, "must be >= 0 (0: off)")
        for name in ("max_steps", "num_threads", "encoding_workers"):
            need(_value(self, name) is None or _value(self, name) >= 1, name, "must be >= 1 (or null)")
        sizes = self.sparse_embedding_sizes
        need(isinstance(sizes, int) or len(sizes) == NUM_SPARSE, "sparse_embedding_sizes", "must be one number or 26")
        return problems

    @property
    def sparse_gradients(self) -> bool:
        return self.embedding_optimizer != "dense_adam"

    @property
    def launches_processes(self) -> bool:
        """More than this process trains (the elastic launcher or torchrun starts them)."""
        return self.distributed.nproc_per_node > 1 or self.distributed.nnodes > 1

    def model_config(self, table_sizes: list[int]) -> DLRMConfig:
        """The DLRM's sizes: table sizes from the feature metadata, everything else from here."""
        sizes = self.sparse_embedding_sizes
        return DLRMConfig(
            table_sizes=list(table_sizes),
            embedding_dims=[sizes] * NUM_SPARSE if isinstance(sizes, int) else list(sizes),
            dense_hidden_sizes=list(self.dense_mlp.hidden_layer_sizes),
            dense_output_size=self.dense_mlp.output_size,
            prediction_hidden_sizes=list(self.prediction_hidden_sizes),
            interaction=self.interaction,
            dcn_layers=self.dcn.num_layers,
            dcn_rank=self.dcn.low_rank,
            prediction_dropout=self.prediction_dropout,
        )


def _value(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def _build(cls: type, values: Any, prefix: str, problems: list[str]) -> Any:
    """An instance of dataclass ``cls`` from a mapping, recording type problems instead of raising."""
    if not isinstance(values, Mapping):
        problems.append(f"{prefix.rstrip('.')} must be a mapping, got {values!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in values:
        if key not in known:
            problems.append(f"{prefix}{key} is not a training setting (known: {', '.join(sorted(known))})")
    kwargs = {}
    for name in known & set(values):
        kind, value = hints[name], values[name]
        if is_dataclass(kind):
            kwargs[name] = _build(kind, value, f"{prefix}{name}.", problems)
        elif _matches(kind, value):
            kwargs[name] = float(value) if kind is float else (list(value) if _is_list(value) else value)
        else:
            problems.append(f"{prefix}{name} must be {_describe(kind)}, got {value!r}")
    return cls(**kwargs)


def _matches(kind: Any, value: Any) -> bool:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(option, value) for option in typing.get_args(kind))
    if origin is list:
        (item,) = typing.get_args(kind)
        return _is_list(value) and all(_matches(item, v) for v in value)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _describe(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(kind))
    if origin is list:
        return f"a list of {_describe(typing.get_args(kind)[0])}s"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))

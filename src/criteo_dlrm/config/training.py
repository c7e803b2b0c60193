"""``parameters_training.yml``: the model's sizes, the optimisers, the loop, processes and the profiler.

``TrainingConfig``'s fields are the YAML keys, nested as the YAML nests; ``from_dict`` reports every problem
of ``params:training`` at once (``config.base``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import DENSE_TRANSFORMS, NUM_SPARSE
from criteo_dlrm.config.base import Checks, Config
from criteo_dlrm.config.evaluation import PRECISIONS, is_device
from criteo_dlrm.models.shapes import DCN, DenseMLP, DLRMConfig

# training.calibration's choices (engine.trained.calibration implements them).
CALIBRATION_METHODS = ("platt", "isotonic", "none")


@dataclass(frozen=True)
class EmbeddingOptimizer:
    """One ``training.embedding_optimizer``: its implementation on each backend and its state's size.

    Attributes:
        torch: its ``torch.optim`` class on the torch backend (None: TorchRec's only).
        fused: its ``torchrec.optim`` class on the torchrec backend, fused into backward (None: none).
        fused_devices: the devices FBGEMM has that fused kernel on.
        state_per_value, state_per_row: optimiser state, in floats per embedding value and per table row.
        whole_model: it updates the dense layers too (dense Adam over every parameter, the predecessor's way).
        adagrad: an Adagrad kind: it takes ``training.adagrad_eps``.
    """

    torch: str | None
    fused: str | None
    fused_devices: tuple[str, ...] = ("cpu", "cuda")
    state_per_value: int = 0
    state_per_row: int = 0
    whole_model: bool = False
    adagrad: bool = False


# The one table of embedding optimisers: the config's checks, the modes, TorchRec's planner and the memory
# accounting all read it.
EMBEDDING_OPTIMIZERS = {
    "sparse_adam": EmbeddingOptimizer("SparseAdam", "Adam", fused_devices=("cuda",), state_per_value=2),
    "adagrad": EmbeddingOptimizer("Adagrad", "Adagrad", state_per_value=1, adagrad=True),
    "sgd": EmbeddingOptimizer("SGD", "SGD"),
    "dense_adam": EmbeddingOptimizer("Adam", None, fused_devices=(), state_per_value=3, whole_model=True),
    "rowwise_adagrad": EmbeddingOptimizer(None, "RowWiseAdagrad", state_per_row=1, adagrad=True),
}
# training.dense_optimizer: the dense layers' ``torch.optim`` class (Adam by default; MLPerf's DLRM-DCNv2 trains them
# with Adagrad, TorchRec's DLRM example with SGD).
DENSE_OPTIMIZERS = {"adam": "Adam", "adagrad": "Adagrad", "sgd": "SGD"}


class EmbeddingBackend(StrEnum):
    """``training.embedding_backend``: where the embedding tables live. The YAML holds its value (``torch``);
    the config holds the member, so code asks it (``.sharded``) instead of comparing names."""

    TORCH = "torch"  # every process holds every table
    TORCHREC = "torchrec"  # TorchRec shards the tables across the processes

    @property
    def sharded(self) -> bool:
        """TorchRec shards the tables across the processes; else every process holds every table."""
        return self is EmbeddingBackend.TORCHREC


# What TorchRec's planner may be forced to (row-wise and table-row-wise need CUDA).
SHARDING_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise")
DECAYS = ("none", "linear", "cosine", "step")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
BACKENDS = ("auto", "gloo", "nccl")


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
class StepDecay:
    """``decay: step``: one change of the learning rates at a fraction of the run (TorchRec's DLRM example)."""

    at: float = 0.8  # the fraction of the run's steps after which the rates change
    learning_rate: float | None = None  # the dense layers' rate from then on; the embeddings' changes by as much


@dataclass
class ProfilerConfig:
    """``training.profiler``: torch.profiler over a few steps (off by default)."""

    enabled: bool = False
    wait: int = 5
    warmup: int = 2
    active: int = 5
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    row_limit: int = 30


@dataclass
class TrainingConfig(Config):
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    allow_tf32: bool = True
    compile: bool = False
    compile_mode: str = "default"
    num_threads: int | None = None
    encoding_workers: int | None = None
    dense_transform: str = "standardised"  # DENSE_TRANSFORMS: standardised, or log_plus_3 (MLPerf's log(x + 3))
    dense_mlp: DenseMLP = field(default_factory=DenseMLP)
    sparse_embedding_sizes: int | list[int] = 32
    multi_hot_sizes: list[int] | None = None  # lookups per feature, sum-pooled (MLPerf's multi-hot Criteo)
    prediction_hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])
    prediction_dropout: float = 0.0
    interaction: str = "dot_cat"
    dcn: DCN = field(default_factory=DCN)
    learning_rate: float = 0.001
    dense_optimizer: str = "adam"
    adagrad_eps: float = 1e-10  # torch's Adagrad default; MLPerf's DLRM-DCNv2 uses 1e-8
    embedding_backend: EmbeddingBackend = EmbeddingBackend.TORCH
    sharding: Sharding = field(default_factory=Sharding)
    embedding_optimizer: str = "sparse_adam"
    embedding_learning_rate: float = 0.003
    embedding_weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "none"
    step_decay: StepDecay = field(default_factory=StepDecay)
    batch_size: BatchSize = field(default_factory=BatchSize)
    num_epochs: int = 3
    max_steps: int | None = None
    validations_per_epoch: int = 4
    validate_every_steps: int = 0  # > 0: overrides validations_per_epoch
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    target_auc: float | None = None  # stop at the first validation at or above it (MLPerf's time to target)
    calibration: str = "platt"  # fitted on the validation rows after training: platt, isotonic or none
    log_every_steps: int = 20
    # Training batches prepared ahead in a background thread (gather, pin, the copy on CUDA); 0: none.
    prefetch_batches: int = 2
    # Threads reading each window of training rows (its chunks at once); the rows are the same with any number.
    reading_threads: int = 2
    # Per-phase step times; None: on the CPU (free there), off on CUDA (each phase would synchronise the GPU)
    # unless the profiler runs.
    phase_timing: bool | None = None
    resume: bool = True
    # Refuse a run whose tables and work are counted larger than the memory it has (engine.memory); false: warn
    # with the count and train anyway.
    memory_check: bool = True
    checkpoint_every_steps: int = 0
    in_progress_dir: str = "data/06_models/in_progress"
    tensorboard_dir: str = "data/08_reporting/tensorboard"
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    distributed: Distributed = field(default_factory=Distributed)

    def problems(self, prefix: str = "") -> list[str]:
        """Values out of range (types are checked by ``from_dict``), and model sizes that cannot be built."""
        checks = Checks(self, prefix)
        need = checks.need
        checks.one_of("embedding_optimizer", EMBEDDING_OPTIMIZERS)
        checks.one_of("decay", DECAYS)
        checks.one_of("dense_optimizer", DENSE_OPTIMIZERS)
        checks.one_of("dense_transform", DENSE_TRANSFORMS)
        checks.positive("adagrad_eps")
        need(
            self.decay != "step" or self.step_decay.learning_rate is not None,
            "step_decay.learning_rate",
            "decay: step needs the rate to change to (e.g. step_decay: {at: 0.8, learning_rate: 0.2})",
        )
        checks.positive("step_decay.learning_rate", optional=True)
        need(0.0 < self.step_decay.at < 1.0, "step_decay.at", "must be a fraction of the run in (0, 1)")
        need(
            self.target_auc is None or 0.5 < self.target_auc < 1.0,
            "target_auc",
            "must be an AUC in (0.5, 1) or null (MLPerf DLRM-DCNv2's is 0.80275)",
        )
        checks.one_of("calibration", CALIBRATION_METHODS)
        checks.one_of("sharding.type", SHARDING_TYPES, optional=True)
        checks.positive("sharding.memory_per_process_gb", optional=True)
        torchrec = self.embedding_backend.sharded
        optimizer = EMBEDDING_OPTIMIZERS.get(self.embedding_optimizer)
        need(
            optimizer is None or not optimizer.whole_model or self.dense_optimizer == "adam",
            "dense_optimizer",
            f"embedding_optimizer {self.embedding_optimizer} trains every parameter with Adam: use dense_optimizer: "
            "adam, or another embedding_optimizer",
        )
        need(
            optimizer is None or torchrec or optimizer.torch is not None,
            "embedding_optimizer",
            f"{self.embedding_optimizer} is TorchRec's fused optimiser: use it with embedding_backend: torchrec (or "
            "use adagrad)",
        )
        need(
            optimizer is None or not torchrec or optimizer.fused is not None,
            "embedding_optimizer",
            f"{self.embedding_optimizer} has no fused TorchRec kernel: use rowwise_adagrad with embedding_backend: "
            "torchrec",
        )
        need(
            torchrec or self.sharding.type is None,
            "sharding.type",
            "only applies to embedding_backend: torchrec (the torch backend keeps every table in every process)",
        )
        need(is_device(self.device), "device", "must be auto, cpu, cuda or cuda:N")
        checks.one_of("precision", (*PRECISIONS, "auto"))
        checks.one_of("compile_mode", COMPILE_MODES)
        checks.one_of("distributed.backend", BACKENDS)
        checks.at_least(0, "prefetch_batches", "seed")  # numpy's generators take no negative seed
        checks.at_least(1, "num_epochs", "batch_size.train", "batch_size.validation", "log_every_steps",
                        "validations_per_epoch", "distributed.nproc_per_node", "distributed.nnodes",
                        "early_stopping.patience", "reading_threads")  # fmt: skip
        checks.positive("learning_rate", "embedding_learning_rate")
        checks.at_least(0, "embedding_weight_decay", "early_stopping.min_delta", "warmup_steps",
                        "validate_every_steps", "checkpoint_every_steps", "distributed.max_restarts",
                        "profiler.wait", "profiler.warmup")  # fmt: skip
        checks.at_least(1, "profiler.active", "profiler.repeat", "profiler.row_limit")
        checks.at_least(1, "max_steps", "num_threads", "encoding_workers", optional=True)
        sizes = self.sparse_embedding_sizes
        need(isinstance(sizes, int) or len(sizes) == NUM_SPARSE, "sparse_embedding_sizes", "must be one number or 26")
        need(
            self.multi_hot_sizes is None or not self.embedding_weight_decay,
            "embedding_weight_decay",
            "penalises the rows a batch looks up one by one, which multi-hot features sum into bags: use 0 with "
            "multi_hot_sizes",
        )
        if not checks.problems:
            try:
                self.model_config([2] * NUM_SPARSE)  # the sizes themselves (positive, dot's equal sizes, dropout)
            except ConfigError as error:
                checks.problems += [f"{prefix}{line.strip()}" for line in str(error).splitlines()[1:]]
        return checks.problems

    @property
    def optimizer(self) -> EmbeddingOptimizer:
        """The embedding optimiser's row of ``EMBEDDING_OPTIMIZERS``."""
        return EMBEDDING_OPTIMIZERS[self.embedding_optimizer]

    def embedding_optimizer_args(self) -> dict:
        """The embedding optimiser's arguments: its learning rate, and ``adagrad_eps`` for an Adagrad kind."""
        return {"lr": self.embedding_learning_rate, **({"eps": self.adagrad_eps} if self.optimizer.adagrad else {})}

    def dense_optimizer_args(self) -> dict:
        """The dense optimiser's arguments: its learning rate, and ``adagrad_eps`` for Adagrad."""
        return {"lr": self.learning_rate, **({"eps": self.adagrad_eps} if self.dense_optimizer == "adagrad" else {})}

    @property
    def sparse_gradients(self) -> bool:
        return not self.optimizer.whole_model

    @property
    def launches_processes(self) -> bool:
        """More than this process trains (the elastic launcher or torchrun starts them)."""
        return self.distributed.nproc_per_node > 1 or self.distributed.nnodes > 1

    def model_config(self, table_sizes: list[int], initial_ctr: float | None = None) -> DLRMConfig:
        """The DLRM's sizes: table sizes (and the click rate the output starts at) from the feature metadata,
        everything else from here, under the same names."""
        sizes = self.sparse_embedding_sizes
        return DLRMConfig(
            table_sizes=list(table_sizes),
            sparse_embedding_sizes=[sizes] * NUM_SPARSE if isinstance(sizes, int) else list(sizes),
            dense_mlp=DenseMLP(list(self.dense_mlp.hidden_layer_sizes), self.dense_mlp.output_size),
            prediction_hidden_sizes=list(self.prediction_hidden_sizes),
            prediction_dropout=self.prediction_dropout,
            interaction=self.interaction,
            dcn=DCN(self.dcn.num_layers, self.dcn.low_rank, self.dcn.init),
            initial_ctr=initial_ctr,
            multi_hot_sizes=list(self.multi_hot_sizes) if self.multi_hot_sizes is not None else None,
        )

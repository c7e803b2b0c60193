"""The training loop: batches in, validated best weights out.

Setup (optimisers, schedules, resume) happens in ``Trainer.__init__``, the loop in ``fit`` and the
per-step work in ``_train_step``. Validation runs over the whole validation set, early stopping
watches validation log loss, and an in-progress checkpoint at each validation lets an interrupted
run continue at the same step, with the same optimiser state and data order.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from loguru import logger
from torch import nn

from criteo_dlrm.data.batches import Batch, BatchLoader
from criteo_dlrm.engine.checkpoint import load_checkpoint, remove_stale_partials, save_atomically
from criteo_dlrm.engine.device import autocast
from criteo_dlrm.engine.metrics import MetricError, binary_metrics
from criteo_dlrm.engine.profiling import ProfilerSettings, profiler
from criteo_dlrm.engine.scoring import probabilities
from criteo_dlrm.engine.tensorboard import MetricLogger, NullLogger, TensorBoardLogger
from criteo_dlrm.errors import ConfigError, UserError
from criteo_dlrm.models.dlrm import DLRM
from criteo_dlrm.progress import progress_bar

EMBEDDING_OPTIMIZERS = ("sparse_adam", "adagrad", "sgd", "dense_adam")
DECAYS = ("none", "linear", "cosine")


class TrainingDivergedError(UserError, RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainingSettings:
    """The loop's knobs (``parameters_training.yml``, less the model sizes)."""

    num_epochs: int = 3
    batch_size_train: int = 2048
    batch_size_validation: int = 16384
    learning_rate: float = 1e-3
    embedding_optimizer: str = "sparse_adam"
    embedding_learning_rate: float = 1e-3
    warmup_steps: int = 0
    decay: str = "none"
    max_steps: int | None = None
    validate_every_steps: int = 0
    checkpoint_every_steps: int = 0
    early_stopping_patience: int = 2
    early_stopping_min_delta: float = 0.0
    log_every_steps: int = 50
    seed: int = 0
    precision: str = "fp32"
    phase_timing: bool = True
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)

    def __post_init__(self) -> None:
        problems = []
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            problems.append(
                f"embedding_optimizer must be one of {EMBEDDING_OPTIMIZERS}, got {self.embedding_optimizer!r}"
            )
        if self.decay not in DECAYS:
            problems.append(f"decay must be one of {DECAYS}, got {self.decay!r}")
        for name in ("num_epochs", "batch_size_train", "batch_size_validation", "log_every_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.embedding_learning_rate <= 0:
            problems.append("learning rates must be positive")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"max_steps must be >= 1 (or null), got {self.max_steps}")
        if self.early_stopping_patience < 1:
            problems.append(f"early_stopping_patience must be >= 1, got {self.early_stopping_patience}")
        if problems:
            raise ConfigError("Invalid training settings:\n  " + "\n  ".join(problems))

    @property
    def sparse_gradients(self) -> bool:
        return self.embedding_optimizer != "dense_adam"


@dataclass
class TrainingResult:
    best_model_state: dict
    best_optimizer_state: dict
    best_step: int
    best_epoch: int
    best_metrics: dict
    history: list[dict]
    steps: int
    stopped_early: bool
    samples_per_second: float


def build_optimizers(model: DLRM, settings: TrainingSettings) -> dict[str, torch.optim.Optimizer]:
    """Adam for the dense layers; the embeddings' optimiser from ``settings.embedding_optimizer``."""
    embeddings = model.embedding_parameters()
    if settings.embedding_optimizer == "dense_adam":  # the seed's way: Adam over every table row, every step
        return {"dense": torch.optim.Adam(model.parameters(), lr=settings.learning_rate)}
    sparse = {
        "sparse_adam": lambda: torch.optim.SparseAdam(embeddings, lr=settings.embedding_learning_rate),
        "adagrad": lambda: torch.optim.Adagrad(embeddings, lr=settings.embedding_learning_rate),
        "sgd": lambda: torch.optim.SGD(embeddings, lr=settings.embedding_learning_rate),
    }[settings.embedding_optimizer]()
    return {"dense": torch.optim.Adam(model.dense_parameters(), lr=settings.learning_rate), "embeddings": sparse}


def learning_rate_factor(step: int, total_steps: int, settings: TrainingSettings) -> float:
    """Linear warm-up over ``warmup_steps``, then constant, linear or cosine decay to zero at ``total_steps``."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    if settings.decay == "none" or total_steps <= settings.warmup_steps:
        return 1.0
    progress = min((step - settings.warmup_steps) / (total_steps - settings.warmup_steps), 1.0)
    return 1.0 - progress if settings.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def predict(
    model: nn.Module, loader: BatchLoader, device: torch.device, precision: str = "fp32", progress: bool | None = False
) -> np.ndarray:
    """Click probabilities for every row of ``loader``, in order: (N,) float64."""
    model.eval()
    outputs = []
    with progress_bar(len(loader.arrays), "scoring", "rows", progress) as bar:
        for batch in loader.batches():
            outputs.append(probabilities(model, batch.dense, batch.sparse, device, precision))
            bar.update(len(batch))
    return torch.cat(outputs).double().numpy() if outputs else np.zeros(0)


class Trainer:
    """Trains a DLRM on one device.

    Args:
        model: the model, already on ``device`` (and compiled if wanted).
        settings: loop settings.
        train_loader, validation_loader: encoded rows; the training loader shuffles.
        device: where to train.
        run_dir: TensorBoard run folder (scalars, profiler traces). A resumed run keeps the folder it
            started in (recorded in its in-progress checkpoint), so one run is one set of curves.
        metric_logger: where scalars go; None: nowhere, or TensorBoard in ``run_dir`` with ``tensorboard``.
        resume_path: in-progress checkpoint file, written at each validation and every
            ``checkpoint_every_steps``; resumed from when its ``fingerprint`` matches.
        fingerprint: identifies the run's settings and data, so an unrelated checkpoint is never resumed.
        tensorboard: write scalars to ``run_dir`` (opened after resuming, dropping the events the
            interrupted run wrote after the step it resumes from).
    """

    def __init__(
        self,
        model: DLRM,
        settings: TrainingSettings,
        train_loader: BatchLoader,
        validation_loader: BatchLoader,
        device: torch.device,
        run_dir: Path,
        metric_logger: MetricLogger | None = None,
        resume_path: Path | None = None,
        fingerprint: str = "",
        tensorboard: bool = False,
    ):
        self.model, self.settings, self.device, self.run_dir = model, settings, device, Path(run_dir)
        self.train_loader, self.validation_loader = train_loader, validation_loader
        self.resume_path, self.fingerprint = resume_path, fingerprint
        self.loss_function = nn.BCEWithLogitsLoss()
        self.optimizers = build_optimizers(model, settings)
        self.steps_per_epoch = len(train_loader)
        self.total_steps = self.steps_per_epoch * settings.num_epochs
        if settings.max_steps is not None:
            self.total_steps = min(self.total_steps, settings.max_steps)
        self.base_rates = {name: [g["lr"] for g in opt.param_groups] for name, opt in self.optimizers.items()}
        self.step = 0
        self.best_loss = math.inf
        self.best: dict = {}
        self.bad_validations = 0
        self.history: list[dict] = []
        self.samples_seen, self.train_seconds = 0, 0.0
        self._maybe_resume()
        self._owns_logger = metric_logger is None and tensorboard
        if self._owns_logger:
            metric_logger = TensorBoardLogger(self.run_dir, purge_step=self.step + 1 if self.step else None)
        self.metric_logger = metric_logger or NullLogger()

    # -- setup -----------------------------------------------------------------------------------
    def _maybe_resume(self) -> None:
        if self.resume_path is None:
            return
        remove_stale_partials(Path(self.resume_path).parent)
        if not Path(self.resume_path).exists():
            return
        state = load_checkpoint(self.resume_path)
        if state.get("fingerprint") != self.fingerprint:
            logger.warning("{} belongs to other settings or data; starting afresh", self.resume_path)
            return
        self.model.load_state_dict(state["model_state"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizer_state"][name])
        self.step, self.best_loss, self.best = state["step"], state["best_loss"], state["best"]
        self.bad_validations, self.history = state["bad_validations"], state["history"]
        torch.set_rng_state(state["torch_rng_state"])
        self.run_dir = Path(state.get("run_dir", self.run_dir))
        logger.info(
            "resumed from {} at step {:,} (best validation log loss {:.5f})",
            self.resume_path,
            self.step,
            self.best_loss,
        )

    def _save_progress(self) -> None:
        if self.resume_path is None:
            return
        state = self.model.state_dict()
        if not all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
            raise TrainingDivergedError(
                f"Training diverged: the weights are NaN or infinite at step {self.step:,} although every loss "
                f"was finite.{self._kept()} Lower the learning rates or add warm-up."
            )
        save_atomically(
            {
                "fingerprint": self.fingerprint,
                "model_state": state,
                "optimizer_state": {name: opt.state_dict() for name, opt in self.optimizers.items()},
                "step": self.step,
                "run_dir": str(self.run_dir),
                "best_loss": self.best_loss,
                "best": self.best,
                "bad_validations": self.bad_validations,
                "history": self.history,
                "torch_rng_state": torch.get_rng_state(),
            },
            self.resume_path,
        )

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainingResult:
        settings = self.settings
        stopped_early = self.bad_validations >= settings.early_stopping_patience
        bar = progress_bar(self.total_steps, "training", "step", initial=self.step)
        try:
            with profiler(settings.profiler, self.run_dir, self.device) as prof:
                stopped_early = stopped_early or self._loop(bar, prof)
            self.metric_logger.log_hparams(
                {**asdict(settings), "profiler": settings.profiler.enabled}, self.best.get("metrics", {})
            )
        finally:
            bar.close()
            if self._owns_logger:
                self.metric_logger.close()
        self._log_outcome(stopped_early)
        return TrainingResult(
            best_model_state=self.best["model_state"],
            best_optimizer_state=self.best["optimizer_state"],
            best_step=self.best["step"],
            best_epoch=self.best["epoch"],
            best_metrics=self.best["metrics"],
            history=self.history,
            steps=self.step,
            stopped_early=stopped_early,
            samples_per_second=self.samples_seen / max(self.train_seconds, 1e-9),
        )

    def _loop(self, bar, prof) -> bool:
        """Train until the last step or early stopping; returns True when early stopping ended it."""
        settings = self.settings
        timings = dict.fromkeys(("data", "forward", "backward", "optimizer"), 0.0)
        unchecked: list[torch.Tensor] = []  # losses since the last finiteness check
        interval_start, interval_samples = time.perf_counter(), 0
        while self.step < self.total_steps:
            epoch, position = divmod(self.step, self.steps_per_epoch)
            batches = self.train_loader.batches(epoch=epoch, start=position)
            while self.step < self.total_steps:
                tick = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                timings["data"] += time.perf_counter() - tick
                unchecked.append(self._train_step(batch, timings))
                self.step += 1
                interval_samples += len(batch)
                self.samples_seen += len(batch)
                self.train_seconds += time.perf_counter() - tick
                prof.step()
                end_of_epoch = self.step % self.steps_per_epoch == 0 or self.step == self.total_steps
                if self.step % settings.log_every_steps == 0 or end_of_epoch:
                    rate = interval_samples / max(time.perf_counter() - interval_start, 1e-9)
                    loss = self._log_interval(unchecked, timings, rate)
                    bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{rate:,.0f}", refresh=False)
                    unchecked, interval_samples = [], 0
                    timings = dict.fromkeys(timings, 0.0)
                    interval_start = time.perf_counter()
                bar.update(1)
                every = settings.validate_every_steps
                validate = end_of_epoch or (every and self.step % every == 0)
                save = settings.checkpoint_every_steps and self.step % settings.checkpoint_every_steps == 0
                if validate or save:
                    # Nothing is saved or validated after a non-finite loss, logged or not yet.
                    self._check_finite(unchecked)
                if validate:
                    if self._validate(epoch) and self.step < self.total_steps:  # also saves progress
                        return True
                elif save:
                    self._save_progress()
        return False

    def _phase(self, timings: dict, name: str, start: float) -> float:
        if self.settings.phase_timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        timings[name] += now - start
        return now

    def _train_step(self, batch: Batch, timings: dict) -> torch.Tensor:
        self.model.train()
        start = time.perf_counter()
        batch = batch.to(self.device, non_blocking=True)
        factor = learning_rate_factor(self.step, self.total_steps, self.settings)
        for name, optimizer in self.optimizers.items():
            for group, base in zip(optimizer.param_groups, self.base_rates[name], strict=True):
                group["lr"] = base * factor
            optimizer.zero_grad(set_to_none=True)
        start = self._phase(timings, "data", start)
        with autocast(self.device, self.settings.precision):
            logits = self.model(batch.dense, batch.sparse)
        loss = self.loss_function(logits.float(), batch.labels)
        start = self._phase(timings, "forward", start)
        loss.backward()
        start = self._phase(timings, "backward", start)
        for optimizer in self.optimizers.values():
            optimizer.step()
        self._phase(timings, "optimizer", start)
        return loss.detach()

    def _kept(self) -> str:
        if self.resume_path and Path(self.resume_path).exists():
            return f" The last good in-progress checkpoint is {self.resume_path}."
        return ""

    def _check_finite(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The losses as one CPU tensor; raises ``TrainingDivergedError`` naming the first non-finite step."""
        values = torch.stack(losses).float().cpu() if losses else torch.zeros(0)
        if not torch.isfinite(values).all():
            bad_step = self.step - len(values) + int(torch.nonzero(~torch.isfinite(values))[0]) + 1
            raise TrainingDivergedError(
                f"Training diverged: the loss is {values[~torch.isfinite(values)][0].item()} at step {bad_step:,}."
                f"{self._kept()} Lower training.learning_rate / training.embedding_learning_rate, or add warm-up "
                "(training.warmup_steps)."
            )
        return values

    def _log_interval(self, losses: list[torch.Tensor], timings: dict, rate: float) -> float:
        values = self._check_finite(losses)
        loss = float(values.mean())
        steps = len(values)
        scalars = {
            "train/loss": loss,
            "train/samples_per_second": rate,
            "train/learning_rate": self.optimizers["dense"].param_groups[0]["lr"],
            **{f"time/{name}_ms": 1000 * seconds / steps for name, seconds in timings.items()},
        }
        if "embeddings" in self.optimizers:
            scalars["train/embedding_learning_rate"] = self.optimizers["embeddings"].param_groups[0]["lr"]
        self.metric_logger.log_scalars(scalars, self.step)
        return loss

    def _log_outcome(self, stopped_early: bool) -> None:
        best = self.best
        kept = (
            f"kept step {best['step']:,} (epoch {best['epoch']}): validation log loss {best['metrics']['log_loss']:.5f}, "
            f"AUC {best['metrics']['auc']:.4f}"
        )
        if stopped_early:
            last = self.history[-1]
            logger.info(
                "early stopping at step {:,} (epoch {}): no better validation log loss in {} validations; {}",
                last["step"],
                last["epoch"],
                self.settings.early_stopping_patience,
                kept,
            )
        else:
            logger.info("training finished at step {:,}; {}", self.step, kept)

    def _validate(self, epoch: int) -> bool:
        """Score the whole validation set; returns True when early stopping says stop."""
        started = time.perf_counter()
        probabilities = predict(self.model, self.validation_loader, self.device, self.settings.precision)
        labels = self.validation_loader.arrays.labels
        try:
            metrics = binary_metrics(labels, probabilities)
        except MetricError as error:
            raise MetricError(f"Validation at step {self.step}: {error}") from error
        self.metric_logger.log_scalars({f"validation/{k}": v for k, v in metrics.items() if k != "rows"}, self.step)
        record = {"step": self.step, "epoch": epoch, **metrics, "seconds": time.perf_counter() - started}
        self.history.append(record)
        improved = metrics["log_loss"] < self.best_loss - self.settings.early_stopping_min_delta
        if improved:
            self.best_loss, self.bad_validations = metrics["log_loss"], 0
            self.best = {
                "model_state": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
                "optimizer_state": copy.deepcopy({n: o.state_dict() for n, o in self.optimizers.items()}),
                "step": self.step,
                "epoch": epoch,
                "metrics": metrics,
            }
        else:
            self.bad_validations += 1
        logger.info(
            "step {:,} (epoch {}): validation log loss {:.5f}, AUC {:.4f}, NE {:.4f}, calibration {:.3f}{}",
            self.step,
            epoch,
            metrics["log_loss"],
            metrics["auc"],
            metrics["normalized_entropy"],
            metrics["calibration"],
            " (best)"
            if improved
            else f" (no improvement {self.bad_validations}/{self.settings.early_stopping_patience})",
        )
        self._save_progress()
        return self.bad_validations >= self.settings.early_stopping_patience

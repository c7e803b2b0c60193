"""The training loop: batches in, validated best weights out.

Setup (resume) happens in ``Trainer.__init__``, the loop in ``fit``, the per-step work in ``TrainStep``
(``engine.step``). Validation runs over the whole validation set, early stopping watches validation log
loss, and an in-progress checkpoint at each validation lets an interrupted run continue at the same step,
with the same optimiser state and data order. The best model and the in-progress state live on disk
(``engine.progress``), written from the live tensors: memory holds the model and its optimiser state once.
How the run spreads over processes (one, a DDP group, or TorchRec's sharded tables) is the parallel mode's
business (``engine.modes``): the loop names none of them.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from loguru import logger

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.config.training import ProfilerConfig, TrainingConfig
from criteo_dlrm.data.batches import BatchLoader, Prefetcher
from criteo_dlrm.engine.checkpoint import load_checkpoint
from criteo_dlrm.engine.metrics import MetricError
from criteo_dlrm.engine.modes import SingleProcess
from criteo_dlrm.engine.profiling import profiler
from criteo_dlrm.engine.progress import ProgressFiles
from criteo_dlrm.engine.result import TrainingResult
from criteo_dlrm.engine.step import PHASES, TrainStep
from criteo_dlrm.engine.tensorboard import MetricLogger, NullLogger, TensorBoardLogger


class TrainingDivergedError(UserError, RuntimeError):
    """The loss became NaN or infinite."""


class Trainer:
    """Trains a DLRM in the given parallel mode.

    Args:
        mode: the model in its parallel mode (``engine.modes``), on its device (and compiled if wanted).
        config: the run's configuration (the model sizes are already in the model).
        train_loader, validation_loader: encoded rows; the training loader shuffles.
        run_dir: TensorBoard run folder (scalars, profiler traces). A resumed run keeps the folder it
            started in (recorded in its in-progress checkpoint), so one run is one set of curves.
        metric_logger: where scalars go; None: nowhere, or TensorBoard in ``run_dir`` with ``tensorboard``.
        resume_path: in-progress checkpoint file, written when training starts, at each validation and every
            ``checkpoint_every_steps``; resumed from when its ``fingerprint`` matches.
        fingerprint: identifies the run's settings and data, so an unrelated checkpoint is never resumed.
        tensorboard: write scalars to ``run_dir`` (opened after resuming, dropping the events the
            interrupted run wrote after the step it resumes from).
        best_path: where the best model is written (default: beside ``resume_path``, or a temporary folder
            that lives as long as the result when resume is off).
    """

    def __init__(
        self,
        mode: SingleProcess,
        config: TrainingConfig,
        train_loader: BatchLoader,
        validation_loader: BatchLoader,
        run_dir: Path,
        metric_logger: MetricLogger | None = None,
        resume_path: Path | None = None,
        fingerprint: str = "",
        tensorboard: bool = False,
        best_path: Path | None = None,
    ):
        self.mode, self.config, self.device, self.run_dir = mode, config, mode.device, Path(run_dir)
        self.train_loader, self.validation_loader = train_loader, validation_loader
        self.is_main = mode.is_main
        self.train_step = TrainStep(mode, config)
        self.phases_timed = self.train_step.timed
        self.steps_per_epoch = len(train_loader)
        self.total_steps = self.steps_per_epoch * config.num_epochs
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.resume_path, self.fingerprint = resume_path, fingerprint
        self.files = ProgressFiles(resume_path, best_path)
        self.step = 0
        self.best_loss = math.inf
        self.best: dict = {}
        self.bad_validations = 0
        self.history: list[dict] = []
        self.samples_seen, self.train_seconds = 0, 0.0
        # Wall time of the run (validations and checkpoints included) before this process began: a resumed run's.
        self.wall_seconds_before, self.started = 0.0, time.perf_counter()
        self.target: dict | None = None  # the first validation at or above config.target_auc
        resumed = self._maybe_resume()
        self.resumed_from_step = self.step if resumed else None
        self._owns_logger = metric_logger is None and tensorboard and self.is_main
        if self._owns_logger:
            metric_logger = TensorBoardLogger(self.run_dir, purge_step=self.step + 1 if self.step else None)
        self.metric_logger = metric_logger or NullLogger()
        if not resumed:
            # A run killed before its first validation resumes from here, into the same run folder.
            self._save_progress()

    # -- setup -----------------------------------------------------------------------------------
    def _maybe_resume(self) -> bool:
        self.files.remove_stale()
        if self.resume_path is None or not Path(self.resume_path).exists():
            return False
        try:
            state = load_checkpoint(self.resume_path, mmap=True)  # copied into the model, never held twice
        except DamagedFileError as error:
            self._set_aside(error)
            return False
        if state.get("fingerprint") != self.fingerprint:
            logger.warning("{} belongs to other settings or data; starting afresh", self.resume_path)
            return False
        best = state["best"]
        if "model_state" in best and self.is_main:  # written before the best model lived in its own file
            self.files.save_best({**state, "step": best["step"], "model_state": best.pop("model_state"),
                                  "optimizer_state": best.pop("optimizer_state")})  # fmt: skip
        if best and not self.files.best.exists():
            logger.warning(
                "{} has no best model beside it ({} is missing); starting afresh", self.resume_path, self.files.best
            )
            return False
        try:
            self.mode.restore_state(state, self.files)
        except DamagedFileError as error:  # a shard of a sharded state (checked before anything is loaded)
            self._set_aside(error)
            return False
        self.step, self.best_loss, self.best = state["step"], state["best_loss"], state["best"]
        self.bad_validations, self.history = state["bad_validations"], state["history"]
        torch.set_rng_state(state["torch_rng_state"])
        self.train_seconds, self.samples_seen = state.get("train_seconds", 0.0), state.get("samples_seen", 0)
        self.wall_seconds_before, self.target = state.get("wall_seconds", 0.0), state.get("target")
        self.run_dir = Path(state.get("run_dir", self.run_dir))
        logger.info(
            "resumed from {} at step {:,} (best validation log loss {:.5f})",
            self.resume_path,
            self.step,
            self.best_loss,
        )
        return True

    def _set_aside(self, error: DamagedFileError) -> None:
        aside = Path(f"{self.resume_path}.damaged")
        if self.is_main:
            os.replace(self.resume_path, aside)
            logger.warning("{} Moved to {}; this run starts afresh.", error, aside)

    def _save_progress(self, improved: bool = False) -> None:
        """Write the in-progress checkpoint (resume on), and the best model when this step's validation
        ``improved``: from the live tensors (``mode.save_state``), no copy kept. Every process calls it."""
        if self.resume_path is None and not improved:
            return
        if not self.mode.weights_finite():  # the same answer in every process: all stop together
            raise TrainingDivergedError(
                f"Training diverged: the weights are NaN or infinite at step {self.step:,} although every loss "
                f"was finite.{self._rows_verified()}{self._kept()} Lower the learning rates or add warm-up."
            )
        self.mode.save_state(
            self.files,
            {
                "fingerprint": self.fingerprint,
                "step": self.step,
                "run_dir": str(self.run_dir),
                "best_loss": self.best_loss,
                "best": self.best,
                "bad_validations": self.bad_validations,
                "history": self.history,
                "torch_rng_state": torch.get_rng_state(),
                "train_seconds": self.train_seconds,
                "samples_seen": self.samples_seen,
                "wall_seconds": self.wall_seconds,
                "target": self.target,
            },
            improved,
        )

    @property
    def wall_seconds(self) -> float:
        """The run's wall time so far, from its first step's process on (validations and checkpoints included)."""
        return self.wall_seconds_before + time.perf_counter() - self.started

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainingResult:
        config = self.config
        # A resumed run that had stopped (early, or at its target) before it was interrupted trains no further.
        stopped_early = self.bad_validations >= config.early_stopping.patience or self.target is not None
        bar = progress_bar(self.total_steps, "training", "step", None if self.is_main else False, initial=self.step)
        profiling = config.profiler if self.is_main else ProfilerConfig(enabled=False)
        try:
            with profiler(profiling, self.run_dir, self.device) as prof:
                stopped_early = stopped_early or self._loop(bar, prof)
            self.metric_logger.log_hparams(
                _flat(asdict(config)), self.best.get("metrics", {}), self.best.get("step", 0)
            )
        finally:
            bar.close()
            if self._owns_logger:
                self.metric_logger.close()
        if self.is_main:
            self._log_outcome(stopped_early)
        stopped_early = stopped_early and self.target is None  # stopped at its target: not early stopping
        result = TrainingResult(
            best_checkpoint=str(self.files.best),
            best_step=self.best["step"],
            best_epoch=self.best["epoch"],
            best_metrics=self.best["metrics"],
            history=self.history,
            steps=self.step,
            stopped_early=stopped_early,
            samples_per_second=self.samples_seen / max(self.train_seconds, 1e-9),
            resumed_from_step=self.resumed_from_step,
            target=self._target_outcome(),
        )
        result.files = self.files  # a temporary best folder lives as long as the result
        return result

    def _target_outcome(self) -> dict | None:
        """``training.target_auc`` and when the run reached it (``reached``: false when it never did)."""
        if self.config.target_auc is None:
            return None
        return {"auc": self.config.target_auc, "reached": self.target is not None, **(self.target or {})}

    def _loop(self, bar, prof) -> bool:
        """Train until the last step, early stopping or the target AUC; returns True when one of the last two
        ended it before the last step."""
        timings = dict.fromkeys(PHASES, 0.0)
        unchecked: list[torch.Tensor] = []  # losses since the last finiteness check
        while self.step < self.total_steps:
            epoch, position = divmod(self.step, self.steps_per_epoch)
            with self._batches(epoch, position) as batches:
                if self._epoch(batches, epoch, bar, prof, timings, unchecked):
                    return True
        return False

    def _batches(self, epoch: int, position: int):
        """The epoch's batches from ``position`` on, prepared ``prefetch_batches`` ahead in a background thread."""
        batches = self.train_loader.batches(epoch=epoch, start=position)
        if not self.config.prefetch_batches:
            return contextlib.nullcontext(batches)
        return Prefetcher(batches, self.config.prefetch_batches, self.device)

    def _epoch(self, batches, epoch: int, bar, prof, timings: dict, unchecked: list) -> bool:
        """Steps of one epoch (until its end or the last step); True when early stopping ended the run."""
        config = self.config
        interval_start, interval_samples = time.perf_counter(), 0
        while self.step < self.total_steps:
            tick = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            timings["data"] += time.perf_counter() - tick
            unchecked.append(self.train_step(batch, self.step, self.total_steps, timings))
            self.step += 1
            rows = batch.global_rows or len(batch)  # every process's rows: the run's rate, not this process's
            interval_samples += rows
            self.samples_seen += rows
            self.train_seconds += time.perf_counter() - tick
            prof.step()
            end_of_epoch = self.step % self.steps_per_epoch == 0 or self.step == self.total_steps
            if self.step % config.log_every_steps == 0 or end_of_epoch:
                rate = interval_samples / max(time.perf_counter() - interval_start, 1e-9)
                loss = self._log_interval(unchecked, timings, rate)
                bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{rate:,.0f}", refresh=False)
                unchecked.clear()
                interval_samples = 0
                timings.update(dict.fromkeys(timings, 0.0))
                interval_start = time.perf_counter()
            bar.update(1)
            validate = end_of_epoch or self._validation_due(epoch)
            save = config.checkpoint_every_steps and self.step % config.checkpoint_every_steps == 0
            if validate or save:
                # Nothing is saved or validated after a non-finite loss, logged or not yet.
                self._check_finite(unchecked)
            if validate:
                if self._validate(epoch) and self.step < self.total_steps:  # also saves progress
                    return True
            elif save:
                self._save_progress()
        return False

    def _validation_due(self, epoch: int) -> bool:
        """Every ``validate_every_steps`` steps, or ``validations_per_epoch`` times per epoch, evenly spaced."""
        if self.config.validate_every_steps:
            return self.step % self.config.validate_every_steps == 0
        every = -(-self.steps_per_epoch // self.config.validations_per_epoch)
        return (self.step - epoch * self.steps_per_epoch) % every == 0

    def _rows_verified(self) -> str:
        """Before a run is called diverged: its rows verified again, whole (each chunk is verified on its first
        read only, so damage done since, read again in a later epoch, would look like a learning rate too high).

        Raises:
            DamagedFileError: the rows are damaged (naming the file, its rows and the fix), instead of divergence.
        """
        digests = [loader.arrays.digests for loader in (self.train_loader, self.validation_loader)]
        digests = [found for found in digests if found is not None]  # stored rows (rows in memory have none)
        if not digests:
            return ""
        logger.info("not finite: verifying the rows read again, whole, before calling it divergence")
        for found in digests:
            found.check_again()
        return " The rows it read were verified again, whole, and are intact."

    def _kept(self) -> str:
        if self.resume_path and Path(self.resume_path).exists():
            return f" The last good in-progress checkpoint is {self.resume_path}."
        return ""

    def _check_finite(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The losses as one CPU tensor (averaged over the processes, so every process sees the same and all
        stop together); raises ``TrainingDivergedError`` naming the first non-finite step."""
        values = torch.stack(losses).float() if losses else torch.zeros(0, device=self.device)
        values = self.mode.mean_over_processes(values).cpu()
        if not torch.isfinite(values).all():
            bad_step = self.step - len(values) + int(torch.nonzero(~torch.isfinite(values))[0]) + 1
            raise TrainingDivergedError(
                f"Training diverged: the loss is {values[~torch.isfinite(values)][0].item()} at step {bad_step:,}."
                f"{self._rows_verified()}{self._kept()} Lower learning_rate / embedding_learning_rate, or add "
                "warm-up (warmup_steps)."
            )
        return values

    def _log_interval(self, losses: list[torch.Tensor], timings: dict, rate: float) -> float:
        values = self._check_finite(losses)
        loss = float(values.mean())
        steps = len(values)
        scalars = {
            "train/loss": loss,
            "train/samples_per_second": rate,
            **{f"train/{name}": value for name, value in self.mode.learning_rates().items()},
            "train/processes": self.mode.world_size,
        }
        if self.phases_timed:
            scalars.update({f"time/{name}_ms": 1000 * seconds / steps for name, seconds in timings.items()})
        self.metric_logger.log_scalars(scalars, self.step)
        return loss

    def _log_outcome(self, stopped_early: bool) -> None:
        best = self.best
        kept = (
            f"kept step {best['step']:,} (epoch {best['epoch']}): validation log loss {best['metrics']['log_loss']:.5f}, "
            f"AUC {best['metrics']['auc']:.4f}"
        )
        if self.config.target_auc is not None and self.target is None:
            logger.warning(
                "target AUC {} not reached in {:,} steps (best validation AUC {:.5f})",
                self.config.target_auc,
                self.step,
                max(record["auc"] for record in self.history),
            )
        if self.target is not None:
            target = self.target
            logger.info(
                "target AUC {} reached at step {:,} (epoch {}): validation AUC {:.5f} after {:.1f} s of training, "
                "{:.1f} s wall; {}",
                self.config.target_auc, target["step"], target["epoch"], target["validation_auc"],
                target["train_seconds"], target["wall_seconds"], kept,
            )  # fmt: skip
        elif stopped_early:
            last = self.history[-1]
            logger.info(
                "early stopping at step {:,} (epoch {}): no better validation log loss in {} validations; {}",
                last["step"],
                last["epoch"],
                self.config.early_stopping.patience,
                kept,
            )
        else:
            logger.info("training finished at step {:,}; {}", self.step, kept)

    def _validate(self, epoch: int) -> bool:
        """Score the whole validation set; returns True when early stopping or the target AUC says stop."""
        started = time.perf_counter()
        probabilities = self.mode.predict(self.validation_loader)  # on rank 0 only
        labels = self.validation_loader.arrays.checked_labels() if self.is_main else None
        try:
            metrics = self.mode.metrics(labels, probabilities)  # computed once, known to every process
        except MetricError as error:
            raise MetricError(f"Validation at step {self.step}: {error}") from error
        self.metric_logger.log_scalars({f"validation/{k}": v for k, v in metrics.items() if k != "rows"}, self.step)
        record = {
            "step": self.step,
            "epoch": epoch,
            **metrics,
            "seconds": time.perf_counter() - started,
            "train_seconds": self.train_seconds,  # training time so far (validations excluded): time to this model
        }
        self.history.append(record)
        improved = metrics["log_loss"] < self.best_loss - self.config.early_stopping.min_delta
        if improved:
            self.best_loss, self.bad_validations = metrics["log_loss"], 0
            self.best = {"step": self.step, "epoch": epoch, "metrics": metrics}  # its weights: self.files.best
        else:
            self.bad_validations += 1
        target = self.config.target_auc
        if target is not None and self.target is None and metrics["auc"] >= target:
            self.target = {"step": self.step, "epoch": epoch, "validation_auc": metrics["auc"],
                           "train_seconds": self.train_seconds, "wall_seconds": self.wall_seconds}  # fmt: skip
            self.metric_logger.log_scalars(
                {"target/train_seconds": self.train_seconds, "target/wall_seconds": self.target["wall_seconds"]},
                self.step,
            )
        if self.is_main:
            self._log_validation(metrics, epoch, improved)
        self._save_progress(improved)
        return self.bad_validations >= self.config.early_stopping.patience or self.target is not None

    def _log_validation(self, metrics: dict, epoch: int, improved: bool) -> None:
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
            else f" (no improvement {self.bad_validations}/{self.config.early_stopping.patience})",
        )


def _flat(values: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become strings (TensorBoard's hparams take scalars only)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value) if isinstance(value, list | tuple) or value is None else value
    return flat

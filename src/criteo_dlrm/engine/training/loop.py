"""The training loop: batches in, validated best weights out.

Setup (resume) happens in ``Trainer.__init__``, the loop in ``fit``, the per-step work in ``TrainStep``
(``engine.training.step``). Validation runs over the whole validation set, early stopping watches validation log
loss, and an in-progress checkpoint at each validation lets an interrupted run continue at the same step,
with the same optimiser state and data order (``engine.training.run_state``: where the run stands, and the checkpoint
that keeps it). The best model and the in-progress state live on disk (``engine.training.run_state``), written from the
live tensors: memory holds the model and its optimiser state once. Non-finite losses and weights stop every
process together (``engine.training.divergence``).
How the run spreads over processes (one, a DDP group, or TorchRec's sharded tables) is the parallel mode's
business (``engine.parallel.modes``): the loop names none of them.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from loguru import logger

from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.config.training import ProfilerConfig, TrainingConfig
from criteo_dlrm.data.batches import BatchLoader, Prefetcher
from criteo_dlrm.engine.parallel.modes import Mode
from criteo_dlrm.engine.trained.metrics import MetricError
from criteo_dlrm.engine.trained.reports import Metrics, Target
from criteo_dlrm.engine.trained.result import TrainingResult
from criteo_dlrm.engine.training.divergence import DivergenceCheck, TrainingDivergedError
from criteo_dlrm.engine.training.profiling import profiler
from criteo_dlrm.engine.training.run_state import InProgress, RunState
from criteo_dlrm.engine.training.step import PHASES, TrainStep
from criteo_dlrm.engine.training.tensorboard import MetricLogger, NullLogger, TensorBoardLogger, flat_hparams

__all__ = ["Trainer", "TrainingDivergedError"]


class Trainer:
    """Trains a DLRM in the given parallel mode.

    Args:
        mode: the model in its parallel mode (``engine.parallel.modes``), on its device (and compiled if wanted).
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
        backends: what the process resolved (``num_threads``, ``tf32``, ``precision`` and with ``auto`` why:
            ``precision_auto``), logged with the settings in TensorBoard's hparams.
    """

    def __init__(
        self,
        mode: Mode,
        config: TrainingConfig,
        train_loader: BatchLoader,
        validation_loader: BatchLoader,
        run_dir: Path,
        metric_logger: MetricLogger | None = None,
        resume_path: Path | None = None,
        fingerprint: str = "",
        tensorboard: bool = False,
        best_path: Path | None = None,
        backends: dict | None = None,
    ):
        self.mode, self.config, self.device, self.run_dir = mode, config, mode.device, Path(run_dir)
        self.train_loader, self.validation_loader = train_loader, validation_loader
        self.is_main = mode.is_main
        self.backends = backends or {}
        self.train_step = TrainStep(mode, config)
        self.phases_timed = self.train_step.timed
        self.steps_per_epoch = len(train_loader)
        self.total_steps = self.steps_per_epoch * config.num_epochs
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.in_progress = InProgress(mode, resume_path, fingerprint, best_path)
        self.files = self.in_progress.files
        self.check = DivergenceCheck(mode, [train_loader, validation_loader], self.in_progress.kept)
        resumed = self.in_progress.resume()
        self.state = resumed or RunState(str(self.run_dir))
        self.run_dir = Path(self.state.run_dir)  # a resumed run keeps the folder it started in
        self.resumed_from_step = self.state.step if resumed else None
        self._owns_logger = metric_logger is None and tensorboard and self.is_main
        if self._owns_logger:
            step = self.state.step
            metric_logger = TensorBoardLogger(self.run_dir, purge_step=step + 1 if step else None)
        self.metric_logger = metric_logger or NullLogger()
        if not resumed:
            # A run killed before its first validation resumes from here, into the same run folder.
            self._save_progress()

    @property
    def step(self) -> int:
        """Steps trained so far (those of the run it resumed included)."""
        return self.state.step

    def _save_progress(self, improved: bool = False) -> None:
        """The in-progress checkpoint (and the best model when ``improved``), once the weights are known finite."""
        if self.in_progress.path is not None or improved:
            self.check.weights(self.state.step)
        self.in_progress.save(self.state, improved)

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainingResult:
        config = self.config
        # A resumed run that had stopped (early, or at its target) before it was interrupted trains no further.
        stopped_early = self.state.bad_validations >= config.early_stopping.patience or self.state.target is not None
        bar = progress_bar(
            self.total_steps, "training", "step", None if self.is_main else False, initial=self.state.step
        )
        profiling = config.profiler if self.is_main else ProfilerConfig(enabled=False)
        try:
            with profiler(profiling, self.run_dir, self.device) as prof:
                stopped_early = stopped_early or self._loop(bar, prof)
            self.metric_logger.log_hparams(
                flat_hparams(config.to_dict()) | flat_hparams(self.backends),  # resolved: the threads, auto's why
                self.state.best.metrics.to_dict() if self.state.best else {},
                self.state.best.step if self.state.best else 0,
            )
        finally:
            bar.close()
            if self._owns_logger:
                self.metric_logger.close()
        state = self.state
        if self.is_main:
            state.log_outcome(config.target_auc, config.early_stopping.patience, stopped_early)
        result = TrainingResult(
            best_checkpoint=str(self.files.best),
            best_step=state.best.step,
            best_epoch=state.best.epoch,
            best_metrics=state.best.metrics,
            history=state.history,
            steps=state.step,
            stopped_early=stopped_early and state.target is None,  # stopped at its target: not early stopping
            samples_per_second=state.samples_seen / max(state.train_seconds, 1e-9),
            resumed_from_step=self.resumed_from_step,
            target=state.target_outcome(config.target_auc),
        )
        result.files = self.files  # a temporary best folder lives as long as the result
        return result

    def _loop(self, bar, prof) -> bool:
        """Train until the last step, early stopping or the target AUC; returns True when one of the last two
        ended it before the last step."""
        timings = dict.fromkeys(PHASES, 0.0)
        unchecked: list[torch.Tensor] = []  # losses since the last finiteness check
        while self.state.step < self.total_steps:
            epoch, position = divmod(self.state.step, self.steps_per_epoch)
            with self._batches(epoch, position) as batches:
                if self._epoch(batches, epoch, bar, prof, timings, unchecked):
                    return True
        return False

    def _batches(self, epoch: int, position: int):
        """The epoch's batches from ``position`` on, prepared ``prefetch_batches`` ahead in a background thread,
        each window of rows read while the one before it is cut into batches."""
        if not self.config.prefetch_batches:
            return contextlib.nullcontext(self.train_loader.batches(epoch=epoch, start=position))
        batches = self.train_loader.batches(epoch=epoch, start=position, read_ahead=True)
        return Prefetcher(batches, self.config.prefetch_batches, self.device)

    def _epoch(self, batches, epoch: int, bar, prof, timings: dict, unchecked: list) -> bool:
        """Steps of one epoch (until its end or the last step); True when early stopping ended the run."""
        config = self.config
        interval_start, interval_samples = time.perf_counter(), 0
        while self.state.step < self.total_steps:
            tick = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            timings["data"] += time.perf_counter() - tick
            unchecked.append(self.train_step(batch, self.state.step, self.total_steps, timings))
            self.state.step += 1
            rows = batch.global_rows or len(batch)  # every process's rows: the run's rate, not this process's
            interval_samples += rows
            self.state.samples_seen += rows
            self.state.train_seconds += time.perf_counter() - tick
            prof.step()
            end_of_epoch = self.state.step % self.steps_per_epoch == 0 or self.state.step == self.total_steps
            if self.state.step % config.log_every_steps == 0 or end_of_epoch:
                rate = interval_samples / max(time.perf_counter() - interval_start, 1e-9)
                loss = self._log_interval(unchecked, timings, rate)
                bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{rate:,.0f}", refresh=False)
                unchecked.clear()
                interval_samples = 0
                timings.update(dict.fromkeys(timings, 0.0))
                interval_start = time.perf_counter()
            bar.update(1)
            validate = end_of_epoch or self._validation_due(epoch)
            save = config.checkpoint_every_steps and self.state.step % config.checkpoint_every_steps == 0
            if validate or save:
                # Nothing is saved or validated after a non-finite loss, logged or not yet.
                self.check.losses(unchecked, self.state.step)
            if validate:
                if self._validate(epoch) and self.state.step < self.total_steps:  # also saves progress
                    return True
            elif save:
                self._save_progress()
        return False

    def _validation_due(self, epoch: int) -> bool:
        """Every ``validate_every_steps`` steps, or ``validations_per_epoch`` times per epoch, evenly spaced."""
        if self.config.validate_every_steps:
            return self.state.step % self.config.validate_every_steps == 0
        every = -(-self.steps_per_epoch // self.config.validations_per_epoch)
        return (self.state.step - epoch * self.steps_per_epoch) % every == 0

    def _log_interval(self, losses: list[torch.Tensor], timings: dict, rate: float) -> float:
        values = self.check.losses(losses, self.state.step)
        loss = float(values.mean())
        steps = len(values)
        scalars = {
            "train/loss": loss,
            "train/samples_per_second": rate,
            **{f"train/{name}": value for name, value in self.mode.optimizers.rates().items()},
            "train/processes": self.mode.world_size,
        }
        if self.phases_timed:
            scalars.update({f"time/{name}_ms": 1000 * seconds / steps for name, seconds in timings.items()})
        self.metric_logger.log_scalars(scalars, self.state.step)
        return loss

    def _validate(self, epoch: int) -> bool:
        """Score the whole validation set; returns True when early stopping or the target AUC says stop."""
        started, state, target = time.perf_counter(), self.state, self.config.target_auc
        probabilities = self.mode.group.predict(
            self.mode.model, self.validation_loader, self.mode.runtime
        )  # on rank 0 only
        labels = self.validation_loader.arrays.checked_labels() if self.is_main else None
        try:
            metrics = self.mode.group.metrics(labels, probabilities)  # computed once, known to every process
        except MetricError as error:
            raise MetricError(f"Validation at step {state.step}: {error}") from error
        scalars = {name: value for name, value in metrics.to_dict().items() if name != "rows"}
        self.metric_logger.log_scalars({f"validation/{name}": value for name, value in scalars.items()}, state.step)
        improved = state.validated(epoch, metrics, time.perf_counter() - started, self.config.early_stopping.min_delta)
        if target is not None and state.target is None and metrics.auc >= target:
            state.target = Target(step=state.step, epoch=epoch, validation_auc=metrics.auc,
                                  train_seconds=state.train_seconds, wall_seconds=state.wall_seconds_now)  # fmt: skip
            self.metric_logger.log_scalars(
                {"target/train_seconds": state.train_seconds, "target/wall_seconds": state.target.wall_seconds},
                state.step,
            )
        if self.is_main:
            self._log_validation(metrics, epoch, improved)
        self._save_progress(improved)
        return state.bad_validations >= self.config.early_stopping.patience or state.target is not None

    def _log_validation(self, metrics: Metrics, epoch: int, improved: bool) -> None:
        patience = self.config.early_stopping.patience
        logger.info(
            "step {:,} (epoch {}): validation log loss {:.5f}, AUC {:.4f}, NE {:.4f}, calibration {:.3f}{}",
            self.state.step, epoch, metrics.log_loss, metrics.auc, metrics.normalized_entropy,
            metrics.calibration, " (best)" if improved else f" (no improvement {self.state.bad_validations}/{patience})",
        )  # fmt: skip

"""The training loop: batches in, validated best weights out.

Setup (optimisers, schedules, resume) happens in ``Trainer.__init__``, the loop in ``fit`` and the
per-step work in ``_train_step``. Validation runs over the whole validation set, early stopping
watches validation log loss, and an in-progress checkpoint at each validation lets an interrupted
run continue at the same step, with the same optimiser state and data order.

In a torch.distributed process group (``engine.distributed``) the same loop runs data-parallel: the dense
layers under ``DistributedDataParallel``, the sparse embedding gradients all-gathered after backward,
each process on its share of every global batch, validation split across the processes and gathered, so
every process takes the same early-stopping decisions; only rank 0 writes checkpoints and TensorBoard.
With TorchRec's sharded tables (``engine.sharding``) the tables are model-parallel instead: their fused
optimiser runs inside backward, and checkpoint state is gathered to rank 0 in the torch backend's layout.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.data.batches import Batch, BatchLoader
from criteo_dlrm.engine.checkpoint import load_checkpoint, remove_stale_partials, save_atomically
from criteo_dlrm.engine.config import TrainingConfig
from criteo_dlrm.engine.device import autocast
from criteo_dlrm.engine.metrics import MetricError, binary_metrics
from criteo_dlrm.engine.profiling import profiler
from criteo_dlrm.engine.scoring import predict
from criteo_dlrm.engine.sharding import ShardedDLRM
from criteo_dlrm.engine.tensorboard import MetricLogger, NullLogger, TensorBoardLogger
from criteo_dlrm.models.dlrm import DLRM

PHASES = ("data", "forward", "backward", "optimizer")  # the parts of a step that are timed


class TrainingDivergedError(UserError, RuntimeError):
    """The loss became NaN or infinite."""


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


def build_optimizers(model: DLRM, settings: TrainingConfig) -> dict[str, torch.optim.Optimizer]:
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


def learning_rate_factor(step: int, total_steps: int, settings: TrainingConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then constant, linear or cosine decay to zero at ``total_steps``."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    if settings.decay == "none" or total_steps <= settings.warmup_steps:
        return 1.0
    progress = min((step - settings.warmup_steps) / (total_steps - settings.warmup_steps), 1.0)
    return 1.0 - progress if settings.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer:
    """Trains a DLRM on one device, or data-parallel when a torch.distributed process group is initialised.

    Args:
        model: the model, already on ``device`` (and compiled if wanted).
        settings: the run's configuration (the model sizes are already in ``model``).
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
        sharded: the model's tables sharded by TorchRec (``model`` is then ``sharded.module``).
    """

    def __init__(
        self,
        model: DLRM,
        settings: TrainingConfig,
        train_loader: BatchLoader,
        validation_loader: BatchLoader,
        device: torch.device,
        run_dir: Path,
        metric_logger: MetricLogger | None = None,
        resume_path: Path | None = None,
        fingerprint: str = "",
        tensorboard: bool = False,
        sharded: ShardedDLRM | None = None,
    ):
        self.model, self.settings, self.device, self.run_dir = model, settings, device, Path(run_dir)
        self.sharded = sharded
        self.train_loader, self.validation_loader = train_loader, validation_loader
        distributed = dist.is_available() and dist.is_initialized()
        self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        self.is_main = self.rank == 0
        # The forward pass that trains: under DDP, backward all-reduces the dense gradients in buckets while
        # it runs. Sparse embedding gradients are left out of DDP and all-gathered after backward
        # (``_all_reduce_sparse``): DDP's own sparse path is gloo-only and crashed once in our tests.
        self.train_model: nn.Module = model if sharded is None else sharded.model
        self.sparse_parameters = model.embedding_parameters() if settings.sparse_gradients and not sharded else []
        self.sync_gradients = True  # False: no gradient exchange at all (the distributed benchmark's baseline)
        if self.world_size > 1 and sharded is None:
            names = {id(p): name for name, p in model.named_parameters()}
            ignored = [names[id(p)] for p in self.sparse_parameters]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
            device_ids = [device.index] if device.type == "cuda" else None
            self.train_model = DistributedDataParallel(model, device_ids=device_ids)
        self.resume_path, self.fingerprint = resume_path, fingerprint
        # Summed here and divided by the global batch's rows, so N processes' averaged gradients are one
        # process's gradient of the mean loss over the global batch, whatever each process's share.
        self.loss_function = nn.BCEWithLogitsLoss(reduction="sum")
        if sharded is None:
            self.optimizers = build_optimizers(model, settings)
        else:  # the tables' optimiser is fused into backward (``ShardedDLRM.set_learning_rate``)
            self.optimizers = {"dense": torch.optim.Adam(model.dense_parameters(), lr=settings.learning_rate)}
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
        self._owns_logger = metric_logger is None and tensorboard and self.is_main
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
        if self.sharded is None:
            self.model.load_state_dict(state["model_state"])
        else:
            self.sharded.load_model_state(state["model_state"])
            self.sharded.load_optimizer_state(state["optimizer_state"]["fused_embeddings"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizer_state"][name])
        self.step, self.best_loss, self.best = state["step"], state["best_loss"], state["best"]
        self.bad_validations, self.history = state["bad_validations"], state["history"]
        torch.set_rng_state(state["torch_rng_state"])
        self.train_seconds, self.samples_seen = state.get("train_seconds", 0.0), state.get("samples_seen", 0)
        self.run_dir = Path(state.get("run_dir", self.run_dir))
        logger.info(
            "resumed from {} at step {:,} (best validation log loss {:.5f})",
            self.resume_path,
            self.step,
            self.best_loss,
        )

    def _snapshot(self) -> tuple[dict | None, dict | None]:
        """The model's and the optimisers' state, copied to the CPU. A sharded run gathers it to rank 0 (every
        process must call this; the others get None)."""
        optimizers = {name: copy.deepcopy(optimizer.state_dict()) for name, optimizer in self.optimizers.items()}
        if self.sharded is not None:
            model_state, fused = self.sharded.model_state(), self.sharded.optimizer_state()
            return (model_state, {**optimizers, "fused_embeddings": fused}) if self.is_main else (None, None)
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}, optimizers

    def _save_progress(self, snapshot: tuple[dict | None, dict | None] | None = None) -> None:
        """Write the in-progress checkpoint (``snapshot``: one ``_snapshot`` taken already at this step)."""
        if self.resume_path is None or (not self.is_main and self.sharded is None):
            return
        state, optimizer_state = snapshot or self._snapshot()
        if not self.is_main:
            return
        if not all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
            raise TrainingDivergedError(
                f"Training diverged: the weights are NaN or infinite at step {self.step:,} although every loss "
                f"was finite.{self._kept()} Lower the learning rates or add warm-up."
            )
        save_atomically(
            {
                "fingerprint": self.fingerprint,
                "model_state": state,
                "optimizer_state": optimizer_state,
                "step": self.step,
                "run_dir": str(self.run_dir),
                "best_loss": self.best_loss,
                "best": self.best,
                "bad_validations": self.bad_validations,
                "history": self.history,
                "torch_rng_state": torch.get_rng_state(),
                "train_seconds": self.train_seconds,
                "samples_seen": self.samples_seen,
            },
            self.resume_path,
        )

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainingResult:
        settings = self.settings
        stopped_early = self.bad_validations >= settings.early_stopping.patience
        bar = progress_bar(self.total_steps, "training", "step", None if self.is_main else False, initial=self.step)
        profiling = settings.profiler if self.is_main else type(settings.profiler)(enabled=False)
        try:
            with profiler(profiling, self.run_dir, self.device) as prof:
                stopped_early = stopped_early or self._loop(bar, prof)
            self.metric_logger.log_hparams(_flat(asdict(settings)), self.best.get("metrics", {}))
        finally:
            bar.close()
            if self._owns_logger:
                self.metric_logger.close()
        if self.is_main:
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
        timings = dict.fromkeys(PHASES, 0.0)
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
                rows = batch.global_rows or len(batch)  # every process's rows: the run's rate, not this process's
                interval_samples += rows
                self.samples_seen += rows
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
                validate = end_of_epoch or self._validation_due(epoch)
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

    def _validation_due(self, epoch: int) -> bool:
        """Every ``validate_every_steps`` steps, or ``validations_per_epoch`` times per epoch, evenly spaced."""
        if self.settings.validate_every_steps:
            return self.step % self.settings.validate_every_steps == 0
        every = -(-self.steps_per_epoch // self.settings.validations_per_epoch)
        return (self.step - epoch * self.steps_per_epoch) % every == 0

    def _phase(self, timings: dict, name: str, start: float) -> float:
        if self.settings.phase_timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        timings[name] += now - start
        return now

    def train_step(self, batch: Batch) -> torch.Tensor:
        """One optimisation step on ``batch`` (what ``fit`` does per step; the benchmarks time it)."""
        loss = self._train_step(batch, dict.fromkeys(PHASES, 0.0))
        self.step += 1
        return loss

    def _train_step(self, batch: Batch, timings: dict) -> torch.Tensor:
        self.model.train()
        start = time.perf_counter()
        batch = batch.to(self.device, non_blocking=True)
        global_rows = batch.global_rows or len(batch)
        factor = learning_rate_factor(self.step, self.total_steps, self.settings)
        for name, optimizer in self.optimizers.items():
            for group, base in zip(optimizer.param_groups, self.base_rates[name], strict=True):
                group["lr"] = base * factor
            optimizer.zero_grad(set_to_none=True)
        if self.sharded is not None:
            self.sharded.set_learning_rate(self.settings.embedding_learning_rate * factor)
        start = self._phase(timings, "data", start)
        decay = self.settings.embedding_weight_decay
        with autocast(self.device, self.settings.precision):
            if decay:
                logits, squares = self.train_model(batch.dense, batch.sparse, embedding_squares=True)
            else:
                logits = self.train_model(batch.dense, batch.sparse)
        # DDP averages the processes' gradients: scaling by world_size makes that the global batch's mean.
        # TorchRec's all-to-all backward sums the sharded tables' gradients instead: a sharded run scales the
        # loss for them and multiplies the DDP-averaged dense gradients by world_size after backward.
        scale = 1 if self.sharded is not None else self.world_size
        loss = self.loss_function(logits.float(), batch.labels)
        if decay:
            loss = loss + decay * squares
        loss = loss * (scale / global_rows)
        start = self._phase(timings, "forward", start)
        exchange = self.world_size > 1 and self.sync_gradients
        alone = exchange or self.world_size == 1 or self.sharded is not None
        with contextlib.nullcontext() if alone else self.train_model.no_sync():
            loss.backward()
        if self.sharded is not None and self.world_size > 1:
            for parameter in self.optimizers["dense"].param_groups[0]["params"]:
                if parameter.grad is not None:
                    parameter.grad.mul_(self.world_size)
        elif exchange:
            self._all_reduce_sparse()
        start = self._phase(timings, "backward", start)
        for optimizer in self.optimizers.values():
            optimizer.step()
        self._phase(timings, "optimizer", start)
        return loss.detach()

    def _all_reduce_sparse(self) -> None:
        """Average the sparse embedding gradients over the processes, as DDP averages the dense ones.

        Each process's gradient (coalesced: one entry per touched row) is all-gathered as indices and
        values, padded to the longest, so it works on gloo and nccl alike; the optimiser sums duplicates.
        """
        for parameter in self.sparse_parameters:
            gradient = parameter.grad.coalesce()
            indices, values = self._all_gather_rows(gradient.indices()[0], gradient.values())
            parameter.grad = torch.sparse_coo_tensor(
                torch.cat(indices).unsqueeze(0),
                torch.cat(values) / self.world_size,
                gradient.shape,
                check_invariants=False,  # built from valid indices just above
            )

    def _all_gather_rows(self, *tensors: torch.Tensor) -> list[list[torch.Tensor]]:
        """Every process's ``tensors`` (each with the same number of rows, any number per process), in rank
        order: the row counts are gathered first, then each tensor padded to the longest, trimmed again."""
        count = torch.tensor([len(tensors[0])], device=tensors[0].device)
        counts = [torch.empty_like(count) for _ in range(self.world_size)]
        dist.all_gather(counts, count)
        gathered = []
        for tensor in tensors:
            padded = tensor.new_zeros((int(max(counts)), *tensor.shape[1:]))
            padded[: len(tensor)] = tensor
            parts = [torch.empty_like(padded) for _ in range(self.world_size)]
            dist.all_gather(parts, padded)
            gathered.append([part[: int(n)] for part, n in zip(parts, counts, strict=True)])
        return gathered

    def _kept(self) -> str:
        if self.resume_path and Path(self.resume_path).exists():
            return f" The last good in-progress checkpoint is {self.resume_path}."
        return ""

    def _check_finite(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The losses as one CPU tensor (averaged over the processes, so every process sees the same and all
        stop together); raises ``TrainingDivergedError`` naming the first non-finite step."""
        values = torch.stack(losses).float() if losses else torch.zeros(0, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(values)
            values /= self.world_size
        values = values.cpu()
        if not torch.isfinite(values).all():
            bad_step = self.step - len(values) + int(torch.nonzero(~torch.isfinite(values))[0]) + 1
            raise TrainingDivergedError(
                f"Training diverged: the loss is {values[~torch.isfinite(values)][0].item()} at step {bad_step:,}."
                f"{self._kept()} Lower learning_rate / embedding_learning_rate, or add warm-up "
                "(warmup_steps)."
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
            "train/processes": self.world_size,
            **{f"time/{name}_ms": 1000 * seconds / steps for name, seconds in timings.items()},
        }
        if "embeddings" in self.optimizers:
            scalars["train/embedding_learning_rate"] = self.optimizers["embeddings"].param_groups[0]["lr"]
        elif self.sharded is not None:
            scalars["train/embedding_learning_rate"] = self.sharded.model.fused_optimizer.param_groups[0]["lr"]
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
                self.settings.early_stopping.patience,
                kept,
            )
        else:
            logger.info("training finished at step {:,}; {}", self.step, kept)

    def _validate(self, epoch: int) -> bool:
        """Score the whole validation set; returns True when early stopping says stop."""
        started = time.perf_counter()
        probabilities, labels = self._validation_predictions()
        try:
            metrics = binary_metrics(labels, probabilities)
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
        improved = metrics["log_loss"] < self.best_loss - self.settings.early_stopping.min_delta
        snapshot = self._snapshot() if improved or self.resume_path is not None else None
        if improved:
            self.best_loss, self.bad_validations = metrics["log_loss"], 0
            self.best = {
                "model_state": snapshot[0],
                "optimizer_state": snapshot[1],
                "step": self.step,
                "epoch": epoch,
                "metrics": metrics,
            }
        else:
            self.bad_validations += 1
        if self.is_main:
            self._log_validation(metrics, epoch, improved)
        self._save_progress(snapshot)
        return self.bad_validations >= self.settings.early_stopping.patience

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
            else f" (no improvement {self.bad_validations}/{self.settings.early_stopping.patience})",
        )

    def _validation_predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """Probabilities for every validation row, in order. With N processes each scores its share of every
        global batch of N x ``batch_size.validation`` rows, so all run the same number of forward passes (a
        sharded model's all-to-all needs every process), and the gathered shares are put back in row order:
        the same array, so the same metrics, as one process."""
        arrays = self.validation_loader.arrays
        if self.world_size == 1:
            return predict(self.model, self.validation_loader, self.device, self.settings.precision), arrays.labels
        batch_size = self.validation_loader.batch_size * self.world_size
        mine = BatchLoader(arrays, batch_size, rank=self.rank, world_size=self.world_size)
        local = torch.from_numpy(predict(self.model, mine, self.device, self.settings.precision))
        gather_device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        (pieces,) = self._all_gather_rows(local.to(gather_device))
        return _row_order([p.cpu().numpy() for p in pieces], len(arrays), batch_size), arrays.labels


def _row_order(shares: list[np.ndarray], rows: int, batch_size: int) -> np.ndarray:
    """Undo ``BatchLoader``'s split: ``shares[r]`` holds rank r's part (``np.array_split``) of each batch in turn."""
    parts, cursors = [], [0] * len(shares)
    for begin in range(0, rows, batch_size):
        size = min(batch_size, rows - begin)
        for rank, share in enumerate(shares):
            count = size // len(shares) + (rank < size % len(shares))
            parts.append(share[cursors[rank] : cursors[rank] + count])
            cursors[rank] += count
    return np.concatenate(parts)


def _flat(values: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become strings (TensorBoard's hparams take scalars only)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value) if isinstance(value, list | tuple) or value is None else value
    return flat

"""One optimisation step: learning-rate schedule, forward, loss, backward (with the mode's gradient exchange)
and the optimisers, each phase timed. The loop calls it every step; a benchmark can call it alone."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import Batch
from criteo_dlrm.engine.parallel.modes import Mode

PHASES = ("data", "forward", "backward", "optimizer")  # the parts of a step that are timed


def learning_rate_factor(step: int, total_steps: int, config: TrainingConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then constant, linear or cosine decay to zero at ``total_steps``, or
    one step change (``decay: step``) after ``step_decay.at`` of the run's steps, to ``step_decay.learning_rate``
    for the dense layers (every rate changes by that factor)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.decay == "step":
        changed = step >= round(config.step_decay.at * total_steps)
        return config.step_decay.learning_rate / config.learning_rate if changed else 1.0
    if config.decay == "none" or total_steps <= config.warmup_steps:
        return 1.0
    progress = min((step - config.warmup_steps) / (total_steps - config.warmup_steps), 1.0)
    return 1.0 - progress if config.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


class LookedUpSquares:
    """The sum of the squared embedding values a training forward pass of ``model`` looked up, () float32: the
    L2 penalty on the rows a batch reaches (``training.embedding_weight_decay``), not on the whole tables.

    Taken outside the model, from the lookups its interaction receives (a forward pre-hook), so ``DLRM.forward``
    returns logits only and the model is wrapped for training (DDP, TorchRec's DistributedModelParallel) as it
    is: a wrapper module that adds the term, as TorchRec's ``DLRMTrain``, would put its own prefix on every
    stored weight's name. Evaluation (the model in eval mode) adds nothing.
    """

    def __init__(self, model: nn.Module):
        self._total: torch.Tensor | None = None
        self._handle = model.interaction.register_forward_pre_hook(self._add)

    def _add(self, interaction: nn.Module, inputs: tuple) -> None:
        if interaction.training:
            _, embedded = inputs  # per embedding group (B, T_g, D_g)
            self._total = sum(e.float().square().sum() for e in embedded)

    def take(self) -> torch.Tensor:
        """The last training forward pass's sum (once: a step that forgot to run forward fails here)."""
        total, self._total = self._total, None
        if total is None:
            raise RuntimeError("no training forward pass since the last take()")
        return total

    def remove(self) -> None:
        self._handle.remove()


class TrainStep:
    """``step(batch, index, total_steps, timings)`` -> the batch's loss (detached), the weights updated.

    The loss is summed over this process's rows and weighted by the mode (``loss_weight``), so N processes'
    averaged gradients are one process's gradient of the mean loss over the global batch.
    """

    def __init__(self, mode: Mode, config: TrainingConfig):
        self.mode, self.config = mode, config
        self.loss_function = nn.BCEWithLogitsLoss(reduction="sum")
        cuda = mode.device.type == "cuda"
        # Whether the phases are timed (``phase_timing``; null: on the CPU, and on CUDA while profiling).
        self.timed = config.phase_timing if config.phase_timing is not None else not cuda or config.profiler.enabled
        self.synchronise = self.timed and cuda  # a CUDA phase's time is its kernels' only once they finished
        self.squares = LookedUpSquares(mode.model) if config.embedding_weight_decay else None

    def _phase(self, timings: dict, name: str, start: float) -> float:
        if not self.timed:
            return start
        if self.synchronise:
            torch.cuda.synchronize(self.mode.device)
        now = time.perf_counter()
        timings[name] += now - start
        return now

    def __call__(self, batch: Batch, index: int, total_steps: int, timings: dict | None = None) -> torch.Tensor:
        mode, config = self.mode, self.config
        timings = timings if timings is not None else dict.fromkeys(PHASES, 0.0)
        mode.model.train()
        start = time.perf_counter()
        batch = batch.to(mode.device, non_blocking=True)
        mode.optimizers.scale(learning_rate_factor(index, total_steps, config))
        mode.optimizers.zero_grad()
        start = self._phase(timings, "data", start)
        with mode.runtime.autocast():
            logits = mode.train_model(batch.dense, batch.sparse)
        loss = self.loss_function(logits.float(), batch.labels)
        if self.squares is not None:
            loss = loss + config.embedding_weight_decay * self.squares.take()
        loss = loss * mode.loss_weight(batch.global_rows or len(batch))
        start = self._phase(timings, "forward", start)
        loss.backward()
        mode.placement.exchange_gradients()
        start = self._phase(timings, "backward", start)
        mode.optimizers.step()
        self._phase(timings, "optimizer", start)
        return loss.detach()

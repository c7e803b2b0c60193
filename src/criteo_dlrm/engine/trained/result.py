"""What a training run hands back (``TrainingResult``): a record with no behaviour, so the loop that makes it
and the checkpoint that stores it both import it, neither importing the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainingResult:
    """A finished ``Trainer.fit``.

    The best model's weights and optimiser state are not in memory: they are in ``best_checkpoint``, a file
    written at the validation that found them (``engine.training.run_state``), read back memory-mapped when the finished
    run's checkpoint is assembled.
    """

    best_checkpoint: str
    best_step: int
    best_epoch: int
    best_metrics: dict
    history: list[dict]
    steps: int
    stopped_early: bool
    samples_per_second: float
    resumed_from_step: int | None = None  # the in-progress checkpoint's step this run continued from
    # training.target_auc and when the run reached it: {auc, reached, step, epoch, validation_auc, train_seconds,
    # wall_seconds}; None without a target.
    target: dict | None = None

"""What a training run hands back (``TrainingResult``): a record with no behaviour, so the loop that makes it
and the checkpoint that stores it both import it, neither importing the other."""

from __future__ import annotations

from dataclasses import dataclass

from criteo_dlrm.common.records import Record
from criteo_dlrm.engine.trained.reports import Metrics, Target, Validation


@dataclass
class TrainingResult(Record):
    """A finished ``Trainer.fit``.

    The best model's weights and optimiser state are not in memory: they are in ``best_checkpoint``, a file
    written at the validation that found them (``engine.training.run_state``), read back memory-mapped when the finished
    run's checkpoint is assembled.
    """

    best_checkpoint: str
    best_step: int
    best_epoch: int
    best_metrics: Metrics
    history: list[Validation]
    steps: int
    stopped_early: bool
    samples_per_second: float
    resumed_from_step: int | None = None  # the in-progress checkpoint's step this run continued from
    target: Target | None = None  # training.target_auc and when the run reached it; None without a target

"""Evaluation nodes: thin adapters over ``criteo_dlrm.engine.trained.evaluation``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from criteo_dlrm.config import EvaluationConfig

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: 0.3 s of every kedro command's start
    from matplotlib.figure import Figure
else:  # the name the annotation reads at run time (Kedro reads every node's type hints, and warned without it)
    Figure = Any


def evaluate_checkpoint(dlrm_checkpoint: dict, evaluation: dict) -> tuple[dict, Figure, Figure, Figure]:
    """Score the checkpoint's test rows with its own encoder and calibration.

    Returns:
        ``(evaluation_metrics, ROC figure, calibration figure, score histogram figure)``.
    """
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint  # torch: imported by the run that evaluates
    from criteo_dlrm.engine.trained.evaluation import evaluation_figures, score_checkpoint

    config = EvaluationConfig.from_dict(evaluation, "evaluation.")
    report, labels, predictions, oracle = score_checkpoint(Checkpoint.from_dict(dlrm_checkpoint), config)
    return (report.to_dict(), *evaluation_figures(report, labels, predictions, oracle))

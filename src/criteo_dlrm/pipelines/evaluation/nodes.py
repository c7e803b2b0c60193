"""Evaluation nodes: thin adapters over ``criteo_dlrm.engine.trained.evaluation``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from criteo_dlrm.config import EvaluationConfig
from criteo_dlrm.engine.trained.reports import EvaluationReport

if TYPE_CHECKING:  # matplotlib and torch are imported where they are used: 0.3 s and more of every kedro command
    from matplotlib.figure import Figure

    from criteo_dlrm.engine.trained.checkpoint import Checkpoint
else:  # the names the annotations read at run time (Kedro reads every node's type hints, and warned without them)
    Figure = Checkpoint = Any


def evaluate_checkpoint(
    dlrm_checkpoint: Checkpoint, evaluation: dict
) -> tuple[EvaluationReport, Figure, Figure, Figure]:
    """Score the checkpoint's test rows with its own encoder and calibration.

    Returns:
        ``(evaluation_metrics, ROC figure, calibration figure, score histogram figure)``.
    """
    from criteo_dlrm.engine.trained.evaluation import evaluation_figures, score_checkpoint  # torch: imported here

    config = EvaluationConfig.from_dict(evaluation, "evaluation.")
    report, labels, predictions, oracle = score_checkpoint(dlrm_checkpoint, config)
    return (report, *evaluation_figures(report, labels, predictions, oracle))

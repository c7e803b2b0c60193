"""Evaluating a checkpoint: its own encoder and calibration on the rows its metadata set aside for testing,
the metrics against the prior and (generated data) the true click probabilities, and the figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from loguru import logger

from criteo_dlrm.config.evaluation import EvaluationConfig
from criteo_dlrm.data.lineage import check_days
from criteo_dlrm.data.parquet import recorded_rows
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.engine.device import Runtime, resolve_device
from criteo_dlrm.engine.trained.calibration import Identity
from criteo_dlrm.engine.trained.checkpoint import Checkpoint
from criteo_dlrm.engine.trained.metrics import binary_metrics, calibration_report
from criteo_dlrm.engine.trained.plots import calibration_figure, roc_figure, score_histogram_figure
from criteo_dlrm.engine.trained.reports import EvaluationReport
from criteo_dlrm.engine.trained.scoring import calibrated, score_days

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: 0.3 s of every kedro command's start
    from matplotlib.figure import Figure


def oracle_probabilities(days: list[SourceDay], rows: int) -> np.ndarray | None:
    """True click probabilities when every scored day was generated with them (the bundled sample)."""
    files = [day.click_probability for day in days]
    if not files or not all(f and Path(f).exists() for f in files):
        return None
    parts = []
    for day, file in zip(days, files, strict=True):
        probability = np.load(file)
        parts.append(probability[slice(*day.row_range)] if day.row_range else probability)
    oracle = np.concatenate(parts)
    if len(oracle) != rows:
        logger.warning("click probabilities cover {:,} rows but {:,} were scored; no oracle metrics", len(oracle), rows)
        return None
    return oracle


def evaluated_days(checkpoint: Checkpoint) -> tuple[str, list[SourceDay]]:
    """``("test", days)``, or ``("validation", days)`` for a checkpoint whose metadata set no test rows aside."""
    source_days = checkpoint.source_days
    if source_days.test:
        return "test", source_days.test
    logger.warning(
        "{} has no test rows (its metadata was made before test splits, or with metadata.test_share 0): the "
        "metrics are on the validation rows that chose the kept model, so they are optimistic.",
        checkpoint.source,
    )
    return "validation", source_days.validation


@dataclass(frozen=True)
class Predictions:
    """The model's probabilities for the evaluated rows: its raw output and the calibrated ones (what scoring
    writes)."""

    raw: np.ndarray
    calibrated: np.ndarray

    def by_name(self) -> dict[str, np.ndarray]:
        return {"raw": self.raw, "calibrated": self.calibrated}


def score_checkpoint(
    checkpoint: Checkpoint, config: EvaluationConfig
) -> tuple[EvaluationReport, np.ndarray, Predictions, np.ndarray | None]:
    """The report (``EvaluationReport``) of the checkpoint on its test rows (or, for a checkpoint whose metadata set none aside, its
    validation rows), with its own encoder and calibration; also returns labels, the raw and calibrated
    predictions and the oracle (None unless every scored day was generated with its click probabilities).

    Raises:
        VocabularyMismatchError, LineageError: the encoder or the days are not what the checkpoint recorded.
    """
    source = checkpoint.source
    encoder = checkpoint.encoder()
    split, days = evaluated_days(checkpoint)
    check_days(days, source)  # scores exactly the rows the checkpoint recorded, or refuses
    device = resolve_device(config.device, "evaluation.device")
    rows = [recorded_rows(day) for day in days]
    labels, logits = score_days(checkpoint.model(), encoder, rows, Runtime(device, config.precision))
    if not checkpoint.calibrated:
        logger.warning("{} was made before calibration: its probabilities are the model's raw output", source)
    predictions = Predictions(
        raw=calibrated(Identity(), logits), calibrated=calibrated(checkpoint.calibration(), logits)
    )
    scores = binary_metrics(labels, predictions.calibrated)
    prior = binary_metrics(labels, np.full(len(labels), checkpoint.train_ctr))
    model_raw = binary_metrics(labels, predictions.raw)
    oracle = oracle_probabilities(days, len(labels))
    oracle_metrics = None if oracle is None else binary_metrics(labels, oracle)
    report = EvaluationReport(
        checkpoint_version=checkpoint.version,
        metadata_version=checkpoint.metadata_version,
        vocabulary_sha256=checkpoint.vocabulary_sha256,
        run_version=checkpoint.run_version,
        trained_step=checkpoint.step,
        rows_evaluated=split,  # which rows every figure here is on
        days=[day.day for day in days],
        source_days=days,
        calibration_method=checkpoint.calibration_method,
        model=scores,  # the calibrated probabilities: what scoring writes and the export returns
        model_raw=model_raw,
        calibration_by_decile={name: calibration_report(labels, p) for name, p in predictions.by_name().items()},
        prior_baseline=prior,
        oracle=oracle_metrics,
        gap_to_oracle=None if oracle_metrics is None else {
            "auc": oracle_metrics.auc - scores.auc, "log_loss": scores.log_loss - oracle_metrics.log_loss,
        },
    )  # fmt: skip
    logger.info(
        "{} on the {} rows of {}: AUC {:.4f}, log loss {:.5f}, NE {:.4f}, calibration {:.3f} (raw: log loss {:.5f}, "
        "calibration {:.3f}; prior: log loss {:.5f}){}",
        source, split, report.days, scores.auc, scores.log_loss, scores.normalized_entropy,
        scores.calibration, model_raw.log_loss, model_raw.calibration, prior.log_loss,
        "" if oracle is None else f"; oracle AUC {oracle_metrics.auc:.4f}, log loss {oracle_metrics.log_loss:.5f}",
    )  # fmt: skip
    return report, labels, predictions, oracle


def figure_title(what: str, report: EvaluationReport) -> str:
    """``Calibration of checkpoint <version>, 10,000 test rows of day_2``: which model and rows a figure is of."""
    return (
        f"{what} of checkpoint {report.checkpoint_version},\n{report.model.rows:,} "
        f"{report.rows_evaluated} rows of {', '.join(report.days)}"
    )


def evaluation_figures(
    report: EvaluationReport, labels: np.ndarray, predictions: Predictions, oracle: np.ndarray | None
) -> tuple[Figure, Figure, Figure]:
    """The ROC curves (the oracle's beside the model's when known), the calibration plot (raw and calibrated)
    and the score histogram of ``score_checkpoint``'s result."""
    probabilities = predictions.calibrated
    curves, aucs = {"model": probabilities}, {"model": report.model.auc}
    if oracle is not None:
        curves["oracle (true probabilities)"], aucs["oracle (true probabilities)"] = oracle, report.oracle.auc
    calibration_curves = {"raw model output": predictions.raw}
    if report.calibration_method != "none":
        calibration_curves[f"calibrated ({report.calibration_method})"] = probabilities
    return (
        roc_figure(labels, curves, aucs, figure_title("ROC curve", report)),
        calibration_figure(labels, calibration_curves, figure_title("Calibration", report)),
        score_histogram_figure(labels, probabilities, figure_title("Predicted CTR by label", report)),
    )

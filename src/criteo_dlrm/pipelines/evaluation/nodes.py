"""Evaluation nodes: thin adapters over ``criteo_dlrm.engine`` (scoring, metrics, plots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from loguru import logger
from matplotlib.figure import Figure

from criteo_dlrm.config import EvaluationConfig
from criteo_dlrm.data.lineage import check_days
from criteo_dlrm.engine.checkpoint import model_from_checkpoint
from criteo_dlrm.engine.device import resolve_device
from criteo_dlrm.engine.metrics import binary_metrics
from criteo_dlrm.engine.plots import calibration_figure, roc_figure, score_histogram_figure
from criteo_dlrm.engine.scoring import checkpoint_encoder, score_days


def _oracle(days: list[dict], rows: int) -> np.ndarray | None:
    """True click probabilities when every scored day was generated with them (the bundled sample)."""
    files = [day.get("click_probability") for day in days]
    if not files or not all(f and Path(f).exists() for f in files):
        return None
    oracle = np.concatenate([np.load(f) for f in files])
    if len(oracle) != rows:
        logger.warning("click probabilities cover {:,} rows but {:,} were scored; no oracle metrics", len(oracle), rows)
        return None
    return oracle


def _score(dlrm_checkpoint: dict, evaluation: dict) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray | None]:
    """Metrics of the checkpoint on its validation days; also returns labels, predictions and the oracle."""
    source = f"dlrm_checkpoint version {dlrm_checkpoint.get('catalog_version')}"
    trained_with = dlrm_checkpoint["metadata"]
    encoder = checkpoint_encoder(dlrm_checkpoint, source)
    days = trained_with["source_days"]["validation"]
    check_days(days, source)  # scores exactly the rows the checkpoint validated on, or refuses
    config = EvaluationConfig.from_dict(evaluation, "evaluation.")
    device = resolve_device(config.device, "evaluation.device")
    model = model_from_checkpoint(dlrm_checkpoint)
    labels, probabilities = score_days(model, encoder, [day["parquet"] for day in days], device, config.precision)
    scores = binary_metrics(labels, probabilities)
    prior = binary_metrics(labels, np.full(len(labels), trained_with["train_ctr"]))
    metrics = {
        "checkpoint_version": dlrm_checkpoint.get("catalog_version"),
        "metadata_version": trained_with["version"],
        "vocabulary_sha256": trained_with["vocabulary_sha256"],
        "run_version": dlrm_checkpoint.get("run_version"),
        "trained_step": dlrm_checkpoint["step"],
        "days": [day["day"] for day in days],
        "source_days": days,
        "model": scores,
        "prior_baseline": prior,
        "oracle": None,
        "gap_to_oracle": None,
    }
    oracle = _oracle(days, len(labels))
    if oracle is not None:
        metrics["oracle"] = binary_metrics(labels, oracle)
        metrics["gap_to_oracle"] = {
            "auc": metrics["oracle"]["auc"] - scores["auc"],
            "log_loss": scores["log_loss"] - metrics["oracle"]["log_loss"],
        }
    logger.info(
        "{} on {}: AUC {:.4f}, log loss {:.5f}, NE {:.4f}, calibration {:.3f} (prior: log loss {:.5f}){}",
        source, metrics["days"], scores["auc"], scores["log_loss"], scores["normalized_entropy"], scores["calibration"],
        prior["log_loss"],
        "" if oracle is None else f"; oracle AUC {metrics['oracle']['auc']:.4f}, log loss {metrics['oracle']['log_loss']:.5f}",
    )  # fmt: skip
    return metrics, labels, probabilities, oracle


def evaluate_checkpoint(dlrm_checkpoint: dict, evaluation: dict) -> tuple[dict, Figure, Figure, Figure]:
    """Score the checkpoint's validation days with its own encoder.

    Returns:
        ``(validation_metrics, ROC figure, calibration figure, score histogram figure)``.
    """
    metrics, labels, probabilities, oracle = _score(dlrm_checkpoint, evaluation)
    curves, aucs = {"model": probabilities}, {"model": metrics["model"]["auc"]}
    if oracle is not None:
        curves["oracle (true probabilities)"], aucs["oracle (true probabilities)"] = oracle, metrics["oracle"]["auc"]
    return (
        metrics,
        roc_figure(labels, curves, aucs),
        calibration_figure(labels, probabilities),
        score_histogram_figure(labels, probabilities),
    )

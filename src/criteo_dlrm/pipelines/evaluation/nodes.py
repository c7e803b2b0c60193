"""Evaluation nodes: thin adapters over ``criteo_dlrm.engine`` (scoring, metrics, plots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from loguru import logger
from matplotlib.figure import Figure

from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.engine.checkpoint import model_from_checkpoint
from criteo_dlrm.engine.device import resolve_device
from criteo_dlrm.engine.metrics import binary_metrics
from criteo_dlrm.engine.plots import calibration_figure, roc_figure, score_histogram_figure
from criteo_dlrm.engine.scoring import check_encoder, score_days


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


def evaluate_checkpoint(dlrm_checkpoint: dict, evaluation: dict) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    """Score the checkpoint's validation days with its own encoder and compute the metrics.

    Returns:
        ``(validation_metrics, curves, labels, probabilities)``; curves holds the scorers to plot.
    """
    source = f"dlrm_checkpoint version {dlrm_checkpoint.get('catalog_version')}"
    trained_with = dlrm_checkpoint["metadata"]
    check_encoder(FeatureEncoder.from_state_dict(dlrm_checkpoint["encoder"]), trained_with["vocabulary_sha256"], source)
    encoder = FeatureEncoder.from_state_dict(dlrm_checkpoint["encoder"])
    days = trained_with["source_days"]["validation"]
    device = resolve_device(evaluation["device"])
    labels, probabilities = score_days(
        model_from_checkpoint(dlrm_checkpoint),
        encoder,
        [day["parquet"] for day in days],
        device,
        evaluation["precision"],
    )
    model = binary_metrics(labels, probabilities)
    prior = binary_metrics(labels, np.full(len(labels), trained_with["train_ctr"]))
    metrics = {
        "checkpoint_version": dlrm_checkpoint.get("catalog_version"),
        "metadata_version": trained_with["version"],
        "vocabulary_sha256": trained_with["vocabulary_sha256"],
        "run_version": dlrm_checkpoint.get("run_version"),
        "trained_step": dlrm_checkpoint["step"],
        "days": [day["day"] for day in days],
        "model": model,
        "prior_baseline": prior,
        "oracle": None,
        "gap_to_oracle": None,
    }
    curves = {"model": probabilities}
    oracle = _oracle(days, len(labels))
    if oracle is not None:
        metrics["oracle"] = binary_metrics(labels, oracle)
        metrics["gap_to_oracle"] = {
            "auc": metrics["oracle"]["auc"] - model["auc"],
            "log_loss": model["log_loss"] - metrics["oracle"]["log_loss"],
        }
        curves["oracle (true probabilities)"] = oracle
    logger.info(
        "{} on {}: AUC {:.4f}, log loss {:.5f}, NE {:.4f}, calibration {:.3f} (prior: log loss {:.5f}){}",
        source,
        metrics["days"],
        model["auc"],
        model["log_loss"],
        model["normalized_entropy"],
        model["calibration"],
        prior["log_loss"],
        ""
        if oracle is None
        else f"; oracle AUC {metrics['oracle']['auc']:.4f}, log loss {metrics['oracle']['log_loss']:.5f}",
    )
    return metrics, curves, labels, probabilities


def plot_evaluation(
    validation_metrics: dict, curves: dict, labels: np.ndarray, probabilities: np.ndarray
) -> tuple[Figure, Figure, Figure]:
    """ROC curve, calibration curve and score histograms."""
    aucs = {"model": validation_metrics["model"]["auc"]}
    if validation_metrics["oracle"] is not None:
        aucs["oracle (true probabilities)"] = validation_metrics["oracle"]["auc"]
    return (
        roc_figure(labels, curves, aucs),
        calibration_figure(labels, probabilities),
        score_histogram_figure(labels, probabilities),
    )

"""Evaluation figures: ROC curve, calibration (reliability) curve and score histograms by label."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from criteo_dlrm.engine.trained.metrics import CALIBRATION_BINS, calibration_report, reliability_curve, roc_curve

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: 0.3 s of every kedro command's start
    from matplotlib.figure import Figure

# Figures are built with matplotlib's object API, not pyplot: no global backend is chosen or changed
# (a notebook importing the project keeps its inline plots), and nothing is left open.


def roc_figure(
    labels: np.ndarray, curves: dict[str, np.ndarray], aucs: dict[str, float], title: str = "ROC curve"
) -> Figure:
    """One ROC curve per scorer (e.g. the model and the oracle), with its AUC in the legend; ``title`` names the
    checkpoint and the rows."""
    figure = _figure((6, 6))
    axes = figure.subplots()
    for name, scores in curves.items():
        fpr, tpr = roc_curve(labels, scores)
        axes.plot(fpr, tpr, label=f"{name} (AUC {aucs[name]:.4f})")
    axes.plot([0, 1], [0, 1], linestyle="--", color="grey", label="chance (AUC 0.5)")
    axes.set(
        xlabel="false positive rate",
        ylabel="true positive rate",
        title=title,
        xlim=(0, 1),
        ylim=(0, 1),
    )
    axes.title.set_fontsize(10)
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def calibration_figure(labels: np.ndarray, curves: dict[str, np.ndarray], title: str) -> Figure:
    """Observed CTR against mean predicted CTR in the report's bins of equal row counts (``CALIBRATION_BINS``),
    with each bin's 95% interval, one curve per set of predictions (the raw model output and the calibrated
    probabilities), each labelled with its calibration and ECE; the diagonal is perfect. ``title`` names the
    checkpoint and the rows."""
    points = {name: reliability_curve(labels, probabilities) for name, probabilities in curves.items()}
    figure = _figure((6.5, 6.5))
    axes = figure.subplots()
    top = max(max(c.predicted.max(), c.observed_high.max()) for c in points.values()) * 1.05
    axes.plot([0, top], [0, top], linestyle="--", color="grey", label="perfect calibration")
    for name, curve in points.items():
        ratio = curves[name].mean() / max(labels.mean(), 1e-12)
        ece = calibration_report(labels, curves[name]).expected_calibration_error
        errors = np.vstack([curve.observed - curve.observed_low, curve.observed_high - curve.observed])
        errors = np.clip(errors, 0.0, None)  # a bin with no click: its low bound is its rate, up to rounding
        axes.errorbar(
            curve.predicted, curve.observed, yerr=errors, marker="o", capsize=3,
            label=f"{name}: calibration {ratio:.3f}, ECE {ece:.4f}",
        )  # fmt: skip
    axes.set(
        xlabel=f"mean predicted CTR ({CALIBRATION_BINS} bins of equal rows; bars: 95% interval)",
        ylabel="observed CTR",
        title=title,
        xlim=(0, top),
        ylim=(0, top),
    )
    axes.title.set_fontsize(10)
    axes.legend(loc="lower right", fontsize=8)  # below the diagonal's top end, where the points are
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def score_histogram_figure(
    labels: np.ndarray, probabilities: np.ndarray, title: str = "Predicted CTR by label"
) -> Figure:
    """Distributions of predicted CTR for clicked and not-clicked rows."""
    figure = _figure((7, 4.5))
    axes = figure.subplots()
    bins = np.linspace(0, 1, 51)
    labels = labels.astype(bool)
    axes.hist(probabilities[~labels], bins=bins, alpha=0.6, density=True, label=f"no click ({(~labels).sum():,} rows)")
    axes.hist(probabilities[labels], bins=bins, alpha=0.6, density=True, label=f"click ({labels.sum():,} rows)")
    axes.set(xlabel="predicted click probability", ylabel="density", title=title)
    axes.title.set_fontsize(10)
    axes.legend()
    figure.tight_layout()
    return figure


def _figure(size: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=size)

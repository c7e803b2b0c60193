"""Exact binary-classification metrics for click prediction, computed by sorting in O(n log n).

AUC averages the ranks of tied scores (the Mann-Whitney statistic), so it equals scikit-learn's on
any input; log loss is in nats; normalized entropy is log loss over the entropy of the observed CTR.
"""

from __future__ import annotations

import numpy as np

from criteo_dlrm.common.errors import DataError

EPSILON = 1e-7


class MetricError(DataError):
    """A metric is undefined on this data (e.g. AUC with a single class)."""


def _check(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    if len(labels) == 0:
        raise MetricError("No rows to evaluate.")
    if not np.isfinite(scores).all():
        raise MetricError(f"{int((~np.isfinite(scores)).sum())} predictions are NaN or infinite.")
    return labels, scores


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; tied scores count half.

    Raises:
        MetricError: only one class is present (AUC is undefined).
    """
    labels, scores = _check(labels, scores)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise MetricError(
            f"AUC is undefined: the data has {positives} clicks and {negatives} non-clicks; both classes are needed."
        )
    order = np.argsort(scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    group = np.concatenate([[0], np.cumsum(sorted_scores[1:] != sorted_scores[:-1])])
    first = np.searchsorted(group, np.arange(group[-1] + 1), side="left")
    last = np.searchsorted(group, np.arange(group[-1] + 1), side="right") - 1
    average_rank = (first + last) / 2 + 1  # 1-based rank shared by a tie group
    positive_rank_sum = float(np.dot(np.bincount(group, weights=sorted_labels), average_rank))
    return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean binary cross-entropy in nats (probabilities clipped to [1e-7, 1 - 1e-7])."""
    labels, probabilities = _check(labels, probabilities)
    p = np.clip(probabilities, EPSILON, 1 - EPSILON)
    return float(-np.mean(np.where(labels, np.log(p), np.log1p(-p))))


def entropy(rate: float) -> float:
    """Entropy (nats) of a Bernoulli(rate): the log loss of always predicting the observed CTR."""
    rate = min(max(rate, EPSILON), 1 - EPSILON)
    return float(-(rate * np.log(rate) + (1 - rate) * np.log1p(-rate)))


def binary_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """rows, observed CTR, AUC, log loss, normalized entropy, calibration and accuracy at 0.5.

    Normalized entropy below 1 means the model beats predicting the observed CTR everywhere;
    calibration is mean prediction / observed CTR (1 is perfectly calibrated on average).
    """
    labels, probabilities = _check(labels, probabilities)
    ctr = float(labels.mean())
    loss = log_loss(labels, probabilities)
    return {
        "rows": int(len(labels)),
        "ctr": ctr,
        "auc": roc_auc(labels, probabilities),
        "log_loss": loss,
        "normalized_entropy": loss / entropy(ctr),
        "calibration": float(probabilities.mean()) / ctr if ctr > 0 else float("inf"),
        "accuracy": float(np.mean((probabilities >= 0.5) == labels)),
    }


def roc_curve(labels: np.ndarray, scores: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) at each distinct threshold, thinned to ``max_points``."""
    labels, scores = _check(labels, scores)
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    cuts = np.concatenate([np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]), [len(scores) - 1]])
    true_positives = np.cumsum(sorted_labels)[cuts]
    false_positives = cuts + 1 - true_positives
    fpr = np.concatenate([[0.0], false_positives / max(false_positives[-1], 1)])
    tpr = np.concatenate([[0.0], true_positives / max(true_positives[-1], 1)])
    if len(fpr) > max_points:
        keep = np.unique(np.linspace(0, len(fpr) - 1, max_points).astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return fpr, tpr


# One binning for the calibration figures, the JSON report and the ECE: deciles of the prediction.
CALIBRATION_BINS = 10


def wilson_interval(
    clicks: np.ndarray, rows: np.ndarray, z: float = 1.959963984540054
) -> tuple[np.ndarray, np.ndarray]:
    """95% Wilson score interval of a click rate (``clicks`` of ``rows``): sound at 3% CTR and few rows, where
    the normal approximation gives negative bounds."""
    rows = np.maximum(np.asarray(rows, dtype=np.float64), 1)
    rate = np.asarray(clicks, dtype=np.float64) / rows
    centre = (rate + z * z / (2 * rows)) / (1 + z * z / rows)
    half = z * np.sqrt(rate * (1 - rate) / rows + z * z / (4 * rows * rows)) / (1 + z * z / rows)
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)  # 0 / 1 exactly at 0 / all clicks


def reliability_curve(
    labels: np.ndarray, probabilities: np.ndarray, bins: int = CALIBRATION_BINS
) -> dict[str, np.ndarray]:
    """Mean prediction and observed CTR per bin of equal row counts (quantiles of the prediction), with the
    observed CTR's 95% interval (``observed_low``, ``observed_high``)."""
    labels, probabilities = _check(labels, probabilities)
    order = np.argsort(probabilities, kind="stable")
    chunks = np.array_split(order, min(bins, len(order)))
    rows = np.array([len(c) for c in chunks])
    clicks = np.array([labels[c].sum() for c in chunks])
    low, high = wilson_interval(clicks, rows)
    return {
        "predicted": np.array([probabilities[c].mean() for c in chunks]),
        "observed": clicks / np.maximum(rows, 1),
        "rows": rows,
        "observed_low": low,
        "observed_high": high,
    }


def calibration_report(labels: np.ndarray, probabilities: np.ndarray, bins: int = CALIBRATION_BINS) -> dict:
    """Calibration beyond the overall ratio: per bin of equal row counts (deciles of the prediction by default),
    the mean prediction, the observed CTR and their ratio; and the expected calibration error (ECE), the
    row-weighted mean of |mean prediction - observed CTR| over those bins (in probability, 0 is perfect).

    Bins of equal rows rather than of equal width: at a 3% click rate nearly every prediction falls in the
    first tenth of [0, 1], where equal-width bins would see one bin.
    """
    curve = reliability_curve(labels, probabilities, bins)
    rows = curve["rows"]
    gaps = np.abs(curve["predicted"] - curve["observed"])
    return {
        "expected_calibration_error": float(np.sum(gaps * rows) / rows.sum()),
        "bins": [
            {
                "rows": int(n),
                "mean_prediction": float(p),
                "observed_ctr": float(o),
                "observed_ctr_interval": [float(lo), float(hi)],  # 95%, Wilson
                "calibration": float(p / o) if o > 0 else None,
            }
            for n, p, o, lo, hi in zip(
                rows, curve["predicted"], curve["observed"], curve["observed_low"], curve["observed_high"], strict=True
            )
        ],
    }

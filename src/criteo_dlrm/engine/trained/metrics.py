"""Exact binary-classification metrics for click prediction, computed by sorting in O(n log n).

AUC averages the ranks of tied scores (the Mann-Whitney statistic), so it equals scikit-learn's on
any input; log loss is in nats; normalized entropy is log loss over the entropy of the observed CTR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.engine.trained.reports import Calibration, Metrics

EPSILON = 1e-7


class MetricError(DataError):
    """A metric is undefined on this data (e.g. AUC with a single class)."""


def _check(labels: np.ndarray, scores: np.ndarray, widen: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Labels as booleans and scores as float64 (``widen``; else float32 scores stay float32), one row each,
    finite, at least one row."""
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores).ravel()
    if widen or scores.dtype not in (np.float32, np.float64):
        scores = scores.astype(np.float64, copy=False)
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    if len(labels) == 0:
        raise MetricError("No rows to evaluate.")
    if not np.isfinite(scores).all():
        raise MetricError(f"{int((~np.isfinite(scores)).sum())} predictions are NaN or infinite.")
    return labels, scores


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; tied scores count half (the Mann-Whitney statistic, equal to scikit-learn's).

    The positives' and the negatives' scores are sorted apart (together one sort of the scores, in their own
    dtype: float32 scores are never widened; probabilities in one sort of their bits, ``_sorted_by_class``),
    then each positive counts the negatives at or below it with one binary search; only positives equal to
    some negative search again for the ties: about 2x numpy's sort of the same scores, where a float64 argsort
    with tie ranks was 60x. Torch tensors (on CUDA too) are computed where they are, by the same steps
    (``roc_auc_torch``).

    Raises:
        MetricError: only one class is present (AUC is undefined).
    """
    if isinstance(scores, torch.Tensor):
        return roc_auc_torch(torch.as_tensor(labels, device=scores.device), scores)
    labels, scores = _check(labels, scores, widen=False)
    if _are_probabilities(scores):
        keys = np.empty(len(scores), np.uint32)
        for begin in range(0, len(scores), _PIECE):
            _write_keys(labels[begin : begin + _PIECE], scores[begin : begin + _PIECE], keys[begin : begin + _PIECE])
        return _auc(*_sorted_by_class(keys, labels))
    return _auc(np.sort(scores[~labels]), np.sort(scores[labels]))


def _auc(negatives: np.ndarray, positives: np.ndarray) -> float:
    """AUC from each class's sorted scores (or order-preserving keys)."""
    _check_classes(len(positives), len(negatives))
    at_or_below = np.searchsorted(negatives, positives, side="right")
    tied = np.flatnonzero(at_or_below > 0)
    tied = tied[negatives[at_or_below[tied] - 1] == positives[tied]]
    equal = at_or_below[tied] - np.searchsorted(negatives, positives[tied], side="left")
    # Twice the Mann-Whitney U, in integers (exact up to 2^63 pairs), divided once.
    twice_u = 2 * int(at_or_below.sum(dtype=np.int64)) - int(equal.sum(dtype=np.int64))
    return twice_u / (2 * len(positives) * len(negatives))


def _are_probabilities(scores: np.ndarray) -> bool:
    """float32 scores none of which is negative: their bits order as their values do, the sign bit free."""
    return scores.dtype == np.float32 and len(scores) > 0 and bool(scores.min() >= 0)


def _write_keys(clicked: np.ndarray, scores: np.ndarray, out: np.ndarray) -> None:
    """Order-preserving uint32 keys of non-negative float32 ``scores`` with the class in the sign bit, so one
    sort of the keys puts every positive after every negative and sorts both (no masked copies of the scores);
    -0.0 is made +0.0 (equal values, one key)."""
    np.add(scores, np.float32(0), out=out.view(np.float32))
    classes = clicked.view(np.uint8).astype(np.uint32)
    classes <<= 31
    out |= classes


def _sorted_by_class(keys: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The negatives' and the positives' keys (``_write_keys``), each sorted, from one sort (in place)."""
    keys.sort()
    split = len(keys) - int(np.count_nonzero(labels))
    return keys[:split], keys[split:] & np.uint32(0x7FFFFFFF)


def roc_auc_torch(labels: torch.Tensor, scores: torch.Tensor) -> float:
    """``roc_auc`` on torch tensors, on their device (a CUDA sort for scores a GPU produced)."""
    labels, scores = labels.reshape(-1).bool(), scores.reshape(-1)
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels but {len(scores)} scores")
    if len(labels) == 0:
        raise MetricError("No rows to evaluate.")
    if not bool(torch.isfinite(scores).all()):
        raise MetricError(f"{int((~torch.isfinite(scores)).sum())} predictions are NaN or infinite.")
    positives = torch.sort(scores[labels]).values
    negatives = torch.sort(scores[~labels]).values
    _check_classes(len(positives), len(negatives))
    at_or_below = torch.searchsorted(negatives, positives, right=True)
    below = torch.searchsorted(negatives, positives)
    twice_u = int(at_or_below.sum()) + int(below.sum())
    return twice_u / (2 * len(positives) * len(negatives))


def _check_classes(positives: int, negatives: int) -> None:
    if positives == 0 or negatives == 0:
        raise MetricError(
            f"AUC is undefined: the data has {positives} clicks and {negatives} non-clicks; both classes are needed."
        )


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean binary cross-entropy in nats (probabilities clipped to [1e-7, 1 - 1e-7])."""
    labels, probabilities = _check(labels, probabilities, widen=False)
    return _sums(labels, probabilities)[0] / len(labels)


# Rows per piece of the one pass over the predictions: its temporaries stay in the CPU's cache instead of costing
# a page fault per 4 KB of a new array the size of the validation set (measured: 5x the arithmetic).
_PIECE = 1 << 18
# The log loss's clip (probabilities in [1e-7, 1 - 1e-7]) applied to the logarithms instead: the same bounds
# (log is increasing), exact in float64 whatever the scores' dtype.
_LOG_LOW, _LOG_HIGH = float(np.log(EPSILON)), float(np.log1p(-EPSILON))


def _sums(labels: np.ndarray, probabilities: np.ndarray, keys: np.ndarray | None = None) -> tuple[float, float, int]:
    """(summed log loss, summed probability, rows right at 0.5) of float32 or float64 probabilities, summed in
    float64, one pass in cache-sized pieces; ``keys``: filled with the AUC's sort keys in the same pass
    (``_write_keys``).

    Each row's logarithm is taken in the scores' own dtype (float32 ones are never widened: 2.5x faster), of what
    the row's label makes exact: ``log1p(-p)`` for every row (no ``1 - p`` rounded first: at a 3% click rate most
    rows' losses are that small number), then, for the clicked rows only, ``log(p) - log1p(-p)``. Each is within
    an ulp or two of its dtype, so the mean is within float32 rounding of float64's on float32 scores.
    """
    loss = total = 0.0
    right = 0
    work = np.empty(min(_PIECE, len(labels)), probabilities.dtype)
    for begin in range(0, len(labels), _PIECE):
        clicked, p = labels[begin : begin + _PIECE], probabilities[begin : begin + _PIECE]
        if keys is not None:
            _write_keys(clicked, p, keys[begin : begin + _PIECE])
        total += float(p.sum(dtype=np.float64))
        right += int(np.count_nonzero((p >= 0.5) == clicked))
        missed = work[: len(p)]  # log(1 - p): each row's loss were it not clicked
        np.negative(p, out=missed)
        with np.errstate(divide="ignore"):  # log(0) = -inf, clipped to log(1e-7) like a probability of 0
            np.log1p(missed, out=missed)
            rows = np.flatnonzero(clicked)
            hit = np.log(p[rows])
        np.clip(missed, _LOG_LOW, _LOG_HIGH, out=missed)
        np.clip(hit, _LOG_LOW, _LOG_HIGH, out=hit)
        loss -= float(missed.sum(dtype=np.float64)) + float(
            hit.sum(dtype=np.float64) - missed[rows].sum(dtype=np.float64)
        )
    return loss, total, right


def entropy(rate: float) -> float:
    """Entropy (nats) of a Bernoulli(rate): the log loss of always predicting the observed CTR."""
    rate = min(max(rate, EPSILON), 1 - EPSILON)
    return float(-(rate * np.log(rate) + (1 - rate) * np.log1p(-rate)))


def binary_metrics(labels: np.ndarray, probabilities: np.ndarray) -> Metrics:
    """rows, observed CTR, AUC, log loss, normalized entropy, calibration and accuracy at 0.5.

    Normalized entropy below 1 means the model beats predicting the observed CTR everywhere;
    calibration is mean prediction / observed CTR (1 is perfectly calibrated on average).
    """
    if isinstance(probabilities, torch.Tensor):
        return binary_metrics_torch(torch.as_tensor(labels, device=probabilities.device), probabilities)
    labels, probabilities = _check(labels, probabilities, widen=False)  # float32 sorted as float32 for the AUC
    rows = len(labels)
    ctr = int(np.count_nonzero(labels)) / rows
    keys = np.empty(rows, np.uint32) if _are_probabilities(probabilities) else None
    loss, total, right = _sums(labels, probabilities, keys)
    return Metrics(
        rows=rows,
        ctr=ctr,
        auc=_auc(*_sorted_by_class(keys, labels)) if keys is not None else roc_auc(labels, probabilities),
        log_loss=loss / rows,
        normalized_entropy=loss / rows / entropy(ctr),
        calibration=total / rows / ctr if ctr > 0 else float("inf"),
        accuracy=right / rows,
    )


def binary_metrics_torch(labels: torch.Tensor, probabilities: torch.Tensor) -> Metrics:
    """``binary_metrics`` computed on the tensors' device (a GPU's scores stay there), by the same steps as
    ``_sums`` (logarithms in the scores' dtype, sums in float64): the same figures within the dtype's rounding
    (another library's logarithms, sums in another order)."""
    labels, p = labels.reshape(-1).bool(), probabilities.reshape(-1)
    auc = roc_auc_torch(labels, p)  # checks rows, finiteness and both classes first
    rows = len(labels)
    ctr = int(labels.sum()) / rows
    if p.dtype not in (torch.float32, torch.float64):
        p = p.float()  # bf16 or fp16 scores: their logarithms in float32 (as numpy's of float16 in float64)
    # Summed on the device in pieces (temporaries of a piece, not of the whole set), read back once; the clicked
    # rows picked by a mask, not by indexing (which would wait for the device to count them).
    sums = torch.zeros(3, dtype=torch.float64, device=p.device)  # log loss, probability, right at 0.5
    for begin in range(0, rows, _DEVICE_PIECE):
        clicked, piece = labels[begin : begin + _DEVICE_PIECE], p[begin : begin + _DEVICE_PIECE]
        missed = torch.log1p(-piece).clamp_(_LOG_LOW, _LOG_HIGH)
        hit = torch.log(piece).clamp_(_LOG_LOW, _LOG_HIGH)
        sums[0] -= missed.sum(dtype=torch.float64) + torch.where(clicked, hit - missed, 0).sum(dtype=torch.float64)
        sums[1] += piece.sum(dtype=torch.float64)
        sums[2] += ((piece >= 0.5) == clicked).sum()
    loss_sum, total, right = sums.tolist()
    loss = loss_sum / rows
    return Metrics(
        rows=rows,
        ctr=ctr,
        auc=auc,
        log_loss=loss,
        normalized_entropy=loss / entropy(ctr),
        calibration=total / rows / ctr if ctr > 0 else float("inf"),
        accuracy=int(right) / rows,
    )


# Rows per piece of ``binary_metrics_torch``'s sums: 16-32 MB temporaries, long enough for a GPU's kernels.
_DEVICE_PIECE = 1 << 22


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


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per bin: the mean prediction, the observed CTR, the rows and the observed CTR's 95% interval."""

    predicted: np.ndarray
    observed: np.ndarray
    rows: np.ndarray
    observed_low: np.ndarray
    observed_high: np.ndarray


def reliability_curve(labels: np.ndarray, probabilities: np.ndarray, bins: int = CALIBRATION_BINS) -> ReliabilityCurve:
    """Mean prediction and observed CTR per bin of equal row counts (quantiles of the prediction), with the
    observed CTR's 95% interval (``observed_low``, ``observed_high``)."""
    labels, probabilities = _check(labels, probabilities)
    order = np.argsort(probabilities, kind="stable")
    chunks = np.array_split(order, min(bins, len(order)))
    rows = np.array([len(c) for c in chunks])
    clicks = np.array([labels[c].sum() for c in chunks])
    low, high = wilson_interval(clicks, rows)
    return ReliabilityCurve(
        predicted=np.array([probabilities[c].mean() for c in chunks]),
        observed=clicks / np.maximum(rows, 1),
        rows=rows,
        observed_low=low,
        observed_high=high,
    )


def calibration_report(labels: np.ndarray, probabilities: np.ndarray, bins: int = CALIBRATION_BINS) -> Calibration:
    """Calibration beyond the overall ratio: per bin of equal row counts (deciles of the prediction by default),
    the mean prediction, the observed CTR and their ratio; and the expected calibration error (ECE), the
    row-weighted mean of |mean prediction - observed CTR| over those bins (in probability, 0 is perfect).

    Bins of equal rows rather than of equal width: at a 3% click rate nearly every prediction falls in the
    first tenth of [0, 1], where equal-width bins would see one bin.
    """
    curve = reliability_curve(labels, probabilities, bins)
    rows = curve.rows
    gaps = np.abs(curve.predicted - curve.observed)
    return Calibration(
        expected_calibration_error=float(np.sum(gaps * rows) / rows.sum()),
        bins=[
            {
                "rows": int(n),
                "mean_prediction": float(p),
                "observed_ctr": float(o),
                "observed_ctr_interval": [float(lo), float(hi)],  # 95%, Wilson
                "calibration": float(p / o) if o > 0 else None,
            }
            for n, p, o, lo, hi in zip(
                rows, curve.predicted, curve.observed, curve.observed_low, curve.observed_high, strict=True
            )
        ],
    )

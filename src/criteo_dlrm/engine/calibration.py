"""Post-hoc calibration: a monotone map from the model's logit to a click probability, fitted once on the
validation rows after training, stored in the checkpoint, and applied wherever a probability leaves the
project (evaluation, batch scoring, the ONNX and ``torch.export`` graphs).

- ``platt``: ``sigmoid(slope * logit + intercept)``, a logistic regression on the logit (Platt scaling).
  It keeps the order of the predictions, so AUC is unchanged.
- ``isotonic``: a non-decreasing piecewise-linear curve through scikit-learn's isotonic regression of the label on
  the logit, interpolated linearly between its knots and flat beyond them. Equal predictions it creates can
  move AUC a little.
- ``none``: ``sigmoid(logit)``, the model's own output (also what checkpoints made before calibration get).

The state stored in a checkpoint holds plain values and tensors only (``weights_only`` loading).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from criteo_dlrm.config.training import CALIBRATION_METHODS

# Isotonic knots are clipped away from 0 and 1: a probability of exactly 0 for a row that is then clicked
# costs an unbounded log loss.
PROBABILITY_FLOOR = 1e-6
# Knots an isotonic calibration keeps at most: its forward pass holds a (rows, knots) matrix, so knots that grow
# with the validation rows (scikit-learn keeps every pooled block's ends, thousands on millions of rows) would
# make a batch's calibration gigabytes. 512 knots: 8 MB for 4,096 rows, the curve between them linear.
MAX_ISOTONIC_KNOTS = 512


def fit_calibration(labels: np.ndarray, logits: np.ndarray, method: str) -> dict:
    """Fit ``method`` on (label, logit) pairs: labels (N,) 0/1, logits (N,) float.

    Returns:
        the state ``Calibration`` is built from: ``method``, its parameters, and ``rows`` (N).
    """
    labels = np.asarray(labels, dtype=np.float64).ravel()
    logits = np.asarray(logits, dtype=np.float64).ravel()
    state: dict = {"method": method, "rows": int(len(labels))}
    if method == "none":
        return state
    if labels.min() == labels.max():
        raise ValueError(f"calibration needs both clicks and non-clicks; the {len(labels):,} rows have one class")
    if method == "platt":
        from sklearn.linear_model import LogisticRegression

        # A large C: the two parameters are fitted by maximum likelihood (a penalty would pull the slope to 0).
        fitted = LogisticRegression(C=1e6, tol=1e-8, max_iter=1000).fit(logits[:, None], labels)
        state.update(slope=float(fitted.coef_[0, 0]), intercept=float(fitted.intercept_[0]))
    elif method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        fitted = IsotonicRegression(out_of_bounds="clip", y_min=PROBABILITY_FLOOR, y_max=1 - PROBABILITY_FLOOR)
        fitted.fit(logits, labels)
        x, y = thin_knots(np.asarray(fitted.X_thresholds_, np.float64), np.asarray(fitted.y_thresholds_, np.float64))
        state.update(knots_logit=torch.from_numpy(x), knots_probability=torch.from_numpy(y))
    else:
        raise ValueError(f"unknown calibration method {method!r}: use one of {CALIBRATION_METHODS}")
    return state


def thin_knots(x: np.ndarray, y: np.ndarray, limit: int = MAX_ISOTONIC_KNOTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``limit`` knots of the piecewise-linear curve through ``(x, y)``: the first, the last, and knots
    spread evenly in order between them (their values are the curve's own, so it stays non-decreasing)."""
    if len(x) <= limit:
        return x, y
    keep = np.unique(np.linspace(0, len(x) - 1, limit).round().astype(np.int64))
    return x[keep], y[keep]


class Calibration(nn.Module):
    """logits (B,) float32 -> calibrated click probabilities (B,) float32 (``fit_calibration``'s state; None: raw)."""

    def __init__(self, state: dict | None = None):
        super().__init__()
        state = state or {"method": "none"}
        self.method = state["method"]
        if self.method == "platt":
            self.register_buffer("slope", torch.tensor(state["slope"], dtype=torch.float32))
            self.register_buffer("intercept", torch.tensor(state["intercept"], dtype=torch.float32))
        elif self.method == "isotonic":
            x = state["knots_logit"].to(torch.float32)
            y = state["knots_probability"].to(torch.float32)
            # Linear pieces between consecutive knots, as (start, width, rise): f(z) = y0 + sum rise * clamp((z - start) / width, 0, 1).
            self.register_buffer("first", y[:1].clone())
            self.register_buffer("starts", x[:-1].clone())
            self.register_buffer("widths", (x[1:] - x[:-1]).clamp_min(1e-12))
            self.register_buffer("rises", y[1:] - y[:-1])
        elif self.method != "none":
            raise ValueError(f"unknown calibration method {self.method!r}: use one of {CALIBRATION_METHODS}")

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if self.method == "platt":
            return torch.sigmoid(logits * self.slope + self.intercept)
        if self.method == "isotonic":
            # z: (B, 1) against the knots (K-1,): written with clamps so that ONNX exports it as plain arithmetic.
            share = ((logits.unsqueeze(-1) - self.starts) / self.widths).clamp(0.0, 1.0)  # (B, K-1)
            return self.first + share @ self.rises
        return torch.sigmoid(logits)


def calibration_from_checkpoint(checkpoint: dict) -> Calibration:
    """The checkpoint's calibration; checkpoints made before calibration score with the raw output (``none``)."""
    return Calibration(checkpoint.get("calibration")).eval()


def describe(state: dict | None) -> str:
    """One line for logs and summaries, e.g. ``platt (slope 0.981, intercept -0.042) fitted on 20,000 validation rows``."""
    if not state or state["method"] == "none":
        return "none (the model's own output)"
    if state["method"] == "platt":
        detail = f"slope {state['slope']:.3f}, intercept {state['intercept']:+.3f}"
    else:
        detail = f"{len(state['knots_logit']):,} knots"
    return f"{state['method']} ({detail}) fitted on {state['rows']:,} validation rows"

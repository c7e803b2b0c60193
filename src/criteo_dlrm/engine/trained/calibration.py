"""Post-hoc calibration: a monotone map from the model's logit to a click probability, fitted once on the
validation rows after training, stored in the checkpoint, and applied wherever a probability leaves the
project (evaluation, batch scoring, the ONNX and ``torch.export`` graphs).

- ``platt`` (``Platt``): ``sigmoid(slope * logit + intercept)``, a logistic regression on the logit (Platt
  scaling). It keeps the order of the predictions, so AUC is unchanged.
- ``isotonic`` (``Isotonic``): a non-decreasing piecewise-linear curve through scikit-learn's isotonic regression
  of the label on the logit, interpolated linearly between its knots and flat beyond them. Equal predictions it
  creates can move AUC a little.
- ``none`` (``Identity``): ``sigmoid(logit)``, the model's own output (also what checkpoints made before
  calibration get).

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


def thin_knots(x: np.ndarray, y: np.ndarray, limit: int = MAX_ISOTONIC_KNOTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``limit`` knots of the piecewise-linear curve through ``(x, y)``: the first, the last, and knots
    spread evenly in order between them (their values are the curve's own, so it stays non-decreasing)."""
    if len(x) <= limit:
        return x, y
    keep = np.unique(np.linspace(0, len(x) - 1, limit).round().astype(np.int64))
    return x[keep], y[keep]


class Calibrator(nn.Module):
    """logits (B,) float32 -> calibrated click probabilities (B,) float32. One class per ``training.calibration``
    method (``CALIBRATORS``): ``fit`` on (label, logit) pairs, ``state`` the plain values a checkpoint stores,
    ``describe`` a line for logs; ``from_state`` builds any of them back. A new method is one more class."""

    method = ""
    stored = ()  # the names of its parameters in ``state``, as ``__init__`` takes them

    def __init__(self, rows: int = 0, **values):
        super().__init__()
        self.rows = rows  # the validation rows it was fitted on
        self.values = values  # its parameters as fitted: ``stored``'s names

    @classmethod
    def fit(cls, labels: np.ndarray, logits: np.ndarray) -> Calibrator:
        """Fitted on labels (N,) 0/1 and logits (N,)."""
        raise NotImplementedError

    @classmethod
    def restore(cls, state: dict) -> Calibrator:
        """Built from ``state``'s own keys (a checkpoint's state also holds the log losses it was judged by)."""
        return cls(**{name: state[name] for name in cls.stored}, rows=state.get("rows", 0))

    def state(self) -> dict:
        """``method``, ``rows`` and its parameters: what a checkpoint stores (``from_state`` reads it)."""
        return {"method": self.method, "rows": self.rows, **self.values}

    def detail(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for logs and summaries, e.g. ``platt (slope 0.981, intercept -0.042) fitted on 20,000
        validation rows``."""
        return f"{self.method} ({self.detail()}) fitted on {self.rows:,} validation rows"


class Identity(Calibrator):
    """``sigmoid(logit)``: the model's own output (what checkpoints made before calibration score with)."""

    method = "none"

    @classmethod
    def fit(cls, labels: np.ndarray, logits: np.ndarray) -> Identity:
        return cls(len(np.ravel(labels)))

    def describe(self) -> str:
        return "none (the model's own output)"

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits)


class Platt(Calibrator):
    """``sigmoid(slope * logit + intercept)``: a logistic regression on the logit."""

    method = "platt"
    stored = ("slope", "intercept")

    def __init__(self, slope: float, intercept: float, rows: int = 0):
        super().__init__(rows, slope=float(slope), intercept=float(intercept))
        self.register_buffer("slope", torch.tensor(slope, dtype=torch.float32))
        self.register_buffer("intercept", torch.tensor(intercept, dtype=torch.float32))

    @classmethod
    def fit(cls, labels: np.ndarray, logits: np.ndarray) -> Platt:
        from sklearn.linear_model import LogisticRegression

        labels, logits = _pairs(labels, logits)
        # A large C: the two parameters are fitted by maximum likelihood (a penalty would pull the slope to 0).
        fitted = LogisticRegression(C=1e6, tol=1e-8, max_iter=1000).fit(logits[:, None], labels)
        return cls(float(fitted.coef_[0, 0]), float(fitted.intercept_[0]), len(labels))

    def detail(self) -> str:
        return f"slope {self.values['slope']:.3f}, intercept {self.values['intercept']:+.3f}"

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits * self.slope + self.intercept)


class Isotonic(Calibrator):
    """A non-decreasing piecewise-linear curve through knots (logit, probability), flat beyond the first and last."""

    method = "isotonic"
    stored = ("knots_logit", "knots_probability")

    def __init__(self, knots_logit: torch.Tensor, knots_probability: torch.Tensor, rows: int = 0):
        super().__init__(rows, knots_logit=knots_logit, knots_probability=knots_probability)
        x, y = knots_logit.to(torch.float32), knots_probability.to(torch.float32)
        # Linear pieces between consecutive knots, as (start, width, rise): f(z) = y0 + sum rise * clamp((z - start) / width, 0, 1).
        self.register_buffer("first", y[:1].clone())
        self.register_buffer("starts", x[:-1].clone())
        self.register_buffer("widths", (x[1:] - x[:-1]).clamp_min(1e-12))
        self.register_buffer("rises", y[1:] - y[:-1])

    @classmethod
    def fit(cls, labels: np.ndarray, logits: np.ndarray) -> Isotonic:
        from sklearn.isotonic import IsotonicRegression

        labels, logits = _pairs(labels, logits)
        fitted = IsotonicRegression(out_of_bounds="clip", y_min=PROBABILITY_FLOOR, y_max=1 - PROBABILITY_FLOOR)
        fitted.fit(logits, labels)
        x, y = thin_knots(np.asarray(fitted.X_thresholds_, np.float64), np.asarray(fitted.y_thresholds_, np.float64))
        return cls(torch.from_numpy(x), torch.from_numpy(y), len(labels))

    def detail(self) -> str:
        return f"{len(self.values['knots_logit']):,} knots"

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        # z: (B, 1) against the knots (K-1,): written with clamps so that ONNX exports it as plain arithmetic.
        share = ((logits.unsqueeze(-1) - self.starts) / self.widths).clamp(0.0, 1.0)  # (B, K-1)
        return self.first + share @ self.rises


# ``training.calibration``'s methods.
CALIBRATORS: dict[str, type[Calibrator]] = {kind.method: kind for kind in (Identity, Platt, Isotonic)}


def calibrator(method: str) -> type[Calibrator]:
    """The class of ``training.calibration``'s ``method``."""
    if method not in CALIBRATORS:
        raise ValueError(f"unknown calibration method {method!r}: use one of {CALIBRATION_METHODS}")
    return CALIBRATORS[method]


def from_state(state: dict | None) -> Calibrator:
    """The calibrator a checkpoint stored (``Calibrator.state``), in eval mode; None (checkpoints made before
    calibration): ``Identity``, the raw output."""
    state = state or {"method": "none"}
    return calibrator(state["method"]).restore(state).eval()


def _pairs(labels: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels, dtype=np.float64).ravel()
    logits = np.asarray(logits, dtype=np.float64).ravel()
    if labels.min() == labels.max():
        raise ValueError(f"calibration needs both clicks and non-clicks; the {len(labels):,} rows have one class")
    return labels, logits

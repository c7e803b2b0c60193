import io

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import roc_auc_score

from criteo_dlrm.config.training import CALIBRATION_METHODS
from criteo_dlrm.engine.trained.calibration import CALIBRATORS, Identity, calibrator, from_state


def _miscalibrated(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a model that is right about the order but off in scale and level: the true probability is
    sigmoid(2 * logit - 1)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(-1.0, 1.0, rows)
    labels = rng.random(rows) < 1 / (1 + np.exp(-(2 * logits - 1)))
    return labels.astype(np.int8), logits


def test_platt_scaling_recovers_the_true_slope_and_intercept():
    labels, logits = _miscalibrated(400_000)
    state = calibrator("platt").fit(labels, logits).state()
    assert state["slope"] == pytest.approx(2.0, abs=0.03) and state["intercept"] == pytest.approx(-1.0, abs=0.03)
    probabilities = from_state(state)(torch.from_numpy(logits).float()).numpy()
    expected = 1 / (1 + np.exp(-(state["slope"] * logits + state["intercept"])))
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5)
    # Fitted by maximum likelihood with an intercept: the mean prediction is the observed click rate.
    assert probabilities.mean() == pytest.approx(labels.mean(), rel=1e-3)


def test_platt_scaling_keeps_the_order_so_auc_is_unchanged():
    labels, logits = _miscalibrated(50_000, seed=1)
    probabilities = from_state(calibrator("platt").fit(labels, logits).state())(torch.from_numpy(logits).float())
    assert roc_auc_score(labels, probabilities.numpy()) == pytest.approx(roc_auc_score(labels, logits), abs=1e-6)


def test_isotonic_calibration_is_scikit_learns_curve_inside_and_beyond_its_knots():
    labels, logits = _miscalibrated(20_000, seed=2)
    state = calibrator("isotonic").fit(labels, logits).state()
    reference = IsotonicRegression(out_of_bounds="clip", y_min=1e-6, y_max=1 - 1e-6).fit(logits, labels)
    points = np.concatenate([np.linspace(-8, 6, 5_000), logits[:1_000]])  # beyond both ends too
    ours = from_state(state)(torch.from_numpy(points).float()).numpy()
    np.testing.assert_allclose(ours, reference.predict(points), atol=1e-5)  # float32 knots
    assert np.all(np.diff(from_state(state)(torch.linspace(-8, 6, 1_000)).numpy()) >= -1e-7), "non-decreasing"


def test_no_calibration_is_the_models_own_probability_and_is_what_old_checkpoints_get():
    logits = torch.linspace(-5, 5, 11)
    torch.testing.assert_close(calibrator("none").fit([0, 1], [0.0, 1.0])(logits), torch.sigmoid(logits))
    torch.testing.assert_close(from_state(None)(logits), torch.sigmoid(logits))
    assert from_state(None).describe() == "none (the model's own output)"


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_a_calibration_state_survives_a_weights_only_checkpoint(method):
    labels, logits = _miscalibrated(5_000, seed=3)
    state = calibrator(method).fit(labels, logits).state()
    buffer = io.BytesIO()
    torch.save({"calibration": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    points = torch.linspace(-4, 4, 101)
    torch.testing.assert_close(from_state(loaded["calibration"])(points), from_state(state)(points))
    assert "fitted on 5,000 validation rows" in from_state(state).describe()


def test_calibration_refuses_one_class_and_unknown_methods():
    with pytest.raises(ValueError, match="both clicks and non-clicks"):
        calibrator("platt").fit(np.zeros(100), np.arange(100.0))
    with pytest.raises(ValueError, match="unknown calibration method 'beta'"):
        calibrator("beta")
    with pytest.raises(ValueError, match="unknown calibration method 'beta'"):
        from_state({"method": "beta", "rows": 3})


def test_an_isotonic_calibration_of_many_rows_keeps_at_most_its_knot_limit_and_scikit_learns_shape():
    from criteo_dlrm.engine.trained.calibration import MAX_ISOTONIC_KNOTS

    labels, logits = _miscalibrated(2_000_000, seed=4)
    reference = IsotonicRegression(out_of_bounds="clip", y_min=1e-6, y_max=1 - 1e-6).fit(logits, labels)
    assert len(reference.X_thresholds_) > MAX_ISOTONIC_KNOTS, "the case: more knots than the limit"
    state = calibrator("isotonic").fit(labels, logits).state()
    assert len(state["knots_logit"]) <= MAX_ISOTONIC_KNOTS
    points = np.sort(logits[:200_000])
    ours = from_state(state)(torch.from_numpy(points).float()).numpy()
    assert np.all(np.diff(ours) >= -1e-7), "still non-decreasing"
    # The thinned curve against scikit-learn's, row-weighted: what the calibrated probabilities lose.
    assert np.mean(np.abs(ours - reference.predict(points))) < 2e-3
    true = 1 / (1 + np.exp(-(2 * points - 1)))
    assert np.mean(np.abs(ours - true)) < np.mean(np.abs(reference.predict(points) - true)) + 1e-3


def test_thinning_keeps_both_ends_and_the_order_of_the_curve():
    from criteo_dlrm.engine.trained.calibration import thin_knots

    labels, logits = _miscalibrated(500_000, seed=5)
    reference = IsotonicRegression(out_of_bounds="clip", y_min=1e-6, y_max=1 - 1e-6).fit(logits, labels)
    x, y = thin_knots(reference.X_thresholds_, reference.y_thresholds_, 64)
    assert len(x) <= 64 and x[0] == reference.X_thresholds_[0] and x[-1] == reference.X_thresholds_[-1]
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) >= 0)
    points = np.sort(logits[:100_000])
    assert np.mean(np.abs(np.interp(points, x, y) - reference.predict(points))) < 5e-3


def test_each_method_the_settings_accept_is_one_calibrator_class_and_its_stored_state_builds_it_back():
    assert set(CALIBRATORS) == set(CALIBRATION_METHODS)
    labels, logits = _miscalibrated(5_000, seed=6)
    points = torch.linspace(-4, 4, 101)
    for method, kind in CALIBRATORS.items():
        fitted = kind.fit(labels, logits).eval()
        # A checkpoint's state holds the log losses it was judged by beside the calibrator's own values.
        stored = {**fitted.state(), "validation_log_loss": {"raw": 0.5, "calibrated": 0.4}, "warning": None}
        restored = from_state(stored)
        assert type(restored) is kind and restored.method == method and restored.rows == 5_000
        torch.testing.assert_close(restored(points), fitted(points))
        assert restored.describe() == fitted.describe()
    assert type(from_state(None)) is Identity

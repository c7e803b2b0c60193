import numpy as np
import pytest
import torch
from sklearn import metrics as sk

from criteo_dlrm.engine.trained import metrics
from criteo_dlrm.engine.trained.metrics import (
    MetricError,
    binary_metrics,
    entropy,
    log_loss,
    reliability_curve,
    roc_auc,
    roc_curve,
)


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_log_loss_match_sklearn_on_random_data(seed):
    rng = np.random.default_rng(seed)
    labels = rng.random(5000) < 0.3
    scores = np.clip(rng.random(5000) * 0.5 + labels * 0.3, 0, 1)
    assert roc_auc(labels, scores) == pytest.approx(sk.roc_auc_score(labels, scores), abs=1e-12)
    assert log_loss(labels, scores) == pytest.approx(sk.log_loss(labels, np.clip(scores, 1e-7, 1 - 1e-7)), rel=1e-9)


def test_auc_handles_heavy_ties_like_sklearn():
    rng = np.random.default_rng(1)
    labels = rng.random(20_000) < 0.2
    scores = np.round(rng.random(20_000) + labels * 0.2, 1)  # ~13 distinct values
    assert roc_auc(labels, scores) == pytest.approx(sk.roc_auc_score(labels, scores), abs=1e-12)
    assert roc_auc(labels, np.full(len(labels), 0.4)) == 0.5


def test_auc_on_a_hand_computed_example():
    # Pairs (pos, neg): (0.8 > 0.3), (0.8 > 0.5), (0.5 = 0.5 -> half), (0.5 > 0.3) -> 3.5 / 4
    assert roc_auc([1, 1, 0, 0], [0.8, 0.5, 0.5, 0.3]) == 0.875


def test_single_class_is_a_clear_error_not_nan():
    with pytest.raises(MetricError, match="0 clicks and 3 non-clicks"):
        roc_auc([0, 0, 0], [0.1, 0.2, 0.3])
    with pytest.raises(MetricError, match="No rows"):
        binary_metrics([], [])
    with pytest.raises(MetricError, match="NaN"):
        binary_metrics([0, 1], [0.5, np.nan])


def test_binary_metrics_by_hand():
    labels = np.array([1, 0, 0, 0])
    probabilities = np.array([0.6, 0.2, 0.2, 0.4])
    result = binary_metrics(labels, probabilities)
    expected_loss = -(np.log(0.6) + 2 * np.log(0.8) + np.log(0.6)) / 4
    assert result.log_loss == pytest.approx(expected_loss)
    assert result.normalized_entropy == pytest.approx(expected_loss / -(0.25 * np.log(0.25) + 0.75 * np.log(0.75)))
    assert result.calibration == pytest.approx(0.35 / 0.25)
    assert result.accuracy == 1.0 and result.auc == 1.0 and result.ctr == 0.25


def test_predicting_the_base_rate_has_normalized_entropy_one():
    labels = np.random.default_rng(0).random(10_000) < 0.1
    result = binary_metrics(labels, np.full(len(labels), labels.mean()))
    assert result.normalized_entropy == pytest.approx(1.0, abs=1e-6)
    assert entropy(labels.mean()) == pytest.approx(result.log_loss)


def test_roc_curve_matches_sklearn_points():
    rng = np.random.default_rng(3)
    labels = rng.random(500) < 0.4
    scores = np.round(rng.random(500), 2)
    fpr, tpr = roc_curve(labels, scores)
    sk_fpr, sk_tpr, _ = sk.roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)


def test_reliability_curve_bins_cover_every_row():
    labels = np.array([0, 0, 1, 1, 0, 1])
    curve = reliability_curve(labels, np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9]), bins=3)
    assert curve.rows.tolist() == [2, 2, 2]
    np.testing.assert_allclose(curve.predicted, [0.15, 0.5, 0.85])
    np.testing.assert_allclose(curve.observed, [0.0, 1.0, 0.5])


def test_calibration_report_bins_equal_rows_and_weights_the_gaps():
    from criteo_dlrm.engine.trained.metrics import calibration_report

    # Four bins of 5 rows, by prediction; a naive loop over the sorted rows is the reference.
    rng = np.random.default_rng(3)
    probabilities = rng.random(20)
    labels = (rng.random(20) < probabilities).astype(int)
    report = calibration_report(labels, probabilities, bins=4)
    order = np.argsort(probabilities)
    gaps = []
    for index, chunk in enumerate(np.split(order, 4)):
        predicted, observed = probabilities[chunk].mean(), labels[chunk].mean()
        gaps.append(abs(predicted - observed))
        assert report.bins[index]["rows"] == 5
        assert report.bins[index]["mean_prediction"] == pytest.approx(predicted)
        assert report.bins[index]["calibration"] == (pytest.approx(predicted / observed) if observed else None)
    assert report.expected_calibration_error == pytest.approx(np.mean(gaps))
    perfect = calibration_report(np.array([0, 1] * 50), np.full(100, 0.5), bins=10)
    assert perfect.expected_calibration_error == pytest.approx(0.0)


@pytest.mark.parametrize("clicks", [0.03, 0.25])
def test_auc_of_float32_scores_and_of_torch_tensors_matches_sklearn_with_ties(clicks):
    rng = np.random.default_rng(3)
    labels = rng.random(50_000) < clicks
    scores = (rng.random(50_000) * 0.2 + labels * 0.05).astype(np.float32)
    scores[:5000] = np.round(scores[:5000], 2)  # many ties, across the classes
    scores[-3:] = -0.0, 0.0, 0.0  # -0.0 ties with 0.0
    expected = sk.roc_auc_score(labels, scores)
    assert roc_auc(labels, scores) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(torch.from_numpy(labels), torch.from_numpy(scores)) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(labels.astype(np.int64), scores.astype(np.float64)) == pytest.approx(expected, abs=1e-12)


def test_torch_auc_refuses_one_class_and_nan_as_numpy_does():
    with pytest.raises(MetricError, match="0 clicks and 3 non-clicks"):
        roc_auc(torch.zeros(3), torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(MetricError, match="NaN"):
        roc_auc(torch.tensor([0, 1]), torch.tensor([0.5, float("nan")]))


def test_binary_metrics_of_float32_probabilities_match_sklearn_across_its_pieces():
    rng = np.random.default_rng(5)
    rows = 3 * metrics._PIECE + 17  # several of the one pass's pieces, the last one short
    labels = rng.random(rows) < 0.03
    scores = np.clip(rng.random(rows, dtype=np.float32) * 0.3 + labels * 0.1, 0, 1).astype(np.float32)
    scores[::7] = np.round(scores[::7], 3)
    result = binary_metrics(labels, scores)
    assert result.auc == pytest.approx(sk.roc_auc_score(labels, scores), abs=1e-12)
    assert result.log_loss == pytest.approx(sk.log_loss(labels, np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7)))
    assert result.accuracy == pytest.approx(sk.accuracy_score(labels, scores >= 0.5))


@pytest.mark.parametrize("device", ["numpy", "cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_float32_log_loss_clips_certain_scores_as_float64_s_and_warns_of_nothing(device, recwarn):
    """Scores of exactly 0 and 1 and the float32 values next to 1 and 0, each clicked and not, among ordinary
    scores at a 3% click rate: the log loss of float32 scores (logarithms in float32) is float64's (sklearn's on
    the widened scores) within float32 rounding, and no logarithm of 0 warns."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(11)
    edges = np.array([0.0, 1.0, np.nextafter(np.float32(1), np.float32(0)), np.float32(1e-8), np.float32(1e-7)])
    labels = np.concatenate([rng.random(50_000) < 0.03, np.repeat([False, True], len(edges))])
    scores = np.concatenate([rng.random(50_000) * 0.2, edges, edges]).astype(np.float32)
    expected = sk.log_loss(labels, np.clip(scores.astype(np.float64), 1e-7, 1 - 1e-7))
    if device == "numpy":
        got = binary_metrics(labels, scores).log_loss
    else:
        got = binary_metrics(torch.from_numpy(labels).to(device), torch.from_numpy(scores).to(device)).log_loss
    assert got == pytest.approx(expected, rel=1e-6)
    assert log_loss(labels, scores) == pytest.approx(expected, rel=1e-6)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in recwarn]


def _devices() -> list:
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _devices())
def test_metrics_of_tensors_are_computed_where_they_are_and_equal_numpy_s(device, monkeypatch):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(metrics, "_DEVICE_PIECE", 30_000)  # the sums in pieces, the last one short
    rng = np.random.default_rng(7)
    labels = rng.random(100_000) < 0.03
    scores = np.clip(rng.random(100_000, dtype=np.float32) * 0.2 + labels * 0.05, 0, 1).astype(np.float32)
    expected = binary_metrics(labels, scores)
    got = binary_metrics(labels, torch.from_numpy(scores).to(device))
    assert type(got) is type(expected)
    for name, value in expected.to_dict().items():
        # Each row's logarithm in float32, by torch's library and numpy's: within float32 rounding of each other.
        rel = 1e-6 if name in ("log_loss", "normalized_entropy") else 1e-12
        assert getattr(got, name) == pytest.approx(value, rel=rel, abs=1e-12), name

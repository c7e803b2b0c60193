"""Evaluating a checkpoint: metrics against scikit-learn's on the rows it scored, the test rows the metadata set
aside, and a checkpoint made before calibration."""

import dataclasses

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from criteo_dlrm.config.evaluation import EvaluationConfig
from criteo_dlrm.engine.trained.checkpoint import Checkpoint
from criteo_dlrm.engine.trained.evaluation import score_checkpoint as score
from tests.conftest import FLOAT32_ROUNDING

CONFIG = EvaluationConfig(device="cpu", precision="fp32")


@pytest.fixture
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


def score_checkpoint(checkpoint: Checkpoint, config: EvaluationConfig):
    return score(checkpoint, config)


def test_metrics_match_sklearn_on_the_scored_rows(checkpoint, tiny_features):
    # The fixture's metadata sets no test rows aside (as metadata made before test splits): the validation rows.
    metrics, labels, predictions, oracle = score_checkpoint(checkpoint, CONFIG)
    np.testing.assert_array_equal(labels, tiny_features["validation"].labels)
    assert metrics.rows_evaluated == "validation" and metrics.calibration_method == "platt"
    model, probabilities = metrics.model, predictions.calibrated
    assert model.rows == 1000
    assert model.auc == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-12)
    assert model.log_loss == pytest.approx(
        log_loss(labels, np.clip(probabilities.astype(float), 1e-7, 1 - 1e-7)), rel=1e-6
    )
    assert metrics.model_raw.auc == pytest.approx(checkpoint.best_validation.auc, abs=1e-9), (
        "same rows, same model as validation"
    )
    assert model.auc == pytest.approx(metrics.model_raw.auc, abs=1e-4), "Platt scaling keeps the order"
    state = checkpoint.calibration_state
    logits = np.log(predictions.raw.astype(float) / (1 - predictions.raw.astype(float)))
    np.testing.assert_allclose(
        probabilities, 1 / (1 + np.exp(-(state["slope"] * logits + state["intercept"]))), rtol=1e-4
    )
    # Fitted on these rows by maximum likelihood: the mean calibrated prediction is their click rate.
    assert model.calibration == pytest.approx(1.0, abs=0.01)
    assert metrics.prior_baseline.auc == 0.5
    assert metrics.checkpoint_version == "2026-11-30T01.00.00.000Z"
    assert metrics.metadata_version == tiny_features["vocabularies"].version
    np.testing.assert_array_equal(
        oracle, np.load(tiny_features["metadata"].source_days.validation[0].click_probability)
    )
    assert metrics.oracle.auc == pytest.approx(roc_auc_score(labels, oracle), abs=1e-12)
    assert metrics.gap_to_oracle["auc"] == pytest.approx(metrics.oracle.auc - model.auc)
    deciles = metrics.calibration_by_decile["calibrated"]
    assert len(deciles.bins) == 10 and sum(b["rows"] for b in deciles.bins) == 1000


def test_evaluation_reports_on_the_test_rows_the_metadata_set_aside(checkpoint, tiny_features):
    validation_day = tiny_features["metadata"].source_days.validation[0]
    source_days = dataclasses.replace(
        checkpoint.source_days, test=[dataclasses.replace(validation_day, row_range=[600, 1000])]
    )
    split = dataclasses.replace(
        checkpoint, trained_with=dataclasses.replace(checkpoint.trained_with, source_days=source_days)
    )
    metrics, labels, predictions, oracle = score_checkpoint(split, CONFIG)
    _, all_labels, all_predictions, all_oracle = score_checkpoint(checkpoint, CONFIG)
    assert metrics.rows_evaluated == "test" and metrics.model.rows == 400
    np.testing.assert_array_equal(labels, all_labels[600:])
    # Other batches than the whole day's (rows 600-999 alone): equal within float32 rounding on every CPU.
    np.testing.assert_allclose(predictions.calibrated, all_predictions.calibrated[600:], **FLOAT32_ROUNDING)
    np.testing.assert_array_equal(oracle, all_oracle[600:])
    assert metrics.model.auc == pytest.approx(roc_auc_score(labels, predictions.calibrated), abs=1e-12)


def test_a_checkpoint_made_before_calibration_evaluates_as_raw_and_says_so(checkpoint, logged):
    old = dataclasses.replace(checkpoint, calibration_state=None)
    metrics, _, predictions, _ = score_checkpoint(old, CONFIG)
    assert metrics.calibration_method == "none"
    np.testing.assert_array_equal(predictions.calibrated, predictions.raw)
    assert metrics.model == metrics.model_raw
    assert any("was made before calibration" in line for line in logged)

import numpy as np
import pytest
import torch
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.runner import SequentialRunner
from kedro_datasets.matplotlib import MatplotlibDataset
from PIL import Image
from sklearn.metrics import log_loss, roc_auc_score

from criteo_dlrm.engine.scoring import VocabularyMismatchError
from criteo_dlrm.pipelines.evaluation import create_pipeline
from criteo_dlrm.pipelines.evaluation.nodes import _score, evaluate_checkpoint
from criteo_dlrm.pipelines.training.nodes import train_dlrm
from tests.conftest import FLOAT32_ROUNDING
from tests.pipelines.training.test_pipeline import training_params


@pytest.fixture(scope="module")
def checkpoint(tiny_features, tmp_path_factory):
    params = training_params(tmp_path_factory.mktemp("train"), num_epochs=1)
    checkpoint, _ = train_dlrm(
        tiny_features["train"],
        tiny_features["validation"],
        tiny_features["metadata"],
        tiny_features["vocabularies"],
        params,
        "v",
    )
    return {**checkpoint, "catalog_version": "2026-11-30T01.00.00.000Z"}


PARAMS = {"device": "cpu", "precision": "fp32"}


def test_metrics_match_sklearn_on_the_scored_rows(checkpoint, tiny_features):
    # The fixture's metadata sets no test rows aside (as metadata made before test splits): the validation rows.
    metrics, labels, predictions, oracle = _score(checkpoint, PARAMS)
    np.testing.assert_array_equal(labels, tiny_features["validation"].labels)
    assert metrics["rows_evaluated"] == "validation" and metrics["calibration_method"] == "platt"
    model, probabilities = metrics["model"], predictions["calibrated"]
    assert model["rows"] == 1000
    assert model["auc"] == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-12)
    assert model["log_loss"] == pytest.approx(
        log_loss(labels, np.clip(probabilities.astype(float), 1e-7, 1 - 1e-7)), rel=1e-6
    )
    assert metrics["model_raw"]["auc"] == pytest.approx(checkpoint["best_validation"]["auc"], abs=1e-9), (
        "same rows, same model as validation"
    )
    assert model["auc"] == pytest.approx(metrics["model_raw"]["auc"], abs=1e-4), "Platt scaling keeps the order"
    state = checkpoint["calibration"]
    logits = np.log(predictions["raw"].astype(float) / (1 - predictions["raw"].astype(float)))
    np.testing.assert_allclose(
        probabilities, 1 / (1 + np.exp(-(state["slope"] * logits + state["intercept"]))), rtol=1e-4
    )
    # Fitted on these rows by maximum likelihood: the mean calibrated prediction is their click rate.
    assert model["calibration"] == pytest.approx(1.0, abs=0.01)
    assert metrics["prior_baseline"]["auc"] == 0.5
    assert metrics["checkpoint_version"] == "2026-11-30T01.00.00.000Z"
    assert metrics["metadata_version"] == tiny_features["vocabularies"].version
    np.testing.assert_array_equal(
        oracle, np.load(tiny_features["metadata"]["source_days"]["validation"][0]["click_probability"])
    )
    assert metrics["oracle"]["auc"] == pytest.approx(roc_auc_score(labels, oracle), abs=1e-12)
    assert metrics["gap_to_oracle"]["auc"] == pytest.approx(metrics["oracle"]["auc"] - model["auc"])
    deciles = metrics["calibration_by_decile"]["calibrated"]
    assert len(deciles["bins"]) == 10 and sum(b["rows"] for b in deciles["bins"]) == 1000


def test_evaluation_reports_on_the_test_rows_the_metadata_set_aside(checkpoint, tiny_features):
    validation_day = tiny_features["metadata"]["source_days"]["validation"][0]
    source_days = {**checkpoint["metadata"]["source_days"], "test": [{**validation_day, "row_range": [600, 1000]}]}
    split = {**checkpoint, "metadata": {**checkpoint["metadata"], "source_days": source_days}}
    metrics, labels, predictions, oracle = _score(split, PARAMS)
    _, all_labels, all_predictions, all_oracle = _score(checkpoint, PARAMS)
    assert metrics["rows_evaluated"] == "test" and metrics["model"]["rows"] == 400
    np.testing.assert_array_equal(labels, all_labels[600:])
    # Other batches than the whole day's (rows 600-999 alone): equal within float32 rounding on every CPU.
    np.testing.assert_allclose(predictions["calibrated"], all_predictions["calibrated"][600:], **FLOAT32_ROUNDING)
    np.testing.assert_array_equal(oracle, all_oracle[600:])
    assert metrics["model"]["auc"] == pytest.approx(roc_auc_score(labels, predictions["calibrated"]), abs=1e-12)


def test_a_checkpoint_made_before_calibration_evaluates_as_raw_and_says_so(checkpoint, logged):
    old = {key: value for key, value in checkpoint.items() if key != "calibration"}
    metrics, _, predictions, _ = _score(old, PARAMS)
    assert metrics["calibration_method"] == "none"
    np.testing.assert_array_equal(predictions["calibrated"], predictions["raw"])
    assert metrics["model"] == metrics["model_raw"]
    assert any("was made before calibration" in line for line in logged)


def test_a_checkpoint_whose_vocabularies_were_altered_is_refused(checkpoint):
    damaged = {**checkpoint, "encoder": {**checkpoint["encoder"]}}
    vocabularies = list(damaged["encoder"]["vocabularies"])
    vocabularies[3] = torch.flip(vocabularies[3], dims=[0])
    damaged["encoder"]["vocabularies"] = vocabularies
    with pytest.raises(VocabularyMismatchError, match="not the ones it was trained with"):
        evaluate_checkpoint(damaged, PARAMS)


def test_pipeline_writes_readable_non_empty_plots(checkpoint, tmp_path):
    plots = {
        name: MatplotlibDataset(filepath=str(tmp_path / f"{name}.png"), version=Version(None, "v1"))
        for name in ("roc_curve_plot", "calibration_plot", "score_histogram_plot")
    }
    catalog = DataCatalog(
        {
            "dlrm_checkpoint": MemoryDataset(checkpoint),
            "params:evaluation": MemoryDataset(PARAMS),
            "evaluation_metrics": MemoryDataset(),
            **plots,
        }
    )
    SequentialRunner().run(create_pipeline(), catalog)
    for name in plots:
        [png] = (tmp_path / f"{name}.png").glob("*/*.png")
        image = Image.open(png).convert("L")
        assert image.size[0] >= 600 and image.size[1] >= 400, name
        assert len(image.getcolors(maxcolors=1 << 16)) > 50, f"{name} is blank"


def test_the_calibration_plot_uses_the_report_s_bins_with_intervals_and_names_its_checkpoint_and_rows(checkpoint):
    from matplotlib.container import ErrorbarContainer

    metrics, _, calibration, _ = evaluate_checkpoint(
        {**checkpoint, "catalog_version": "2026-01-01T00.00.00.000Z"}, PARAMS
    )
    [axes] = calibration.axes
    title = axes.get_title()
    assert "checkpoint 2026-01-01T00.00.00.000Z" in title and f"{metrics['model']['rows']:,} " in title
    curves = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
    assert len(curves) == 2, "the raw output and the calibrated probabilities"
    for curve, name in zip(curves, ("raw", "calibrated"), strict=True):
        report = metrics["calibration_by_decile"][name]
        x, y = curve.lines[0].get_data()
        assert len(x) == len(report["bins"]) == 10, "the JSON's and the ECE's bins"
        np.testing.assert_allclose(y, [b["observed_ctr"] for b in report["bins"]])
        assert f"ECE {report['expected_calibration_error']:.4f}" in curve.get_label()
    assert axes.get_legend()._loc == 4, "lower right, clear of the top points"


def test_each_bin_s_interval_is_the_wilson_interval_of_its_clicks():
    from scipy.stats import binomtest

    from criteo_dlrm.engine.metrics import calibration_report

    rng = np.random.default_rng(0)
    probabilities = rng.random(1500) * 0.06
    labels = (rng.random(1500) < probabilities).astype(np.int8)  # 3% CTR, about 45 clicks
    for entry in calibration_report(labels, probabilities)["bins"]:
        clicks = round(entry["observed_ctr"] * entry["rows"])
        reference = binomtest(clicks, entry["rows"]).proportion_ci(method="wilson")
        assert entry["observed_ctr_interval"] == pytest.approx([reference.low, reference.high], abs=1e-12)


def test_a_bin_without_a_click_has_an_interval_from_zero_and_plots():
    from criteo_dlrm.engine.metrics import calibration_report
    from criteo_dlrm.engine.plots import calibration_figure

    probabilities = np.linspace(0.001, 0.05, 210)
    labels = np.zeros(210, np.int8)
    labels[-3:] = 1  # every bin but the last without a click; bins of 21 rows (where rounding went below 0)
    report = calibration_report(labels, probabilities)
    assert report["bins"][0]["observed_ctr_interval"][0] == 0.0
    calibration_figure(labels, {"raw model output": probabilities}, "Calibration")

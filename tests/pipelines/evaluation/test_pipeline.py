import dataclasses

import numpy as np
import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.runner import SequentialRunner
from kedro_datasets.matplotlib import MatplotlibDataset
from PIL import Image

from criteo_dlrm.engine.trained.scoring import VocabularyMismatchError
from criteo_dlrm.pipelines.evaluation import create_pipeline
from criteo_dlrm.pipelines.evaluation.nodes import evaluate_checkpoint
from tests.conftest import with_altered_vocabulary


@pytest.fixture
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


PARAMS = {"device": "cpu", "precision": "fp32"}


def test_a_checkpoint_whose_vocabularies_were_altered_is_refused(checkpoint):
    damaged = with_altered_vocabulary(checkpoint, 3)
    with pytest.raises(VocabularyMismatchError, match="not the ones it was trained with"):
        evaluate_checkpoint(damaged, PARAMS)


def test_pipeline_writes_readable_non_empty_plots(checkpoint, tmp_path):
    plots = {
        name: MatplotlibDataset(
            filepath=str(tmp_path / f"{name}.png"), version=Version(None, "2026-01-01T00.00.00.000Z")
        )
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

    metrics, roc, calibration, histogram = evaluate_checkpoint(
        dataclasses.replace(checkpoint, version="2026-01-01T00.00.00.000Z"), PARAMS
    )
    for figure in (roc, calibration, histogram):  # the ROC curve and the histogram said neither (issue 45 item 6)
        title = figure.axes[0].get_title()
        assert "checkpoint 2026-01-01T00.00.00.000Z" in title and f"{metrics.model.rows:,} " in title, title
    [axes] = calibration.axes
    curves = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
    assert len(curves) == 2, "the raw output and the calibrated probabilities"
    for curve, name in zip(curves, ("raw", "calibrated"), strict=True):
        report = metrics.calibration_by_decile[name]
        x, y = curve.lines[0].get_data()
        assert len(x) == len(report.bins) == 10, "the JSON's and the ECE's bins"
        np.testing.assert_allclose(y, [b["observed_ctr"] for b in report.bins])
        assert f"ECE {report.expected_calibration_error:.4f}" in curve.get_label()
    assert axes.get_legend()._loc == 4, "lower right, clear of the top points"


def test_each_bin_s_interval_is_the_wilson_interval_of_its_clicks():
    from scipy.stats import binomtest

    from criteo_dlrm.engine.trained.metrics import calibration_report

    rng = np.random.default_rng(0)
    probabilities = rng.random(1500) * 0.06
    labels = (rng.random(1500) < probabilities).astype(np.int8)  # 3% CTR, about 45 clicks
    for entry in calibration_report(labels, probabilities).bins:
        clicks = round(entry["observed_ctr"] * entry["rows"])
        reference = binomtest(clicks, entry["rows"]).proportion_ci(method="wilson")
        assert entry["observed_ctr_interval"] == pytest.approx([reference.low, reference.high], abs=1e-12)


def test_a_bin_without_a_click_has_an_interval_from_zero_and_plots():
    from criteo_dlrm.engine.trained.metrics import calibration_report
    from criteo_dlrm.engine.trained.plots import calibration_figure

    probabilities = np.linspace(0.001, 0.05, 210)
    labels = np.zeros(210, np.int8)
    labels[-3:] = 1  # every bin but the last without a click; bins of 21 rows (where rounding went below 0)
    report = calibration_report(labels, probabilities)
    assert report.bins[0]["observed_ctr_interval"][0] == 0.0
    calibration_figure(labels, {"raw model output": probabilities}, "Calibration")

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
    metrics, labels, probabilities, oracle = _score(checkpoint, PARAMS)
    np.testing.assert_array_equal(labels, tiny_features["validation"].labels)
    model = metrics["model"]
    assert model["rows"] == 1000
    assert model["auc"] == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-12)
    assert model["log_loss"] == pytest.approx(
        log_loss(labels, np.clip(probabilities.astype(float), 1e-7, 1 - 1e-7)), rel=1e-6
    )
    assert model["auc"] == pytest.approx(checkpoint["best_validation"]["auc"], abs=1e-9), (
        "same rows, same model as validation"
    )
    assert metrics["prior_baseline"]["auc"] == 0.5
    assert metrics["checkpoint_version"] == "2026-11-30T01.00.00.000Z"
    assert metrics["metadata_version"] == tiny_features["vocabularies"].version
    np.testing.assert_array_equal(
        oracle, np.load(tiny_features["metadata"]["source_days"]["validation"][0]["click_probability"])
    )
    assert metrics["oracle"]["auc"] == pytest.approx(roc_auc_score(labels, oracle), abs=1e-12)
    assert metrics["gap_to_oracle"]["auc"] == pytest.approx(metrics["oracle"]["auc"] - model["auc"])


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
            "validation_metrics": MemoryDataset(),
            **plots,
        }
    )
    SequentialRunner().run(create_pipeline(), catalog)
    for name in plots:
        [png] = (tmp_path / f"{name}.png").glob("*/*.png")
        image = Image.open(png).convert("L")
        assert image.size[0] >= 600 and image.size[1] >= 400, name
        assert len(image.getcolors(maxcolors=1 << 16)) > 50, f"{name} is blank"

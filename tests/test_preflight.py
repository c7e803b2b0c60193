"""The checks before a run are keyed on the node functions a pipeline runs, not on node names."""

import pytest
from kedro.io import DataCatalog
from kedro.pipeline import Node, Pipeline

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config import EvaluationConfig
from criteo_dlrm.pipelines.evaluation.nodes import evaluate_checkpoint
from criteo_dlrm.preflight import check_before_run


def _evaluation(name: str) -> Pipeline:
    outputs = ["evaluation_metrics", "roc_curve_plot", "calibration_plot", "score_histogram_plot"]
    return Pipeline([Node(evaluate_checkpoint, ["dlrm_checkpoint", "params:evaluation"], outputs, name=name)])


@pytest.mark.parametrize("name", ["evaluate_checkpoint", "my_own_evaluation"])
def test_a_node_keeps_its_checks_whatever_it_is_named(name):
    configs = {"evaluation": EvaluationConfig(device="cuda:99")}
    with pytest.raises(ConfigError, match="evaluation.device"):
        check_before_run(configs, _evaluation(name), DataCatalog({}))


def test_a_pipeline_without_the_node_is_not_checked_for_it():
    configs = {"evaluation": EvaluationConfig(device="cuda:99")}
    check_before_run(configs, Pipeline([]), DataCatalog({}))

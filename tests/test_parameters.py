import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.parameters import ParameterError, check_parameters, load_schema, unknown_parameters
from tests.conftest import PROJECT_ROOT


@pytest.fixture(scope="module")
def schema():
    return load_schema(PROJECT_ROOT / "conf" / "base")


def test_the_shipped_parameters_are_all_known(schema):
    assert unknown_parameters(schema, schema) == []
    assert set(schema) == {"ingestion", "metadata", "training", "evaluation"}


def test_misspelt_names_are_reported_with_the_closest_known_one(schema):
    given = {"training": {"num_epoch": 5, "batch_size": {"trian": 8}, "seed": 1}, "trainng": {}}
    assert unknown_parameters(given, schema) == [
        "training.num_epoch (did you mean training.num_epochs?)",
        "training.batch_size.trian (did you mean training.batch_size.train?)",
        "trainng (did you mean training?)",
    ]


def test_free_form_mappings_and_runtime_only_names_are_accepted(schema):
    given = {"metadata": {"vocabulary_size_overrides": {"SPARSE_2": 10}}, "ingestion": {"raw_dir": "/data"}}
    check_parameters(given, schema)


@pytest.mark.slow
def test_a_run_with_a_misspelt_parameter_stops_before_any_node(project):
    bootstrap_project(project)
    with (
        pytest.raises(ParameterError, match=r"training.num_epoch \(did you mean training.num_epochs\?\)"),
        KedroSession.create(project_path=project, runtime_params={"training": {"num_epoch": 1}}) as session,
    ):
        session.run(pipeline_names=["ingestion"])
    assert not (project / "data/02_intermediate/ingestion_report.json").exists()

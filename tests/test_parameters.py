import copy

import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.parameters import (
    ParameterError,
    check_parameters,
    load_schema,
    missing_parameters,
    unknown_parameters,
)
from tests.conftest import PROJECT_ROOT


@pytest.fixture(scope="module")
def schema():
    return load_schema(PROJECT_ROOT / "conf" / "base")


def test_the_shipped_parameters_are_all_known(schema):
    assert unknown_parameters(schema, schema) == []
    assert set(schema) == {"ingestion", "metadata", "training", "evaluation", "scoring"}


def test_misspelt_names_are_reported_with_the_closest_known_one(schema):
    given = {"training": {"num_epoch": 5, "batch_size": {"trian": 8}, "seed": 1}, "trainng": {}}
    assert unknown_parameters(given, schema) == [
        "training.num_epoch (did you mean training.num_epochs?)",
        "training.batch_size.trian (did you mean training.batch_size.train?)",
        "trainng (did you mean training?)",
    ]


def _shipped(schema) -> dict:
    given = copy.deepcopy(schema)
    del given["ingestion"]["raw_dir"]  # runtime-only: absent unless given on the command line
    return given


def test_free_form_mappings_and_runtime_only_names_are_accepted(schema):
    check_parameters(_shipped(schema), schema)
    given = _shipped(schema)
    given["metadata"]["vocabulary_size_overrides"] = {"SPARSE_2": 10}
    given["ingestion"]["raw_dir"] = "/data"
    check_parameters(given, schema)


def test_missing_keys_are_reported_before_anything_runs(schema):
    given = _shipped(schema)
    given["training"] = {**given["training"], "dense_mlp": {"hidden_layer_sizes": [128, 64]}}
    del given["training"]["sparse_embedding_sizes"]
    assert missing_parameters(given, schema) == ["training.dense_mlp.output_size", "training.sparse_embedding_sizes"]
    with pytest.raises(ParameterError, match=r"Missing parameter\(s\): training.dense_mlp.output_size, "):
        check_parameters(given, schema)


@pytest.mark.slow
def test_a_partial_override_in_conf_local_merges_into_conf_base(project):
    (project / "conf" / "local" / "parameters.yml").write_text(
        "training:\n  dense_mlp:\n    hidden_layer_sizes: [128, 64]\n"
    )
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params={"training": {"max_steps": 3}}) as session:
        params = session.load_context().params
        session.run()
    assert params["training"]["dense_mlp"] == {"hidden_layer_sizes": [128, 64], "output_size": 16}
    assert params["training"]["sparse_embedding_sizes"] == 16 and params["training"]["max_steps"] == 3
    [version] = (project / "data/06_models/dlrm_checkpoint.pt").iterdir()
    import torch

    checkpoint = torch.load(version / "dlrm_checkpoint.pt", weights_only=True)
    assert checkpoint["model_config"]["dense_hidden_sizes"] == [128, 64]


@pytest.mark.slow
def test_a_run_with_a_misspelt_parameter_stops_before_any_node(project):
    bootstrap_project(project)
    with (
        pytest.raises(ParameterError, match=r"training.num_epoch \(did you mean training.num_epochs\?\)"),
        KedroSession.create(project_path=project, runtime_params={"training": {"num_epoch": 1}}) as session,
    ):
        session.run(pipeline_names=["ingestion"])
    assert not (project / "data/02_intermediate/ingestion_report.json").exists()


def test_a_run_with_a_wrongly_typed_training_parameter_stops_before_any_node(project):
    from criteo_dlrm.common.errors import ConfigError

    bootstrap_project(project)
    with (
        pytest.raises(ConfigError, match=r"training.num_epochs must be an integer, got 'abc'"),
        KedroSession.create(project_path=project, runtime_params={"training": {"num_epochs": "abc"}}) as session,
    ):
        session.run(pipeline_names=["ingestion"])
    assert not list((project / "data/02_intermediate").rglob("*.parquet"))


def test_the_torchrec_backend_without_torchrec_installed_stops_naming_the_install_command(schema, monkeypatch):
    from criteo_dlrm.common.errors import ConfigError

    monkeypatch.setitem(__import__("sys").modules, "torchrec", None)  # as if the extra were not installed
    given = copy.deepcopy(schema)
    given["training"]["embedding_backend"] = "torchrec"
    given["training"]["embedding_optimizer"] = "rowwise_adagrad"
    with pytest.raises(ConfigError, match=r"needs TorchRec and FBGEMM .*pip install fbgemm-gpu-cpu==1\.8\.0"):
        check_parameters(given, schema)
    check_parameters(schema, schema)  # the default torch backend needs nothing extra

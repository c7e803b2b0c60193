"""Every pipeline's parameters through one typed mechanism: defaults are conf/base's, problems refused at once."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config import CONFIGS, ParameterError, parse_parameters
from criteo_dlrm.config.metadata import MetadataConfig
from tests.conftest import PROJECT_ROOT


@pytest.fixture(scope="module")
def shipped() -> dict:
    tree = {}
    for path in sorted((PROJECT_ROOT / "conf" / "base").glob("parameters*.yml")):
        tree.update(yaml.safe_load(path.read_text()))
    return tree


def test_every_pipelines_defaults_are_conf_bases(shipped):
    assert (
        set(shipped) == set(CONFIGS) == {"preprocessing", "ingestion", "metadata", "training", "evaluation", "scoring"}
    )
    for section, config in CONFIGS.items():
        assert config().to_dict() == shipped[section], f"{section}: the dataclass defaults drifted from conf/base"
        assert config.from_dict(shipped[section], f"{section}.") == config()


def test_misspelt_names_are_reported_with_the_closest_known_one(shipped):
    given = copy.deepcopy(shipped)
    given["training"].update({"num_epoch": 5, "batch_size": {"trian": 8}})
    given["trainng"] = {}
    with pytest.raises(ParameterError) as caught:
        parse_parameters(given)
    message = str(caught.value)
    assert "training.num_epoch is not a parameter (did you mean training.num_epochs?)" in message
    assert "training.batch_size.trian is not a parameter (did you mean training.batch_size.train?)" in message
    assert "trainng is not a parameter block (did you mean training?)" in message


def test_a_block_that_leaves_keys_out_gets_conf_bases_defaults(shipped):
    configs = parse_parameters({"training": {"dense_mlp": {"hidden_layer_sizes": [128, 64]}}})
    assert configs["training"].dense_mlp.output_size == 32 and configs["training"].sparse_embedding_sizes == 32
    assert configs["ingestion"].raw_dir == shipped["ingestion"]["raw_dir"]


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("ingestion", {"workers": 0}, "ingestion.workers must be >= 1 (or null), got 0"),
        ("ingestion", {"block_size_mb": 0}, "ingestion.block_size_mb must be from 1/64 to 2048 (MB), got 0.0"),
        ("ingestion", {"max_reject_fraction": -1}, "ingestion.max_reject_fraction must be a share from 0 to 1"),
        ("ingestion", {"rows_per_day": "many"}, "ingestion.rows_per_day must be an integer or null, got 'many'"),
        ("metadata", {"validation_days": ["day_2"], "train_days": ["day_1", "day_2"]}, "both list ['day_2']"),
        ("metadata", {"validation_days": []}, "metadata.validation_days must list at least one day"),
        ("training", {"learning_rate": float("inf")}, "training.learning_rate must be a finite number, got inf"),
        ("training", {"early_stopping": {"min_delta": float("nan")}}, "min_delta must be a finite number, got nan"),
        ("training", {"sparse_embedding_sizes": 0, "dense_mlp": {"output_size": 0}}, "sizes must be positive"),
        ("training", {"device": "gpu"}, "training.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        ("evaluation", {"precision": "fp16"}, "evaluation.precision must be one of ('fp32', 'bf16')"),
        ("scoring", {"export": {"tolerance": 0}}, "scoring.export.tolerance must be positive, got 0.0"),
    ],
)
def test_nonsense_values_of_every_pipeline_are_refused_naming_the_parameter(section, values, message):
    with pytest.raises(ParameterError) as caught:
        parse_parameters({section: values})
    assert message in str(caught.value)


def test_the_torchrec_backend_without_torchrec_installed_stops_naming_the_install_command(monkeypatch):
    from kedro.pipeline import Pipeline

    from criteo_dlrm.pipelines.training import create_pipeline
    from criteo_dlrm.preflight import check_before_run

    monkeypatch.setitem(__import__("sys").modules, "torchrec", None)  # as if the extra were not installed
    configs = parse_parameters(
        {"training": {"embedding_backend": "torchrec", "embedding_optimizer": "rowwise_adagrad"}}
    )

    class NoCatalog:
        def get(self, name):
            return None

    with pytest.raises(ConfigError, match=r"needs TorchRec and FBGEMM .*pip install fbgemm-gpu-cpu==1\.8\.0"):
        check_before_run(configs, create_pipeline(), NoCatalog())
    check_before_run(parse_parameters({}), Pipeline([]), NoCatalog())  # nothing to check, nothing needed


@pytest.mark.slow
def test_a_partial_override_in_conf_local_merges_into_conf_base(project):
    (project / "conf" / "local" / "parameters.yml").write_text(
        "training:\n  dense_mlp:\n    hidden_layer_sizes: [128, 64]\n"
    )
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params={"training": {"max_steps": 3}}) as session:
        params = session.load_context().params
        session.run()
    assert params["training"]["dense_mlp"] == {"hidden_layer_sizes": [128, 64], "output_size": 32}
    assert params["training"]["sparse_embedding_sizes"] == 32 and params["training"]["max_steps"] == 3
    [version] = (project / "data/06_models/dlrm_checkpoint.pt").iterdir()
    checkpoint = torch.load(version / "dlrm_checkpoint.pt", weights_only=True)
    assert checkpoint["model_config"]["dense_mlp"]["hidden_layer_sizes"] == [128, 64]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["conf_local", "params"])
def test_the_raw_folder_is_read_from_conf_local_and_from_the_command_line(project, tmp_path, where):
    from criteo_dlrm.data.synthetic import write_days

    own = tmp_path / "own"
    write_days(own, days=2, rows_per_day=300, seed=5)
    runtime = {"ingestion": {"raw_dir": str(own)}} if where == "params" else None
    if where == "conf_local":
        (project / "conf" / "local" / "parameters.yml").write_text(f"ingestion:\n  raw_dir: {own}\n")
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params=runtime) as session:
        session.run(pipeline_names=["ingestion"])
    report = yaml.safe_load((project / "data/02_intermediate/ingestion_report.json").read_text())
    assert report["raw_dir"] == str(own) and [day["rows"] for day in report["days"]] == [300, 300]


@pytest.mark.slow
def test_a_run_with_a_misspelt_parameter_stops_before_any_node(project):
    bootstrap_project(project)
    with (
        pytest.raises(
            ParameterError, match=r"training.num_epoch is not a parameter \(did you mean training.num_epochs\?\)"
        ),
        KedroSession.create(project_path=project, runtime_params={"training": {"num_epoch": 1}}) as session,
    ):
        session.run(pipeline_names=["ingestion"])
    assert not (project / "data/02_intermediate/ingestion_report.json").exists()


@pytest.mark.parametrize(
    ("runtime", "pipelines", "message"),
    [
        ({"training": {"num_epochs": "abc"}}, ["ingestion"], r"training.num_epochs must be an integer, got 'abc'"),
        ({"training": {"sparse_embedding_sizes": 0}}, None, r"sizes must be positive"),
        ({"metadata": {"validation_days": ["day_9"]}}, None, r"metadata.validation_days names \['day_9'\]"),
        ({"ingestion": {"workers": 0}}, None, r"ingestion.workers must be >= 1"),
        ({"training": {"device": "cuda:99"}}, None, r"training.device is 'cuda:99' but"),
    ],
)
def test_bad_parameters_stop_the_run_before_any_node(project, runtime, pipelines, message):
    bootstrap_project(project)
    with (
        pytest.raises(ConfigError, match=message),
        KedroSession.create(project_path=project, runtime_params=runtime) as session,
    ):
        session.run(pipeline_names=pipelines)
    assert not list((project / "data/02_intermediate").rglob("*.parquet")), "nothing ran"


def test_a_modulus_hash_size_without_the_modulus_hash_is_refused_not_ignored():
    from criteo_dlrm.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"modulus_hash_size is 200,000,000 but metadata.use_modulus_hash is false"):
        MetadataConfig.from_dict({"modulus_hash_size": 200_000_000}, "metadata.")
    MetadataConfig.from_dict({"modulus_hash_size": 1000, "use_modulus_hash": True}, "metadata.")

"""Whole-project runs in a temporary copy: `kedro run`, reruns from the catalog, pinned versions."""

import json
from pathlib import Path

import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.pipeline_registry import register_pipelines
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow


def _run(project: Path, **kwargs) -> None:
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params=kwargs.pop("runtime_params", None)) as session:
        session.run(**kwargs)


def _versions(project: Path, name: str) -> list[str]:
    return sorted(p.name for p in (project / name).iterdir())


def _load(project: Path, name: str, version: str) -> dict:
    return json.loads((project / name / version / Path(name).name).read_text())


def test_registry_has_every_pipeline_and_default_runs_them_all():
    bootstrap_project(PROJECT_ROOT)
    pipelines = register_pipelines()
    assert set(pipelines) == {"__default__", "ingestion", "metadata", "training", "evaluation"}
    default_nodes = {node.name for node in pipelines["__default__"].nodes}
    assert default_nodes == {
        "convert_raw_days", "compute_feature_metadata", "encode_features", "train_dlrm", "evaluate_checkpoint"
    }  # fmt: skip


def test_kedro_run_then_catalog_driven_reruns_and_pinned_evaluation(project):
    fast = {"training": {"num_epochs": 1}}
    _run(project, runtime_params=fast)
    [first_checkpoint] = _versions(project, "data/06_models/dlrm_checkpoint.pt")
    [first_metadata] = _versions(project, "data/04_feature/feature_metadata.json")
    [first_eval] = _versions(project, "data/08_reporting/validation_metrics.json")
    first_metrics = _load(project, "data/08_reporting/validation_metrics.json", first_eval)
    assert (
        first_metrics["checkpoint_version"] == first_checkpoint and first_metrics["metadata_version"] == first_metadata
    )
    assert (project / "data/08_reporting/tensorboard" / first_checkpoint).is_dir(), (
        "TensorBoard run named after the checkpoint"
    )
    assert 0.6 < first_metrics["model"]["auc"] < first_metrics["oracle"]["auc"]
    parquet = project / "data/02_intermediate/day_0.parquet"
    converted = parquet.stat().st_mtime_ns

    # New metadata (other parameters) and a second model, trained from the persisted Parquet.
    _run(
        project,
        pipeline_names=["metadata", "training"],
        runtime_params={"metadata": {"min_frequency": 1}, "training": {"num_epochs": 1, "seed": 3}},
    )
    assert parquet.stat().st_mtime_ns == converted, "no re-ingestion"
    checkpoints = _versions(project, "data/06_models/dlrm_checkpoint.pt")
    metadata_versions = _versions(project, "data/04_feature/feature_metadata.json")
    assert len(checkpoints) == 2 and len(metadata_versions) == 2

    # Training again alone reuses the latest metadata.
    _run(project, pipeline_names=["training"], runtime_params=fast)
    assert len(_versions(project, "data/06_models/dlrm_checkpoint.pt")) == 3

    # The older checkpoint, pinned, is scored with its own metadata version and reproduces its metrics.
    _run(project, pipeline_names=["evaluation"], load_versions={"dlrm_checkpoint": first_checkpoint})
    pinned = _load(
        project,
        "data/08_reporting/validation_metrics.json",
        _versions(project, "data/08_reporting/validation_metrics.json")[-1],
    )
    assert pinned["checkpoint_version"] == first_checkpoint
    assert pinned["metadata_version"] == first_metadata != metadata_versions[-1]
    assert pinned["model"] == pytest.approx(first_metrics["model"])

    import torch

    second = torch.load(
        project / "data/06_models/dlrm_checkpoint.pt" / checkpoints[1] / "dlrm_checkpoint.pt", weights_only=True
    )
    assert second["metadata"]["version"] == metadata_versions[1]
    assert second["training_parameters"]["seed"] == 3, "--params overrides are recorded with the checkpoint"
    assert (
        second["training_parameters"]["num_epochs"] == 1 and second["training_parameters"]["batch_size"]["train"] == 256
    )

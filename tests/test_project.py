"""Whole-project runs in a temporary copy: `kedro run`, reruns from the catalog, pinned versions."""

import json
from pathlib import Path

import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.pipeline_registry import register_pipelines
from tests.conftest import FLOAT32_ROUNDING, PROJECT_ROOT

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
    assert set(pipelines) == {"__default__", "ingestion", "metadata", "training", "evaluation", "scoring"}
    default_nodes = {node.name for node in pipelines["__default__"].nodes}
    assert default_nodes == {
        "convert_raw_days", "compute_feature_metadata", "encode_features", "train_dlrm", "evaluate_checkpoint"
    }  # fmt: skip


def test_kedro_run_then_catalog_driven_reruns_and_pinned_evaluation(project):
    fast = {"training": {"num_epochs": 1}}
    _run(project, runtime_params=fast)
    [first_checkpoint] = _versions(project, "data/06_models/dlrm_checkpoint.pt")
    [first_metadata] = _versions(project, "data/04_feature/feature_metadata.json")
    [first_eval] = _versions(project, "data/08_reporting/evaluation_metrics.json")
    first_metrics = _load(project, "data/08_reporting/evaluation_metrics.json", first_eval)
    assert (
        first_metrics["checkpoint_version"] == first_checkpoint and first_metrics["metadata_version"] == first_metadata
    )
    assert (project / "data/08_reporting/tensorboard" / first_checkpoint).is_dir(), (
        "TensorBoard run named after the checkpoint"
    )
    assert 0.6 < first_metrics["model"]["auc"] < first_metrics["oracle"]["auc"]
    report = json.loads((project / "data/02_intermediate/ingestion_report.json").read_text())
    parquet = project / report["days"][0]["parquet"]
    converted = parquet.stat().st_mtime_ns

    # New metadata (other parameters) and a second model, trained from the persisted Parquet.
    _run(
        project,
        pipeline_names=["metadata", "training"],
        runtime_params={
            "metadata": {"min_frequency": 1, "min_expected_clicks": 0},
            "training": {"num_epochs": 1, "seed": 3},
        },
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
        "data/08_reporting/evaluation_metrics.json",
        _versions(project, "data/08_reporting/evaluation_metrics.json")[-1],
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


def _real_folder(folder: Path, days: list[list[str]]) -> Path:
    folder.mkdir(parents=True)
    for index, lines in enumerate(days):
        (folder / f"day_{index}").write_text("".join(lines))
    return folder


def _newest(project: Path, name: str) -> str:
    return _versions(project, name)[-1]


def test_pinned_reruns_on_real_rows_use_exactly_their_data_or_refuse(project, real_data, tmp_path):
    from criteo_dlrm.data.lineage import LineageError

    kaggle = _real_folder(
        tmp_path / "kaggle",
        [
            (real_data / "kaggle_dac_train_first10k.tsv").read_text().splitlines(keepends=True),
            (real_data / "kaggle_dac_train_random4584.tsv").read_text().splitlines(keepends=True),
        ],
    )
    terabyte_rows = (real_data / "terabyte_day0_first10k.tsv").read_text().splitlines(keepends=True)
    terabyte = _real_folder(tmp_path / "terabyte", [terabyte_rows[:5000], terabyte_rows[5000:]])
    fast = {"num_epochs": 1, "batch_size": {"train": 128, "validation": 16384}}
    checkpoints, metrics = "data/06_models/dlrm_checkpoint.pt", "data/08_reporting/evaluation_metrics.json"

    # 1. Kaggle rows: checkpoint A.
    _run(project, runtime_params={"ingestion": {"raw_dir": str(kaggle)}, "training": fast})
    a_checkpoint, a_metadata = _newest(project, checkpoints), _newest(project, "data/04_feature/feature_metadata.json")
    a_metrics = _load(project, metrics, _newest(project, metrics))
    assert a_metrics["model"]["rows"] == 2292 and a_metrics["rows_evaluated"] == "test", "day_1's second half tests"
    assert [d["source"]["path"] for d in a_metrics["source_days"]] == [str((kaggle / "day_1").resolve())]

    # 2. Terabyte rows: checkpoint B, Parquet in its own folder.
    _run(project, runtime_params={"ingestion": {"raw_dir": str(terabyte)}, "training": fast})
    assert _load(project, metrics, _newest(project, metrics))["model"]["rows"] == 2500

    # 3. A pinned: scores A's own test rows and reproduces A's metrics, within float32 rounding: the scores' last
    # bits follow PyTorch's thread count, which each run's training chooses by the cores idle at its start and the
    # evaluations after it keep (in this process: this evaluation-only run, the second run's choice).
    _run(project, pipeline_names=["evaluation"], load_versions={"dlrm_checkpoint": a_checkpoint})
    pinned = _load(project, metrics, _newest(project, metrics))
    assert pinned["checkpoint_version"] == a_checkpoint and pinned["model"]["rows"] == a_metrics["model"]["rows"]
    assert pinned["model"] == pytest.approx(a_metrics["model"], rel=FLOAT32_ROUNDING["rtol"])

    # 4. Training pinned to A's metadata trains on A's rows (the Kaggle days), not on what was ingested last.
    _run(
        project,
        pipeline_names=["training"],
        load_versions={"feature_metadata": a_metadata, "feature_vocabularies": a_metadata},
        runtime_params={"training": fast},
    )
    summary = _load(
        project, "data/08_reporting/training_summary.json", _newest(project, "data/08_reporting/training_summary.json")
    )
    assert summary["metadata_version"] == a_metadata
    assert [d["rows"] for d in summary["source_days"]["train"]] == [10_000]
    assert summary["best_validation"]["rows"] == 2292, "day_1's first half validates"

    # The data under A changes (its raw day edited and converted again): pinned reruns refuse, naming it.
    with (kaggle / "day_1").open("a") as handle:
        handle.write((real_data / "kaggle_dac_train_first10k.tsv").read_text().splitlines(keepends=True)[0])
    _run(project, pipeline_names=["ingestion"], runtime_params={"ingestion": {"raw_dir": str(kaggle)}})
    written = len(_versions(project, metrics))
    with pytest.raises(LineageError, match=r"day_1: .*day_1.parquet has changed since \(4,584 rows then, 4,585 now\)"):
        _run(project, pipeline_names=["evaluation"], load_versions={"dlrm_checkpoint": a_checkpoint})
    with pytest.raises(LineageError, match=rf"feature_metadata version {a_metadata} was made from data"):
        _run(
            project,
            pipeline_names=["training"],
            load_versions={"feature_metadata": a_metadata, "feature_vocabularies": a_metadata},
        )
    assert len(_versions(project, metrics)) == written, "refused before writing anything"


def test_a_pinned_version_that_does_not_exist_lists_the_ones_that_do(ran_project, monkeypatch):
    from criteo_dlrm.hooks import MissingVersionError

    monkeypatch.chdir(ran_project)
    [existing] = _versions(ran_project, "data/06_models/dlrm_checkpoint.pt")
    with pytest.raises(MissingVersionError) as error:
        _run(ran_project, pipeline_names=["evaluation"], load_versions={"dlrm_checkpoint": "2020-01-01T00.00.00.000Z"})
    message = str(error.value)
    assert message.startswith("dlrm_checkpoint version 2020-01-01T00.00.00.000Z does not exist.")
    assert existing in message and "--load-versions=dlrm_checkpoint:<version>" in message

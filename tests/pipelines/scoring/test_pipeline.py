"""The scoring pipeline through a KedroSession on a project copy after `kedro run`."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import pytest
import torch
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.source_days import SourceDays
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.engine.trained.calibration import from_state
from criteo_dlrm.engine.trained.checkpoint import Checkpoint, model_from_checkpoint
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.engine.trained.reports import EvaluationReport, ExportReport, ScoringReport
from criteo_dlrm.engine.trained.scoring import calibrated, score_days
from tests.conftest import FLOAT32_ROUNDING, with_altered_vocabulary

pytestmark = pytest.mark.slow


def _run(project: Path, **kwargs) -> None:
    bootstrap_project(project)
    with KedroSession.create(project_path=project, runtime_params=kwargs.pop("runtime_params", None)) as session:
        session.run(**kwargs)


def _newest(project: Path, name: str) -> Path:
    folder = project / name
    return folder / sorted(p.name for p in folder.iterdir())[-1] / Path(name).name


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A project copy after `kedro run` (one epoch) and one scoring run of its own raw days."""

    from tests.conftest import copy_project

    project = copy_project(tmp_path_factory.mktemp("scoring") / "project")
    previous = Path.cwd()
    os.chdir(project)
    try:
        _run(project, runtime_params={"training": {"num_epochs": 1}})
        _run(project, pipeline_names=["scoring"])
        yield project
    finally:
        os.chdir(previous)


def test_scoring_the_validation_day_reproduces_the_evaluation_exactly(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(trained)
    folder = tmp_path / "validation_only"
    folder.mkdir()
    shutil.copy(trained / "data/01_raw/day_2.gz", folder / "day_2.gz")
    _run(
        trained,
        pipeline_names=["scoring"],
        runtime_params={"scoring": {"input_dir": str(folder)}},
        node_names=["score_new_days"],
    )
    report = json.loads(_newest(trained, "data/07_model_output/scoring_report.json").read_text())
    evaluation = json.loads(_newest(trained, "data/08_reporting/evaluation_metrics.json").read_text())
    assert ScoringReport.from_dict(report).others == {}, "the report is its record: every key a field"
    assert EvaluationReport.from_dict(evaluation).others == {}
    assert report["checkpoint_version"] == evaluation["checkpoint_version"]
    assert report["calibration_method"] == evaluation["calibration_method"] == "platt"
    # Evaluation reports on the test rows, the day's second half: the same rows of the predictions give the same.
    [test] = evaluation["source_days"]
    assert test["day"] == "day_2" and test["row_range"] == [10_000, 20_000]
    predictions = pd.read_parquet(_newest(trained, "data/07_model_output/predictions.parquet"))
    tested = predictions.iloc[10_000:]
    # Evaluation scored the second half alone, scoring the whole day: other batches, so equal within float32
    # rounding (the kernels, and so the last bits, depend on the batch shape and the CPU).
    metrics = binary_metrics(tested["label"].to_numpy(), tested["click_probability"].to_numpy())
    assert metrics.to_dict() == pytest.approx(evaluation["model"], rel=FLOAT32_ROUNDING["rtol"])

    checkpoint = torch.load(_newest(trained, "data/06_models/dlrm_checkpoint.pt"), weights_only=True)
    _, logits = score_days(
        model_from_checkpoint(checkpoint),
        FeatureEncoder.from_state_dict(checkpoint["encoder"]),
        [test["parquet"]],
    )
    assert np.array_equal(predictions["logit"].to_numpy(), logits), "the same rows in the same batches: bit for bit"
    expected = calibrated(from_state(checkpoint["calibration"]), logits)
    assert np.array_equal(predictions["click_probability"].to_numpy(), expected)
    assert predictions["row"].tolist() == list(range(1, 20_001)), "line numbers of the raw file"


def test_unlabelled_files_are_scored_with_line_numbers_and_rejects(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(trained)
    with gzip.open(trained / "data/01_raw/day_2.gz", "rt") as handle:
        lines = [line.split("\t", 1)[1] for line in handle][:3000]  # Criteo's test layout: 39 fields
    lines.insert(10, "not\ta\trow\n")
    folder = tmp_path / "unlabelled"
    folder.mkdir()
    (folder / "test.txt").write_text("".join(lines))
    params = {"scoring": {"input_dir": str(folder), "max_reject_fraction": 0.01}}
    _run(trained, pipeline_names=["scoring"], runtime_params=params, node_names=["score_new_days"])
    report = json.loads(_newest(trained, "data/07_model_output/scoring_report.json").read_text())
    assert report["rows"] == 3000 and report["labelled"] is False and report["metrics"] is None
    assert report["source_days"][0]["source"]["path"] == str((folder / "test.txt").resolve())
    predictions = pd.read_parquet(_newest(trained, "data/07_model_output/predictions.parquet"))
    assert predictions["label"].isna().all()
    assert predictions["row"].tolist() == [*range(1, 11), *range(12, 3002)], "line 11 was rejected"
    rejects = list((trained / "data/07_model_output/scoring_input").glob("unlabelled-*/test.rejects.tsv"))
    assert len(rejects) == 1 and "\t11\t3 fields, expected 39\t" in rejects[0].read_text()

    labelled = pd.read_parquet(_first_scoring_run(trained))
    day_2 = labelled[labelled["day"] == "day_2"].set_index("row")["click_probability"]
    original_lines = [row if row < 11 else row - 1 for row in predictions["row"]]  # a line was inserted at 11
    # Other batch boundaries than the labelled run's, so float rounding may differ in the last place.
    np.testing.assert_allclose(predictions["click_probability"], day_2.loc[original_lines], rtol=0, atol=1e-6)


def _first_scoring_run(project: Path) -> Path:
    folder = project / "data/07_model_output/predictions.parquet"
    return folder / sorted(p.name for p in folder.iterdir())[0] / "predictions.parquet"


def test_raw_rows_through_the_exported_files_give_the_scoring_pipelines_probabilities(trained):
    """A serving system's view: raw TSV lines, serving_encoder.npz and dlrm.onnx, no criteo_dlrm code."""
    encoder = np.load(_newest(trained, "data/06_models/serving_encoder.npz"))
    session = onnxruntime.InferenceSession(
        str(_newest(trained, "data/06_models/dlrm.onnx")), providers=["CPUExecutionProvider"]
    )
    first, unseen, missing = (int(encoder[name]) for name in ("first_row", "unseen_row", "missing_row"))
    assert (first, unseen, missing) == (2, 0, 1)
    lookups = [{int(v): first + i for i, v in enumerate(encoder[f"SPARSE_{f}"])} for f in range(26)]
    with gzip.open(trained / "data/01_raw/day_1.gz", "rt") as handle:
        lines = [next(handle) for _ in range(500)]
    dense = np.zeros((500, 13), np.float32)
    sparse = np.zeros((500, 26), np.int64)
    for row, line in enumerate(lines):
        fields = line.rstrip("\n").split("\t")
        for i, text in enumerate(fields[1:14]):
            if text:
                dense[row, i] = (np.log1p(max(int(text), 0)) - encoder["dense_mean"][i]) / encoder["dense_std"][i]
        for f, text in enumerate(fields[14:]):
            sparse[row, f] = lookups[f].get(int(text, 16), unseen) if text else missing
    [served] = session.run(["probability"], {"dense": dense, "sparse": sparse})
    scored = pd.read_parquet(_first_scoring_run(trained))
    expected = scored[scored["day"] == "day_1"]["click_probability"].to_numpy()[:500]
    assert np.abs(served - expected).max() <= 1e-5
    report = json.loads(_newest(trained, "data/06_models/export_report.json").read_text())
    assert report["onnx_check"]["max_abs_difference"] <= 1e-5 and report["exported_program_bytes"] > 0
    assert ExportReport.from_dict(report).others == {}, "the report is its record: every key a field"


def test_the_mlflow_model_of_the_run_gives_the_scoring_pipelines_probabilities_and_registers(trained, monkeypatch):
    """The training run's model in MLflow's format, loaded by URI: raw fields in, the same probabilities out."""
    import mlflow

    from tests.tracking.test_model import raw_frame

    monkeypatch.chdir(trained)
    mlflow.set_tracking_uri(f"sqlite:///{trained}/data/09_tracking/mlflow.db")
    version = json.loads(_newest(trained, "data/07_model_output/scoring_report.json").read_text())
    # The training run (its lineage tags); scoring runs name their checkpoint too, and carry no model.
    runs = mlflow.search_runs(experiment_names=["criteo_dlrm"], filter_string="tags.train_days != ''")
    [run_id] = runs["run_id"]
    scoring = mlflow.search_runs(experiment_names=["criteo_dlrm"], filter_string="tags.scored_days != ''")
    assert set(scoring["tags.checkpoint_version"]) == {runs["tags.checkpoint_version"].iloc[0]}, "which model scored"
    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    with gzip.open(trained / "data/01_raw/day_1.gz", "rt") as handle:
        lines = [next(handle) for _ in range(500)]
    predicted = np.asarray(model.predict(raw_frame(lines)))
    scored = pd.read_parquet(_first_scoring_run(trained))
    expected = scored[scored["day"] == "day_1"]["click_probability"].to_numpy()[:500]
    np.testing.assert_allclose(predicted, expected, rtol=0, atol=1e-6)
    assert version["checkpoint_version"] == runs["tags.checkpoint_version"].iloc[0]
    registered = mlflow.register_model(f"runs:/{run_id}/model", "criteo-dlrm")
    from_registry = mlflow.pyfunc.load_model(f"models:/criteo-dlrm/{registered.version}")
    first = raw_frame(lines[:50])  # scored in a batch of 50, not 500: equal within float32 rounding
    np.testing.assert_allclose(np.asarray(from_registry.predict(first)), predicted[:50], **FLOAT32_ROUNDING)
    whole = first.copy()  # counts as whole numbers: int64 where none is missing, nullable Int64 elsewhere
    for name in whole.columns[:13]:
        column = whole[name].astype("Int64")
        whole[name] = column.astype("int64") if not column.isna().any() else column
    assert "int64" in set(map(str, whole.dtypes)) and "Int64" in set(map(str, whole.dtypes))
    np.testing.assert_array_equal(np.asarray(from_registry.predict(whole)), from_registry.predict(first))


def test_a_checkpoint_made_before_calibration_scores_its_raw_output_and_says_so(trained, tmp_path, monkeypatch, logged):

    from criteo_dlrm.pipelines.scoring.nodes import score_new_days

    monkeypatch.chdir(trained)
    checkpoint = torch.load(_newest(trained, "data/06_models/dlrm_checkpoint.pt"), weights_only=True)
    old = Checkpoint.from_dict({key: value for key, value in checkpoint.items() if key != "calibration"})
    folder = tmp_path / "days"
    folder.mkdir()
    shutil.copy(trained / "data/01_raw/day_2.gz", folder / "day_2.gz")
    params = {"input_dir": str(folder), "parquet_dir": str(tmp_path / "parquet"), "device": "cpu"}
    staged, report = score_new_days(old, params)
    assert report.calibration_method == "none"
    predictions = pd.read_parquet(staged)
    raw = 1 / (1 + np.exp(-predictions["logit"].to_numpy().astype(np.float64)))
    np.testing.assert_allclose(predictions["click_probability"].to_numpy(), raw, rtol=1e-6)
    assert any("was made before calibration" in line for line in logged)


def test_the_serving_recipe_of_the_docs_runs_as_written_and_scores_what_the_pipeline_scores(trained):
    import sys

    from tests.conftest import PROJECT_ROOT

    page = (PROJECT_ROOT / "docs/scoring.md").read_text()
    serving = page[page.index("## Serving") :]
    code = re.search(r"```python\n(.*?)```", serving, re.DOTALL).group(1)
    result = subprocess.run([sys.executable, "-c", code], cwd=trained, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = float(re.search(r"click probability ([0-9.]+)", result.stdout).group(1))
    scored = pd.read_parquet(_first_scoring_run(trained))
    assert printed == pytest.approx(scored[scored["day"] == "day_1"]["click_probability"].iloc[0], abs=2e-6)


def test_export_refuses_a_checkpoint_whose_vocabularies_were_altered(tiny_checkpoint):
    from criteo_dlrm.engine.trained.scoring import VocabularyMismatchError
    from criteo_dlrm.pipelines.scoring.nodes import export_model

    damaged = with_altered_vocabulary(tiny_checkpoint, 5)
    with pytest.raises(VocabularyMismatchError, match="dlrm_checkpoint version .* not the ones it was trained with"):
        export_model(damaged, {})


def _checkpoint(tmp_path: Path):
    """A small trained checkpoint and a raw folder of 400 rows to score."""
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.engine.training.recipe import run_training

    write_day(tmp_path / "raw" / "day_0", 400, day=0, model=ClickModel(seed=3))
    write_day(tmp_path / "train" / "day_0", 2000, day=0, model=ClickModel(seed=3))
    parquet = Path(convert_day(tmp_path / "train" / "day_0", tmp_path / "train.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(min_expected_clicks=0), progress=False)
    metadata = dataclasses.replace(metadata, source_days=SourceDays())
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    rows = encoder.encode_days([parquet])
    config = TrainingConfig.from_dict(
        {"num_epochs": 1, "resume": False, "tensorboard_dir": str(tmp_path / "tb"), "validations_per_epoch": 1}
    )
    checkpoint, _ = run_training(config, rows, rows, metadata, vocabularies, "r")
    return dataclasses.replace(checkpoint, version="v")


def test_scoring_leaves_nothing_behind_and_removes_what_a_killed_scoring_left(tmp_path):
    from criteo_dlrm.pipelines.scoring.nodes import score_new_days

    parquet_dir = tmp_path / "scoring_input"
    parquet_dir.mkdir()
    stale = parquet_dir / f".predictions.parquet.{2**22 + 99}.0123abcd.partial"  # a pid no process has
    stale.write_bytes(b"half")
    checkpoint = _checkpoint(tmp_path)
    staged, report = score_new_days(checkpoint, {"input_dir": str(tmp_path / "raw"), "parquet_dir": str(parquet_dir)})
    assert not stale.exists() and staged.parent == parquet_dir and staged.name.endswith(".partial")
    assert report.rows == 400

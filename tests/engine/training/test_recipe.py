"""The training recipe's checks around a run: click rates that do not belong together, extreme calibrations."""

from __future__ import annotations

import dataclasses
import errno
import json

import numpy as np
import pytest
import torch

from criteo_dlrm.data.source_days import SourceDay, SourceDays
from criteo_dlrm.engine.trained.reports import Metrics, TrainingSummary
from criteo_dlrm.engine.training.recipe import calibration_warning, click_rate_warning
from criteo_dlrm.summary import RunRecord, render

DAYS = SourceDays(train=[SourceDay(day="day_0"), SourceDay(day="day_1")], validation=[SourceDay(day="terabyte_0")])


def _labels(rows: int, ctr: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(rows) < ctr).astype(np.uint8)


def test_two_datasets_in_one_folder_are_named_with_both_click_rates_and_their_days():
    warning = click_rate_warning(0.234, 40_000, _labels(20_000, 0.027), DAYS)
    assert warning and "day_0, day_1: CTR 0.2340, 40,000 rows" in warning and "terabyte_0: CTR 0.02" in warning
    assert "8." in warning.split("x apart")[0][-4:], warning


def test_click_rates_that_chance_or_a_day_s_drift_explains_say_nothing():
    assert click_rate_warning(0.2544, 40_000, _labels(10_000, 0.2544 * 1.055, seed=1), DAYS) is None  # the sample
    assert click_rate_warning(0.25, 40, _labels(20, 0.1, seed=2), DAYS) is None, "20 rows: chance"
    assert click_rate_warning(0.031, 4_000_000_000, _labels(1_000_000, 0.033, seed=3), DAYS) is None, "1TB's drift"


def test_an_extreme_calibration_is_named_and_a_usual_one_is_not():
    assert "slope is 6.60" in calibration_warning({"method": "platt", "slope": 6.6}, 9.8)
    assert "9.80x the validation rows' click rate" in calibration_warning({"method": "isotonic"}, 9.8)
    assert calibration_warning({"method": "platt", "slope": 1.04}, 0.94) is None


def test_the_run_summary_shows_the_warnings_in_short_lines():
    warning = click_rate_warning(0.234, 40_000, _labels(20_000, 0.027), DAYS)
    validation = Metrics(rows=10, ctr=0.25, auc=0.7, log_loss=0.5, normalized_entropy=0.9, calibration=1.0,
                         accuracy=0.75)  # fmt: skip
    summary = TrainingSummary(steps=10, stopped_early=False, best_step=10, samples_per_second=1.0,
                              best_validation=validation, warnings=[warning])  # fmt: skip
    text = render(RunRecord(version="v", saved={"training_summary": summary}))
    assert "warning: the training days (day_0, day_1" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.slow
def test_a_finished_run_whose_checkpoint_could_not_be_stored_is_stored_by_the_rerun_without_retraining(
    project, monkeypatch
):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from criteo_dlrm.datasets import torch_checkpoint_dataset

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    runtime = {"training": {"num_epochs": 1, "validations_per_epoch": 1}}
    bootstrap_project(project)
    with monkeypatch.context() as patched:
        patched.setattr(torch_checkpoint_dataset.TorchCheckpointDataset, "save", full)
        with pytest.raises(Exception, match="No space left"), KedroSession.create(project, runtime_params=runtime) as s:
            s.run(pipeline_names=["ingestion", "metadata", "training"])
    [in_progress] = (project / "data/06_models/in_progress").glob("dlrm_*.pt")
    finished = torch.load(in_progress, weights_only=True)
    assert finished["step"] == 157, "the finished run's state is kept"
    assert not list((project / "data/08_reporting/training_summary.json").glob("*/training_summary.json"))
    with KedroSession.create(project, runtime_params=runtime) as session:
        session.run(pipeline_names=["training"])
    [summary] = (project / "data/08_reporting/training_summary.json").glob("*/training_summary.json")
    stored = json.loads(summary.read_text())
    assert stored["steps"] == 157 and [h["step"] for h in stored["history"]] == [157], "resumed at its end"
    assert not in_progress.exists(), "removed once the checkpoint is stored"


def _finished_run(tmp_path, **settings):
    """A tiny run trained with resume on (8 steps of 2,000 rows), its rows and metadata, and its outputs as the
    catalog's latest finished run."""
    import dataclasses

    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.synthetic import ClickModel, write_day
    from criteo_dlrm.engine.training.recipe import FinishedRun, run_training

    write_day(tmp_path / "train" / "day_0", 2000, day=0, model=ClickModel(seed=3))
    parquet = convert_day(tmp_path / "train" / "day_0", tmp_path / "train.parquet").parquet
    metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(min_expected_clicks=0), progress=False)
    metadata = dataclasses.replace(metadata, source_days=SourceDays())
    rows = FeatureEncoder.from_metadata(metadata, vocabularies).encode_days([parquet])

    def config(**changed):
        values = {"num_epochs": 1, "validations_per_epoch": 1, "tensorboard_dir": str(tmp_path / "tb"),
                  "in_progress_dir": str(tmp_path / "in_progress"), **settings, **changed}  # fmt: skip
        return TrainingConfig.from_dict(values)

    checkpoint, summary = run_training(config(), rows, rows, metadata, vocabularies, "first")
    finished = FinishedRun("first", summary, lambda: dataclasses.replace(checkpoint, version="first"))
    return config, (rows, metadata, vocabularies), finished


def test_a_finished_run_is_reused_only_as_its_checkpoint_s_own_fingerprint_says_with_this_code(
    tmp_path, monkeypatch, logged
):
    """Issue 62 items 1 and 4: the code was not part of a finished run's identity (an upgrade reused the model the
    old code trained), and the reuse read the fingerprint from the summary alone (a summary and its checksum copied
    from another run made a 20-step model count as the default run's)."""
    from criteo_dlrm.engine.trained import checkpoint as checkpoints
    from criteo_dlrm.engine.training import recipe
    from criteo_dlrm.engine.training.recipe import FinishedRun, run_training

    config, (rows, metadata, vocabularies), finished = _finished_run(tmp_path)
    stored = finished.checkpoint()
    assert stored.fingerprint == finished.summary.fingerprint and stored.code == checkpoints.code_identity()

    _, summary = run_training(config(), rows, rows, metadata, vocabularies, "second", previous=finished)
    assert summary.reused_version == "first" and summary.reused_differences == []

    # Another run's checkpoint under this summary (its fingerprint inside is another's): trained again.
    other = FinishedRun("first", finished.summary, lambda: dataclasses.replace(stored, fingerprint="0123456789abcdef"))
    _, summary = run_training(config(), rows, rows, metadata, vocabularies, "third", previous=other)
    assert summary.reused_version is None and summary.fingerprint == finished.summary.fingerprint
    assert summary.trained_because == "version first's checkpoint is not the run its summary names"
    assert any("but its checkpoint was trained with other ones" in line for line in logged), logged

    # The same settings and rows, other code (an upgrade): trained again, and said why.
    changed = {**checkpoints.code_identity(), "source_sha256": "f" * 64}
    monkeypatch.setattr(recipe, "code_identity", lambda: changed)
    _, summary = run_training(config(), rows, rows, metadata, vocabularies, "fourth", previous=finished)
    assert summary.reused_version is None and summary.code == changed
    assert summary.fingerprint != finished.summary.fingerprint
    assert summary.trained_because.startswith("version first was trained by other code (criteo_dlrm ")
    assert any("not reused: version first was trained by other code" in line for line in logged)


def test_a_reused_run_whose_settings_left_out_of_its_identity_differ_says_so_and_how_to_train_anyway(tmp_path, logged):
    """Issue 62 item 1: after a 1-process run, the same run with distributed.nproc_per_node=2 trained nothing and
    reported the 1-process model with only "reused version"."""
    from criteo_dlrm.engine.training.recipe import run_training
    from criteo_dlrm.summary import RunRecord, render

    config, (rows, metadata, vocabularies), finished = _finished_run(tmp_path)
    changed = config(distributed={"nproc_per_node": 2}, log_every_steps=5)
    _, summary = run_training(changed, rows, rows, metadata, vocabularies, "second", previous=finished)
    assert summary.reused_version == "first" and summary.processes == 1
    assert summary.reused_differences == [
        "training.log_every_steps 20 there, 5 here",
        "training.distributed.nproc_per_node 1 there, 2 here",
    ]
    [warning] = [line for line in logged if "settings that leave the model as it is" in line]
    assert (
        "training.distributed.nproc_per_node 1 there, 2 here" in warning
        and "kedro run --params=training.resume=false" in warning
    )
    text = render(RunRecord(version="second", saved={"training_summary": summary}))
    assert "the reused run differs in training.log_every_steps 20 there, 5 here;" in text, text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_run_that_does_not_reuse_the_finished_one_says_why_in_its_summary(tmp_path):
    """Issue 62 item 12: a rerun that trained again said only that it trained, not what kept it from reusing."""
    from criteo_dlrm.engine.training.recipe import run_training
    from criteo_dlrm.summary import RunRecord, render

    config, (rows, metadata, vocabularies), finished = _finished_run(tmp_path)
    assert finished.summary.trained_because is None, "nothing to compare: the first run"
    _, summary = run_training(config(learning_rate=0.01, batch_size={"train": 128}), rows, rows, metadata,
                              vocabularies, "second", previous=finished)  # fmt: skip
    assert summary.trained_because == (
        "version first trained with other training.batch_size.train, training.learning_rate"
    )
    text = render(RunRecord(version="second", saved={"training_summary": summary}))
    assert "  not reused: version first trained with other training.batch_size.train," in text, text

    _, reused = run_training(config(), rows, rows, metadata, vocabularies, "fourth", previous=finished)
    assert reused.reused_version == "first" and reused.trained_because is None

"""The training recipe's checks around a run: click rates that do not belong together, extreme calibrations."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import torch

from criteo_dlrm.engine.recipe import calibration_warning, click_rate_warning
from criteo_dlrm.summary import RunRecord, render

DAYS = {"train": [{"day": "day_0"}, {"day": "day_1"}], "validation": [{"day": "terabyte_0"}]}


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
    summary = {"steps": 10, "stopped_early": False, "best_step": 10, "samples_per_second": 1.0, "warnings": [warning]}
    summary["best_validation"] = {"auc": 0.7, "log_loss": 0.5, "normalized_entropy": 0.9, "calibration": 1.0}
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

"""A training job and its outcome through their files: typed on both sides, and nothing else accepted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from criteo_dlrm.common.errors import ConfigError, DataError
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine.trained.reports import Metrics, Target, Validation
from criteo_dlrm.engine.trained.result import TrainingResult
from criteo_dlrm.engine.training.job import TrainingJob, TrainingOutcome
from tests.conftest import TINY_MODEL


def _job(tmp_path, **config) -> TrainingJob:
    values = {**TINY_MODEL, "tensorboard_dir": str(tmp_path / "tb"), "in_progress_dir": str(tmp_path / "p"), **config}
    return TrainingJob(TrainingConfig.from_dict(values), "train_rows", "validation_rows", [5] * 26, "f1", "v1", 0.25)


def test_a_job_file_gives_back_the_job_with_its_configuration_typed(tmp_path):
    job = _job(tmp_path, batch_size={"train": 64}, embedding_optimizer="adagrad")
    job.save(tmp_path / "job.json")
    loaded = TrainingJob.load(tmp_path / "job.json")
    assert loaded == job and isinstance(loaded.config, TrainingConfig)
    assert loaded.config.batch_size.train == 64 and loaded.config.embedding_optimizer == "adagrad"
    assert loaded.run_dir == tmp_path / "tb" / "v1"
    assert loaded.resume_path == tmp_path / "p" / "dlrm_f1.pt"
    assert _job(tmp_path, resume=False).resume_path is None


def test_a_job_file_of_another_kind_or_with_settings_out_of_range_is_refused(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"format": 99}))
    with pytest.raises(DataError, match=f"{path} is not a training job file"):
        TrainingJob.load(path)
    _job(tmp_path).save(path)
    values = json.loads(path.read_text())
    values["config"]["learning_rate"] = -1.0
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match="training.learning_rate"):
        TrainingJob.load(path)


def test_rows_held_in_memory_are_never_written_into_a_job_file(tmp_path, tiny_features):
    job = _job(tmp_path)
    job.train = tiny_features["train"]
    with pytest.raises(ValueError, match="store rows held in memory first"):
        job.save(tmp_path / "job.json")


def test_an_outcome_file_gives_back_the_outcome_and_where_its_best_model_is(tmp_path):
    metrics = Metrics(rows=10, ctr=0.3, auc=0.7, log_loss=0.5, normalized_entropy=0.8, calibration=1.0, accuracy=0.7)
    history = [Validation.of(metrics, step=7, epoch=1, seconds=0.5, train_seconds=12.0)]
    target = Target(auc=0.65, step=7, epoch=1, validation_auc=0.7, train_seconds=12.0, wall_seconds=14.0)
    result = TrainingResult("progress/best/dlrm_x.pt", 7, 1, metrics, history, 9, False, 12.5, target=target)
    outcome = TrainingOutcome(result, "runs/v1", "cpu", {"threads": 2}, 1, {"backend": "torch"})
    outcome.save(tmp_path / "outcome.pt")  # read back with weights_only: plain values, no record's class
    loaded = TrainingOutcome.load(tmp_path / "outcome.pt")
    assert loaded.result == result and isinstance(loaded.result.history[0], Validation)
    assert (loaded.processes, loaded.embeddings) == (1, {"backend": "torch"})


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_planted_job_and_outcome_files_never_run_code(tmp_path):
    from criteo_dlrm.engine.training.job import TrainingJob, TrainingOutcome

    marker = tmp_path / "ran"
    planted = tmp_path / "outcome_x.pt"
    torch.save({"outcome": _Payload(marker)}, planted)
    with pytest.raises(DataError, match=str(planted)):
        TrainingOutcome.load(planted)
    job = tmp_path / "job_x.json"
    job.write_bytes(__import__("pickle").dumps(_Payload(marker)))
    with pytest.raises(DataError, match=str(job)):
        TrainingJob.load(job)
    assert not marker.exists(), "the planted payload ran"

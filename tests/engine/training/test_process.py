"""One training process's whole part: its mode chosen and built, the loaders, the Trainer, the outcome."""

import math
import traceback

import pytest
import torch
import torch.distributed as dist

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.training.job import TrainingJob
from criteo_dlrm.engine.training.process import train_process
from tests.conftest import TINY_MODEL


def _job(features, tmp_path, **values) -> TrainingJob:
    config = TrainingConfig.from_dict(
        {**TINY_MODEL, "num_epochs": 1, "batch_size": {"train": 500, "validation": 1000}, "validations_per_epoch": 1,
         "device": "cpu", "resume": False, "tensorboard_dir": str(tmp_path / "tb"),
         "in_progress_dir": str(tmp_path / "in_progress"), **values}
    )  # fmt: skip
    sizes = [features["metadata"].sparse[name]["table_size"] for name in SPARSE_COLUMNS]
    return TrainingJob(config, features["train"], features["validation"], sizes, "f", "v1", 0.25)


def test_a_process_alone_trains_the_job_and_reports_where_its_tables_lived(tiny_features, tmp_path):
    job = _job(tiny_features, tmp_path)
    outcome = train_process(job, torch.device("cpu"))
    assert outcome.processes == 1 and outcome.device == "cpu"
    assert outcome.result.steps == math.ceil(3000 / 500)
    assert outcome.run_dir == str(tmp_path / "tb" / "v1")
    assert outcome.embeddings == {
        "backend": "torch",
        "bytes_per_process": embedding_bytes(job.table_sizes, [8] * 26, "sparse_adam"),
    }
    assert not dist.is_initialized()


def _ddps_alive_at_each_destroy(monkeypatch) -> list[int]:
    """How many DDP modules are alive each time the process group is destroyed: one freed after its group drops the
    group's last reference with the interpreter's lock held and waits for the group's threads, which may need that
    lock to free a tensor (a deadlock seen in the stack of a hung GPU smoke dry run)."""
    import gc

    from torch.nn.parallel import DistributedDataParallel

    alive: list[int] = []
    destroy = dist.destroy_process_group

    def counted(*args, **kwargs):
        alive.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", counted)
    return alive


def test_a_torchrec_job_in_one_process_gets_a_group_of_its_own_and_closes_it(tiny_features, tmp_path, monkeypatch):
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    alive = _ddps_alive_at_each_destroy(monkeypatch)
    job = _job(tiny_features, tmp_path, embedding_backend="torchrec", embedding_optimizer="rowwise_adagrad")
    outcome = train_process(job, torch.device("cpu"))
    assert outcome.embeddings["backend"] == "torchrec" and len(outcome.embeddings["tables"]) == 26
    assert outcome.result.steps == math.ceil(3000 / 500)
    assert not dist.is_initialized(), "the group it opened is closed"
    assert alive == [0], "the model (TorchRec's dense layers under DDP) freed before its group"


def test_a_torchrec_job_that_fails_frees_its_model_before_the_group_it_opened(tiny_features, tmp_path, monkeypatch):
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    from criteo_dlrm.engine.training import loop

    def fails(self):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(loop.Trainer, "fit", fails)
    alive = _ddps_alive_at_each_destroy(monkeypatch)
    job = _job(tiny_features, tmp_path, embedding_backend="torchrec", embedding_optimizer="rowwise_adagrad")
    with pytest.raises(RuntimeError, match="a step failed") as failure:
        train_process(job, torch.device("cpu"))
    assert alive == [0], "the failed run's frames (its model) freed before the group"
    shown = "".join(traceback.format_exception(failure.value))
    assert "in _train_in_group" in shown and "result = trainer.fit()" in shown, "the error still says where it was"
    assert not dist.is_initialized()

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import AbstractDataset, DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.runner import SequentialRunner

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.datasets import EncodedArraysDataset, TorchCheckpointDataset
from criteo_dlrm.engine.trained.reports import TrainingSummary
from criteo_dlrm.engine.training.recipe import finish_run
from criteo_dlrm.hooks import MissingInputError
from criteo_dlrm.models import DLRM, DLRMConfig
from criteo_dlrm.models.dlrm import ConfigError
from criteo_dlrm.pipelines.training import create_pipeline
from tests.conftest import PROJECT_ROOT


def training_params(tmp_path: Path, **overrides) -> dict:
    params = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_training.yml").read_text())["training"]
    params.update(
        num_epochs=2,
        tensorboard_dir=str(tmp_path / "tb"),
        in_progress_dir=str(tmp_path / "progress"),
        batch_size={"train": 200, "validation": 4096},
    )
    params.update(overrides)
    return params


class _NoEarlierRun(AbstractDataset):
    """What ``PreviousVersionDataset`` loads when there is no earlier version: None."""

    def load(self) -> None:
        return None

    def save(self, data) -> None:
        raise NotImplementedError

    def _describe(self) -> dict:
        return {}


def _catalog(tiny_features, params, checkpoint_path) -> DataCatalog:
    folder = checkpoint_path.parent
    return DataCatalog(
        {
            "feature_metadata": MemoryDataset(tiny_features["metadata"]),
            "feature_vocabularies": MemoryDataset(tiny_features["vocabularies"], copy_mode="assign"),
            "params:training": MemoryDataset(params),
            "params:preprocessing": MemoryDataset({"engine": "local"}),
            "run_version": MemoryDataset("2026-11-30T00.00.00.000Z"),
            "previous_training_summary": _NoEarlierRun(),
            "previous_dlrm_checkpoint": _NoEarlierRun(),
            "dlrm_checkpoint": TorchCheckpointDataset(
                filepath=str(checkpoint_path), version=Version(None, "2026-01-01T00.00.00.000Z")
            ),
            "train_features": EncodedArraysDataset(path=str(folder / "train_features")),
            "validation_features": EncodedArraysDataset(path=str(folder / "validation_features")),
            "training_summary": MemoryDataset(),
        }
    )


def test_training_pipeline_writes_a_complete_checkpoint(tiny_features, tmp_path):
    params = training_params(tmp_path)
    catalog = _catalog(tiny_features, params, tmp_path / "ckpt.pt")
    SequentialRunner().run(create_pipeline(), catalog)
    checkpoint = TorchCheckpointDataset(filepath=str(tmp_path / "ckpt.pt"), version=Version(None, None)).load()
    stored = checkpoint.to_dict()
    for key in (
        "model_state",
        "optimizer_state",
        "step",
        "epoch",
        "model_config",
        "training_parameters",
        "encoder",
        "best_validation",
        "library_versions",
    ):
        assert key in stored, key
    assert checkpoint.metadata_version == "2026-01-01T00.00.00.000Z"
    assert checkpoint.vocabulary_sha256 == tiny_features["metadata"].vocabulary_sha256
    assert checkpoint.training_parameters == params
    assert set(checkpoint.optimizer_state) == {"dense", "embeddings"}

    model = DLRM(DLRMConfig.from_dict(stored["model_config"]))
    model.load_state_dict(checkpoint.model_state)
    encoder = FeatureEncoder.from_state_dict(checkpoint.encoder_state)
    assert encoder.table_sizes == model.config.table_sizes

    summary = catalog.load("training_summary")
    assert isinstance(summary, TrainingSummary) and summary.others == {}, "the summary is its record: every key a field"
    assert Path(summary.tensorboard_run) == tmp_path / "tb" / "2026-11-30T00.00.00.000Z"
    assert list(Path(summary.tensorboard_run).glob("events.out.tfevents.*"))
    assert summary.best_validation == checkpoint.best_validation
    # The in-progress checkpoint stays until the run's checkpoint is stored (the project hook then removes it):
    # a failure to store it loses nothing, the rerun resumes.
    assert [str(p) for p in (tmp_path / "progress").glob("*.pt")] == [summary.in_progress_checkpoint]
    finish_run(summary)
    assert not list((tmp_path / "progress").glob("*.pt")), "a finished, stored run leaves nothing to resume"
    stored = catalog.load("train_features")
    assert isinstance(stored.sparse.packed, np.memmap) and isinstance(stored.dense, np.memmap)
    assert stored.row_order == "shuffled"  # the training rows, stored shuffled: the same rows in another order
    expected = tiny_features["train"]
    mine, theirs = (
        np.column_stack([np.asarray(r.sparse), np.asarray(r.dense), np.asarray(r.labels)]) for r in (stored, expected)
    )
    assert not np.array_equal(mine, theirs)
    np.testing.assert_array_equal(mine[np.lexsort(mine.T)], theirs[np.lexsort(theirs.T)])
    np.testing.assert_array_equal(catalog.load("validation_features").dense, tiny_features["validation"].dense)


def test_dot_products_with_mismatched_sizes_fail_before_training(tiny_features, tmp_path):
    params = training_params(tmp_path, sparse_embedding_sizes=8)
    with pytest.raises(ConfigError, match="dense_mlp.output_size"):
        TrainingConfig.from_dict(params).model_config(_table_sizes(tiny_features))


def test_per_feature_embedding_sizes_with_cat(tiny_features, tmp_path):
    params = training_params(tmp_path, interaction="cat", sparse_embedding_sizes=[4] * 13 + [8] * 13)
    config = TrainingConfig.from_dict(params).model_config(_table_sizes(tiny_features))
    assert config.sparse_embedding_sizes == [4] * 13 + [8] * 13


def _table_sizes(features) -> list[int]:
    return [features["metadata"].sparse[f"SPARSE_{i}"]["table_size"] for i in range(26)]


def test_bf16_training_runs_on_cpu(tiny_features, tmp_path):
    params = training_params(tmp_path, precision="bf16", max_steps=5)
    catalog = _catalog(tiny_features, params, tmp_path / "ckpt.pt")
    SequentialRunner().run(create_pipeline(), catalog)
    assert catalog.load("training_summary").steps == 5


@pytest.mark.parametrize(
    ("bf16_rate", "step_speedup", "chosen"),
    [(900.0, 1.5, "bf16"), (900.0, 0.9, "fp32"), (6.0, None, "fp32")],
    ids=["amx-like, a faster step", "amx-like, a slower step", "avx2-like"],
)
def test_precision_auto_trains_in_what_the_probe_chose_and_the_summary_says_why(
    tiny_features, tmp_path, monkeypatch, bf16_rate, step_speedup, chosen
):
    """Issue 48 item 1: precision auto is resolved in the training process; the run trains in it (TensorBoard's
    hparams carry it) and the summary records what was chosen and why: with the step's measured speed-up where
    the matmuls say bf16 can help (issue 61 item 1)."""
    from criteo_dlrm.engine import device as device_module
    from criteo_dlrm.engine.training import precision as precision_module

    monkeypatch.setattr(device_module, "PROBE_CACHE", tmp_path / "probe.json")
    monkeypatch.setattr(device_module, "matmul_rate", lambda dtype, seconds=0.25, size=1024: 150.0 if dtype == torch.float32
                        else bf16_rate)  # fmt: skip
    monkeypatch.setattr(precision_module, "STEP_CACHE", tmp_path / "steps.json")
    monkeypatch.setattr(precision_module, "measure_step_rates", lambda *_: {"fp32": 1e4, "bf16": 1e4 * step_speedup})
    params = training_params(tmp_path, precision="auto", max_steps=5)
    catalog = _catalog(tiny_features, params, tmp_path / "ckpt.pt")
    SequentialRunner().run(create_pipeline(), catalog)
    summary = catalog.load("training_summary")
    precision = summary.precision
    assert precision["precision"] == chosen and f"{bf16_rate / 150:.2f}x its fp32" in precision["precision_auto"]
    assert precision.get("precision_bf16_step_speedup") == step_speedup
    if step_speedup:
        assert f"this run's step trains {step_speedup:.2f}x as fast in bf16" in precision["precision_auto"]
    # TensorBoard's hparams say it too (issue 62 item 15: the docs said so, they did not).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(summary.tensorboard_run)
    events.Reload()
    started = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    assert b"precision_auto" in started and precision["precision_auto"].encode() in started


def test_cuda_on_a_machine_without_it_is_refused(tiny_features, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    catalog = _catalog(tiny_features, training_params(tmp_path, device="cuda"), tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError, match="no usable CUDA"):
        SequentialRunner().run(create_pipeline(), catalog)


@pytest.mark.slow
def test_training_on_a_fresh_clone_names_the_commands_to_run_first(project):
    bootstrap_project(project)
    with pytest.raises(MissingInputError) as error, KedroSession.create(project_path=project) as session:
        session.run(pipeline_names=["training"])
    message = str(error.value)
    assert "needs feature_metadata, feature_vocabularies" in message
    assert "Run `kedro run --pipelines=ingestion,metadata` first" in message


class _Killed(Exception):
    pass


def test_the_resume_fingerprint_covers_the_validation_days(tiny_features, tmp_path, monkeypatch):
    import dataclasses

    from criteo_dlrm.data.lineage import encoded_lineage
    from criteo_dlrm.engine.training.step import TrainStep
    from criteo_dlrm.pipelines.training.nodes import train_dlrm

    params = training_params(tmp_path, validate_every_steps=5)
    vocabularies = tiny_features["vocabularies"]
    original_step = TrainStep.__call__

    def killed_at_step_8(self, batch, index, *args):
        if index == 8:
            raise _Killed
        return original_step(self, batch, index, *args)

    monkeypatch.setattr(TrainStep, "__call__", killed_at_step_8)
    with pytest.raises(_Killed):
        train_dlrm(
            tiny_features["train"], tiny_features["validation"], tiny_features["metadata"], vocabularies, params, "r1"
        )
    [in_progress] = (tmp_path / "progress").glob("dlrm_*.pt")
    monkeypatch.setattr(TrainStep, "__call__", original_step)

    # Other validation days (metadata.validation_days changed): another run, never resumed into.
    metadata = tiny_features["metadata"]
    day_7 = dataclasses.replace(metadata.source_days.validation[0], day="day_7", fingerprint="f" * 16)
    other = dataclasses.replace(metadata, source_days=dataclasses.replace(metadata.source_days, validation=[day_7]))
    validation = dataclasses.replace(
        tiny_features["validation"],
        lineage=encoded_lineage(other, vocabularies.version, other.source_days.validation),
    )
    _, summary = train_dlrm(tiny_features["train"], validation, other, vocabularies, params, "r2")
    assert summary.history[0].step == 5 and summary.tensorboard_run.endswith("r2"), "started afresh"
    assert in_progress.exists(), "the interrupted run's state is kept for its own rerun"

    _, summary = train_dlrm(
        tiny_features["train"], tiny_features["validation"], tiny_features["metadata"], vocabularies, params, "r3"
    )
    assert summary.history[0].step == 5 and summary.in_progress_checkpoint == str(in_progress), (
        "the same run resumed and finished"
    )
    assert summary.tensorboard_run.endswith("r1"), "in the folder it started in"


def test_a_resumed_run_keeps_the_precision_its_in_progress_state_was_trained_in(tiny_features, tmp_path, monkeypatch):
    """precision: auto resolved otherwise after an interruption (the probe's cache changed, the thread count followed
    the idle cores) trained the remaining steps in the other precision and recorded only the new one."""
    from criteo_dlrm.engine import device as device_module
    from criteo_dlrm.engine.training import precision as precision_module
    from criteo_dlrm.engine.training.step import TrainStep
    from criteo_dlrm.pipelines.training.nodes import train_dlrm

    monkeypatch.setattr(device_module, "PROBE_CACHE", tmp_path / "probe.json")
    monkeypatch.setattr(precision_module, "STEP_CACHE", tmp_path / "steps.json")
    monkeypatch.setattr(precision_module, "measure_step_rates", lambda *_: {"fp32": 1e4, "bf16": 2e4})
    rates = {torch.float32: 150.0, torch.bfloat16: 900.0}  # bf16 6x fp32: auto takes bf16
    monkeypatch.setattr(device_module, "matmul_rate", lambda dtype, seconds=0.25, size=1024: rates[dtype])
    params = training_params(tmp_path, precision="auto", validate_every_steps=5)
    original_step = TrainStep.__call__
    precisions = []

    def killed_at_step_8(self, batch, index, *args):
        precisions.append(self.mode.runtime.precision)
        if index == 8:
            raise _Killed
        return original_step(self, batch, index, *args)

    monkeypatch.setattr(TrainStep, "__call__", killed_at_step_8)
    inputs = (tiny_features["train"], tiny_features["validation"], tiny_features["metadata"])
    with pytest.raises(_Killed):
        train_dlrm(*inputs, tiny_features["vocabularies"], params, "r1")
    assert set(precisions) == {"bf16"}
    (tmp_path / "probe.json").unlink()
    rates[torch.bfloat16] = 6.0  # measured again: now auto would take fp32
    precisions.clear()
    monkeypatch.setattr(TrainStep, "__call__", lambda self, *a: precisions.append(self.mode.runtime.precision)
                        or original_step(self, *a))  # fmt: skip
    _, summary = train_dlrm(*inputs, tiny_features["vocabularies"], params, "r2")
    assert summary.resumed_from_step in (5, 8) and set(precisions) == {"bf16"}, "the rest trained in bf16 too"
    assert summary.precision["precision"] == "bf16"
    assert (
        "kept from the in-progress checkpoint, trained in bf16 (auto would choose fp32 now"
        in (summary.precision["precision_auto"])
    )


def test_rows_encoded_from_other_days_or_vocabularies_are_refused(tiny_features, tmp_path):
    import dataclasses

    from criteo_dlrm.data.lineage import LineageError
    from criteo_dlrm.pipelines.training.nodes import train_dlrm

    stale = dataclasses.replace(
        tiny_features["train"], lineage={**tiny_features["train"].lineage, "metadata_version": "older"}
    )
    with pytest.raises(
        LineageError,
        match=r"train_features were encoded with feature_metadata version older on day_0 .*Encode them again: `kedro run --pipelines=training`",
    ):
        train_dlrm(
            stale,
            tiny_features["validation"],
            tiny_features["metadata"],
            tiny_features["vocabularies"],
            training_params(tmp_path),
            "r",
        )


def test_rows_encoded_with_another_dense_transform_are_refused(tiny_features, tmp_path):
    """Issue 47 item 5: the dense transform is part of the encoded rows' lineage (rows of the standardised one, as
    every row encoded before the setting, are never trained on as log(x + 3))."""
    from criteo_dlrm.data.lineage import LineageError
    from criteo_dlrm.pipelines.training.nodes import train_dlrm

    with pytest.raises(LineageError, match=r"but this run trains with .*dense_transform log_plus_3\. Encode them"):
        train_dlrm(
            tiny_features["train"],
            tiny_features["validation"],
            tiny_features["metadata"],
            tiny_features["vocabularies"],
            {**training_params(tmp_path), "dense_transform": "log_plus_3"},
            "r",
        )


@pytest.mark.slow
def test_training_pipeline_on_two_processes_reads_the_stored_rows_by_folder(tiny_features, tmp_path, monkeypatch):
    from criteo_dlrm.engine.training import recipe

    sent = []
    original = recipe.launch
    monkeypatch.setattr(
        recipe, "launch", lambda job, settings: sent.extend([job.train, job.validation]) or original(job, settings)
    )
    params = training_params(tmp_path, distributed={**training_params(tmp_path)["distributed"], "nproc_per_node": 2})
    catalog = _catalog(tiny_features, params, tmp_path / "ckpt.pt")
    SequentialRunner().run(create_pipeline(), catalog)
    assert sent == [str(tmp_path / "train_features"), str(tmp_path / "validation_features")], "folders, not bytes"
    summary = catalog.load("training_summary")
    assert summary.processes == 2 and summary.steps == 2 * 15
    checkpoint = TorchCheckpointDataset(filepath=str(tmp_path / "ckpt.pt"), version=Version(None, None)).load()
    assert checkpoint.training_parameters["distributed"]["nproc_per_node"] == 2

import dataclasses
import json

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from criteo_dlrm.config.training import ProfilerConfig, TrainingConfig
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.engine.parallel import group as parallel_group
from criteo_dlrm.engine.parallel.optimizers import build_optimizers
from criteo_dlrm.engine.trained.reports import Metrics, Target
from criteo_dlrm.engine.training.loop import Trainer, TrainingDivergedError
from criteo_dlrm.engine.training.profiling import TOP_OPS_REPORT
from criteo_dlrm.engine.training.run_state import load_best
from criteo_dlrm.engine.training.tensorboard import TensorBoardLogger
from criteo_dlrm.models import DLRM
from criteo_dlrm.models.dlrm import ConfigError
from tests.conftest import TINY_MODEL, tiny_model_config, tiny_trainer


def _model(features, seed=0, sparse=True) -> DLRM:
    torch.manual_seed(seed)
    sizes = [features["metadata"].sparse[f"SPARSE_{i}"]["table_size"] for i in range(26)]
    ctr = features["metadata"].click_rate  # the output starts at the prior, as a run's model does
    return DLRM(TrainingConfig.from_dict(TINY_MODEL).model_config(sizes, ctr), sparse_gradients=sparse)


def _trainer(features, tmp_path, config: TrainingConfig, **kwargs) -> Trainer:
    return tiny_trainer(features, config, tmp_path / "run", **kwargs)


def _config(**overrides) -> TrainingConfig:
    """The test's configuration; ``early_stopping_patience=2`` sets ``early_stopping.patience``, and so on."""
    # Validation at each epoch's end only, unless a test asks for more.
    values = {"num_epochs": 2, "batch_size": {"train": 200, "validation": 512}, "log_every_steps": 5}
    values["validations_per_epoch"] = 1
    values["embedding_learning_rate"] = 0.01
    for name, value in overrides.items():
        block, _, key = name.partition("_")
        nested = {"early": "early_stopping", "batch": "batch_size"}
        if block in nested and name.startswith(nested[block] + "_"):
            values.setdefault(nested[block], {})[name.removeprefix(nested[block] + "_")] = value
        else:
            values[name] = value
    profiler = values.pop("profiler", None)
    config = TrainingConfig.from_dict(values)
    if profiler is not None:
        config.profiler = profiler
    return config


def test_default_optimisers_are_adam_and_sparse_adam(tiny_features):
    model = _model(tiny_features)
    optimizers = build_optimizers(model, TrainingConfig())
    assert isinstance(optimizers["dense"], torch.optim.Adam) and isinstance(
        optimizers["embeddings"], torch.optim.SparseAdam
    )
    assert {id(p) for g in optimizers["embeddings"].param_groups for p in g["params"]} == {
        id(p) for p in model.embedding_parameters()
    }
    predecessor_way = build_optimizers(
        _model(tiny_features, sparse=False), TrainingConfig(embedding_optimizer="dense_adam")
    )
    assert list(predecessor_way) == ["dense"]


def test_training_learns_the_planted_signal_and_validates_on_every_row(tiny_features, tmp_path):
    result = _trainer(tiny_features, tmp_path, _config(num_epochs=3)).fit()
    assert result.steps == 3 * 15
    assert [h.step for h in result.history] == [15, 30, 45]
    assert all(h.rows == 1000 for h in result.history), "validation covers the whole validation set"
    assert result.best_metrics.auc > 0.6
    assert result.best_metrics.log_loss == min(h.log_loss for h in result.history)


def test_same_seed_gives_the_same_metrics_twice(tiny_features, tmp_path):
    first = _trainer(tiny_features, tmp_path / "a", _config()).fit()
    second = _trainer(tiny_features, tmp_path / "b", _config()).fit()
    assert [h.log_loss for h in first.history] == [h.log_loss for h in second.history]
    other = _trainer(tiny_features, tmp_path / "c", _config(seed=1)).fit()
    assert [h.log_loss for h in other.history] != [h.log_loss for h in first.history]


class _Crash(Exception):
    pass


@pytest.mark.parametrize(
    ("saving", "crash_at", "resumes_at"),
    [({"validate_every_steps": 4}, 19, 16), ({"checkpoint_every_steps": 3}, 20, 18)],
    ids=["at-validations", "every-3-steps"],
)
def test_an_interrupted_run_resumes_to_the_same_weights(tiny_features, tmp_path, saving, crash_at, resumes_at):
    config = _config(num_epochs=2, **saving)
    reference = _trainer(tiny_features, tmp_path / "whole", config)
    reference_result = reference.fit()

    resume_path = tmp_path / "progress.pt"
    crashing = _trainer(tiny_features, tmp_path / "crash", config, resume_path=resume_path, fingerprint="x")
    original_step = crashing.train_step

    def step_then_crash(batch, *args):
        if crashing.step == crash_at:  # a few steps after the last in-progress checkpoint
            raise _Crash
        return original_step(batch, *args)

    crashing.train_step = step_then_crash
    with pytest.raises(_Crash):
        crashing.fit()
    assert resume_path.exists()

    resumed = _trainer(tiny_features, tmp_path / "resumed", config, resume_path=resume_path, fingerprint="x")
    assert resumed.step == resumes_at
    result = resumed.fit()
    for name, tensor in reference.mode.model.state_dict().items():
        torch.testing.assert_close(resumed.mode.model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    assert [h.log_loss for h in result.history] == [h.log_loss for h in reference_result.history]
    for name, state in reference.mode.optimizers["embeddings"].state_dict()["state"].items():
        torch.testing.assert_close(
            resumed.mode.optimizers["embeddings"].state_dict()["state"][name]["exp_avg"], state["exp_avg"]
        )


def test_a_checkpoint_of_other_settings_is_not_resumed(tiny_features, tmp_path):
    resume_path = tmp_path / "progress.pt"
    _trainer(tiny_features, tmp_path / "a", _config(num_epochs=1), resume_path=resume_path, fingerprint="one").fit()
    other = _trainer(tiny_features, tmp_path / "b", _config(num_epochs=1), resume_path=resume_path, fingerprint="two")
    assert other.step == 0


def test_early_stopping_keeps_the_best_validation(tiny_features, tmp_path, monkeypatch):
    losses = iter([0.5, 0.4, 0.45, 0.46, 0.3])

    def scripted(labels, probabilities):
        return Metrics(
            rows=len(labels),
            ctr=0.25,
            auc=0.7,
            log_loss=next(losses),
            normalized_entropy=0.9,
            calibration=1.0,
            accuracy=0.7,
        )

    monkeypatch.setattr(parallel_group, "binary_metrics", scripted)
    result = _trainer(
        tiny_features, tmp_path, _config(num_epochs=5, validate_every_steps=5, early_stopping_patience=2)
    ).fit()
    assert result.stopped_early
    assert [h.log_loss for h in result.history] == [0.5, 0.4, 0.45, 0.46]
    assert result.best_step == 10 and result.best_metrics.log_loss == 0.4


def _scripted_aucs(monkeypatch, aucs: list[float]) -> None:
    """Validations that measure ``aucs`` in turn (and a falling log loss: early stopping never stops them)."""
    values = iter(enumerate(aucs))

    def scripted(labels, probabilities):
        index, auc = next(values)
        return Metrics(rows=len(labels), ctr=0.25, auc=auc, log_loss=0.5 - 0.01 * index,
                       normalized_entropy=0.9, calibration=1.0, accuracy=0.7)  # fmt: skip

    monkeypatch.setattr(parallel_group, "binary_metrics", scripted)


def test_target_auc_stops_at_the_first_validation_that_reaches_it_and_says_when(tiny_features, tmp_path, monkeypatch):
    """Issue 47 item 3: MLPerf's figure of merit is the time to the first validation at or above the target."""
    _scripted_aucs(monkeypatch, [0.70, 0.74, 0.7503, 0.80, 0.81, 0.82])
    run = _trainer(tiny_features, tmp_path, _config(num_epochs=3, validate_every_steps=5, target_auc=0.75),
                   tensorboard=True)  # fmt: skip
    result = run.fit()
    assert [h.step for h in result.history] == [5, 10, 15] and result.steps == 15
    assert not result.stopped_early, "stopped at its target, not by early stopping"
    target = result.target
    assert target.reached and target.auc == 0.75 and target.step == 15 and target.validation_auc == 0.7503
    assert 0 < target.train_seconds <= target.wall_seconds
    assert target.train_seconds == result.history[-1].train_seconds
    scalars = EventAccumulator(str(run.run_dir)).Reload().Scalars("target/wall_seconds")
    assert [(e.step, round(e.value, 3)) for e in scalars] == [(15, round(target.wall_seconds, 3))]


def test_a_target_auc_never_reached_runs_every_step_and_says_so(tiny_features, tmp_path, monkeypatch):
    _scripted_aucs(monkeypatch, [0.70, 0.71, 0.72, 0.73])  # the last for the run without a target
    result = _trainer(tiny_features, tmp_path, _config(num_epochs=1, validate_every_steps=5, target_auc=0.8)).fit()
    assert result.steps == 15 and result.target == Target(auc=0.8, reached=False)
    assert _trainer(tiny_features, tmp_path / "none", _config(num_epochs=1)).fit().target is None


def test_a_run_that_reached_its_target_resumes_to_no_further_step(tiny_features, tmp_path, monkeypatch):
    _scripted_aucs(monkeypatch, [0.70, 0.76])
    config = _config(num_epochs=3, validate_every_steps=5, target_auc=0.75)
    resume_path = tmp_path / "progress.pt"
    first = _trainer(tiny_features, tmp_path / "a", config, resume_path=resume_path, fingerprint="x").fit()
    assert first.steps == 10 and first.target.step == 10
    again = _trainer(tiny_features, tmp_path / "b", config, resume_path=resume_path, fingerprint="x").fit()
    assert again.steps == 10 and again.target == first.target


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tiny_features, tmp_path):
    train = tiny_features["train"]
    dense = np.array(train.dense)
    dense[25 * 200 % len(dense) :, 0] = np.inf  # rows of later batches (file order below) carry an inf
    poisoned = EncodedArrays(np.array(train.labels), dense, np.array(train.sparse))
    config = _config(num_epochs=3, validate_every_steps=5)
    trainer = _trainer(
        tiny_features, tmp_path, config, train=poisoned, shuffle=False, resume_path=tmp_path / "progress.pt",
        fingerprint="f",
    )  # fmt: skip
    with pytest.raises(TrainingDivergedError, match=r"at step 11\b.*progress.pt"):
        trainer.fit()
    assert torch.load(tmp_path / "progress.pt", weights_only=True)["step"] == 10


def test_tensorboard_scalars_and_hparams_read_back(tiny_features, tmp_path):
    logger = TensorBoardLogger(tmp_path / "run")
    _trainer(tiny_features, tmp_path, _config(num_epochs=1), metric_logger=logger).fit()
    logger.close()
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "train/loss", "train/learning_rate", "train/embedding_learning_rate", "train/samples_per_second",
        "time/data_ms", "time/forward_ms", "time/backward_ms", "time/optimizer_ms",
        "validation/log_loss", "validation/auc", "validation/normalized_entropy", "validation/accuracy", "validation/calibration",
    }  # fmt: skip
    assert expected <= tags
    assert [e.step for e in events.Scalars("validation/auc")] == [15]
    assert all(np.isfinite(e.value) for e in events.Scalars("train/loss"))
    assert not [tag for tag in tags if tag.startswith("hparams/")], "no one-point cards ahead of the curves"
    kept_tags = sorted(tag for tag in tags if tag.startswith("validation_kept/"))
    assert {"validation_kept/auc", "validation_kept/log_loss", "validation_kept/calibration"} <= set(kept_tags)
    assert sorted(tags)[-len(kept_tags) :] == kept_tags, "after the real curves"
    [kept] = events.Scalars("validation_kept/auc")
    [best] = [e for e in events.Scalars("validation/auc") if e.step == kept.step]
    assert kept.value == best.value, "the kept model's point, at its step"
    plugin = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin and b"validation_kept/auc" in plugin["_hparams_/experiment"]


def test_profiler_writes_a_trace_and_a_top_ops_report(tiny_features, tmp_path):
    profile = ProfilerConfig(enabled=True, wait=1, warmup=1, active=2, repeat=1)
    _trainer(tiny_features, tmp_path, _config(num_epochs=1, profiler=profile)).fit()
    traces = list((tmp_path / "run").glob("*.pt.trace.json"))
    assert len(traces) == 1
    trace = json.loads(traces[0].read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("aten::addmm" in name or "aten::mm" in name for name in names)
    report = (tmp_path / "run" / TOP_OPS_REPORT).read_text()
    assert "Self CPU" in report and "aten::" in report
    assert report.startswith("Operators of the profiled training steps") and "threading.py(...): wait" in report


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"embedding_optimizer": "lamb"}, "embedding_optimizer must be one of"),
        ({"decay": "exponential"}, "decay must be one of"),
        ({"decay": "step"}, "decay: step needs the rate to change to"),
        ({"decay": "step", "step_decay": {"at": 1.0, "learning_rate": 0.1}}, "step_decay.at must be a fraction"),
        ({"target_auc": 1.2}, "target_auc must be an AUC in"),
        ({"dense_optimizer": "lamb"}, "dense_optimizer must be one of"),
        ({"dense_optimizer": "sgd", "embedding_optimizer": "dense_adam"}, "trains every parameter with Adam"),
        ({"adagrad_eps": 0}, "adagrad_eps must be positive"),
        ({"batch_size": {"train": 0}}, "batch_size.train must be >= 1"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
    ],
)
def test_invalid_training_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainingConfig.from_dict(overrides)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_training_with_bf16_and_the_profiler(tiny_features, tmp_path):
    config = _config(num_epochs=1, precision="bf16", profiler=ProfilerConfig(enabled=True, wait=1, warmup=1, active=2))
    trainer = _trainer(tiny_features, tmp_path, config, device=torch.device("cuda"))
    result = trainer.fit()
    assert result.best_metrics.auc > 0.55
    assert "CUDA" in (tmp_path / "run" / TOP_OPS_REPORT).read_text()


def _poison_after_step(trainer: Trainer, step: int) -> None:
    """The weights turn NaN right after training step ``step`` (1-based), as an exploding update would."""
    original_step = trainer.train_step

    def poisoned(batch, *args):
        loss = original_step(batch, *args)
        if trainer.state.step == step - 1:
            with torch.no_grad():
                trainer.mode.model.prediction_mlp[0].weight.fill_(float("nan"))
        return loss

    trainer.train_step = poisoned


def test_a_non_finite_loss_between_log_lines_is_never_saved_as_progress(tiny_features, tmp_path):
    progress = tmp_path / "progress.pt"
    trainer = _trainer(
        tiny_features, tmp_path, _config(log_every_steps=5, checkpoint_every_steps=3), resume_path=progress
    )
    _poison_after_step(trainer, 11)
    with pytest.raises(TrainingDivergedError, match=r"at step 12\b.*progress.pt"):
        trainer.fit()
    saved = torch.load(progress, weights_only=True)
    assert saved["step"] == 9, "the last save before the first non-finite loss"
    assert all(torch.isfinite(t).all() for t in saved["model_state"].values())


def test_a_non_finite_loss_between_log_lines_is_never_validated(tiny_features, tmp_path):
    trainer = _trainer(tiny_features, tmp_path, _config(log_every_steps=5, validate_every_steps=3))
    _poison_after_step(trainer, 11)
    with pytest.raises(TrainingDivergedError, match=r"at step 12\b"):
        trainer.fit()
    assert [h.step for h in trainer.state.history] == [3, 6, 9]


def test_early_stopping_says_where_it_stopped_and_what_it_kept(tiny_features, tmp_path, monkeypatch):
    from loguru import logger

    losses = iter([0.5, 0.4, 0.45, 0.46])
    real = parallel_group.binary_metrics
    monkeypatch.setattr(
        parallel_group, "binary_metrics", lambda y, p: dataclasses.replace(real(y, p), log_loss=next(losses))
    )
    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    try:
        _trainer(tiny_features, tmp_path, _config(num_epochs=5, validate_every_steps=5)).fit()
    finally:
        logger.remove(sink)
    assert any(
        line.startswith("early stopping at step 20 (epoch 1): no better validation log loss in 2 validations; "
                        "kept step 10 (epoch 0): validation log loss 0.40000")
        for line in lines
    ), lines  # fmt: skip


def test_a_killed_run_leaves_no_debris_and_resumes_into_its_own_tensorboard_folder(tiny_features, tmp_path):
    progress = tmp_path / "in_progress" / "progress.pt"
    progress.parent.mkdir()
    stale = progress.parent / f".progress.pt.{2**22 + 12345}.partial"  # a pid that no process has
    stale.write_bytes(b"")
    config = _config(num_epochs=2, validate_every_steps=4, log_every_steps=2)
    first = _trainer(tiny_features, tmp_path / "first", config, resume_path=progress, fingerprint="x", tensorboard=True)
    assert not stale.exists(), "stale partial checkpoint files are cleaned at start"
    original_step = first.train_step

    def crash_at_19(batch, *args):
        if first.step == 19:
            first.metric_logger.writer.flush()  # what a killed process had written by then
            raise _Crash
        return original_step(batch, *args)

    first.train_step = crash_at_19
    with pytest.raises(_Crash):
        first.fit()
    resumed = _trainer(
        tiny_features, tmp_path / "second", config, resume_path=progress, fingerprint="x", tensorboard=True
    )
    assert resumed.run_dir == tmp_path / "first" / "run" and resumed.step == 16
    resumed.fit()
    assert not (tmp_path / "second" / "run").exists(), "no orphan folder"
    _trainer(tiny_features, tmp_path / "whole", config, tensorboard=True).fit()

    def curve(folder):
        events = EventAccumulator(str(folder))
        events.Reload()
        return [(event.step, event.value) for event in events.Scalars("train/loss")]

    resumed_curve, whole_curve = curve(tmp_path / "first" / "run"), curve(tmp_path / "whole" / "run")
    assert [step for step, _ in resumed_curve] == [step for step, _ in whole_curve], "no gap, no doubled stretch"
    assert [value for _, value in resumed_curve] == pytest.approx([value for _, value in whole_curve])


def test_a_dcn_v2_model_learns_the_planted_signal(tiny_features, tmp_path):
    sizes = [tiny_features["metadata"].sparse[f"SPARSE_{i}"]["table_size"] for i in range(26)]
    model_config = tiny_model_config(
        sizes, sparse_embedding_sizes=[4] * 13 + [8] * 13, interaction="dcn", dcn={"num_layers": 2, "low_rank": 16}
    )
    trainer = _trainer(tiny_features, tmp_path, _config(num_epochs=3), model_config=model_config)
    assert trainer.fit().best_metrics.auc > 0.6


def test_validations_per_epoch_are_evenly_spaced_and_early_stopping_can_end_mid_epoch(
    tiny_features, tmp_path, monkeypatch
):
    # 3,000 rows in batches of 200: 15 steps an epoch; 4 validations an epoch: after 4, 8, 12 and 15 steps.
    result = _trainer(
        tiny_features, tmp_path, _config(num_epochs=2, validations_per_epoch=4, early_stopping_patience=9)
    ).fit()
    assert [h.step for h in result.history] == [4, 8, 12, 15, 19, 23, 27, 30]
    assert all(b.train_seconds > a.train_seconds > 0 for a, b in zip(result.history, result.history[1:], strict=False))

    losses = iter([0.5, 0.4, 0.45, 0.46, 0.3])

    def scripted(labels, probabilities):
        return Metrics(rows=len(labels), ctr=0.25, auc=0.7, log_loss=next(losses), normalized_entropy=0.9,
                       calibration=1.0, accuracy=0.7)  # fmt: skip

    monkeypatch.setattr(parallel_group, "binary_metrics", scripted)
    stopped = _trainer(
        tiny_features, tmp_path / "stop", _config(num_epochs=3, validations_per_epoch=4, early_stopping_patience=1)
    ).fit()
    assert stopped.stopped_early and stopped.steps == 12, "stopped in the middle of the first epoch"
    assert stopped.best_step == 8


def test_embedding_weight_decay_adds_the_squares_of_the_looked_up_rows_to_the_loss(tiny_features, tmp_path):
    from criteo_dlrm.models.torchrec_embeddings import split_tables

    trainer = _trainer(tiny_features, tmp_path, _config(embedding_weight_decay=0.01, embedding_optimizer="sgd"))
    batch = next(trainer.train_loader.batches())
    model = trainer.mode.model
    with torch.no_grad():
        bce = nn.functional.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.labels)
        tables = {f: t.clone() for f, t in split_tables(model.state_dict(), model.config).items()}
    # A naive count: every looked-up value squared, per row of the batch (a row looked up twice counts twice).
    squares = sum(float(tables[f][int(index)].square().sum()) for row in batch.sparse for f, index in enumerate(row))
    loss = trainer.train_step(batch, 0, trainer.total_steps)
    assert float(loss) == pytest.approx(float(bce) + 0.01 * squares / len(batch), rel=1e-5)
    after = split_tables(model.state_dict(), model.config)
    untouched = sorted(set(range(len(tables[0]))) - set(batch.sparse[:, 0].tolist()))
    torch.testing.assert_close(after[0][untouched], tables[0][untouched], rtol=0, atol=0)


def test_prefetching_trains_on_the_same_batches_to_the_same_weights(tiny_features, tmp_path):
    torch.manual_seed(0)
    ahead = _trainer(tiny_features, tmp_path / "ahead", _config(num_epochs=2, prefetch_batches=2)).fit()
    torch.manual_seed(0)
    inline = _trainer(tiny_features, tmp_path / "inline", _config(num_epochs=2, prefetch_batches=0)).fit()
    assert [h.step for h in ahead.history] == [h.step for h in inline.history]
    ahead_state, inline_state = load_best(ahead).model_state, load_best(inline).model_state
    for name, tensor in inline_state.items():
        assert torch.equal(ahead_state[name], tensor), name


def test_a_non_finite_loss_from_rows_damaged_after_their_first_check_names_the_file_not_the_learning_rate(
    tiny_features, tmp_path
):
    """Issue 46 item 2: bytes overwritten after their chunk was first verified were read again in a later epoch,
    the loss went NaN, and the run blamed the learning rate."""
    from criteo_dlrm.common.storage import DamagedFileError
    from criteo_dlrm.data.chunk_digests import write_digests
    from criteo_dlrm.data.stored import open_encoded, write_encoded

    folder = tmp_path / "train_features"
    write_encoded(tiny_features["train"], folder)
    write_digests(folder)
    stored = open_encoded(folder)
    config = TrainingConfig.from_dict({**TINY_MODEL, "batch_size": {"train": 64, "validation": 300}})
    trainer = tiny_trainer(tiny_features, config, tmp_path / "run", train=stored)
    stored.check_rows(0, len(stored))  # every chunk verified once, as the first epoch does
    with pytest.raises(TrainingDivergedError, match="The rows it read were verified again, whole, and are intact"):
        trainer.check.losses([torch.tensor(float("nan"))], trainer.state.step)
    dense = np.load(folder / "dense.npy", mmap_mode="r")
    with open(folder / "dense.npy", "r+b") as handle:  # 256 bytes overwritten while the run goes on
        handle.seek(dense.offset + 100 * dense.strides[0])
        handle.write(b"\xff" * 256)
    with pytest.raises(DamagedFileError, match=r"dense.npy is damaged: rows 0-.*kedro run --pipelines=training"):
        trainer.check.losses([torch.tensor(float("nan"))], trainer.state.step)
    assert (folder / "damaged.txt").exists(), "recorded, so the next run encodes the rows again"

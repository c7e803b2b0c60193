"""The in-progress state of a run: its files written once from the live tensors (memory holds the model once),
the best model beside them, a damaged one set aside, a killed run resumed into its own folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.engine.trained.checkpoint import load_checkpoint, save_atomically
from criteo_dlrm.engine.trained.result import TrainingResult
from criteo_dlrm.engine.training.run_state import ProgressFiles, best_path_for, load_best
from tests.conftest import PROJECT_ROOT


def test_a_truncated_in_progress_checkpoint_is_set_aside_and_the_run_starts_afresh(tiny_features, tmp_path):
    from tests.engine.training.test_loop import _config, _trainer

    progress = tmp_path / "in_progress" / "progress.pt"
    first = _trainer(tiny_features, tmp_path / "a", _config(num_epochs=1), resume_path=progress, fingerprint="x")
    first.fit()
    with open(progress, "r+b") as handle:
        handle.truncate(progress.stat().st_size // 3)
    again = _trainer(tiny_features, tmp_path / "b", _config(num_epochs=1), resume_path=progress, fingerprint="x")
    assert again.step == 0
    assert Path(f"{progress}.damaged").exists()


def test_a_run_killed_before_its_first_validation_resumes_into_its_own_run_folder(tiny_features, tmp_path):
    from tests.engine.training.test_loop import _config, _Crash, _trainer

    progress = tmp_path / "in_progress" / "progress.pt"
    config = _config(num_epochs=1, validations_per_epoch=1)
    first = _trainer(tiny_features, tmp_path / "first", config, resume_path=progress, fingerprint="x")
    original = first.train_step

    def crash(batch, index, *args):
        if index == 3:
            raise _Crash
        return original(batch, index, *args)

    first.train_step = crash
    with pytest.raises(_Crash):
        first.fit()
    second = _trainer(tiny_features, tmp_path / "second", config, resume_path=progress, fingerprint="x")
    assert second.run_dir == tmp_path / "first" / "run", "no orphan folder: the rerun continues the first one's"


def test_a_damaged_best_model_is_found_at_the_resume_and_the_run_starts_afresh(tiny_features, tmp_path, logged):
    """Issue 62 item 10: a damaged best model beside the in-progress checkpoint was found only once the resumed run
    had trained to its end."""
    from criteo_dlrm.engine.training.run_state import best_path_for
    from tests.engine.training.test_loop import _config, _trainer

    progress = tmp_path / "in_progress" / "progress.pt"
    config = _config(num_epochs=1, validations_per_epoch=2)
    _trainer(tiny_features, tmp_path / "a", config, resume_path=progress, fingerprint="x").fit()
    best = best_path_for(progress)
    assert _trainer(tiny_features, tmp_path / "b", config, resume_path=progress, fingerprint="x").step > 0
    data = bytearray(best.read_bytes())
    data[len(data) // 2] ^= 1
    best.unlink()  # a hard link of the in-progress checkpoint written at that step: written anew, that one stays
    best.write_bytes(bytes(data))
    again = _trainer(tiny_features, tmp_path / "c", config, resume_path=progress, fingerprint="x")
    assert again.step == 0
    assert any(f"{best} is damaged" in line and "this run starts afresh" in line for line in logged), logged


# A Trainer over tables of 26 x 60,000 rows x 32 values (200 MB) with SparseAdam (400 MB of state), three
# validations, resume on; it prints the process's resident memory before the model existed, and its peak.
_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    import numpy as np, torch
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.stored import EncodedArrays
    from criteo_dlrm.engine.training.loop import Trainer
    from criteo_dlrm.engine.memory import embedding_bytes
    from criteo_dlrm.engine.parallel.modes import build_mode

    rows, folder = 60_000, Path(sys.argv[1])
    rng = np.random.default_rng(0)
    def arrays(n):
        return EncodedArrays((rng.random(n) < 0.25).astype(np.float32), rng.standard_normal((n, 13), np.float32),
                             rng.integers(0, rows, (n, 26)).astype(np.int32))
    train, validation = arrays(6144), arrays(2048)
    config = TrainingConfig.from_dict({
        "dense_mlp": {"hidden_layer_sizes": [16], "output_size": 32}, "sparse_embedding_sizes": 32,
        "prediction_hidden_sizes": [16], "batch_size": {"train": 256, "validation": 1024}, "max_steps": 24,
        "validate_every_steps": 8, "prefetch_batches": 0, "in_progress_dir": str(folder),
    })
    model_config = config.model_config([rows] * 26, 0.25)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.manual_seed(0)
    mode = build_mode(model_config, config, torch.device("cpu"))
    trainer = Trainer(mode, config, BatchLoader(train, 256, shuffle=True, seed=0), BatchLoader(validation, 1024),
                      folder / "run", resume_path=folder / "dlrm_x.pt", fingerprint="x")
    result = trainer.fit()
    state = embedding_bytes(model_config.table_sizes, model_config.sparse_embedding_sizes, "sparse_adam")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"base": base, "peak": peak, "state": state, "validations": len(result.history)}))
    """
)


@pytest.mark.slow
def test_training_holds_the_model_and_its_optimiser_state_once(tmp_path):
    """The best model and the in-progress state go to disk from the live tensors: no copy of the state in memory
    (a copy at each validation and another kept as the best model took it to 3x)."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path)], capture_output=True, text=True, cwd=PROJECT_ROOT, check=True
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["validations"] == 3
    grown = measured["peak"] - measured["base"]
    # Tables + SparseAdam state (600 MB) once, a quarter more for working buffers, and the tiny model's batches.
    assert grown <= 1.25 * measured["state"] + 150e6, (grown / 1e6, measured["state"] / 1e6)


def _values(step: int) -> dict:
    return {"step": step, "model_state": {"w": torch.full((4,), float(step))}, "optimizer_state": {}}


def test_an_improving_validation_links_the_best_model_to_the_state_just_written(tmp_path):
    files = ProgressFiles(tmp_path / "dlrm_x.pt")
    assert files.best == best_path_for(files.latest) == tmp_path / "best" / "dlrm_x.pt"
    files.save(_values(5), improved=True)
    assert os.stat(files.best).st_ino == os.stat(files.latest).st_ino, "one write, two names"
    files.save(_values(9), improved=False)
    assert load_checkpoint(files.latest)["step"] == 9
    assert load_checkpoint(files.best)["step"] == 5, "the best is kept when a later validation is worse"
    files.remove()
    assert not files.latest.exists() and not files.best.exists()


def test_with_resume_off_only_the_best_model_is_written_in_a_folder_that_lives_with_the_result(tmp_path):
    files = ProgressFiles(None)
    files.save(_values(3), improved=False)
    assert not files.best.exists()
    files.save(_values(4), improved=True)
    result = TrainingResult(str(files.best), 4, 0, {}, [], 4, False, 1.0)
    model_state = load_best(result).model_state
    assert torch.equal(model_state["w"], torch.full((4,), 4.0))


def test_a_best_model_of_another_step_is_refused_naming_it(tmp_path):
    files = ProgressFiles(tmp_path / "dlrm_x.pt")
    files.save(_values(7), improved=True)
    with pytest.raises(DamagedFileError, match=rf"{files.best} holds step 7, not the best step 6"):
        load_best(TrainingResult(str(files.best), 6, 0, {}, [], 8, False, 1.0))


def test_an_in_progress_checkpoint_that_carried_its_best_model_inside_resumes_with_it_in_its_own_file(
    tiny_features, tmp_path
):
    from tests.engine.training.test_loop import _config, _trainer

    progress = tmp_path / "in_progress" / "dlrm_x.pt"
    config = _config(num_epochs=1, validations_per_epoch=2)
    _trainer(tiny_features, tmp_path / "first", config, resume_path=progress, fingerprint="x").fit()
    latest, best = load_checkpoint(progress), load_checkpoint(best_path_for(progress))
    # The layout before the best model had its own file: its state inside the in-progress checkpoint.
    latest["best"] = {**latest["best"], "model_state": best["model_state"], "optimizer_state": best["optimizer_state"]}
    best_path_for(progress).unlink()
    save_atomically(latest, progress)
    resumed = _trainer(tiny_features, tmp_path / "second", config, resume_path=progress, fingerprint="x")
    assert resumed.step == latest["step"], "resumed, not started afresh"
    assert load_checkpoint(progress)["step"] == latest["step"], "the in-progress state is the latest, not the best"
    moved = load_checkpoint(best_path_for(progress))
    assert moved["step"] == latest["best"]["step"]
    for name, tensor in best["model_state"].items():
        assert torch.equal(moved["model_state"][name], tensor), name

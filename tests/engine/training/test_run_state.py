"""Checks of a run's in-progress state: a damaged one set aside, a killed run resumed into its own folder."""

from __future__ import annotations

from pathlib import Path

import pytest


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
    from criteo_dlrm.engine.trained.progress import best_path_for
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

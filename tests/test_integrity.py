"""Fault injection: nothing damaged, half-written, planted or concurrently written is ever used as if it were fine.

Each test reproduces one fault of the integrity review (issue 22) and checks that the project refuses it with
the file's name (or rebuilds what can be rebuilt), never returning a wrong result.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from kedro.io.core import Version

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.common.locks import LockedError, exclusive
from criteo_dlrm.common.storage import DiskFullError
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import EncodedDays, FeatureEncoder
from criteo_dlrm.data.lineage import encoded_lineage
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import iter_batches
from criteo_dlrm.data.raw import IngestionError, convert_day, convert_or_reuse, scan_raw_folder
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.datasets import EncodedArraysDataset, JSONDataset, TorchCheckpointDataset


@pytest.fixture(scope="module")
def day(tmp_path_factory) -> tuple[Path, Path, list]:
    folder = tmp_path_factory.mktemp("day")
    write_day(folder / "day_0", 3000, day=0, model=ClickModel(seed=4))
    parquet = Path(convert_day(folder / "day_0", folder / "out" / "day_0.parquet").parquet)
    return folder / "day_0", parquet, pq.read_table(parquet).to_pylist()


def _fails_with(kind: type, action, match: str) -> str:
    """Run ``action``; it must fail with ``kind`` (perhaps wrapped by Kedro) and a message matching ``match``."""
    import re

    with pytest.raises(Exception) as caught:
        action()
    chain, error = [], caught.value
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, kind) for e in chain), caught.value
    assert re.search(match, str(caught.value)), caught.value
    return str(caught.value)


def _refused(action, path: Path) -> str:
    """Run ``action``; it must fail with a ``DataError`` (perhaps wrapped by Kedro) naming ``path``."""
    from criteo_dlrm.cli import user_error

    with pytest.raises(Exception) as caught:
        action()
    assert isinstance(user_error(caught.value), DataError), caught.value
    assert str(path) in str(caught.value), caught.value
    return str(caught.value)


def _flip(path: Path, position: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_no_flipped_bit_anywhere_in_a_parquet_day_reads_back_as_other_numbers(day, tmp_path):
    _, parquet, rows = day
    rng = random.Random(0)
    size = parquet.stat().st_size
    refused = 0
    for trial in range(120):
        copy = tmp_path / f"flip_{trial}" / "day_0.parquet"
        copy.parent.mkdir()
        copy.write_bytes(parquet.read_bytes())
        Path(f"{copy}.fingerprint").write_bytes(Path(f"{parquet}.fingerprint").read_bytes())
        _flip(copy, rng.randrange(size), rng.randrange(8))
        try:
            read = [row for batch in iter_batches([copy]) for row in batch.to_pylist()]
        except DataError as error:
            assert str(copy) in str(error), "the refusal names the day"
            refused += 1
            continue
        assert read == rows, f"trial {trial}: a flipped bit read back as other numbers"
    assert refused > 100, "nearly every flip lands in checked bytes"


def test_ingestion_rebuilds_a_damaged_day_instead_of_calling_it_converted(day, tmp_path):
    source, parquet, rows = day
    destination = tmp_path / "day_0.parquet"
    convert_day(source, destination)
    _flip(destination, destination.stat().st_size // 2, 3)  # inside the data pages
    convert_or_reuse(source, destination)
    assert pq.read_table(destination).to_pylist() == rows


def _encoded(day, tmp_path) -> tuple[EncodedArraysDataset, EncodedDays]:
    _, parquet, _ = day
    metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(min_expected_clicks=0), progress=False)
    metadata = dataclasses.replace(
        metadata, source_days={"train": [{"day": "day_0", "rows": 3000, "fingerprint": "f"}]}
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    lineage = encoded_lineage(metadata, "v1", metadata.source_days["train"])
    return EncodedArraysDataset(str(tmp_path / "train_features")), EncodedDays(encoder, [str(parquet)], lineage, 1)


@pytest.mark.parametrize(
    "damage",
    ["noise in labels", "deleted layout", "truncated sparse"],
)
def test_damaged_encoded_rows_are_refused_before_use_and_rebuilt_on_the_next_save(day, tmp_path, damage):
    dataset, days = _encoded(day, tmp_path)
    dataset.save(days)
    clean = {name: np.array(getattr(dataset.load(), name)) for name in ("labels", "dense", "sparse")}
    folder = tmp_path / "train_features"
    if damage == "noise in labels":
        with open(folder / "labels.npy", "r+b") as handle:
            handle.seek(200)
            handle.write(os.urandom(4096)[: 3000 - 200])
    elif damage == "deleted layout":
        (folder / "layout.json").unlink()
    else:
        with open(folder / "sparse.npy", "r+b") as handle:
            handle.truncate(os.path.getsize(folder / "sparse.npy") // 2)
    from criteo_dlrm.data.batches import BatchLoader

    def train_on_them():  # what training does: load the rows, read them in shuffled batches
        return list(BatchLoader(EncodedArraysDataset(str(folder)).load(), 500, shuffle=True).batches())

    message = _refused(train_on_them, folder)
    if damage == "noise in labels":  # found as the chunk is first read (not on load), with its rows named
        assert "labels.npy is damaged: rows 0-2,999 are not what was written" in message
        assert "found by an earlier run" in _refused(EncodedArraysDataset(str(folder)).load, folder)
    fresh = EncodedArraysDataset(str(folder))
    fresh.save(days)  # same lineage: without the digests these rows would be reused as they are
    rebuilt = fresh.load()
    for name, array in clean.items():
        np.testing.assert_array_equal(np.array(getattr(rebuilt, name)), array, err_msg=name)


def test_a_checkpoint_with_overwritten_bytes_is_refused_naming_it(tmp_path):
    path = tmp_path / "dlrm_checkpoint.pt"
    TorchCheckpointDataset(str(path), version=Version(None, None)).save({"weights": torch.randn(50_000)})
    [file] = path.glob("*/dlrm_checkpoint.pt")
    with open(file, "r+b") as handle:
        handle.seek(file.stat().st_size // 2)
        handle.write(b"\xff" * 256)
    message = _refused(TorchCheckpointDataset(str(path), version=Version(None, None)).load, file)
    assert "is damaged" in message


def test_a_truncated_in_progress_checkpoint_is_set_aside_and_the_run_starts_afresh(tiny_features, tmp_path):
    from tests.engine.test_loop import _config, _trainer

    progress = tmp_path / "in_progress" / "progress.pt"
    first = _trainer(tiny_features, tmp_path / "a", _config(num_epochs=1), resume_path=progress, fingerprint="x")
    first.fit()
    with open(progress, "r+b") as handle:
        handle.truncate(progress.stat().st_size // 3)
    again = _trainer(tiny_features, tmp_path / "b", _config(num_epochs=1), resume_path=progress, fingerprint="x")
    assert again.step == 0
    assert Path(f"{progress}.damaged").exists()


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_planted_job_and_outcome_files_never_run_code(tmp_path):
    from criteo_dlrm.engine.job import TrainingJob, TrainingOutcome

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


def test_concurrent_saves_of_one_dataset_folder_never_mix(day, tmp_path):
    dataset, days = _encoded(day, tmp_path)
    other, _ = _encoded(day, tmp_path)
    with exclusive(tmp_path / "train_features", "the encoded rows train_features"):
        _fails_with(LockedError, lambda: other.save(days), f"being written by process {os.getpid()}")
    dataset.save(days)
    assert len(dataset.load()) == 3000


def test_a_full_disk_while_a_version_is_written_leaves_the_last_complete_version_as_the_latest(tmp_path, monkeypatch):
    from criteo_dlrm.datasets import versioned_file

    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"version": 1})

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(versioned_file._HashingWriter, "write", full)
    failing = JSONDataset(str(path), version=Version(None, "2026-01-02T00.00.00.000Z"))
    _fails_with(DiskFullError, lambda: failing.save({"version": 2}), f"No space left on {path}")
    monkeypatch.undo()  # (no chdir to undo here)
    assert JSONDataset(str(path), version=Version(None, None)).load() == {"version": 1}
    assert not list(path.glob("*/*.partial")) and not list(path.glob("*/.*.partial"))


def test_a_full_disk_is_reported_as_such_for_a_day_being_converted(day, tmp_path, monkeypatch):
    import pyarrow.parquet

    source, _, _ = day

    class FullWriter(pyarrow.parquet.ParquetWriter):
        def write_table(self, table, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("criteo_dlrm.data.raw.convert.pq.ParquetWriter", FullWriter)
    with pytest.raises(DiskFullError, match=rf"No space left on {tmp_path}.* while writing the Parquet of day_0"):
        convert_day(source, tmp_path / "day_0.parquet")
    assert not list(tmp_path.glob("*day_0*")), "nothing half-written is left"


def test_encoding_checks_the_space_it_needs_before_writing_a_row(day, tmp_path, monkeypatch):
    import shutil

    dataset, days = _encoded(day, tmp_path)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=10_000))
    _fails_with(
        DiskFullError, lambda: dataset.save(days), r"No space left on .* 3,000 encoded rows \(10.0 kB free; it needs"
    )
    assert not (tmp_path / "train_features").exists()


def test_every_unused_file_of_a_raw_folder_is_named_and_unreadable_days_are_refused(tmp_path):
    folder = tmp_path / "raw"
    write_day(folder / "day_0", 50, day=0, model=ClickModel(seed=1))
    (folder / "part-1.txt").write_bytes((folder / "day_0").read_bytes())
    (folder / "README.md").write_text("notes")
    scanned = scan_raw_folder(folder)
    assert [p.name for p in scanned.days] == ["day_0", "part-1.txt"]
    assert "README.md" in scanned.ignored and "day_0.click_probability.npy" in scanned.ignored
    os.mkfifo(folder / "day_3")
    (folder / "day_4.gz").symlink_to(folder / "day_4.gz")  # a link to itself: a loop
    (folder / "day 5.gz").write_bytes(b"")
    with pytest.raises(IngestionError) as caught:
        scan_raw_folder(folder)
    message = str(caught.value)
    assert "day_3: is a FIFO, not a regular file" in message
    assert "day_4.gz: cannot be opened" in message
    assert "'day 5.gz': looks like a day file but its name is not one" in message


def test_a_line_longer_than_a_block_names_the_line_and_the_setting(tmp_path):
    source = tmp_path / "day_0"
    write_day(source, 100, day=0, model=ClickModel(seed=2))
    lines = source.read_text().splitlines(keepends=True)
    lines.insert(60, "1" + "\t" * 39 + "a" * (3 << 20) + "\n")
    source.write_text("".join(lines))
    with pytest.raises(IngestionError, match=r"a line from line \d+ on is longer than one block .*block_size_mb=1\)"):
        convert_day(source, tmp_path / "day_0.parquet", block_size=1 << 20)


def test_metadata_and_vocabularies_of_two_runs_are_refused_before_training(tmp_path):
    from criteo_dlrm.datasets import FeatureVocabulariesDataset
    from criteo_dlrm.preflight import MismatchedVersionsError, check_same_run

    for version in ("2026-01-01T00.00.00.000Z", "2026-01-02T00.00.00.000Z"):
        JSONDataset(str(tmp_path / "m.json"), version=Version(None, version)).save({"v": version})
        FeatureVocabulariesDataset(str(tmp_path / "v.npz"), version=Version(None, version)).save({"SPARSE_0": [1]})
    pinned = JSONDataset(str(tmp_path / "m.json"), version=Version("2026-01-01T00.00.00.000Z", None))
    latest = FeatureVocabulariesDataset(str(tmp_path / "v.npz"), version=Version(None, None))
    with pytest.raises(MismatchedVersionsError, match="feature_vocabularies:2026-01-01T00.00.00.000Z"):
        check_same_run(pinned, latest)


def test_json_reports_are_refused_when_damaged(tmp_path):
    path = tmp_path / "evaluation_metrics.json"
    JSONDataset(str(path), version=Version(None, None)).save({"auc": 0.7})
    [file] = path.glob("*/evaluation_metrics.json")
    file.write_text(json.dumps({"auc": 0.9}))
    assert "is damaged" in _refused(JSONDataset(str(path), version=Version(None, None)).load, file)


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


def test_a_run_killed_before_its_first_validation_resumes_into_its_own_run_folder(tiny_features, tmp_path):
    from tests.engine.test_loop import _config, _Crash, _trainer

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


def _checkpoint(tmp_path: Path) -> dict:
    """A small trained checkpoint and a raw folder of 400 rows to score."""
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.engine.recipe import run_training

    write_day(tmp_path / "raw" / "day_0", 400, day=0, model=ClickModel(seed=3))
    write_day(tmp_path / "train" / "day_0", 2000, day=0, model=ClickModel(seed=3))
    parquet = Path(convert_day(tmp_path / "train" / "day_0", tmp_path / "train.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(min_expected_clicks=0), progress=False)
    metadata = dataclasses.replace(metadata, source_days={"train": [], "validation": []})
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    rows = encoder.encode_days([parquet])
    config = TrainingConfig.from_dict(
        {"num_epochs": 1, "resume": False, "tensorboard_dir": str(tmp_path / "tb"), "validations_per_epoch": 1}
    )
    checkpoint, _ = run_training(config, rows, rows, metadata, vocabularies, "r")
    return {**checkpoint, "catalog_version": "v"}


def test_scoring_leaves_nothing_behind_and_removes_what_a_killed_scoring_left(tmp_path):
    from criteo_dlrm.pipelines.scoring.nodes import score_new_days

    parquet_dir = tmp_path / "scoring_input"
    parquet_dir.mkdir()
    stale = parquet_dir / f".predictions.parquet.{2**22 + 99}.0123abcd.partial"  # a pid no process has
    stale.write_bytes(b"half")
    checkpoint = _checkpoint(tmp_path)
    staged, report = score_new_days(checkpoint, {"input_dir": str(tmp_path / "raw"), "parquet_dir": str(parquet_dir)})
    assert not stale.exists() and staged.parent == parquet_dir and staged.name.endswith(".partial")
    assert report["rows"] == 400


# -- Round three (issue 33) -------------------------------------------------------------------------------------


def _run_in_session(project: Path, params: dict, pipelines: list[str] | None = None) -> None:
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(project)
    with KedroSession.create(project, runtime_params=params) as session:
        session.run(pipeline_names=pipelines)


@pytest.mark.parametrize(
    ("train_days", "overlap"), [(["day_0", "day_2"], "day_2"), (["day_2"], "day_2"), (["day_1", "day_2"], "day_2")]
)
def test_training_days_that_take_the_default_validation_day_are_refused_before_ingestion(project, train_days, overlap):
    from criteo_dlrm.common.errors import ConfigError

    message = _fails_with(
        ConfigError,
        lambda: _run_in_session(project, {"metadata": {"train_days": train_days}, "training": {"num_epochs": 1}}),
        rf"metadata.train_days and the default validation day both take \['{overlap}'\]",
    )
    assert "metadata.validation_days" in message
    assert not (project / "data/02_intermediate").exists() or not list(
        (project / "data/02_intermediate").rglob("*.parquet")
    )


def test_every_split_whether_named_or_by_default_gives_each_day_one_role_at_most():
    from criteo_dlrm.common.errors import ConfigError

    names = ["day_0", "day_1", "day_2", "day_3"]
    cases = [
        {}, {"train_days": ["day_0"]}, {"validation_days": ["day_1"]}, {"test_days": ["day_3"]},
        {"train_days": ["day_3"]}, {"test_days": ["day_2"], "train_days": ["day_0", "day_3"]},
        {"validation_days": ["day_0"], "train_days": ["day_0", "day_1"]}, {"test_days": ["day_0", "day_1", "day_2"]},
        {"validation_days": ["day_3"], "test_days": ["day_2"], "train_days": ["day_2"]},
    ]  # fmt: skip
    for settings in cases:
        try:
            split = MetadataConfig(**settings).split(names)
        except ConfigError:
            continue
        roles = [*split.train, *split.validation, *split.test]
        assert len(roles) == len(set(roles)), (settings, split)
        assert split.train and split.validation, (settings, split)
    with pytest.raises(ConfigError, match=r"the default validation day both take \['day_3'\]"):
        MetadataConfig(train_days=["day_3"]).split(names)
    with pytest.raises(ConfigError, match=r"metadata.train_days and the default validation day both take \['day_3'\]"):
        MetadataConfig(test_days=["day_2"], train_days=["day_0", "day_3"]).split(names)


@pytest.mark.parametrize("name", ["día_0.txt.gz", "day_8.gz\n", "trаin.txt"])  # the last with a Cyrillic 'а'
def test_day_names_outside_the_documented_naming_are_refused_not_converted_or_sorted_last(tmp_path, name):
    for day in ("day_0.gz", "day_1.gz"):
        (tmp_path / day).write_bytes(b"")
    (tmp_path / name).write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(IngestionError, match="looks like a day file but its name is not one") as refused:
        scan_raw_folder(tmp_path)
    assert repr(name) in str(refused.value), "the name is shown as it is, newline included"


def test_the_order_of_days_is_one_rule_and_a_mixed_folder_says_which_day_validates(tmp_path):
    from loguru import logger

    for day in ("day_10.gz", "day_9.gz", "zeta.txt", "alpha.tsv.gz"):
        (tmp_path / day).write_bytes(b"")
    said = []
    handler = logger.add(lambda message: said.append(str(message)), level="WARNING")
    try:
        days = scan_raw_folder(tmp_path).days
    finally:
        logger.remove(handler)
    assert [p.name for p in days] == ["day_9.gz", "day_10.gz", "alpha.tsv.gz", "zeta.txt"]
    assert any("zeta comes last and validates" in line for line in said), said


def test_the_ingestion_summary_says_which_days_train_validate_and_test():
    from criteo_dlrm.summary import split_line

    names = ["day_0", "day_1", "day_2", "day_3"]
    assert split_line(MetadataConfig().split(names), 0.5, names) == (
        "day_0, day_1, day_2 train; day_3 validate (first 50%) and test (last 50%)"
    )
    config = MetadataConfig(train_days=["day_1"], test_days=["day_3"])
    assert split_line(config.split(names), 0.5, names) == "day_1 train; day_2 validate; day_3 test; day_0 unused"


def _saved_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A versioned checkpoint saved as training saves it: ``(its file, the dataset's path)``."""
    path = tmp_path / "dlrm_checkpoint.pt"
    state = {"format": 3, "model_state": {"w": torch.arange(6.0)}, "calibration": {"method": "platt", "a": 1.5}}
    TorchCheckpointDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save(state)
    [file] = path.glob("*/dlrm_checkpoint.pt")
    return file, path


def _edit_calibration(file: Path) -> None:
    state = torch.load(file, weights_only=True)
    state["calibration"]["a"] = 9.0
    torch.save(state, file)


def test_a_checkpoint_edited_and_stripped_of_its_digest_is_refused(tmp_path):
    file, path = _saved_checkpoint(tmp_path)
    _edit_calibration(file)
    Path(f"{file}.sha256").unlink()
    message = _refused(TorchCheckpointDataset(str(path), version=Version(None, None)).load, file)
    assert "has no digest" in message and "--load-versions" in message


def test_a_checkpoint_rewritten_with_a_fresh_file_digest_is_refused_by_the_digest_inside(tmp_path):
    import hashlib

    file, path = _saved_checkpoint(tmp_path)
    _edit_calibration(file)
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    assert "content is not what was written" in _refused(
        TorchCheckpointDataset(str(path), version=Version(None, None)).load, file
    )
    state = torch.load(file, weights_only=True)
    del state["content_sha256"]  # and with the digest inside removed as well
    torch.save(state, file)
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    assert "lost the content digest" in _refused(
        TorchCheckpointDataset(str(path), version=Version(None, None)).load, file
    )


def test_a_checkpoint_of_format_2_without_a_digest_inside_still_loads_on_its_file_digest(tmp_path):
    import hashlib

    path = tmp_path / "dlrm_checkpoint.pt"
    file = path / "2025-01-01T00.00.00.000Z" / "dlrm_checkpoint.pt"
    file.parent.mkdir(parents=True)
    torch.save({"format": 2, "model_state": {"w": torch.ones(2)}}, file)
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    loaded = TorchCheckpointDataset(str(path), version=Version(None, None)).load()
    assert loaded["format"] == 2 and torch.equal(loaded["model_state"]["w"], torch.ones(2))


def test_feature_metadata_without_its_digest_is_refused(tmp_path):
    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"label": {"ctr": 0.25}})
    [file] = path.glob("*/feature_metadata.json")
    file.write_text(json.dumps({"label": {"ctr": 0.03}}))
    Path(f"{file}.sha256").unlink()
    assert "has no digest" in _refused(JSONDataset(str(path), version=Version(None, None)).load, file)


def test_a_digest_is_compared_whatever_its_case(tmp_path):
    file, path = _saved_checkpoint(tmp_path)
    sidecar = Path(f"{file}.sha256")
    sidecar.write_text(sidecar.read_text().upper() + "\n")
    loaded = TorchCheckpointDataset(str(path), version=Version(None, None)).load()
    assert loaded["calibration"]["a"] == 1.5 and "content_sha256" not in loaded


def test_encoded_rows_without_their_digests_are_refused_and_rebuilt(day, tmp_path):
    dataset, days = _encoded(day, tmp_path)
    dataset.save(days)
    folder = tmp_path / "train_features"
    (folder / "digests.json").unlink()
    assert "digests.json is missing" in _refused(EncodedArraysDataset(str(folder)).load, folder)
    EncodedArraysDataset(str(folder)).save(days)
    assert (folder / "digests.json").exists()


def test_stored_rows_with_indices_beyond_their_claimed_tables_are_refused_naming_the_folder(day, tmp_path):
    from criteo_dlrm.common.storage import DamagedFileError
    from criteo_dlrm.data.stored import check_index_range, open_encoded

    dataset, days = _encoded(day, tmp_path)
    dataset.save(days)
    folder = tmp_path / "train_features"
    rows = open_encoded(folder)
    true_maxima = np.asarray(rows.sparse[:]).max(axis=0)
    assert rows.index_maxima == true_maxima.tolist(), "the recorded maxima are the rows' own"
    sizes = list(days.encoder.table_sizes)
    check_index_range(rows, sizes, "the training rows")
    smaller = list(sizes)
    smaller[5] = int(true_maxima[5])  # the metadata a forged lineage claims: one table a row too small
    with pytest.raises(DamagedFileError, match=rf"{folder}: the training rows .*SPARSE_5: index {true_maxima[5]:,}"):
        check_index_range(rows, smaller, "the training rows")
    in_memory = days.encoder.encode_days(days.paths)
    assert in_memory.index_maxima == true_maxima.tolist()
    in_memory.index_maxima = None  # rows without recorded maxima are read for them
    with pytest.raises(DamagedFileError, match="SPARSE_5"):
        check_index_range(in_memory, smaller, "the training rows")
    from loguru import logger

    said = []
    handler = logger.add(lambda message: said.append(str(message)), level="WARNING")
    try:
        days.encoder.table_sizes = smaller  # the same lineage, claiming smaller tables: not reused as they are
        EncodedArraysDataset(str(folder)).save(days)
    finally:
        logger.remove(handler)
    assert any("SPARSE_5" in line and "Encoding them again" in line for line in said), said


@pytest.mark.parametrize("kind", ["file", "folder", "parquet day"])
def test_every_staged_rename_is_followed_by_a_sync_of_its_folder(tmp_path, monkeypatch, kind, day):
    import stat

    from criteo_dlrm.common import storage

    events = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(source, destination):
        real_replace(source, destination)
        events.append(("rename", Path(destination).parent))

    def fsync(descriptor):
        real_fsync(descriptor)
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            events.append(("sync", Path(os.readlink(f"/proc/self/fd/{descriptor}"))))

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    if kind == "file":
        storage.write_bytes_atomically(tmp_path / "report.json", b"{}")
    elif kind == "folder":
        with storage.atomic_folder(tmp_path / "rows") as staged:
            (staged / "labels.npy").write_bytes(b"x")
    else:
        convert_day(day[0], tmp_path / "out" / "day_0.parquet")
    renames = [index for index, event in enumerate(events) if event[0] == "rename"]
    assert renames, events
    for index in renames:
        folder = events[index][1]
        assert ("sync", folder.resolve()) in [(e[0], e[1].resolve()) for e in events[index + 1 :]], (folder, events)


def _preflight(pipeline: str, params: dict, tmp_path: Path, monkeypatch) -> None:
    """``preflight.check_before_run`` for ``kedro run --pipelines=<pipeline> --params=...``, in ``tmp_path``."""
    from kedro.io import DataCatalog
    from kedro.pipeline import Pipeline

    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import PIPELINE_ORDER, _pipeline
    from criteo_dlrm.preflight import check_before_run

    monkeypatch.chdir(tmp_path)
    names = PIPELINE_ORDER if pipeline == "__default__" else [pipeline]
    check_before_run(parse_parameters(params), sum((_pipeline(n) for n in names), Pipeline([])), DataCatalog())


def test_tables_too_large_in_modulus_hash_mode_are_refused_before_ingestion(project):
    from criteo_dlrm.common.errors import ConfigError

    params = {"metadata": {"use_modulus_hash": True, "modulus_hash_size": 200_000_000}}
    message = _fails_with(ConfigError, lambda: _run_in_session(project, params), r"need [\d,.]+ GB")
    assert "metadata.modulus_hash_size" in message
    assert not list((project / "data").rglob("*.parquet")), "refused before ingestion"


def test_tables_too_large_in_an_existing_metadata_version_name_the_metadata_rerun(project):
    from criteo_dlrm.common.errors import ConfigError

    _run_in_session(project, {"metadata": {"max_vocabulary_size": 5}}, ["ingestion", "metadata"])
    params = {"training": {"sparse_embedding_sizes": 1_000_000_000, "dense_mlp": {"output_size": 1_000_000_000}}}
    message = _fails_with(ConfigError, lambda: _run_in_session(project, params, ["training"]), r"need [\d,.]+ GB")
    assert "feature_metadata version" in message and "--pipelines=metadata,training" in message


@pytest.mark.parametrize("case", ["missing folder", "foreign parquet"])
def test_a_scoring_input_that_cannot_be_scored_is_refused_before_any_work(tmp_path, monkeypatch, case):
    import pyarrow as pa

    folder = tmp_path / "to_score"
    if case == "foreign parquet":
        folder.mkdir()
        pq.write_table(pa.table({"user": [1, 2], "item": [3, 4]}), folder / "clicks.parquet")
        match, kind = r"clicks.parquet is not a Parquet day this project can score .*scoring.input_dir takes", DataError
    else:
        match, kind = r"scoring.input_dir: the folder .*to_score does not exist", IngestionError
    with pytest.raises(kind, match=match) as refused:
        _preflight("scoring", {"scoring": {"input_dir": str(folder)}}, tmp_path, monkeypatch)
    assert "ingestion.force" not in str(refused.value), "no ingestion fix for a scoring input"


def test_more_training_processes_than_cores_on_the_cpu_are_refused(tmp_path, monkeypatch):
    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.common.parallel import available_cores

    params = {"training": {"device": "cpu", "distributed": {"nproc_per_node": available_cores() + 1}}}
    with pytest.raises(
        ConfigError, match=rf"nproc_per_node={available_cores() + 1} starts .* at most {available_cores()}"
    ):
        _preflight("training", params, tmp_path, monkeypatch)
    _preflight(
        "training",
        {"training": {"device": "cpu", "distributed": {"nproc_per_node": available_cores()}}},
        tmp_path,
        monkeypatch,
    )


def test_a_full_disk_while_marking_a_version_or_writing_predictions_names_the_folder(tmp_path, monkeypatch):

    from criteo_dlrm.engine import scoring

    dataset = JSONDataset(str(tmp_path / "metrics.json"), version=Version(None, "2026-01-01T00.00.00.000Z"))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    from criteo_dlrm.common import storage

    with monkeypatch.context() as patched:
        patched.setattr(storage, "create_exclusive", full)
        with pytest.raises(DiskFullError, match=r"No space left on .*metrics.json.*while writing the marker"):
            dataset.mark_incomplete("2026-01-01T00.00.00.000Z", {"run": "r"})
    destination = tmp_path / "predictions.parquet"
    monkeypatch.setattr(scoring, "_write_predictions", lambda *args: (destination.write_bytes(b"half"), full())[1])
    with pytest.raises(DiskFullError, match=rf"No space left on {tmp_path} while writing the predictions"):
        scoring.write_predictions(None, None, None, [], destination)
    assert not destination.exists(), "nothing half-written is left"


def test_every_folder_a_run_writes_is_checked_before_the_first_node(tmp_path, monkeypatch):
    from criteo_dlrm.common import storage
    from criteo_dlrm.common.storage import NotWritableError

    real = storage.create_exclusive

    def read_only(path):
        if "08_reporting" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path)

    monkeypatch.setattr(storage, "create_exclusive", read_only)
    with pytest.raises(NotWritableError, match=r"data/08_reporting/tensorboard is not writable \(Read-only file sys"):
        _preflight("__default__", {}, tmp_path, monkeypatch)
    assert not list(tmp_path.rglob("*.parquet"))


def test_the_folders_checked_are_every_output_folder_of_the_whole_job(project):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import register_pipelines
    from criteo_dlrm.preflight import _output_folders

    bootstrap_project(project)
    with KedroSession.create(project) as session:
        context = session.load_context()
        folders = _output_folders(
            parse_parameters(context.params), register_pipelines()["__default__"], context.catalog
        )
    named = {str(Path(folder)).split("data/", 1)[-1] for folder in folders}
    for expected in ("02_intermediate", "04_feature/feature_metadata.json", "05_model_input", "06_models/in_progress",
                     "06_models/dlrm_checkpoint.pt", "08_reporting/tensorboard", "08_reporting/evaluation_metrics.json"):  # fmt: skip
        assert expected in named, (expected, named)


@pytest.mark.parametrize("setting", ["ingestion.output_dir", "training.in_progress_dir"])
def test_an_output_folder_that_is_a_file_is_refused_naming_the_setting(tmp_path, monkeypatch, setting):
    from criteo_dlrm.common.storage import NotWritableError

    block, field = setting.split(".")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotWritableError, match=rf"a_file is a file, where this run needs a folder .* point {setting}"):
        _preflight("__default__", {block: {field: str(tmp_path / "a_file")}}, tmp_path, monkeypatch)


def test_a_raw_folder_that_is_a_file_says_so(tmp_path):
    (tmp_path / "day_0.gz").write_bytes(b"")
    with pytest.raises(
        IngestionError, match=rf"day_0.gz is a file, not a folder.*`kedro run --params=ingestion.raw_dir={tmp_path}`$"
    ):
        scan_raw_folder(tmp_path / "day_0.gz")


def test_a_tracking_server_answering_404_is_refused_before_the_run():
    import http.server
    import threading

    from criteo_dlrm.tracking.hooks import TrackingServerError, check_tracking_server
    from tests.conftest import unused_port

    port = unused_port()
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with pytest.raises(TrackingServerError, match=r"answered HTTP 404 .*not an MLflow tracking server"):
            check_tracking_server(f"http://127.0.0.1:{port}/nothing-here")
    finally:
        server.server_close()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"training:\n  seed: 1\n  seed: 2\n", r"line 3, column 3: the key 'seed' is given twice \(first on line 2\)"),
        (b"training:\n  seed: [1\n", r"parameters.yml, line 3, column 1: expected ','"),
        (b"training:\n  seed: 1 # caf\xe9\n", r"parameters.yml, line 2: byte 0xe9 is not UTF-8"),
        (
            b"training:\n  seed: !!python/name:os.system\n",
            r"line 2, column 9: could not determine a constructor .*tags are not read",
        ),
        (
            b"a: &a [x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
            b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
            r"parameters.yml: its aliases \(\*name\) expand to more than 10,000 values",
        ),
    ],
)
def test_a_configuration_file_kedro_cannot_read_is_refused_naming_file_and_line(tmp_path, content, problem):
    from criteo_dlrm.cli import check_conf_files
    from criteo_dlrm.common.errors import ConfigError

    (tmp_path / "base").mkdir()
    (tmp_path / "local").mkdir()
    (tmp_path / "base" / "parameters.yml").write_text("training:\n  seed: 0\n")
    check_conf_files(tmp_path, None)
    (tmp_path / "local" / "parameters.yml").write_bytes(content)
    with pytest.raises(ConfigError, match=problem):
        check_conf_files(tmp_path, None)


def test_a_yaml_merge_key_is_read_as_yaml_reads_it(tmp_path):
    """A standard merge key (<<: *base) was refused as 'could not determine a constructor'."""
    from criteo_dlrm.cli import check_conf_files, versioned_datasets

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "catalog.yml").write_text(
        "_versioned: &versioned\n  type: criteo_dlrm.datasets.JSONDataset\n  versioned: true\n"
        "a:\n  <<: *versioned\n  filepath: data/a.json\nb:\n  <<: *versioned\n  versioned: false\n  filepath: b\n"
    )
    check_conf_files(tmp_path, None)
    assert versioned_datasets(tmp_path) == {"_versioned": "_versioned", "a": "data/a.json"}


def test_a_raw_file_whose_time_alone_changed_names_how_to_restore_its_day(day, tmp_path):
    import shlex
    import shutil

    from criteo_dlrm.data.lineage import LineageError, check_days, day_lineage

    raw = tmp_path / "raw" / "day_0"
    raw.parent.mkdir()
    shutil.copy(day[0], raw)
    parquet = tmp_path / "out" / "day_0.parquet"
    convert_or_reuse(raw, parquet)
    recorded = day_lineage("day_0", parquet)
    os.utime(raw, ns=(raw.stat().st_atime_ns, raw.stat().st_mtime_ns + 5 * 10**9))  # `touch`: same bytes
    convert_or_reuse(raw, parquet)  # a plain rerun converts it again: another Parquet
    with pytest.raises(LineageError) as refused:
        check_days([recorded], "dlrm_checkpoint")
    message = str(refused.value)
    assert "cannot be restored" not in message
    touch = re.search(r"`(touch -d [^`]+)`", message).group(1)
    subprocess.run(shlex.split(touch), check=True)
    convert_or_reuse(raw, parquet)  # what `kedro run --pipelines=ingestion` does for this day
    check_days([recorded], "dlrm_checkpoint")


def test_a_modulus_hash_size_without_the_modulus_hash_is_refused_not_ignored():
    from criteo_dlrm.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"modulus_hash_size is 200,000,000 but metadata.use_modulus_hash is false"):
        MetadataConfig.from_dict({"modulus_hash_size": 200_000_000}, "metadata.")
    MetadataConfig.from_dict({"modulus_hash_size": 1000, "use_modulus_hash": True}, "metadata.")


def test_predictions_that_cannot_fit_are_refused_before_the_export_runs(tmp_path, monkeypatch):
    """A full predictions folder was found only when the predictions were written, after the ONNX export."""
    import shutil as real_shutil

    from kedro.io import DataCatalog

    from criteo_dlrm.common import storage
    from criteo_dlrm.datasets import BinaryFileDataset

    raw = tmp_path / "to_score"
    raw.mkdir()
    line = "\t".join(["1", *["5"] * 13, *["68fd1e64"] * 26]) + "\n"
    (raw / "day_0").write_text(line * 2000)  # 2,000 lines of 262 bytes: at least 524 rows counted, 4 bytes each
    predictions = tmp_path / "full_disk" / "predictions.parquet"
    usage = real_shutil.disk_usage

    def full(path):
        found = usage(path)
        return found._replace(free=1000) if "full_disk" in str(path) else found

    monkeypatch.setattr(storage.shutil, "disk_usage", full)
    catalog = DataCatalog({"predictions": BinaryFileDataset(str(predictions), version=Version(None, None))})
    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import _pipeline
    from criteo_dlrm.preflight import check_before_run

    monkeypatch.chdir(tmp_path)
    configs = parse_parameters({"scoring": {"input_dir": str(raw), "parquet_dir": str(tmp_path / "staged")}})
    with pytest.raises(DiskFullError) as refused:
        check_before_run(configs, _pipeline("scoring"), catalog)
    message = str(refused.value)
    assert f"No space left on {predictions} while writing the predictions of 524 rows or more" in message
    assert "(1.0 kB free; it needs 2.1 kB)" in message
    check_before_run(configs, _pipeline("scoring"), DataCatalog())  # the staging folder has room

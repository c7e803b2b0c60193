"""Versioned outputs (``datasets.versioned_file``): a version a run began and did not finish is never the latest,
and a run reads the versions that were newest when it began. Part of the fault injection
(``tests/faults.py``)."""

from __future__ import annotations

import errno
import json
import os

import pytest
from kedro.io.core import Version

from criteo_dlrm.common.storage import DiskFullError
from criteo_dlrm.datasets import JSONDataset
from tests.faults import fails_with


def test_a_version_a_killed_run_began_is_never_the_latest(tmp_path):
    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"version": 1})
    begun = JSONDataset(str(path), version=Version(None, "2026-01-02T00.00.00.000Z"))
    marker = path / "2026-01-02T00.00.00.000Z" / ".incomplete"  # as another (killed) process wrote it
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"pid": 2**22 + 17, "host": "gone", "token": "0" * 32}))
    begun.save({"version": 2})  # its node's other outputs never came
    reader = JSONDataset(str(path), version=Version(None, None))
    assert reader.load() == {"version": 1}
    assert list(reader.incomplete_versions()) == [str(path / "2026-01-02T00.00.00.000Z")]
    begun.mark_complete("2026-01-02T00.00.00.000Z")
    assert JSONDataset(str(path), version=Version(None, None)).load() == {"version": 2}


def test_a_marker_with_this_process_pid_and_host_is_still_another_run_s(tmp_path):
    import socket

    from criteo_dlrm.preflight import _in_progress

    path = tmp_path / "dlrm_checkpoint.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"version": 1})
    half = JSONDataset(str(path), version=Version(None, "2026-01-02T00.00.00.000Z"))
    half.save({"version": 2})
    marker = {"pid": os.getpid(), "host": socket.gethostname(), "run": "2026-01-02T00.00.00.000Z"}
    (path / "2026-01-02T00.00.00.000Z" / ".incomplete").write_text(json.dumps(marker))  # pid 1 in two containers
    assert JSONDataset(str(path), version=Version(None, None)).load() == {"version": 1}
    assert not _in_progress(marker), "a dead run's marker, reported as such"
    half.mark_incomplete("2026-01-02T00.00.00.000Z", marker)  # this process's own marker: its own version
    assert JSONDataset(str(path), version=Version(None, None)).load() == {"version": 2}


def test_a_run_reads_its_own_outputs_and_the_inputs_that_were_newest_when_it_began(tmp_path):
    """Issue 46 item 1: a second run started while the first trained saved a newer checkpoint, which the first
    then evaluated and reported as its own."""
    from kedro.io import DataCatalog
    from kedro.pipeline import Node, Pipeline

    from criteo_dlrm.preflight import pin_versions

    def versioned(name: str, save: str | None) -> JSONDataset:
        return JSONDataset(str(tmp_path / name), version=Version(None, save))

    versioned("inputs.json", "2026-01-01T00.00.00.000Z").save({"made_by": "an earlier run"})
    run = "2026-01-02T00.00.00.000Z"
    catalog = DataCatalog({"inputs": versioned("inputs.json", run), "outputs": versioned("outputs.json", run)})
    pipeline = Pipeline([Node(lambda inputs: inputs, "inputs", "outputs", name="make"),
                         Node(lambda outputs: None, "outputs", None, name="read")])  # fmt: skip
    pin_versions(catalog, pipeline, run, {})
    # Another run, begun later, completes both while this one runs.
    versioned("inputs.json", "2026-01-03T00.00.00.000Z").save({"made_by": "the other run"})
    versioned("outputs.json", "2026-01-03T00.00.00.000Z").save({"made_by": "the other run"})
    assert catalog.load("inputs") == {"made_by": "an earlier run"}
    catalog.save("outputs", {"made_by": "this run"})
    assert catalog.load("outputs") == {"made_by": "this run"}


def test_a_full_disk_while_a_version_is_written_leaves_the_last_complete_version_as_the_latest(tmp_path, monkeypatch):
    from criteo_dlrm.datasets import versioned_file

    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"version": 1})

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(versioned_file._HashingWriter, "write", full)
    failing = JSONDataset(str(path), version=Version(None, "2026-01-02T00.00.00.000Z"))
    fails_with(DiskFullError, lambda: failing.save({"version": 2}), f"No space left on {path}")
    monkeypatch.undo()  # (no chdir to undo here)
    assert JSONDataset(str(path), version=Version(None, None)).load() == {"version": 1}
    assert not list(path.glob("*/*.partial")) and not list(path.glob("*/.*.partial"))


def test_a_full_disk_while_marking_a_version_or_writing_predictions_names_the_folder(tmp_path, monkeypatch):

    from criteo_dlrm.engine.trained import scoring

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


def test_a_folder_beside_the_versions_that_is_not_one_is_never_the_latest_and_loads_when_pinned(tmp_path, logged):
    """Issue 62 item 10: a `backup` folder (a copy of a version) beside the versions was taken for the newest one,
    refused as a clock set back, and the suggested pin loaded the backup."""
    import shutil

    path = tmp_path / "dlrm_checkpoint.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"version": 1})
    JSONDataset(str(path), version=Version(None, "2026-01-02T00.00.00.000Z")).save({"version": 2})
    shutil.copytree(path / "2026-01-01T00.00.00.000Z", path / "backup")
    reader = JSONDataset(str(path), version=Version(None, None))
    assert reader.load() == {"version": 2} and reader.versions() == [
        "2026-01-01T00.00.00.000Z",
        "2026-01-02T00.00.00.000Z",
    ]
    [warning] = [line for line in logged if "is not a version" in line]
    assert f"{path}: backup is not a version" in warning
    assert JSONDataset(str(path), version=Version("backup", None)).load() == {"version": 1}

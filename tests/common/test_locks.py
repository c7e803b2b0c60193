"""One writer at a time (``common.locks``): a second is refused naming the first, a killed one is reported, and
nothing planted at a lock's path is written through. Part of the fault injection (``tests/faults.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from criteo_dlrm.common.locks import LockedError, exclusive


def _lock_holder(target: Path, what: str) -> subprocess.Popen:
    """Another process holding the lock on ``target``, once this returns."""
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time; from criteo_dlrm.common.locks import exclusive\n"
            f"with exclusive({str(target)!r}, {what!r}):\n    print('held', flush=True); time.sleep(60)"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_naming_the_process_that_holds_the_lock(tmp_path):
    target = tmp_path / "train_features"
    holder = _lock_holder(target, "rows")
    try:
        with (
            pytest.raises(LockedError, match=rf"being written by process {holder.pid} on .*-c"),
            exclusive(target, "rows"),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(target, "rows"):  # the OS released the lock of the killed holder
        pass


def test_a_run_that_finds_the_lock_of_a_killed_run_says_how_that_run_ended(tmp_path, logged):
    """Issue 50 item 3: the next run said nothing of the run a kill -9 (or the OOM killer) ended."""
    target = tmp_path / "train_features"
    holder = _lock_holder(target, "the encoded rows")
    holder.kill()
    holder.wait()
    with exclusive(target, "the encoded rows"):
        pass
    said = "".join(logged)
    assert f"the encoded rows ({target}): the run that wrote it last, process {holder.pid} on" in said
    assert "ended without finishing: its process was killed" in said
    logged.clear()
    with exclusive(target, "the encoded rows"):
        pass
    assert not logged, "a run that finished leaves nothing to say"


def test_no_lock_file_is_left_behind_and_stale_ones_go_unless_held(tmp_path):
    """A run left a zero-byte lock file per in-progress checkpoint; those an earlier version left are removed at
    the next run, except one a running process holds."""
    from filelock import FileLock

    from criteo_dlrm.common.locks import remove_stale_locks

    with exclusive(tmp_path / "dlrm_a.pt", "the in-progress checkpoint"):
        assert (tmp_path / ".dlrm_a.pt.lock").exists()
    assert not list(tmp_path.glob(".*.lock*")), "nothing left once released"
    (tmp_path / ".dlrm_old.pt.lock").write_bytes(b"")  # left by an earlier version
    held = FileLock(tmp_path / ".dlrm_running.pt.lock", timeout=0)
    held.acquire()
    try:
        remove_stale_locks(tmp_path)
        assert sorted(path.name for path in tmp_path.glob(".*.lock")) == [".dlrm_running.pt.lock"]
    finally:
        held.release()
    with exclusive(tmp_path / "dlrm_running.pt", "the in-progress checkpoint"):
        pass  # taken again after its holder let go


@pytest.mark.parametrize("planted", ["owner link", "lock link", "lock folder"])
def test_a_link_or_folder_planted_at_a_lock_path_is_refused_and_nothing_is_written_through_it(tmp_path, planted):
    from criteo_dlrm.common.locks import LockError

    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "data" / "train_features"
    target.parent.mkdir()
    lock = target.with_name(".train_features.lock")
    {
        "owner link": lambda: Path(f"{lock}.owner").symlink_to(victim),
        "lock link": lambda: lock.symlink_to(victim),
        "lock folder": lambda: lock.mkdir(),
    }[planted]()
    with pytest.raises(LockError, match=r"is a (symbolic link|folder), where this project keeps the lock .*\(rm -r"):
        with exclusive(target, "the encoded rows"):
            pass
    assert victim.read_text() == "precious"


def test_the_owner_record_is_written_beside_the_lock_never_through_a_link_planted_meanwhile(tmp_path, monkeypatch):
    from criteo_dlrm.common import locks

    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "train_features"
    owner = tmp_path / ".train_features.lock.owner"
    original = locks.FileLock.acquire

    def acquire_then_plant(self, *args, **kwargs):  # a link planted between the check and the write
        result = original(self, *args, **kwargs)
        owner.symlink_to(victim)
        return result

    monkeypatch.setattr(locks.FileLock, "acquire", acquire_then_plant)
    with exclusive(target, "the encoded rows"):
        assert json.loads(owner.read_text())["pid"] == os.getpid() and not owner.is_symlink()
    assert victim.read_text() == "precious"

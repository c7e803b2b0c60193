"""Files written whole or not at all (``common.storage``). Part of the fault injection (``tests/faults.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from criteo_dlrm.common.storage import atomic_file, create_exclusive
from criteo_dlrm.data.raw import convert_day


def test_staging_files_never_follow_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "planted.partial"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        create_exclusive(link)
    with atomic_file(tmp_path / "out.bin") as handle:
        handle.write(b"new")
    assert victim.read_text() == "precious" and (tmp_path / "out.bin").read_bytes() == b"new"


@pytest.mark.parametrize("kind", ["file", "folder", "parquet day"])
def test_every_staged_rename_is_followed_by_a_sync_of_its_folder(tmp_path, monkeypatch, kind, converted_day):
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
        convert_day(converted_day[0], tmp_path / "out" / "day_0.parquet")
    renames = [index for index, event in enumerate(events) if event[0] == "rename"]
    assert renames, events
    for index in renames:
        folder = events[index][1]
        assert ("sync", folder.resolve()) in [(e[0], e[1].resolve()) for e in events[index + 1 :]], (folder, events)

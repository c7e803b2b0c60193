"""Files written whole or not at all (``common.storage``). Part of the fault injection of ``tests/test_integrity.py``."""

from __future__ import annotations

import pytest

from criteo_dlrm.common.storage import atomic_file, create_exclusive


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

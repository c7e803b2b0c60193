import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from criteo_dlrm.common import memory
from criteo_dlrm.common.memory import memory_room

GIB = 1 << 30


def _tree(root: Path, membership: str, mount: str, groups: dict[str, dict[str, str]]) -> Path:
    """A made-up filesystem root: ``/proc/self/cgroup``, ``/proc/self/mountinfo`` and cgroup folders' files."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(membership + "\n")
    (root / "proc/self/mountinfo").write_text("22 1 0:20 / /proc rw - proc proc rw\n" + mount + "\n")
    for folder, files in groups.items():
        path = root / folder.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (path / name).write_text(text + "\n")
    return root


def test_the_tightest_of_the_process_s_v1_group_and_its_ancestors_bounds_the_room(tmp_path, monkeypatch):
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: type("M", (), {"available": 64 * GIB})())
    base = "/sys/fs/cgroup/memory"
    root = _tree(
        tmp_path, "5:memory:/slurm/job_7", f"35 31 0:32 / {base} rw - cgroup cgroup rw,memory",
        {
            # The job's own group: 4 GiB, 1 GiB used of which 0.5 GiB is page cache it can drop: 3.5 GiB.
            f"{base}/slurm/job_7": {"memory.limit_in_bytes": str(4 * GIB), "memory.usage_in_bytes": str(GIB),
                                    "memory.stat": f"cache 9\ntotal_inactive_file {GIB // 2}"},
            # The scheduler's group above it: 3 GiB, 2.5 GiB used: 0.5 GiB.
            f"{base}/slurm": {"memory.limit_in_bytes": str(3 * GIB), "memory.usage_in_bytes": str(5 * GIB // 2)},
            base: {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": str(10 * GIB)},
        },
    )  # fmt: skip
    room = memory_room(root)
    assert room.available == GIB // 2
    assert f"{root}{base}/slurm " in room.where and "limit 3.22 GB" in room.where
    (root / f"{base.lstrip('/')}/slurm/memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    assert memory_room(root).available == 3 * GIB + GIB // 2


def test_a_v2_group_seen_from_inside_its_namespace_is_the_mount_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: type("M", (), {"available": 64 * GIB})())
    root = _tree(
        tmp_path, "0::/", "40 30 0:40 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw",
        {"/sys/fs/cgroup": {"memory.max": str(2 * GIB), "memory.current": str(GIB), "memory.stat": "inactive_file 0"}},
    )  # fmt: skip
    assert memory_room(root).available == GIB
    (root / "sys/fs/cgroup/memory.max").write_text("max\n")
    assert memory_room(root).available == 64 * GIB
    assert memory_room(root).where == "this machine's available memory"


def test_without_cgroups_the_room_is_the_kernel_s_available_memory(tmp_path):
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kernel = int(meminfo["MemAvailable"].split()[0]) * 1024  # free memory and the page cache it can drop
    assert memory_room(tmp_path).available == pytest.approx(kernel, abs=256 << 20)


_V1_MEMORY = Path("/sys/fs/cgroup/memory")


def _own_v1_group() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _V1_MEMORY / path.lstrip("/")
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not _V1_MEMORY.is_dir(), reason="needs root and cgroup v1's memory")
def test_inside_a_real_1_5_gb_group_the_room_is_at_most_the_group_s(tmp_path):
    parent = _own_v1_group()
    group = parent / f"criteo_dlrm_test_{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(1_500_000_000))
        script = textwrap.dedent(
            f"""
            from pathlib import Path
            import os
            Path("{group}/cgroup.procs").write_text(str(os.getpid()))
            from criteo_dlrm.common.memory import memory_room
            room = memory_room()
            print(room.available, room.where)
            """
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
        available, where = out.split(" ", 1)
        assert 0 < int(available) <= 1_500_000_000
        assert str(group) in where
    finally:
        group.rmdir()

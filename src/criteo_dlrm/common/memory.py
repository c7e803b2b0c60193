"""How much memory this process can still have: the smallest room among its memory cgroup and the cgroup's
ancestors (a batch job's limit, wherever the scheduler set it), and the machine's available memory.

A group's room is its limit less what it holds, with the page cache it can drop counted as free (inactive
file pages: a job that read hundreds of GB of days has most of its limit in cache, which the kernel reclaims
before it kills anything), as the machine's MemAvailable counts it. Groups are found as the kernel lists them
for this process (``/proc/self/cgroup``), on the mounts it lists (``/proc/self/mountinfo``): cgroup v1's
``memory`` hierarchy and v2's unified one, in a container whose namespace makes its group the root as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

# v2, then v1: the limit, the use, and the key of the inactive page cache in memory.stat (v1's ``total_``
# counts the group's descendants too, as its usage does).
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class MemoryRoom:
    """Bytes this process can still have (``available``), and where that bound comes from (``where``): a
    cgroup's folder with its limit, or the machine's available memory."""

    available: int
    where: str


def memory_room(root: str | Path = "/") -> MemoryRoom:
    """The smallest room among this process's memory cgroup, its ancestors and the machine (``root``: another
    filesystem root, for tests)."""
    room = MemoryRoom(int(psutil.virtual_memory().available), "this machine's available memory")
    for folder, files in _memory_groups(Path(root)):
        left = _group_room(folder, files)
        if left is not None and left[0] < room.available:
            limit = left[1]
            room = MemoryRoom(left[0], f"the memory cgroup {folder} (limit {limit / 1e9:,.2f} GB)")
    return room


def available_memory() -> int:
    """Bytes of memory a new process can have now (``memory_room``)."""
    return memory_room().available


def _memory_groups(root: Path) -> list[tuple[Path, tuple[str, str, str]]]:
    """This process's memory cgroup folder and each ancestor up to its mount, with the file names to read."""
    try:
        memberships = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    groups = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        mount = _mount_of(mounts, version)
        if mount is None:
            continue
        mount_root, mount_point = mount
        # A path outside the mount's root is the namespace's own view, relative to the mount already.
        relative = path[len(mount_root) :] if path.startswith(mount_root) else path
        top = root / mount_point.lstrip("/")
        folder = top / relative.strip("/")
        files = _V2 if version == "v2" else _V1
        while True:
            groups.append((folder, files))
            if folder == top or top not in folder.parents:
                break
            folder = folder.parent
    return groups


def _mount_of(mounts: list[str], version: str) -> tuple[str, str] | None:
    """``(root within the hierarchy, mount point)`` of the v1 memory or the v2 cgroup mount."""
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[dash + 3] if len(fields) > dash + 3 else ""
        if version == "v2" and fstype == "cgroup2":
            return fields[3], fields[4]
        if version == "v1" and fstype == "cgroup" and "memory" in options.split(","):
            return fields[3], fields[4]
    return None


def _group_room(folder: Path, files: tuple[str, str, str]) -> tuple[int, int] | None:
    """``(room, limit)`` of one group, or None where it sets no limit (or cannot be read)."""
    limit_name, usage_name, inactive_key = files
    try:
        limit_text = (folder / limit_name).read_text().strip()
        usage = int((folder / usage_name).read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= _UNLIMITED:
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
                break
    except (OSError, ValueError):
        pass
    limit = int(limit_text)
    return max(limit - usage + inactive, 0), limit

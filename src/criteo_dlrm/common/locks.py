"""Exclusive locks on what a run writes, so two runs in one project never write the same files at once.

A lock is ``filelock``'s (an OS file lock: released by the OS when its process dies, so a killed run never
leaves a lock behind) on ``.<name>.lock`` beside the path, with ``.<name>.lock.owner`` saying which process
holds it. A second
run that needs the same files stops at once with that process's pid, command and start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.storage import atomic_file


class LockedError(UserError, RuntimeError):
    """Another process is writing what this run needs to write."""


class LockError(UserError, OSError):
    """A lock's path holds something this project did not put there (a symbolic link, a folder)."""


def _owner(lock_path: Path) -> str:
    try:
        owner = json.loads(Path(f"{lock_path}.owner").read_text())
    except (OSError, ValueError):
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
    return f"process {owner.get('pid')} on {owner.get('host')} (`{owner.get('command')}`, started {started})"


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the lock on ``path`` (a file or folder that is about to be written) for the block.

    Raises:
        LockedError: another process holds it; the message names that process and what to do.
    """
    lock_path = Path(path).with_name(f".{Path(path).name}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    owner = Path(f"{lock_path}.owner")
    for entry in (lock_path, owner):  # a planted link would make the lock write where it points
        kind = "a symbolic link" if entry.is_symlink() else "a folder" if entry.is_dir() else None
        if kind:
            raise LockError(
                f"{entry} is {kind}, where this project keeps the lock on {what} ({path}); it was not followed. "
                f"Remove it (rm -r '{entry}') and run the same command again."
            )
    lock = FileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LockedError(
            f"{what} ({path}) is being written by {_owner(lock_path)}. Two runs in one project would overwrite "
            "each other's files: wait for that run to finish (or stop it), then run this command again."
        ) from None
    try:
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
            "started": time.time(),
        }
        # Staged (created exclusively, never through a link) and renamed over the name: a link planted there
        # since the check above is replaced, not followed.
        with atomic_file(owner, what=f"the lock's owner record {owner}") as handle:
            handle.write(json.dumps(record).encode())
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()

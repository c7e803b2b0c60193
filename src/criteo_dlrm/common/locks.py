"""Exclusive locks on what a run writes, so two runs in one project never write the same files at once.

A lock is ``filelock``'s (an OS file lock: released by the OS when its process dies, so a killed run never
leaves a lock behind) on ``.<name>.lock`` beside the path, with ``.<name>.lock.owner`` saying which process
holds it. A second
run that needs the same files stops at once with that process's pid, command and start time.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout
from loguru import logger

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.storage import atomic_file


class LockedError(UserError, RuntimeError):
    """Another process is writing what this run needs to write."""


class LockError(UserError, OSError):
    """A lock's path holds something this project did not put there (a symbolic link, a folder)."""


@dataclass(frozen=True)
class Holder:
    """The process that holds a lock, as its ``.<name>.lock.owner`` record says."""

    pid: int
    host: str
    command: str
    started: float

    @classmethod
    def this_process(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
                   time.time())  # fmt: skip

    def __str__(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"process {self.pid} on {self.host} (`{self.command}`, started {started})"


def _owner(lock_path: Path) -> str:
    try:
        return str(Holder(**json.loads(Path(f"{lock_path}.owner").read_text())))
    except (OSError, ValueError, TypeError):  # unreadable, not JSON, or not a holder's fields
        return "another process"


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the lock on ``path`` (a file or folder that is about to be written) for the block.

    Raises:
        LockedError: another process holds it; the message names that process and what to do.
    """
    lock_path, owner = _paths(path, what)
    lock = _acquire(lock_path)
    if lock is None:
        raise LockedError(
            f"{what} ({path}) is being written by {_owner(lock_path)}. Two runs in one project would overwrite "
            "each other's files: wait for that run to finish (or stop it), then run this command again."
        )
    if owner.is_file():  # a holder that finished removed its record: this one's process died holding the lock
        logger.warning(
            "{} ({}): the run that wrote it last, {}, ended without finishing: its process was killed (by a signal, "
            "the out-of-memory killer, or the machine stopping; the job's log or `dmesg` says which). What it left "
            "half-done is not used: this run makes it again, or resumes from its last in-progress checkpoint.",
            what, path, _owner(lock_path),
        )  # fmt: skip
    try:
        _record_holder(owner, what)
        yield
    finally:
        _let_go(lock, lock_path, owner)


# The locks this process holds until it exits (``hold_until_exit``), by their lock files.
_HELD: dict[Path, FileLock] = {}


def hold_until_exit(path: str | os.PathLike, what: str) -> str | None:
    """Hold the lock on ``path`` until this process ends (let go at its exit, or by the OS when it is killed), for
    what a process keeps while it lives (a server it starts). Returns None, or, when another process holds the lock,
    that process (its pid, command and start time)."""
    lock_path, owner = _paths(path, what)
    if lock_path in _HELD:
        return None
    lock = _acquire(lock_path)
    if lock is None:
        return _owner(lock_path)
    _record_holder(owner, what)
    _HELD[lock_path] = lock
    atexit.register(_let_go, lock, lock_path, owner)
    return None


def _paths(path: str | os.PathLike, what: str) -> tuple[Path, Path]:
    """The lock file of ``path`` and its owner record, refused where something other than this project's is there."""
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
    return lock_path, owner


def _record_holder(owner: Path, what: str) -> None:
    # Staged (created exclusively, never through a link) and renamed over the name: a link planted there since the
    # check of ``_paths`` is replaced, not followed.
    with atomic_file(owner, what=f"the lock's owner record {owner}") as handle:
        handle.write(json.dumps(asdict(Holder.this_process())).encode())


def _let_go(lock: FileLock, lock_path: Path, owner: Path) -> None:
    owner.unlink(missing_ok=True)
    lock_path.unlink(missing_ok=True)  # while held: no lock file is left behind (``_acquire`` sees it go)
    lock.release()


def _acquire(lock_path: Path) -> FileLock | None:
    """The lock on ``lock_path``, or None when another process holds it. A lock taken on a file its holder
    removed before releasing it (the name now free for a new file) is let go and taken again on the name."""
    for _ in range(100):
        lock = FileLock(lock_path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return None
        try:
            same = os.fstat(lock._context.lock_file_fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return lock
        lock.release()
    raise LockError(f"{lock_path} was replaced 100 times while this process took the lock: something else uses it")


def remove_stale_locks(folder: str | os.PathLike, keep: str | os.PathLike | None = None) -> None:
    """Lock files in ``folder`` that no process holds (left by an earlier version of this project, whose locks
    stayed after their run, or by a killed run), each removed while held so that no run is taking it at the
    time; except the lock of ``keep``, which this run takes next (and says how its last holder ended)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for lock_path in folder.glob(".*.lock"):
        if lock_path.is_symlink() or not lock_path.is_file():
            continue
        if keep is not None and lock_path.name == f".{Path(keep).name}.lock":
            continue
        lock = _acquire(lock_path)
        if lock is not None:
            lock_path.unlink(missing_ok=True)
            Path(f"{lock_path}.owner").unlink(missing_ok=True)
            lock.release()

"""Writing files so that nothing half-written, damaged or planted is ever read as finished.

Every output is staged under a unique name (``.<name>.<pid>.<random>.partial``, created exclusively, never
through a symlink) beside its destination, then renamed into place. A killed process leaves only staging
names behind; ``remove_stale_partials`` deletes those whose process is gone. Digests (sha256) tie a file to
what was written, so damage found later is refused with the file's name instead of being used.

Full disks are reported as such (``DiskFullError``: which path, and what was needed where it is known),
never as a damaged input or a crash deep in a library.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from criteo_dlrm.common.errors import Advice, DataError, UserError

_STAGED = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)(\.[0-9a-f]+)?\.partial$")
# Digests read files in pieces of this size, hashed in threads (hashlib releases the GIL): a file of many
# gigabytes is hashed by every core, not one.
DIGEST_PIECE = 64 << 20


class DiskFullError(UserError, OSError):
    """No space left where a run writes; the message names the folder and what was needed."""


class DamagedFileError(DataError):
    """A file's content no longer matches the digest recorded when it was written."""


def in_project(path: str | os.PathLike) -> Path | None:
    """``path`` relative to the project (the working folder ``kedro run`` runs in), or None when outside it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return None


def identity_path(path: str | os.PathLike) -> str:
    """How a file's identity names it: relative to the project when it is inside it (``in_project``), so a copy
    of the project at another path is the same data; its absolute path otherwise."""
    relative = in_project(path)
    return relative.as_posix() if relative is not None else str(Path(path).resolve())


def staging_path(path: str | os.PathLike) -> Path:
    """A unique staging name beside ``path`` for this process: ``.<name>.<pid>.<random>.partial``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")


def create_exclusive(path: str | os.PathLike) -> BinaryIO:
    """Open a new file for writing; refuses to reuse an existing name or to follow a symlink planted there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a full disk or quota, however a library worded it."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(error)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def size_text(size: float) -> str:
    """``1.2 GB``, ``340 MB``, ``12 kB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size:,.0f} bytes"


def disk_full_error(folder: str | os.PathLike, what: str, needed: int | None = None) -> DiskFullError:
    """The message for a full disk under ``folder`` while writing ``what``."""
    free = shutil.disk_usage(_existing(Path(folder))).free
    need = f"; it needs {size_text(needed)}" if needed is not None else ""
    return DiskFullError(
        f"No space left on {folder} while writing {what} ({size_text(free)} free{need}). Free some space "
        "there (or point the output elsewhere in conf/base/catalog_*.yml or the pipeline's parameters) and run "
        "the same command again: nothing half-written is kept."
    )


class NotWritableError(UserError, OSError):
    """A folder a run writes to is read-only, not a folder, or cannot be created."""


def check_writable(folder: str | os.PathLike, what: str, setting: str) -> None:
    """Refuse, before any work, a folder this run will write ``what`` into that cannot take a file: read-only,
    a file where the folder should be, or not creatable. The folder is created (as the run would).

    ``setting``: where the folder is configured, for the message (``conf/base/catalog_training.yml``,
    ``ingestion.output_dir``).
    """
    folder = Path(folder)
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise NotWritableError(
            f"{blocker} is a file, where this run needs a folder for {what} ({folder}). Move the file away, or "
            f"point {setting} at a folder."
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check.{os.getpid()}.{secrets.token_hex(4)}"
        create_exclusive(probe).close()
        probe.unlink()
    except OSError as error:
        if is_disk_full(error):
            raise disk_full_error(folder, what) from error
        raise NotWritableError(
            f"{folder} is not writable ({error.strerror or error}): this run writes {what} there. Make it "
            f"writable (or mount it read-write), or point {setting} at another folder; nothing was run."
        ) from None


def check_free_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """Refuse before writing ``needed`` bytes of ``what`` under ``folder`` when the disk has less free."""
    if shutil.disk_usage(_existing(Path(folder))).free < needed:
        raise disk_full_error(folder, what, needed)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def reserve(handle: BinaryIO, size: int) -> None:
    """Allocate ``size`` bytes for ``handle``'s file now, so a full disk fails here and not later through a
    memory map (where it is a SIGBUS that kills the process). Where the filesystem cannot, it is a no-op."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(handle.fileno(), 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        # EOPNOTSUPP / EINVAL: a filesystem without allocation (tmpfs on old kernels, some network mounts).


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, what: str | None = None) -> Iterator[BinaryIO]:
    """Write ``path`` through a staged file that replaces it only once the block finished without error.

    Raises:
        DiskFullError: the disk filled up while writing (the staged file is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = staging_path(path)
    try:
        with create_exclusive(staged) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staged, path)
        sync_folder(path.parent)
    except BaseException as error:
        if is_disk_full(error):
            raise disk_full_error(path.parent, what or str(path)) from error
        raise
    finally:
        staged.unlink(missing_ok=True)


def sync_folder(folder: str | os.PathLike) -> None:
    """Make the renames in ``folder`` durable: a rename is on disk only once its folder is synced, so a power
    loss after a "saved" line could otherwise bring back the old file (or none)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a platform or filesystem that cannot open folders (their renames are synced by other means)
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(descriptor)


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> None:
    with atomic_file(path) as handle:
        handle.write(data)


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, what: str | None = None) -> Iterator[Path]:
    """Fill a staged folder that takes ``path``'s place only once the block finished without error.

    The old folder is moved aside, the new one renamed in, then the old one deleted: a reader sees the old
    folder or the new one (or, for an instant, none), never a mixture.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = staging_path(path)
    staged.mkdir()  # exclusive: fails if anything (a planted symlink included) has the name
    try:
        yield staged
        old = staging_path(path)
        if path.exists() or path.is_symlink():
            os.replace(path, old)
        os.replace(staged, path)
        sync_folder(path.parent)
        shutil.rmtree(old, ignore_errors=True)
        if old.is_symlink():
            old.unlink()
    except BaseException as error:
        if is_disk_full(error):
            raise disk_full_error(path.parent, what or str(path)) from error
        raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def link_or_copy(source: str | os.PathLike, destination: str | os.PathLike) -> None:
    """A hard link (no bytes written; the file stays while either name does), a copy where the filesystem has
    no links or the two are on different filesystems."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def staged_owner(path: Path) -> int | None:
    """The pid in a staging name made by ``staging_path`` (None for other names)."""
    match = _STAGED.match(path.name)
    return int(match.group("pid")) if match else None


def remove_stale_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete the staging files and folders a killed process left in ``folder``; returns what was deleted.

    One whose process still runs is another write in progress and is left alone.
    """
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for partial in folder.glob(".*.partial"):
        pid = staged_owner(partial)
        if pid is not None and not process_alive(pid):
            if partial.is_dir() and not partial.is_symlink():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def file_digest(path: str | os.PathLike, threads: int | None = None) -> str:
    """sha256 over the sha256 of each ``DIGEST_PIECE`` of the file (a tree: pieces hash in parallel threads)."""
    size = os.path.getsize(path)
    starts = range(0, max(size, 1), DIGEST_PIECE)

    def piece(start: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(start)
            return hashlib.sha256(handle.read(DIGEST_PIECE)).digest()

    workers = threads or min(len(starts), os.cpu_count() or 1)
    if workers <= 1:
        digests = [piece(start) for start in starts]
    else:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(piece, starts))
    return hashlib.sha256(str(size).encode() + b"".join(digests)).hexdigest()


def check_digest(path: str | os.PathLike, expected: str, fix: Advice, what: str | None = None) -> None:
    """Raise ``DamagedFileError`` naming ``path`` (as ``what``) and ``fix`` unless its digest is ``expected``."""
    named = f"{what}: {path}" if what else str(path)
    if not Path(path).exists():
        raise DamagedFileError(f"{named} is missing. {fix}", fix=fix)
    actual = file_digest(path)
    if actual != expected.strip().lower():
        raise DamagedFileError(
            f"{named} is damaged: its content (sha256 {actual[:12]}...) is not what was written "
            f"(sha256 {expected[:12]}...). {fix}",
            fix=fix,
        )


def reading(path: str | os.PathLike, action: Callable[[], object], fix: Advice, what: str | None = None) -> object:
    """Run ``action`` (which reads ``path``); a failure that means a damaged or truncated file becomes a
    ``DamagedFileError`` naming the file and ``fix``, instead of a library's traceback."""
    try:
        return action()
    except UserError:
        raise
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met a type that could run code
        named = f"{what}: {path}" if what else str(path)
        raise DamagedFileError(
            f"{named} is not a file this project wrote: it holds objects that could run code when loaded "
            f"({_first_line(error)}). It was not loaded. {fix}",
            fix=fix,
        ) from error
    except (OSError, ValueError, RuntimeError, EOFError, KeyError, IndexError) as error:
        if is_disk_full(error):
            raise
        named = f"{what}: {path}" if what else str(path)
        raise DamagedFileError(f"{named} cannot be read ({_first_line(error)}). {fix}", fix=fix) from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__

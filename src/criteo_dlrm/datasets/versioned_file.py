"""Shared plumbing of our file datasets: atomic writes with a content digest, verified reads, and versions
that are complete or not used.

- A save writes ``<file>.sha256`` (the digest of what was written) and the file itself through a staged,
  uniquely named file renamed into place: a crash or a full disk never leaves a partial file under the
  real name. A load checks the digest first and refuses a damaged file, naming it.
- A version a run has begun but not finished carries an ``.incomplete`` marker in its folder (set and
  cleared by ``hooks.OutputVersionHooks`` around the node that writes it, so that all of a node's outputs appear
  together). Loading the latest version skips such versions; ``incomplete_versions`` lists them. The marker
  names its writer by ``RUN_TOKEN``, random per process: a pid and host repeat (in containers kedro is often
  pid 1 on a fixed hostname), so a marker another process left is never taken for this one's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, Any

import fsspec
from kedro.io.core import AbstractVersionedDataset, DatasetError, Version, get_filepath_str, get_protocol_and_path
from loguru import logger

from criteo_dlrm.common.storage import (
    DamagedFileError,
    atomic_file,
    disk_full_error,
    in_project,
    is_disk_full,
    staging_path,
)

DIGEST_SUFFIX = ".sha256"
INCOMPLETE = ".incomplete"
# Kedro's version names (``kedro.io.core.generate_timestamp``): a folder beside them named otherwise (a user's
# ``backup``) is not a version, never taken for the latest.
VERSION_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}\.\d{2}\.\d{2}\.\d{3}Z")
# This process's name in the markers it writes: 128 random bits, never the same for two processes.
RUN_TOKEN = secrets.token_hex(16)


class VersionedFileDataset(AbstractVersionedDataset):
    """A single file per version on any fsspec filesystem (local, ``s3://``, ``gs://``, ``abfs://``)."""

    def __init__(
        self,
        filepath: str,
        version: Version | None = None,
        credentials: dict[str, Any] | None = None,
        fs_args: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ):
        protocol, path = get_protocol_and_path(filepath, version)
        self._protocol = protocol
        fs_args = dict(fs_args or {})
        if protocol == "file":
            fs_args.setdefault("auto_mkdir", True)
        self._fs = fsspec.filesystem(protocol, **(credentials or {}), **fs_args)
        self.metadata = metadata
        super().__init__(
            filepath=PurePosixPath(path), version=version, exists_function=self._fs.exists, glob_function=self._fs.glob
        )

    # -- reading -------------------------------------------------------------------------------------
    def _load_path(self) -> str:
        return get_filepath_str(self._get_load_path(), self._protocol)

    def _verified_path(self) -> str:
        """The path a load reads, after checking the file against the digest recorded when it was written
        (one streaming read: memory stays at a piece whatever the file's size)."""
        path = self._load_path()
        digest = hashlib.sha256()
        with self._fs.open(path, "rb") as handle:
            while piece := handle.read(1 << 24):
                digest.update(piece)
        self._check_digest(path, digest.hexdigest())
        return path

    def _read(self, reader: Callable[[IO[bytes]], Any]) -> Any:
        with self._fs.open(self._verified_path(), "rb") as handle:
            return reader(handle)

    def _check_digest(self, path: str, actual: str) -> None:
        """Refuse ``path`` unless its sidecar holds ``actual`` (hex, either case). This project writes a digest
        beside every file it writes, so a file without one was damaged or put there by other means: refused too."""
        digest_path = path + DIGEST_SUFFIX
        if not self._fs.exists(digest_path):
            raise DamagedFileError(
                f"{path} has no digest ({digest_path} is missing): this project writes one beside every file it "
                f"saves, so the file cannot be trusted to be what was written. {self._fix()}"
            )
        with self._fs.open(digest_path, "rb") as handle:
            recorded = handle.read().decode(errors="replace").split()
        expected = recorded[0].lower() if recorded else ""
        if actual != expected:
            raise DamagedFileError(
                f"{path} is damaged: its content (sha256 {actual[:12]}...) is not what was written (sha256 "
                f"{expected[:12] or 'none recorded'}...). {self._fix()}"
            )

    def _fix(self) -> str:
        if self._version is None:
            return "Run the pipeline that writes it again."
        return (
            f"Run the pipeline that writes it again (a new version), or pin an intact version with --load-versions "
            f"(the versions: ls {get_filepath_str(self._filepath, self._protocol)})."
        )

    # -- writing -------------------------------------------------------------------------------------
    def _write_atomically(self, writer: Callable[[IO[bytes]], None]) -> None:
        """Write through a staged file renamed into place, its digest written beside it first."""
        path = get_filepath_str(self._get_save_path(), self._protocol)
        if self._protocol == "file":
            with atomic_file(path) as handle:
                hashing = _HashingWriter(handle)
                writer(hashing)
                with atomic_file(path + DIGEST_SUFFIX) as digest:
                    digest.write(hashing.hexdigest().encode())
        else:
            buffer = io.BytesIO()
            writer(buffer)
            data = buffer.getvalue()
            self._write_remote(path + DIGEST_SUFFIX, hashlib.sha256(data).hexdigest().encode())
            self._write_remote(path, data)
        self._fs.invalidate_cache(path)

    def _write_remote(self, path: str, data: bytes) -> None:
        temporary = str(staging_path(Path(path)))
        try:
            with self._fs.open(temporary, "wb") as handle:
                handle.write(data)
            self._fs.mv(temporary, path)
        except OSError as error:
            if is_disk_full(error):
                raise disk_full_error(os.path.dirname(path), path) from error
            raise
        finally:
            if self._fs.exists(temporary):
                self._fs.rm(temporary)

    # -- versions ------------------------------------------------------------------------------------
    def _get_versions(self) -> list[str]:
        """Existing versions, most recent first (Kedro picks the first as the latest), without those another
        process has begun and not completed (a run in progress, or one that was killed)."""
        versions, said = [], self.__dict__.setdefault("_not_versions", set())
        for path in super()._get_versions():
            folder = PurePosixPath(path).parent
            if not VERSION_NAME.fullmatch(folder.name):
                if folder.name not in said:  # said once
                    said.add(folder.name)
                    logger.warning(
                        "{}: {} is not a version (a version is named by its run's time, e.g. 2026-12-05T12.38.27.695Z) "
                        "and is never loaded as the latest; --load-versions loads it by its name",
                        in_project(folder.parent) or folder.parent, folder.name,
                    )  # fmt: skip
            elif not self._begun_elsewhere(folder):
                versions.append(path)
        return versions

    def _begun_elsewhere(self, folder: PurePosixPath) -> bool:
        marker = f"{folder}/{INCOMPLETE}"
        if not self._fs.exists(marker):
            return False
        with self._fs.open(marker, "rb") as handle:
            try:
                owner = json.loads(handle.read() or b"{}")
            except ValueError:
                return True
        return not isinstance(owner, dict) or owner.get("token") != RUN_TOKEN

    def versions(self) -> list[str]:
        """The complete versions this dataset holds, oldest first."""
        if self._version is None:
            return []
        try:
            return sorted(PurePosixPath(path).parent.name for path in self._get_versions())
        except DatasetError:
            return []

    def version_path(self, version: str) -> str:
        """The file of ``version``."""
        return get_filepath_str(self._get_versioned_path(version), self._protocol)

    def saved_path(self) -> str:
        """The file this run's save wrote: its version of it, or the file itself when not versioned."""
        version = self.resolve_save_version()
        return self.version_path(version) if version else get_filepath_str(self._filepath, self._protocol)

    def local_folder(self) -> Path | None:
        """The local folder a save writes into (the versions' folder when versioned); None on remote storage."""
        if self._protocol != "file":
            return None
        path = Path(str(self._filepath))
        return path if self._version is not None else path.parent

    def version_folder(self, version: str) -> str:
        return get_filepath_str(self._filepath / version, self._protocol)

    def mark_incomplete(self, version: str, owner: dict) -> None:
        """Begin ``version``: until ``mark_complete``, loading the latest version skips it in every other process
        (``owner``: what the marker says of the run, for messages; this process's ``RUN_TOKEN`` is added)."""
        folder = self.version_folder(version)
        try:
            self._fs.makedirs(folder, exist_ok=True)
            record = json.dumps({**owner, "token": RUN_TOKEN}).encode()
            if self._protocol == "file":  # staged and renamed over the name: a link planted there is not followed
                what = f"the marker of the version this run begins ({folder}/{INCOMPLETE})"
                with atomic_file(f"{folder}/{INCOMPLETE}", what=what) as handle:
                    handle.write(record)
            else:
                with self._fs.open(f"{folder}/{INCOMPLETE}", "wb") as handle:
                    handle.write(record)
        except OSError as error:
            if is_disk_full(error):
                raise disk_full_error(
                    folder, f"the marker of the version this run begins ({folder}/{INCOMPLETE})"
                ) from error
            raise

    def discard_if_empty(self, version: str) -> None:
        """Remove ``version``'s folder when it holds nothing but its marker (its node failed before saving)."""
        folder = self.version_folder(version)
        if self._fs.exists(folder) and [PurePosixPath(p).name for p in self._fs.ls(folder, detail=False)] in (
            [INCOMPLETE],
            [],
        ):
            self._fs.rm(folder, recursive=True)

    def mark_complete(self, version: str) -> None:
        marker = f"{self.version_folder(version)}/{INCOMPLETE}"
        if self._fs.exists(marker):
            self._fs.rm(marker)

    def incomplete_versions(self) -> dict[str, dict]:
        """``{version folder: what its marker says (pid, host, run)}`` for versions never completed."""
        if self._version is None:
            return {}
        found = {}
        for marker in self._fs.glob(f"{get_filepath_str(self._filepath, self._protocol)}/*/{INCOMPLETE}"):
            with self._fs.open(marker, "rb") as handle:
                try:
                    owner = json.loads(handle.read() or b"{}")
                except ValueError:
                    owner = {}
            found[str(PurePosixPath(marker).parent)] = owner
        return found

    def loaded_version(self) -> str | None:
        """The version a load reads: the pinned one, else the latest (None when unversioned)."""
        if self._version is None:
            return None
        try:
            return self.resolve_load_version()
        except DatasetError:
            return None

    def _exists(self) -> bool:
        try:
            return self._fs.exists(self._load_path())
        except DatasetError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {"filepath": self._filepath, "protocol": self._protocol, "version": self._version}


class _HashingWriter(io.RawIOBase):
    """Passes writes to ``handle`` and hashes them on the way."""

    def __init__(self, handle: IO[bytes]):
        super().__init__()
        self._handle, self._digest = handle, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._digest.update(data)
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

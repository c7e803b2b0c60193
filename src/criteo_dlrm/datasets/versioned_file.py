"""Shared plumbing of our versioned, fsspec-backed file datasets: atomic writes and version lookup."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import IO, Any

import fsspec
from kedro.io.core import AbstractVersionedDataset, DatasetError, Version, get_filepath_str, get_protocol_and_path


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

    def _load_path(self) -> str:
        return get_filepath_str(self._get_load_path(), self._protocol)

    def _read(self, reader: Callable[[IO[bytes]], Any]) -> Any:
        with self._fs.open(self._load_path(), "rb") as handle:
            return reader(handle)

    def _write_atomically(self, writer: Callable[[IO[bytes]], None]) -> None:
        """Write to a temporary name, then rename: a crash mid-write never leaves a corrupt file."""
        path = get_filepath_str(self._get_save_path(), self._protocol)
        temporary = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            with self._fs.open(temporary, "wb") as handle:
                writer(handle)
            self._fs.mv(temporary, path)
        finally:
            if self._fs.exists(temporary):
                self._fs.rm(temporary)
        self._fs.invalidate_cache(path)

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

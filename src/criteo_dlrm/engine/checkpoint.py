"""Checkpoint files: atomic writes, ``weights_only`` loads, and what a checkpoint records."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = 1


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("torch", "numpy", "pyarrow", "pandas", "kedro", "criteo_dlrm"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def fingerprint(*parts: Any) -> str:
    """A short hash of JSON-able settings: two runs resume each other only when these agree."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to a temporary file, then rename: a crash mid-write leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def remove_stale_partials(folder: str | Path) -> list[Path]:
    """Delete the ``.<name>.<pid>.partial`` files that ``save_atomically`` left behind in a killed process.

    A file whose process still runs is another save in progress and is left alone. Returns what was deleted.
    """
    removed = []
    for partial in Path(folder).glob(".*.partial"):
        pid = partial.name.removesuffix(".partial").rsplit(".", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True`` (no arbitrary code runs from the file)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def model_from_checkpoint(checkpoint: dict[str, Any]) -> torch.nn.Module:
    """The DLRM a checkpoint describes, with its weights (on the CPU, in eval mode)."""
    from criteo_dlrm.models import DLRM, DLRMConfig

    model = DLRM(DLRMConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model_state"])
    return model.eval()

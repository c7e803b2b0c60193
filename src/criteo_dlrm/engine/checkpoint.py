"""Checkpoint files: atomic writes, ``weights_only`` loads, and what a checkpoint records."""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from criteo_dlrm.common.storage import DamagedFileError, atomic_file, reading

# 3: the content digest inside (DIGEST_KEY); 2: the model's names are the YAML's (dense_mlp, prediction_mlp);
# 1: bottom_mlp, top_mlp and flat size names.
CHECKPOINT_FORMAT = 3
_FORMER_MODULES = {"bottom_mlp.": "dense_mlp.", "top_mlp.": "prediction_mlp."}


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


def state_digest(value: Any) -> str:
    """sha256 of a checkpoint's content (every tensor's bytes, dtype and shape, and every plain value), in key
    order: the same for the same content whatever file it was loaded from."""
    digest = hashlib.sha256()

    def visit(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            tensor = item.detach().cpu().contiguous()
            digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
            if tensor.numel():  # hashed in place (the buffer itself, no copy of a table of many gigabytes)
                digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(item, dict):
            digest.update(f"D{len(item)}".encode())
            for key in sorted(item, key=str):
                digest.update(f"K{key!r}".encode())
                visit(item[key])
        elif isinstance(item, list | tuple):
            digest.update(f"L{len(item)}".encode())
            for element in item:
                visit(element)
        else:
            digest.update(f"V{item!r}".encode())

    visit(value)
    return digest.hexdigest()


DIGEST_KEY = "content_sha256"


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` through a staged file renamed into place, with the content's digest inside: a crash
    mid-write leaves the old file intact, and damage is found when it is loaded (``load_checkpoint``)."""
    with atomic_file(path, what=f"the checkpoint {path}") as handle:
        torch.save({**checkpoint, DIGEST_KEY: state_digest(checkpoint)}, handle)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True`` (no code runs from the file), checking the content digest
    ``save_atomically`` stored.

    Raises:
        DamagedFileError: the file cannot be read or its content is not what was written, naming it.
    """
    fix = "It cannot be used; delete it (a rerun then starts afresh)."
    state = reading(path, lambda: torch.load(path, map_location="cpu", weights_only=True), fix)
    if not isinstance(state, dict):
        raise DamagedFileError(f"{path} is not a checkpoint written by this project. {fix}")
    expected = state.pop(DIGEST_KEY, None)
    if expected is None:
        raise DamagedFileError(f"{path} has no content digest: it was not written by this project's save. {fix}")
    if state_digest(state) != expected:
        raise DamagedFileError(f"{path} is damaged: its content is not what was written. {fix}")
    return state


def model_from_checkpoint(checkpoint: dict[str, Any]) -> torch.nn.Module:
    """The DLRM a checkpoint describes, with its weights (on the CPU, in eval mode)."""
    from criteo_dlrm.models import DLRM, DLRMConfig

    model = DLRM(DLRMConfig.from_dict(checkpoint["model_config"]))
    state = {}
    for key, value in checkpoint["model_state"].items():
        prefix = next((old for old in _FORMER_MODULES if key.startswith(old)), None)
        state[_FORMER_MODULES[prefix] + key.removeprefix(prefix) if prefix else key] = value
    model.load_state_dict(state)
    return model.eval()

"""The run's state on disk while it trains, so that memory holds the model once.

Two files: the in-progress checkpoint (the latest state, which a rerun resumes from), and the best model so
far. Both are written from the live tensors, one after another (``torch.save`` writes each tensor's bytes as
they are; nothing is copied first), never kept as a second copy in memory. At a validation that improves, the
best file is a hard link to the in-progress file just written (no second write; a copy where the filesystem
has no links). Resume off, only the best file is written, at the validations that improve.

Kept beside the in-progress checkpoint (``<folder>/best/<name>``) so a rerun that resumes finds both; removed
with it once the finished run's checkpoint is stored (``recipe.finish_run``).

A sharded run (TorchRec) writes its tensors from every process into a folder beside the file
(``<name>.state-<step>/``, ``engine.trained.sharded_checkpoint``); the file then holds the bookkeeping and names the
folder with the digest of each of its files. The best model's folder is hard-linked file by file as well.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from criteo_dlrm.common.storage import DamagedFileError, link_or_copy, remove_stale_partials, staging_path
from criteo_dlrm.engine.trained.checkpoint import load_checkpoint, save_atomically
from criteo_dlrm.engine.trained.result import TrainingResult


def best_path_for(in_progress: str | os.PathLike) -> Path:
    """Where the best model of the run whose in-progress checkpoint is ``in_progress`` is kept."""
    in_progress = Path(in_progress)
    return in_progress.parent / "best" / in_progress.name


class ProgressFiles:
    """The in-progress checkpoint (``latest``; None when resume is off) and the best model (``best``: beside it,
    or in a temporary folder that lives as long as this object and the results that hold it)."""

    def __init__(self, latest: str | os.PathLike | None, best: str | os.PathLike | None = None):
        self.latest = Path(latest) if latest is not None else None
        self._folder = None
        if best is None and self.latest is not None:
            best = best_path_for(self.latest)
        elif best is None:
            self._folder = tempfile.TemporaryDirectory(prefix="criteo_dlrm_best_")
            best = Path(self._folder.name) / "best.pt"
        self.best = Path(best)

    def remove_stale(self) -> None:
        """Staging files of killed writers, beside both files."""
        for path in (self.latest, self.best):
            if path is not None and path.parent.exists():
                remove_stale_partials(path.parent)

    def save(self, values: dict[str, Any], improved: bool) -> None:
        """Write ``values`` as the in-progress checkpoint, and as the best model when ``improved``."""
        if self.latest is None:
            if improved:
                self.save_best(values)
            return
        self.latest.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(values, self.latest)
        if improved:
            self.best.parent.mkdir(parents=True, exist_ok=True)
            staged = staging_path(self.best)
            link_or_copy(self.latest, staged)
            os.replace(staged, self.best)

    def save_sharded(self, values: dict[str, Any], tensors: dict[str, torch.Tensor], improved: bool) -> None:
        """A sharded run's checkpoint: ``tensors`` written by every process into the folder beside the file,
        ``values`` (with the folder's name and digests) by rank 0. Every process calls it."""
        # Imported here: torch.distributed.checkpoint takes half a second of every kedro command's start otherwise.
        from criteo_dlrm.engine.trained.sharded_checkpoint import write_state

        target = self.latest if self.latest is not None else self.best
        folder = target.parent / f"{target.stem}.state-{values['step']}"
        target.parent.mkdir(parents=True, exist_ok=True)
        digests = write_state(tensors, folder)
        if digests is not None:  # rank 0
            values = {**values, "sharded_state": {"folder": folder.name, "digests": digests}}
            if self.latest is None:
                self.save_best(values)
            else:
                self.save(values, improved=False)
                if improved:
                    self._link_best(folder, values)
            for path in (self.latest, self.best):
                if path is not None:
                    _remove_unreferenced_folders(path)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # the files are in place before any process goes on (and may save again)

    def _link_best(self, folder: Path, values: dict[str, Any]) -> None:
        """The best model: the state folder's files hard-linked into ``best/`` (copied without links), then the
        file naming it."""
        linked = self.best.parent / folder.name
        shutil.rmtree(linked, ignore_errors=True)
        shutil.copytree(folder, linked, copy_function=link_or_copy)
        self.save_best(values)

    def state_folder(self, values: dict[str, Any]) -> Path:
        """The folder of a sharded run's tensors that ``values`` (loaded from the in-progress file) names."""
        return self.latest.parent / values["sharded_state"]["folder"]

    def save_best(self, values: dict[str, Any]) -> None:
        """Write ``values`` as the best model alone (resume off, or an in-progress checkpoint of an earlier version
        of this project, which carried the best model inside it)."""
        self.best.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(values, self.best)

    def remove(self) -> None:
        """Both files and their state folders (a finished run whose checkpoint is stored)."""
        for path in (self.latest, self.best):
            if path is not None:
                remove_checkpoint(path)


def _state_folders(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.stem}.state-*"))


def _remove_unreferenced_folders(path: Path) -> None:
    """The state folders beside ``path`` that it does not name (earlier steps), and a killed save's staging."""
    keep = None
    if path.exists():
        keep = (load_checkpoint(path).get("sharded_state") or {}).get("folder")
    for folder in [*_state_folders(path), *path.parent.glob(f".{path.stem}.state-*.partial")]:
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


def remove_checkpoint(path: str | os.PathLike) -> None:
    """An in-progress or best checkpoint file and its state folders."""
    path = Path(path)
    path.unlink(missing_ok=True)
    for folder in _state_folders(path):
        shutil.rmtree(folder, ignore_errors=True)


def load_best(result: TrainingResult) -> dict[str, Any]:
    """The best model's entries of the run's checkpoint (``checkpoint.training_checkpoint``): its
    ``model_state`` and ``optimizer_state``, memory-mapped from ``result.best_checkpoint`` (pages are read as they
    are used and can be dropped again: the file is not copied into memory); or, for a sharded run, its state
    folder (``sharded_state``, with the absolute ``path``) and the dense optimiser's ``dense_param_groups``: not
    read here, so no process ever holds a sharded run's whole state (the run's checkpoint links the folder's files).

    Raises:
        DamagedFileError: the file is damaged, or holds another step than the result's best, naming it (a state
            folder's files are checked when the model is read).
    """
    path = Path(result.best_checkpoint)
    values = load_checkpoint(path, mmap=True)
    if values.get("step") != result.best_step:
        raise DamagedFileError(
            f"{path} holds step {values.get('step')}, not the best step {result.best_step:,} of this run: it was "
            "replaced while the run trained. Delete it and its in-progress checkpoint; a rerun then starts afresh."
        )
    if "sharded_state" in values:
        return {"sharded_state": values["sharded_state"], "dense_param_groups": values["dense_param_groups"]}
    return {"model_state": values["model_state"], "optimizer_state": values["optimizer_state"]}

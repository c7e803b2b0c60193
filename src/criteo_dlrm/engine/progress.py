"""The run's state on disk while it trains, so that memory holds the model once.

Two files: the in-progress checkpoint (the latest state, which a rerun resumes from), and the best model so
far. Both are written from the live tensors, one after another (``torch.save`` writes each tensor's bytes as
they are; nothing is copied first), never kept as a second copy in memory. At a validation that improves, the
best file is a hard link to the in-progress file just written (no second write; a copy where the filesystem
has no links). Resume off, only the best file is written, at the validations that improve.

Kept beside the in-progress checkpoint (``<folder>/best/<name>``) so a rerun that resumes finds both; removed
with it once the finished run's checkpoint is stored (``recipe.finish_run``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from criteo_dlrm.common.storage import DamagedFileError, remove_stale_partials, staging_path
from criteo_dlrm.engine.checkpoint import load_checkpoint, save_atomically
from criteo_dlrm.engine.result import TrainingResult


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
            try:
                os.link(self.latest, staged)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(self.latest, staged)
            os.replace(staged, self.best)

    def save_best(self, values: dict[str, Any]) -> None:
        """Write ``values`` as the best model alone (resume off, or an in-progress checkpoint of an earlier version
        of this project, which carried the best model inside it)."""
        self.best.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(values, self.best)

    def remove(self) -> None:
        """Both files (a finished run whose checkpoint is stored)."""
        for path in (self.latest, self.best):
            if path is not None:
                path.unlink(missing_ok=True)


def load_best(result: TrainingResult) -> tuple[dict, dict]:
    """The best model's ``(model_state, optimizer_state)``, memory-mapped from ``result.best_checkpoint`` (pages
    are read as they are used and can be dropped again: the file is not copied into memory).

    Raises:
        DamagedFileError: the file is damaged, or holds another step than the result's best, naming it.
    """
    path = result.best_checkpoint
    values = load_checkpoint(path, mmap=True)
    if values.get("step") != result.best_step:
        raise DamagedFileError(
            f"{path} holds step {values.get('step')}, not the best step {result.best_step:,} of this run: it was "
            "replaced while the run trained. Delete it and its in-progress checkpoint; a rerun then starts afresh."
        )
    return values["model_state"], values["optimizer_state"]

"""Where a training run stands (``RunState``) and the in-progress checkpoint that keeps it (``InProgress``): what
an interrupted run resumes, with the same weights, optimiser state, random state and record of validations.

The checkpoint is written here from what the parallel mode hands out (``engine.parallel.modes.SavedState``: its
live tensors, nothing copied) and its state is given back to the mode on resume. Two files (``ProgressFiles``):
the in-progress checkpoint (the latest state, which a rerun resumes from), and the best model so far, each written
once, from the live tensors (``torch.save`` writes each tensor's bytes as they are), never kept as a second copy
in memory. At a validation that improves, the best file is a hard link to the in-progress file just written (no
second write; a copy where the filesystem has no links). Resume off, only the best file is written, at the
validations that improve.

The best file is kept beside the in-progress checkpoint (``<folder>/best/<name>``) so a rerun that resumes finds
both; removed with it once the finished run's checkpoint is stored (``recipe.finish_run``).

A sharded run (TorchRec) writes its tensors from every process into a folder beside the file
(``<name>.state-<step>/``, ``engine.trained.sharded_checkpoint``); the file then holds the bookkeeping and names
the folder with the digest of each of its files. The best model's folder is hard-linked file by file as well.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.records import Record, stored, typed
from criteo_dlrm.common.storage import DamagedFileError, link_or_copy, remove_stale_partials, staging_path
from criteo_dlrm.engine.parallel.modes import Mode, SavedState
from criteo_dlrm.engine.trained.checkpoint import StateFolder, Weights, load_checkpoint, save_atomically
from criteo_dlrm.engine.trained.reports import Metrics, Target, Validation
from criteo_dlrm.engine.trained.result import TrainingResult


@dataclass
class RunState:
    """The loop's position and record, stored in the in-progress checkpoint beside the weights.

    ``best`` is the best validation (its weights: the best file; None before the first); ``target`` the first
    validation at or above ``training.target_auc``; ``wall_seconds`` the run's wall time before this process began
    (a resumed run's). Stored in the in-progress checkpoint as plain values (``values``, ``from_values``)."""

    run_dir: str
    step: int = 0
    best_loss: float = math.inf
    best: Validation | None = None
    bad_validations: int = 0
    history: list[Validation] = field(default_factory=list)
    train_seconds: float = 0.0
    samples_seen: int = 0
    wall_seconds: float = 0.0
    target: Target | None = None
    started: float = field(default_factory=time.perf_counter, repr=False, compare=False)  # this process's start

    @classmethod
    def from_values(cls, values: dict) -> RunState:
        """From an in-progress checkpoint's values (those written before a field existed get its default)."""
        names = [name for name in cls.__dataclass_fields__ if name != "started"]
        known = {name: values[name] for name in names if name in values}
        if best := known.pop("best", None):  # stored as {step, epoch, metrics}
            known["best"] = Validation.of(Metrics.from_dict(best["metrics"]), step=best["step"], epoch=best["epoch"])
        return cls(**typed(cls, known))

    def values(self) -> dict:
        """The stored form (plain values: the checkpoint is read with ``weights_only``), the wall time brought up to
        now."""
        names = [name for name in self.__dataclass_fields__ if name not in ("started", "best")]
        best = self.best
        kept = {} if best is None else {"step": best.step, "epoch": best.epoch, "metrics": best.metrics.to_dict()}
        return {**stored(self, names), "best": kept, "wall_seconds": self.wall_seconds_now}

    @property
    def wall_seconds_now(self) -> float:
        """The run's wall time so far, from its first step's process on (validations and checkpoints included)."""
        return self.wall_seconds + time.perf_counter() - self.started

    def validated(self, epoch: int, metrics: Metrics, seconds: float, min_delta: float) -> bool:
        """Record a validation at this step; True when its log loss is the best so far by ``min_delta``."""
        # train_seconds: training time so far (validations excluded): the time to this model.
        record = Validation.of(metrics, step=self.step, epoch=epoch, seconds=seconds, train_seconds=self.train_seconds)
        self.history.append(record)
        improved = metrics.log_loss < self.best_loss - min_delta
        if improved:
            self.best_loss, self.bad_validations = metrics.log_loss, 0
            self.best = record
        else:
            self.bad_validations += 1
        return improved

    def target_outcome(self, target_auc: float | None) -> Target | None:
        """``training.target_auc`` and when the run reached it (``reached``: false when it never did)."""
        if target_auc is None:
            return None
        return replace(self.target, auc=target_auc) if self.target else Target(auc=target_auc, reached=False)

    def log_outcome(self, target_auc: float | None, patience: int, stopped_early: bool) -> None:
        """The run's last line: where it stopped, why, and the model it kept."""
        if target_auc is not None and self.target is None:
            best_auc = max(record.auc for record in self.history)
            logger.warning("target AUC {} not reached in {:,} steps (best validation AUC {:.5f})", target_auc,
                           self.step, best_auc)  # fmt: skip
        if self.target is not None:
            target = self.target
            logger.info(
                "target AUC {} reached at step {:,} (epoch {}): validation AUC {:.5f} after {:.1f} s of training, "
                "{:.1f} s wall; {}",
                target_auc, target.step, target.epoch, target.validation_auc,
                target.train_seconds, target.wall_seconds, self.kept(),
            )  # fmt: skip
        elif stopped_early:
            last = self.history[-1]
            logger.info("early stopping at step {:,} (epoch {}): no better validation log loss in {} validations; {}",
                        last.step, last.epoch, patience, self.kept())  # fmt: skip
        else:
            logger.info("training finished at step {:,}; {}", self.step, self.kept())

    def kept(self) -> str:
        best = self.best
        return (
            f"kept step {best.step:,} (epoch {best.epoch}): validation log loss {best.log_loss:.5f}, AUC {best.auc:.4f}"
        )


@dataclass(frozen=True, kw_only=True)
class Stamp(Record):
    """What an in-progress or best file says of itself beside the run's state and its weights: the settings and
    data it belongs to (``fingerprint``), the step it holds, the precision it trained in and torch's random state
    (None: written before it was kept)."""

    fingerprint: str | None = None
    step: int | None = None
    precision: str | None = None
    torch_rng_state: torch.Tensor | None = None


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

    def write(self, state: SavedState | None, values: dict[str, Any], improved: bool) -> None:
        """Write what a mode handed out (``state``; None: another process writes it) with ``values`` (the loop's
        bookkeeping): one file, or a sharded mode's folder of every process's shards and the file naming it."""
        if state is not None and state.shards is not None:
            self.save_sharded(values, state.weights, state.shards, improved)
        elif state is not None:
            self.save({**values, **state.weights.to_dict()}, improved)

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

    def save_sharded(
        self, values: dict[str, Any], weights: Weights, tensors: dict[str, torch.Tensor], improved: bool
    ) -> None:
        """A sharded run's checkpoint: ``tensors`` written by every process into the folder beside the file,
        ``values`` and ``weights`` (with the folder's name and digests) by rank 0. Every process calls it."""
        # Imported here: torch.distributed.checkpoint takes half a second of every kedro command's start otherwise.
        from criteo_dlrm.engine.trained.sharded_checkpoint import write_state

        target = self.latest if self.latest is not None else self.best
        folder = target.parent / f"{target.stem}.state-{values['step']}"
        target.parent.mkdir(parents=True, exist_ok=True)
        digests = write_state(tensors, folder)
        if digests is not None:  # rank 0
            named = replace(weights, sharded_state=StateFolder(folder=folder.name, digests=digests))
            values = {**values, **named.to_dict()}
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
    if path.exists() and (weights := Weights.from_dict(load_checkpoint(path))).sharded:
        keep = weights.sharded_state.folder
    for folder in [*_state_folders(path), *path.parent.glob(f".{path.stem}.state-*.partial")]:
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)


def remove_checkpoint(path: str | os.PathLike) -> None:
    """An in-progress or best checkpoint file and its state folders."""
    path = Path(path)
    path.unlink(missing_ok=True)
    for folder in _state_folders(path):
        shutil.rmtree(folder, ignore_errors=True)


def load_best(result: TrainingResult) -> Weights:
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
    if (step := Stamp.from_dict(values).step) != result.best_step:
        raise DamagedFileError(
            f"{path} holds step {step}, not the best step {result.best_step:,} of this run: it was "
            "replaced while the run trained. Delete it and its in-progress checkpoint; a rerun then starts afresh."
        )
    return Weights.from_dict(values)  # load_checkpoint gave a state folder its path


class InProgress:
    """The in-progress checkpoint at ``path`` (None: resume off, only the best model is written) and the best
    model (``best_path``: beside it by default), for a run whose settings and data are ``fingerprint``."""

    def __init__(self, mode: Mode, path: Path | None, fingerprint: str, best_path: Path | None = None):
        self.mode, self.path, self.fingerprint = mode, path, fingerprint
        self.files = ProgressFiles(path, best_path)

    def resume(self) -> RunState | None:
        """The state to continue from, its weights and optimiser state restored into the mode; None: start afresh
        (no checkpoint, another run's, or a damaged one: set aside as ``<name>.damaged``)."""
        self.files.remove_stale()
        if self.path is None or not Path(self.path).exists():
            return None
        try:
            values = load_checkpoint(self.path, mmap=True)  # copied into the model, never held twice
        except DamagedFileError as error:
            return self._set_aside(error)
        stamp = Stamp.from_dict(values)
        if stamp.fingerprint != self.fingerprint:
            logger.warning("{} belongs to other settings or data; starting afresh", self.path)
            return None
        best = values["best"]
        if "model_state" in best and self.mode.is_main:  # written before the best model lived in its own file
            self.files.save_best({**values, "step": best["step"], "model_state": best.pop("model_state"),
                                  "optimizer_state": best.pop("optimizer_state")})  # fmt: skip
        if best and not self.files.best.exists():
            logger.warning(
                "{} has no best model beside it ({} is missing); starting afresh", self.path, self.files.best
            )
            return None
        if best and (problem := self._damaged_best(best["step"])):  # found now, not once the resumed run has ended
            return self._set_aside(DamagedFileError(f"Its best model cannot be used: {problem}"))
        weights = Weights.from_dict(values)  # a state folder with its path (``load_checkpoint``)
        try:
            self.mode.placement.restore_state(weights)
        except DamagedFileError as error:  # a shard of a sharded state (checked before anything is loaded)
            return self._set_aside(error)
        torch.set_rng_state(stamp.torch_rng_state)
        state = RunState.from_values(values)
        logger.info("resumed from {} at step {:,} (best validation log loss {:.5f})", self.path, state.step,
                    state.best_loss)  # fmt: skip
        return state

    def _damaged_best(self, step: int) -> str:
        """What is wrong with the best model beside the in-progress checkpoint ("" when it is whole and of
        ``step``): its file's content digest, and a sharded run's state folder, every file (the processes share
        the hashing: every one calls it)."""
        try:
            kept = load_checkpoint(self.files.best, mmap=True)
            if (kept_step := Stamp.from_dict(kept).step) != step:
                return f"{self.files.best} holds step {kept_step}, not the best step {step:,}."
            if (weights := Weights.from_dict(kept)).sharded:
                from criteo_dlrm.engine.trained.sharded_checkpoint import check_state  # torch's DCP: 0.5 s to import

                sharded = weights.sharded_state
                check_state(Path(sharded.path), sharded.digests, fix="(the best model's state)")
        except DamagedFileError as error:
            return str(error)
        return ""

    def save(self, state: RunState, improved: bool = False) -> None:
        """Write the in-progress checkpoint (resume on), and the best model when this step's validation
        ``improved``: from the live tensors the mode hands out (``mode.placement.saved_state``), no copy kept. Every process
        calls it."""
        if self.path is None and not improved:
            return
        values = {"fingerprint": self.fingerprint, **state.values(), "torch_rng_state": torch.get_rng_state()}
        values["precision"] = self.mode.runtime.precision  # a resumed run trains on in it (resumed_precision)
        self.files.write(self.mode.placement.saved_state(), values, improved)

    def kept(self) -> str:
        """Where the last good state is, for a message about a run that cannot go on ("" when none is)."""
        if self.path and Path(self.path).exists():
            return f" The last good in-progress checkpoint is {self.path}."
        return ""

    def _set_aside(self, error: DamagedFileError) -> None:
        aside = Path(f"{self.path}.damaged")
        if self.mode.is_main:
            os.replace(self.path, aside)
            logger.warning("{} Moved to {}; this run starts afresh.", error, aside)


def resumed_precision(path: Path | None, fingerprint: str) -> str | None:
    """The precision the in-progress checkpoint at ``path`` was trained in, when it is this run's (``fingerprint``)
    and says (None otherwise): a resumed run keeps it, whatever ``precision: auto`` would choose now. Read without
    its digest check (the resume checks it, and starts afresh from a damaged one)."""
    if path is None or not Path(path).exists():
        return None
    try:
        values = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - damaged: the resume sets it aside and says so
        return None
    if not isinstance(values, dict) or (stamp := Stamp.from_dict(values)).fingerprint != fingerprint:
        return None
    return stamp.precision if isinstance(stamp.precision, str) else None

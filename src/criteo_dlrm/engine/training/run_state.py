"""Where a training run stands (``RunState``) and the in-progress checkpoint that keeps it (``InProgress``): what
an interrupted run resumes, with the same weights, optimiser state, random state and record of validations.

The weights and optimiser state are the parallel mode's to write and read (``engine.parallel.modes``: from the live
tensors, sharded or not); the files are ``engine.trained.progress``'s. This module holds the bookkeeping beside them.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from loguru import logger

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.engine.trained.checkpoint import load_checkpoint
from criteo_dlrm.engine.trained.progress import ProgressFiles


@dataclass
class RunState:
    """The loop's position and record, stored in the in-progress checkpoint beside the weights.

    ``best`` is the best validation's ``{step, epoch, metrics}`` (its weights: the best file); ``target`` the first
    validation at or above ``training.target_auc`` (``{step, epoch, validation_auc, train_seconds,
    wall_seconds}``); ``wall_seconds`` the run's wall time before this process began (a resumed run's)."""

    run_dir: str
    step: int = 0
    best_loss: float = math.inf
    best: dict = field(default_factory=dict)
    bad_validations: int = 0
    history: list[dict] = field(default_factory=list)
    train_seconds: float = 0.0
    samples_seen: int = 0
    wall_seconds: float = 0.0
    target: dict | None = None
    started: float = field(default_factory=time.perf_counter, repr=False, compare=False)  # this process's start

    @classmethod
    def from_values(cls, values: dict) -> RunState:
        """From an in-progress checkpoint's values (those written before a field existed get its default)."""
        names = [name for name in cls.__dataclass_fields__ if name != "started"]
        return cls(**{name: values[name] for name in names if name in values})

    def values(self) -> dict:
        """The stored form, the wall time brought up to now."""
        stored = {name: value for name, value in asdict(self).items() if name != "started"}
        return {**stored, "wall_seconds": self.wall_seconds_now}

    @property
    def wall_seconds_now(self) -> float:
        """The run's wall time so far, from its first step's process on (validations and checkpoints included)."""
        return self.wall_seconds + time.perf_counter() - self.started

    def validated(self, epoch: int, metrics: dict, seconds: float, min_delta: float) -> bool:
        """Record a validation at this step; True when its log loss is the best so far by ``min_delta``."""
        # train_seconds: training time so far (validations excluded): the time to this model.
        record = {"step": self.step, "epoch": epoch, **metrics, "seconds": seconds, "train_seconds": self.train_seconds}
        self.history.append(record)
        improved = metrics["log_loss"] < self.best_loss - min_delta
        if improved:
            self.best_loss, self.bad_validations = metrics["log_loss"], 0
            self.best = {"step": self.step, "epoch": epoch, "metrics": metrics}
        else:
            self.bad_validations += 1
        return improved

    def target_outcome(self, target_auc: float | None) -> dict | None:
        """``training.target_auc`` and when the run reached it (``reached``: false when it never did)."""
        if target_auc is None:
            return None
        return {"auc": target_auc, "reached": self.target is not None, **(self.target or {})}

    def log_outcome(self, target_auc: float | None, patience: int, stopped_early: bool) -> None:
        """The run's last line: where it stopped, why, and the model it kept."""
        if target_auc is not None and self.target is None:
            best_auc = max(record["auc"] for record in self.history)
            logger.warning("target AUC {} not reached in {:,} steps (best validation AUC {:.5f})", target_auc,
                           self.step, best_auc)  # fmt: skip
        if self.target is not None:
            target = self.target
            logger.info(
                "target AUC {} reached at step {:,} (epoch {}): validation AUC {:.5f} after {:.1f} s of training, "
                "{:.1f} s wall; {}",
                target_auc, target["step"], target["epoch"], target["validation_auc"],
                target["train_seconds"], target["wall_seconds"], self.kept(),
            )  # fmt: skip
        elif stopped_early:
            last = self.history[-1]
            logger.info("early stopping at step {:,} (epoch {}): no better validation log loss in {} validations; {}",
                        last["step"], last["epoch"], patience, self.kept())  # fmt: skip
        else:
            logger.info("training finished at step {:,}; {}", self.step, self.kept())

    def kept(self) -> str:
        best = self.best
        return (
            f"kept step {best['step']:,} (epoch {best['epoch']}): validation log loss "
            f"{best['metrics']['log_loss']:.5f}, AUC {best['metrics']['auc']:.4f}"
        )


class SavesState(Protocol):
    """What of a parallel mode (``engine.parallel.modes``) the in-progress checkpoint uses."""

    is_main: bool

    def save_state(self, files: ProgressFiles, values: dict, improved: bool) -> None: ...

    def restore_state(self, values: dict, files: ProgressFiles) -> None: ...


class InProgress:
    """The in-progress checkpoint at ``path`` (None: resume off, only the best model is written) and the best
    model (``best_path``: beside it by default), for a run whose settings and data are ``fingerprint``."""

    def __init__(self, mode: SavesState, path: Path | None, fingerprint: str, best_path: Path | None = None):
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
        if values.get("fingerprint") != self.fingerprint:
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
        try:
            self.mode.restore_state(values, self.files)
        except DamagedFileError as error:  # a shard of a sharded state (checked before anything is loaded)
            return self._set_aside(error)
        torch.set_rng_state(values["torch_rng_state"])
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
            if kept.get("step") != step:
                return f"{self.files.best} holds step {kept.get('step')}, not the best step {step:,}."
            if "sharded_state" in kept:
                from criteo_dlrm.engine.trained.sharded_checkpoint import check_state  # torch's DCP: 0.5 s to import

                sharded = kept["sharded_state"]
                check_state(Path(sharded["path"]), sharded["digests"], fix="(the best model's state)")
        except DamagedFileError as error:
            return str(error)
        return ""

    def save(self, state: RunState, improved: bool = False) -> None:
        """Write the in-progress checkpoint (resume on), and the best model when this step's validation
        ``improved``: from the live tensors (``mode.save_state``), no copy kept. Every process calls it."""
        if self.path is None and not improved:
            return
        values = {"fingerprint": self.fingerprint, **state.values(), "torch_rng_state": torch.get_rng_state()}
        runtime = getattr(self.mode, "runtime", None)
        if runtime is not None:  # a resumed run trains on in what this state was trained in (resumed_precision)
            values["precision"] = runtime.precision
        self.mode.save_state(self.files, values, improved)

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
    if not isinstance(values, dict) or values.get("fingerprint") != fingerprint:
        return None
    precision = values.get("precision")
    return precision if isinstance(precision, str) else None

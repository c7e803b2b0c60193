"""A whole training run, from a configuration and encoded rows to a checkpoint and a summary.

``run_training`` is the one entry point: it runs in this process, or (``distributed.nproc_per_node`` > 1)
starts that many processes through torch.distributed's elastic launcher (``engine.training.distributed``), each of
which calls ``train_process``. Whatever runs it (the Kedro node, a benchmark, ``torchrun``), a run is
the same: seeding, device, model, loaders, the ``Trainer``, and the checkpoint assembled from its result.
"""

from __future__ import annotations

import contextlib
import gc
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger

from criteo_dlrm.common.errors import ConfigError, Fix
from criteo_dlrm.common.locks import exclusive, remove_stale_locks
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.source_days import SourceDays
from criteo_dlrm.data.stored import EncodedArrays, check_index_range
from criteo_dlrm.engine.device import Runtime, resolve_device
from criteo_dlrm.engine.memory import check_replicated_memory
from criteo_dlrm.engine.parallel.modes import placement_class
from criteo_dlrm.engine.trained.calibration import Identity, calibrator
from criteo_dlrm.engine.trained.checkpoint import (
    Checkpoint,
    TrainedWith,
    code_identity,
    fingerprint,
    model_with_weights,
    training_checkpoint,
)
from criteo_dlrm.engine.trained.metrics import log_loss
from criteo_dlrm.engine.trained.reports import TrainingSummary
from criteo_dlrm.engine.trained.scoring import calibrated, predict
from criteo_dlrm.engine.training.distributed import SPLITS, launch, launcher_folder, rows_folder
from criteo_dlrm.engine.training.job import TrainingJob, TrainingOutcome
from criteo_dlrm.engine.training.process import train_process
from criteo_dlrm.engine.training.run_state import best_path_for, load_best, remove_checkpoint
from criteo_dlrm.models.shapes import DLRMConfig

# Settings that change neither the data order nor the arithmetic: a run may resume across them (the
# number of processes included: every process count sees the same global batches in the same order).
NOT_IN_FINGERPRINT = (
    "resume", "profiler", "log_every_steps", "tensorboard_dir", "in_progress_dir", "num_threads",
    "encoding_workers", "distributed", "calibration", "prefetch_batches", "reading_threads", "memory_check",
)  # fmt: skip


# Settings that leave the training alone but change a finished run's checkpoint or what the run produces besides
# it: a finished run is reused only when they are the same as well.
FINISHED_SETTINGS = ("calibration", "profiler")


@dataclass(frozen=True)
class FinishedRun:
    """A finished run's stored results: their catalog version, its summary, and a function that reads its
    checkpoint (None when it cannot be read)."""

    version: str
    summary: TrainingSummary
    checkpoint: Callable[[], Checkpoint | None]


def run_training(
    config: TrainingConfig,
    train: EncodedArrays,
    validation: EncodedArrays,
    metadata: FeatureMetadata,
    vocabularies: dict[str, np.ndarray] | None,
    run_version: str,
    metadata_version: str | None = None,
    previous: FinishedRun | None = None,
) -> tuple[Checkpoint, TrainingSummary]:
    """Train on ``train``, validate on the whole of ``validation``.

    Args:
        config: the run's configuration.
        train, validation: encoded rows (stored ones are memory-mapped and travel to worker processes by folder).
        metadata: the ``feature_metadata`` they were encoded with (table sizes, vocabulary digest, days).
        vocabularies: its vocabularies (None in modulus-hash mode), kept in the checkpoint for scoring.
        run_version: names the TensorBoard run folder and is recorded in the checkpoint.
        metadata_version: the metadata's catalog version, recorded in the checkpoint.
        previous: the latest finished run; with resume on, when it trained with the same settings on the same rows
            (``FINISHED_SETTINGS`` included) its checkpoint and summary are this run's, and nothing is trained.

    Returns:
        ``(checkpoint, summary)``: the best checkpoint (weights, optimiser state, step, configuration,
        metadata version and encoder) and a JSON summary of the run.
    """
    rates, model_config, device = _checked(config, train, validation, metadata)
    everything = config.to_dict()
    settings = {k: v for k, v in everything.items() if k not in NOT_IN_FINGERPRINT}
    job = TrainingJob(
        config=config,
        train=str(train.folder) if train.folder is not None else train,
        validation=str(validation.folder) if validation.folder is not None else validation,
        table_sizes=metadata.table_sizes,
        # Validating on other days is another run, never resumed into.
        fingerprint=fingerprint(settings, metadata.vocabulary_sha256, train.lineage, validation.lineage),
        run_version=run_version,
        initial_ctr=model_config.initial_ctr,
    )
    finished = finished_fingerprint(job.fingerprint, everything, code_identity())
    trained_because = None
    if previous is not None and job.resume_path is not None:
        reused, trained_because = _reuse(previous, job.fingerprint, everything, metadata.source_days)
        if reused is not None:
            return reused
    outcome = _train(job)
    gc.collect()  # the trained model and its optimiser state are gone before the best one is read back
    kept = KeptRun(outcome, job, model_config, metadata, metadata_version, finished, trained_because, rates)
    return kept.checkpoint_and_summary(vocabularies, validation, device)


def _checked(
    config: TrainingConfig, train: EncodedArrays, validation: EncodedArrays, metadata: FeatureMetadata
) -> tuple[str | None, DLRMConfig, torch.device]:
    """What can be refused before any process starts (no rows, indices past the tables, impossible sizes, too
    little memory, a mode the device cannot run), checked: ``(click-rate warning or None, model config, device)``."""
    if len(train) == 0 or len(validation) == 0:
        raise ConfigError("Training needs rows in both the training and the validation days.")
    table_sizes = metadata.table_sizes
    check_index_range(train, table_sizes, "the training rows")
    check_index_range(validation, table_sizes, "the validation rows")
    rates = click_rate_warning(metadata.click_rate, metadata.rows, validation.checked_labels(), metadata.source_days)
    if rates:
        logger.warning("click rates: {}", rates)
    initial_ctr = metadata.click_rate if 0 < metadata.click_rate < 1 else None
    model_config = config.model_config(table_sizes, initial_ctr)
    check_replicated_memory(config, model_config)
    device = resolve_device(config.device, "training.device")
    placement_class(config).check(config, device)
    return rates, model_config, device


def _train(job: TrainingJob) -> TrainingOutcome:
    """Train ``job`` here, or in the processes it asks for, holding its in-progress checkpoint's lock: two runs
    of the same settings on the same data would share (and overwrite) one in-progress checkpoint."""
    if job.resume_path is not None:
        remove_stale_locks(job.resume_path.parent, keep=job.resume_path)
    with exclusive(job.resume_path, "the in-progress checkpoint") if job.resume_path else contextlib.nullcontext():
        if job.resume_path is not None:  # what a killed run of this job left in its folder, which the lock makes ours
            for leftover in [launcher_folder(job), *(rows_folder(job, split) for split in SPLITS)]:
                shutil.rmtree(leftover, ignore_errors=True)
        try:
            if job.config.launches_processes and not dist.is_initialized():
                return launch(job, job.config.distributed)
            return train_process(job)
        except KeyboardInterrupt:
            _say_how_to_resume(job.resume_path)
            raise


@dataclass(frozen=True)
class KeptRun:
    """A trained run, before its checkpoint and summary are assembled: the outcome of its processes, the job, the
    model's configuration, the metadata it trained with, its fingerprint as a finished run, why it trained, and
    its click-rate warning."""

    outcome: TrainingOutcome
    job: TrainingJob
    model_config: DLRMConfig
    metadata: FeatureMetadata
    metadata_version: str | None
    finished: str
    trained_because: str | None
    rates: str | None

    def checkpoint_and_summary(
        self, vocabularies: dict[str, np.ndarray] | None, validation: EncodedArrays, device: torch.device
    ) -> tuple[Checkpoint, TrainingSummary]:
        """The run's checkpoint (the best model, read back memory-mapped, calibrated on ``validation``) and its
        summary, whatever ran the training (one process, the launcher's, a resumed run)."""
        outcome, result, config, metadata = self.outcome, self.outcome.result, self.job.config, self.metadata
        # Memory-mapped, read as it is written into the run's checkpoint; a sharded run's folder is not read: the
        # catalog's dataset links its files into the checkpoint's version.
        best = load_best(result)
        sharded = best.sharded
        if sharded:
            best = replace(best, sharded_state=replace(best.sharded_state, tables=list(SPARSE_COLUMNS)))
        elif self.job.resume_path is None:  # nothing resumes from it (the mapping stays valid after the unlink)
            remove_checkpoint(result.best_checkpoint)
        encoder = FeatureEncoder.from_metadata(metadata, vocabularies, config.dense_transform)
        trained_with = TrainedWith(version=self.metadata_version, vocabulary_sha256=metadata.vocabulary_sha256,
                                   train_ctr=metadata.click_rate, source_days=metadata.source_days)  # fmt: skip
        run = {"run_version": self.job.run_version, "tensorboard_run": outcome.run_dir}
        in_progress = self.job.resume_path
        # Here, once: the kept model's logits on the validation rows.
        kept = model_with_weights(self.model_config, best)
        calibration = calibrate(kept, validation, config, Runtime(device, outcome.backends["precision"]))
        del kept
        warnings = [warning for warning in (self.rates, calibration.pop("warning", None)) if warning]
        everything = config.to_dict()
        checkpoint = training_checkpoint(
            result,
            best,
            self.model_config,
            everything,
            trained_with,
            encoder.state_dict(),
            calibration,
            run,
            self.finished,
        )
        summary = TrainingSummary(
            **run,
            device=outcome.device,
            processes=outcome.processes,
            # What the run trained in, and with precision: auto why (engine.device.resolve_precision).
            precision={key: value for key, value in outcome.backends.items() if key.startswith("precision")},
            threads=outcome.backends.get("num_threads"),
            embeddings=outcome.embeddings,
            lookups_per_row=self.model_config.lookups_per_row,  # 26, or the multi-hot sizes summed (MLPerf's: 214)
            steps=result.steps,
            resumed_from_step=result.resumed_from_step,
            best_step=result.best_step,
            stopped_early=result.stopped_early,
            target=result.target,  # training.target_auc and when it was reached (MLPerf's time to target)
            samples_per_second=result.samples_per_second,
            best_validation=result.best_metrics,
            calibration={key: value for key, value in calibration.items() if not key.startswith("knots")},
            history=result.history,
            warnings=warnings,
            metadata_version=self.metadata_version,
            source_days=metadata.source_days,
            fingerprint=self.finished,  # a rerun with the same settings on the same rows reuses this run (``_reuse``)
            settings=everything,  # what a later run that does not reuse this one names as its difference
            trained_because=self.trained_because,
            code=code_identity(),
            # Removed once the checkpoint is stored (``finish_run``): until then a rerun resumes from it.
            in_progress_checkpoint=str(in_progress) if in_progress is not None else None,
            # Its files are linked into the stored checkpoint, then removed.
            best_checkpoint=str(result.best_checkpoint) if sharded and in_progress is None else None,
        )
        return checkpoint, summary


def finished_fingerprint(job_fingerprint: str, settings: dict, code: dict | None) -> str:
    """A finished run's identity: its job's (settings and rows), the ``FINISHED_SETTINGS`` and the code that
    trained it (``code_identity``; None: a run made before the code was recorded)."""
    finished = {key: settings[key] for key in FINISHED_SETTINGS}
    return fingerprint(job_fingerprint, finished) if code is None else fingerprint(job_fingerprint, finished, code)


def _reuse(
    previous: FinishedRun, job_fingerprint: str, settings: dict, source_days: SourceDays | None
) -> tuple[tuple[Checkpoint, TrainingSummary] | None, str | None]:
    """The finished run's checkpoint and summary as this run's, when it trained with these settings on these rows
    with this code (``finished_fingerprint``), as its checkpoint's own content says (its summary and the summary's
    checksum can be copied from another run; the checkpoint's fingerprint is under its content digest), and None;
    otherwise None and why not, in a few words (said in the log and the run's summary)."""
    code = code_identity()
    finished = finished_fingerprint(job_fingerprint, settings, code)
    summary_says = previous.summary.fingerprint
    if summary_says != finished:
        why = _why_not_the_same(previous, job_fingerprint, settings, source_days)
        logger.info("training: not reused: {}; training again", why)
        return None, why
    checkpoint = previous.checkpoint()
    if checkpoint is None:
        return None, f"version {previous.version}'s checkpoint cannot be read"
    if checkpoint.fingerprint != finished:
        logger.warning(
            "training: the summary of version {} names this run's settings, rows and code, but its checkpoint was "
            "trained {} (the fingerprint under its content digest: {}; this run's: {}): training again",
            previous.version,
            "before checkpoints recorded it" if checkpoint.fingerprint is None else "with other ones",
            checkpoint.fingerprint, finished,
        )  # fmt: skip
        return None, f"version {previous.version}'s checkpoint is not the run its summary names"
    differences = _differences(checkpoint.training_parameters, settings, LEFT_OUT_OF_REUSE)
    summary = replace(previous.summary, reused_version=previous.version,
                      reused_differences=differences, in_progress_checkpoint=None, best_checkpoint=None,
                      trained_because=None)  # fmt: skip
    logger.info(
        "training: reused the finished run of version {} (the same settings on the same rows: {:,} steps, kept step "
        "{:,}, validation log loss {:.5f}). To train again, run with training.resume=false.",
        previous.version, summary.steps, summary.best_step, summary.best_validation.log_loss,
    )  # fmt: skip
    if differences:
        again = Fix(params={"training.resume": False})
        logger.bind(fixes=(again,)).warning(
            "training: the reused run differs from this one in settings that leave the model as it is ({}); its "
            "figures (the processes, samples/s) are that run's. To train with this run's: `{}`",
            "; ".join(differences), again,
        )  # fmt: skip
    return (replace(checkpoint, version=None), summary), None


def _why_not_the_same(
    previous: FinishedRun, job_fingerprint: str, settings: dict, source_days: SourceDays | None
) -> str:
    """Why the finished run ``previous`` is not this one (its summary's fingerprint differs), in a few words: other
    code, other days, the settings that differ (summaries that record theirs), or other rows."""
    then = previous.summary.code
    if previous.summary.fingerprint == finished_fingerprint(job_fingerprint, settings, then):
        return f"version {previous.version} was trained by other code ({_code_named(then)}; this is {_code_named(code_identity())})"
    if previous.summary.source_days != source_days:
        return f"version {previous.version} trained on other days"
    if (recorded := previous.summary.settings) is not None:
        keys = tuple(key for key in sorted(recorded.keys() | settings.keys())
                     if key not in NOT_IN_FINGERPRINT or key in FINISHED_SETTINGS)  # fmt: skip
        if changed := _differences(recorded, settings, keys):
            names = [difference.split(" ", 1)[0] for difference in changed]
            return f"version {previous.version} trained with other {', '.join(names)}"
    return f"version {previous.version} trained on other rows (another metadata version or encoding)"


# Settings a finished run is reused across (they change neither the data order nor the arithmetic), said when the
# reused run's differ: ``resume`` aside (on, or nothing is reused).
LEFT_OUT_OF_REUSE = tuple(key for key in NOT_IN_FINGERPRINT if key not in FINISHED_SETTINGS and key != "resume")


def _differences(then: dict, now: dict, keys: tuple[str, ...], prefix: str = "training.") -> list[str]:
    """``training.<setting> <then> there, <now> here`` for each of ``keys`` (nested blocks by their leaves) that
    differs between the reused run's settings and this run's."""
    found = []
    for key in keys:
        old, new = then.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found += _differences(old, new, tuple(sorted(old.keys() | new.keys())), f"{prefix}{key}.")
        elif old != new:
            found.append(f"{prefix}{key} {old} there, {new} here")
    return found


def _code_named(code: dict | None) -> str:
    """``criteo_dlrm 0.1, source sha256 1a2b3c4d5e6f``, or that a run did not record it."""
    if not code:
        return "code not recorded: a run made before runs recorded their code"
    return f"criteo_dlrm {code.get('criteo_dlrm')}, source sha256 {str(code.get('source_sha256'))[:12]}"


def _say_how_to_resume(resume_path: Path | None) -> None:
    """What an interrupted run leaves and the command that continues it (Ctrl-C ends ``kedro run`` with click's
    bare "Aborted!")."""
    if resume_path is None:
        logger.warning("training interrupted; training.resume is off, so a rerun starts afresh")
    elif resume_path.exists():
        again = Fix()  # the same command
        logger.bind(fixes=(again,)).warning(
            "training interrupted: its state as of the last in-progress checkpoint (written at each validation and "
            "every training.checkpoint_every_steps steps) is in {}. Run the same command to continue from it: `{}` "
            "(what was already made is reused).",
            resume_path,
            again,
        )
    else:
        logger.warning("training interrupted before its first in-progress checkpoint: the same command starts afresh")


# Click rates this many times apart (either way), far beyond chance, are not one dataset's drift between days
# (Criteo 1TB's days differ by a few per cent): two datasets in one folder, or a split by label.
CTR_RATIO_WARNING = 1.5
# A Platt slope outside this range, or a raw output whose mean is this many times off: the model's scores do
# not mean on the validation rows what they meant in training.
EXTREME_SLOPE = (1 / 3, 3.0)
EXTREME_RAW_CALIBRATION = 2.0


def click_rate_warning(
    train_ctr: float, train_rows: int, labels: np.ndarray, source_days: SourceDays | None
) -> str | None:
    """A warning when the validation rows click at a rate the training rows' does not explain: more than
    ``CTR_RATIO_WARNING`` times apart and beyond chance (a two-proportion z of 5)."""
    rows = len(labels)
    if not rows or not train_rows or not 0 < train_ctr < 1:
        return None
    ctr = float(np.mean(labels, dtype=np.float64))
    pooled = (train_ctr * train_rows + ctr * rows) / (train_rows + rows)
    z = abs(train_ctr - ctr) / max(math.sqrt(pooled * (1 - pooled) * (1 / train_rows + 1 / rows)), 1e-12)
    ratio = max(train_ctr, ctr) / max(min(train_ctr, ctr), 1e-12)
    if ratio < CTR_RATIO_WARNING or z < 5:
        return None
    days = source_days or SourceDays()
    names = {split: ", ".join(day.day for day in days.split(split)) or "?" for split in ("train", "validation")}
    return (
        f"the training days ({names['train']}: CTR {train_ctr:.4f}, {train_rows:,} rows) and the validation days "
        f"({names['validation']}: CTR {ctr:.4f}, {rows:,} rows) click at rates {ratio:.1f}x apart, far beyond chance "
        f"(z = {z:.0f}): are they one dataset? Two datasets in one raw folder (Kaggle's and Criteo 1TB's) give this; "
        "the calibration fitted on the validation rows then corrects for the other data, not the model."
    )


def calibration_warning(state: dict, raw_calibration: float) -> str | None:
    """A warning for a fitted calibration far from the identity, or a raw output far off the observed rate."""
    slope = state.get("slope")
    if slope is not None and not EXTREME_SLOPE[0] <= slope <= EXTREME_SLOPE[1]:
        return (
            f"the Platt calibration's slope is {slope:.2f} (1: the model's scores are calibrated as they are; "
            f"{EXTREME_SLOPE[0]:.2f}-{EXTREME_SLOPE[1]:.0f} is usual) and the raw output's calibration "
            f"{raw_calibration:.2f}: the validation rows are not like the training rows (another dataset, another "
            "period), or the model did not learn (see the validation history)."
        )
    if not 1 / EXTREME_RAW_CALIBRATION <= raw_calibration <= EXTREME_RAW_CALIBRATION:
        return (
            f"the raw output's mean is {raw_calibration:.2f}x the validation rows' click rate: they do not click "
            "like the training rows (another dataset, another period); the calibration corrects it, the model "
            "may still rank them poorly."
        )
    return None


def calibrate(model: torch.nn.Module, validation: EncodedArrays, config: TrainingConfig, runtime: Runtime) -> dict:
    """Fit ``config.calibration`` on the kept model's logits for the validation rows (``engine.trained.calibration``).

    Returns:
        the calibration's state, with the validation log loss before and after (``validation_log_loss``).
    """
    model = model.to(runtime.device)
    loader = BatchLoader(validation, config.batch_size.validation)
    scores = predict(model, loader, runtime, output="logit")
    labels = validation.checked_labels()
    fitted = calibrator(config.calibration).fit(labels, scores)
    scores = scores.astype(np.float32)  # the logits as scoring and evaluation hold them
    probabilities = calibrated(Identity(), scores)  # the model's own output, as evaluation's "raw"
    raw = log_loss(labels, probabilities)
    after = log_loss(labels, calibrated(fitted.eval(), scores))
    state = {**fitted.state(), "validation_log_loss": {"raw": raw, "calibrated": after}}
    logger.info("calibration: {}; validation log loss {:.5f} -> {:.5f}", fitted.describe(), raw, after)
    raw_calibration = float(np.mean(probabilities, dtype=np.float64) / max(np.mean(labels, dtype=np.float64), 1e-12))
    if warning := calibration_warning(state, raw_calibration):
        state["warning"] = warning
        logger.warning("calibration: {}", warning)
    return state


def finish_run(record: TrainingSummary) -> None:
    """Delete a finished run's in-progress checkpoint and its best model: call it once the run's checkpoint is
    stored (``record``: the run's summary)."""
    if path := record.in_progress_checkpoint:
        remove_checkpoint(path)
        remove_checkpoint(best_path_for(path))
    if record.best_checkpoint:  # a sharded run without resume
        remove_checkpoint(record.best_checkpoint)

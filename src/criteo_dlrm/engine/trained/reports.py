"""The reports a run writes, read as records: the training summary, the evaluation, the scoring and the export.

Their producers build them complete (``engine.training.recipe``, ``engine.trained.evaluation``, the scoring nodes);
``to_dict`` is the JSON their datasets store (``training_summary``, ``evaluation_metrics``, ``scoring_report``,
``export_report``) and ``from_dict`` reads one back (keys this version does not know are kept in ``others``, and written
again). Each renders its own lines of the block ``kedro run`` prints at the end (``lines``, put together by
``summary.render``) and the values experiment tracking logs (``tracked``, logged by ``tracking.hooks``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, fields
from typing import Any

from criteo_dlrm.common.records import Record
from criteo_dlrm.common.schema import NUM_SPARSE
from criteo_dlrm.data.source_days import SourceDay, SourceDays, days_tag

FIGURES = ("auc", "log_loss", "normalized_entropy", "calibration")  # a validation's or evaluation's, each tracked
INDENT = " " * 12  # a report's lines after its first, under the block's column of values
WIDTH = 100 - 2 - len(INDENT)  # a value's columns: the block's lines stay within 100, never wrapped by a terminal


def wrapped(text: str, first: str = INDENT) -> list[str]:
    """``text`` as lines of the block: the first after ``first`` (a stage's name, or the indent), the rest under
    the column of values; broken at spaces only (a path or a version longer than a line stays whole, to copy)."""
    head, *rest = textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False) or [""]
    return [first + head, *(INDENT + line for line in rest)]


def fitted(line: str) -> list[str]:
    """A line of the block (a stage's name or the indent, then its values) as lines within its 100 columns."""
    if len(line) <= len(INDENT) + WIDTH:
        return [line]
    return wrapped(line[len(INDENT) :], first=line[: len(INDENT)])


@dataclass(frozen=True)
class Tracked:
    """What a report logs to experiment tracking: metric sets (each at its step; None: no step) and tags."""

    metrics: list[tuple[dict[str, float], int | None]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Metrics(Record):
    """A model's figures on labelled rows (``engine.trained.metrics.binary_metrics``): the rows and their click
    rate (``ctr``), AUC, log loss (nats), normalized entropy (log loss over the click rate's entropy: below 1 beats
    predicting it everywhere), calibration (mean prediction over the click rate) and accuracy at 0.5."""

    rows: int
    ctr: float
    auc: float
    log_loss: float
    normalized_entropy: float
    calibration: float
    accuracy: float
    others: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, float]:
        """The figures tracked and logged for it (``FIGURES``)."""
        return {name: getattr(self, name) for name in FIGURES}

    def line(self) -> str:
        """``AUC 0.7512, log loss 0.13201, NE 0.8791, calibration 1.004``."""
        return (
            f"AUC {self.auc:.4f}, log loss {self.log_loss:.5f}, NE {self.normalized_entropy:.4f}, "
            f"calibration {self.calibration:.3f}"
        )

    def below_prior(self) -> str | None:
        """The warning for a model worse than predicting the average click rate (NE of 1 or more); None otherwise."""
        if self.normalized_entropy < 1:
            return None
        return (
            "NE above 1: worse than predicting the average click rate. Likely too few clicks for the vocabularies "
            "and the model (see metadata.min_expected_clicks), or a learning rate too high."
        )


@dataclass(frozen=True, kw_only=True)
class Validation(Metrics):
    """A validation during training: its step and epoch, its figures, how long it took (``seconds``) and the
    training time before it (``train_seconds``: the time to this model)."""

    OMIT_NONE = True  # a history written without the times is written back without them

    step: int
    epoch: int
    seconds: float | None = None
    train_seconds: float | None = None

    @classmethod
    def of(cls, metrics: Metrics, **values: Any) -> Validation:
        return cls(**{f.name: getattr(metrics, f.name) for f in fields(Metrics)}, **values)

    @property
    def metrics(self) -> Metrics:
        return Metrics(**{f.name: getattr(self, f.name) for f in fields(Metrics)})


@dataclass(frozen=True, kw_only=True)
class Calibration(Record):
    """A model's calibration beyond the overall ratio (``metrics.calibration_report``): the expected calibration
    error (ECE: the row-weighted mean of |mean prediction - observed CTR| over the bins) and each bin's rows, mean
    prediction, observed CTR with its 95% interval, and their ratio."""

    expected_calibration_error: float
    bins: list[dict[str, Any]] = field(default_factory=list)
    others: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Target(Record):
    """``training.target_auc`` (``auc``) and whether the run reached it; when it did, the validation that did
    (``step``, ``epoch``, ``validation_auc``) and the training and wall time to it (MLPerf's time to target)."""

    OMIT_NONE = True

    auc: float | None = None
    reached: bool = True
    step: int | None = None
    epoch: int | None = None
    validation_auc: float | None = None
    train_seconds: float | None = None
    wall_seconds: float | None = None


def _lineage(
    checkpoint_version: str | None, metadata_version: str | None, days: list[SourceDay] | None, tag: str
) -> dict:
    """Which model and rows a report's figures are of: ``checkpoint_version``, ``metadata_version``, the days."""
    tags = {"checkpoint_version": checkpoint_version or "", "metadata_version": metadata_version or "",
            tag: days_tag(days)}  # fmt: skip
    return {key: str(value) for key, value in tags.items() if value}


@dataclass(frozen=True)
class TrainingSummary(Record):
    """What training did and measured (``training_summary``, written by ``engine.training.recipe.run_training``).

    Attributes:
        steps, best_step: the steps taken and the kept model's; ``resumed_from_step`` where it resumed,
            ``reused_version`` the finished run it reused instead (then it trained nothing), and
            ``reused_differences`` the settings that leave the model alone in which that run differed.
        stopped_early: early stopping ended it; ``target``: ``training.target_auc`` and when it was reached.
        best_validation: the kept model's validation metrics; ``history``: every validation's.
        precision: what it trained in (``precision``, and ``precision_auto``: why, with ``auto``); ``threads``:
            PyTorch's CPU threads in each process on the CPU (they decide the figures' last digits).
        embeddings: where the tables lived (``backend``, ...); ``lookups_per_row``: 26, or the multi-hot sum.
        warnings: what the run found worth a look (learning rates, calibration).
        calibration: the fitted calibration's state, its knots aside; ``run_version``, ``tensorboard_run``: the
            run's names; ``metadata_version``, ``source_days``: the rows it trained on; ``fingerprint``: the
            settings, rows and code (a rerun with the same reuses this run); ``code``: the code that trained it;
            ``settings``: the training settings; ``trained_because``: why the latest finished run was not reused.
        in_progress_checkpoint: removed once the checkpoint is stored, until then a rerun resumes from it;
            ``best_checkpoint``: a sharded run's best model without resume, linked into the stored checkpoint.
    """

    steps: int
    best_step: int
    samples_per_second: float
    stopped_early: bool
    best_validation: Metrics
    history: list[Validation] = field(default_factory=list)
    processes: int = 1
    device: str = "cpu"
    precision: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None
    embeddings: dict[str, Any] = field(default_factory=dict)
    lookups_per_row: int | None = None
    target: Target | None = None
    resumed_from_step: int | None = None
    reused_version: str | None = None
    reused_differences: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    run_version: str | None = None
    tensorboard_run: str | None = None
    metadata_version: str | None = None
    source_days: SourceDays | None = None
    fingerprint: str | None = None
    code: dict[str, str] | None = None
    settings: dict[str, Any] | None = None
    trained_because: str | None = None
    in_progress_checkpoint: str | None = None
    best_checkpoint: str | None = None
    others: dict[str, Any] = field(default_factory=dict)

    def lines(self, evaluated: bool) -> list[str]:
        """Its lines of the run's block; ``evaluated``: the run evaluated the model too (else the kept model's
        validation figures are said here)."""
        target = self.target
        stop = "stopped early" if self.stopped_early else "ran every step"
        if target and target.reached:
            stop = (
                f"target AUC {target.auc} at step {target.step:,}: {target.train_seconds:,.1f} s of training, "
                f"{target.wall_seconds:,.1f} s wall"
            )
        start = f"resumed at step {self.resumed_from_step:,}, " if self.resumed_from_step else ""
        if self.reused_version:
            start = f"reused version {self.reused_version}: "
        precision = self.precision or {}
        trained_in = f"{precision['precision']}, " if precision.get("precision") else ""  # absent in older records
        if self.threads and self.device == "cpu":  # the sums' order, so the last digits, follow the thread count
            each = " a process" if self.processes > 1 else ""
            trained_in += f"{self.threads} thread{'s' if self.threads > 1 else ''}{each}, "
        lines = wrapped(  # a reused version's name or a reached target wraps
            f"{start}{self.steps:,} steps ({stop}), kept step {self.best_step:,}, {trained_in}"
            f"{self.samples_per_second:,.0f} samples/s",
            first="training    ",
        )
        if self.trained_because:
            lines += wrapped(f"not reused: {self.trained_because}")
        if self.reused_differences:
            differences = "; ".join(self.reused_differences)
            lines += wrapped(f"the reused run differs in {differences} (training.resume=false trains anew)")
        if why := precision.get("precision_auto"):
            lines += wrapped(f"precision auto: {precision['precision']}, {why}")
        if self.lookups_per_row and self.lookups_per_row != NUM_SPARSE:
            lines.append(f"{INDENT}multi-hot: {self.lookups_per_row} lookups a row")
        if target and not target.reached:
            lines.append(f"{INDENT}target AUC {target.auc} not reached")
        for warning in self.warnings or ():
            lines += wrapped(f"warning: {warning}")
        if not evaluated:
            lines.append(f"{INDENT}validation {self.best_validation.line()}")
            if warning := self.best_validation.below_prior():
                lines.append(INDENT + warning)
        return lines

    def tracked(self) -> Tracked:
        """Every validation at its step, the kept model's figures at its step, the run's totals, MLPerf's time to
        target, and where it trained."""
        metrics = [
            ({f"validation_{name}": value for name, value in record.figures().items()}, record.step)
            for record in self.history
        ]
        kept = {f"kept_validation_{name}": value for name, value in self.best_validation.figures().items()}
        metrics.append((kept, self.best_step))
        totals = {"training_steps": self.steps, "kept_step": self.best_step,
                  "samples_per_second": self.samples_per_second, "processes": self.processes}  # fmt: skip
        metrics.append((totals, None))
        if self.target and self.target.reached:  # MLPerf's figure of merit
            times = {"time_to_target_train_seconds": self.target.train_seconds,
                     "time_to_target_wall_seconds": self.target.wall_seconds}  # fmt: skip
            metrics.append((times, self.target.step))
        tags = {"device": str(self.device), "stopped_early": str(self.stopped_early),
                **{key: str(value) for key, value in (self.precision or {}).items()},
                "embedding_backend": str((self.embeddings or {}).get("backend", "torch"))}  # fmt: skip
        return Tracked(metrics, tags)


@dataclass(frozen=True)
class EvaluationReport(Record):
    """A checkpoint's figures on held-out rows (``evaluation_metrics``, written by ``engine.trained.evaluation``).

    Attributes:
        model, model_raw: the calibrated and the raw output's metrics; ``calibration_by_decile`` their
            reliability; ``prior_baseline`` predicting the training click rate; ``oracle`` the true click
            probabilities' (generated days; None otherwise).
        rows_evaluated: ``test`` (never used to choose or calibrate the model), or ``validation`` for a
            checkpoint without test rows; ``days``: their names; ``source_days`` with row ranges.
        checkpoint_version, metadata_version, vocabulary_sha256, run_version, trained_step: which model.
        gap_to_oracle: how far the model's AUC and log loss are from the oracle's.
    """

    model: Metrics
    prior_baseline: Metrics
    days: list[str]
    model_raw: Metrics
    checkpoint_version: str | None = None
    metadata_version: str | None = None
    source_days: list[SourceDay] | None = None
    rows_evaluated: str = "validation"
    calibration_method: str = "none"
    calibration_by_decile: dict[str, Calibration] = field(default_factory=dict)
    oracle: Metrics | None = None
    gap_to_oracle: dict[str, float] | None = None
    vocabulary_sha256: str | None = None
    run_version: str | None = None
    trained_step: int | None = None
    others: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        lines = [
            f"evaluation  checkpoint {self.checkpoint_version}, {self.model.rows:,} {self.rows_evaluated} rows "
            f"of {', '.join(self.days)}:",
            INDENT + self.model.line(),
        ]
        if self.calibration_method != "none":
            raw = self.model_raw
            lines.append(
                f"{INDENT}{self.calibration_method} calibration: ECE {self.calibrated_ece:.4f}; raw output: log loss "
                f"{raw.log_loss:.5f}, calibration {raw.calibration:.3f}"
            )
        lines.append(f"{INDENT}prior log loss {self.prior_baseline.log_loss:.5f}")
        if self.oracle:
            lines[-1] += f"; oracle AUC {self.oracle.auc:.4f}, log loss {self.oracle.log_loss:.5f}"
        if warning := self.model.below_prior():
            lines.append(INDENT + warning)
        return lines

    @property
    def calibrated_ece(self) -> float:
        """The expected calibration error of the probabilities scoring writes (the calibrated ones)."""
        return self.calibration_by_decile["calibrated"].expected_calibration_error

    def tracked(self) -> Tracked:
        """The figures, named by the rows they are of (``test_auc``, ``validation_raw_log_loss``, ...), and which
        model and rows they are of, also when the run evaluated a stored checkpoint only."""
        rows = self.rows_evaluated
        values = {f"{rows}_{name}": value for name, value in self.model.figures().items()}
        values.update({f"{rows}_raw_{name}": value for name, value in self.model_raw.figures().items()})
        values[f"{rows}_expected_calibration_error"] = self.calibrated_ece
        values[f"{rows}_prior_log_loss"] = self.prior_baseline.log_loss
        if self.oracle:
            values.update({f"{rows}_oracle_auc": self.oracle.auc, f"{rows}_oracle_log_loss": self.oracle.log_loss})
        tags = {"evaluated_rows": rows, "calibration_method": self.calibration_method}
        tags |= _lineage(self.checkpoint_version, self.metadata_version, self.source_days, "evaluated_days")
        return Tracked([(values, None)], tags)


@dataclass(frozen=True)
class ScoringReport(Record):
    """What scoring read and wrote (``scoring_report``, written by the scoring node).

    Attributes:
        calibration_method: how ``click_probability`` was made from the logit (none: the model's raw output).
        unseen_share: of the category values scored, those the checkpoint never saw in training: high when these
            days come from other data.
        metrics: of labelled days (``labelled``); None otherwise.
    """

    rows: int
    checkpoint_version: str | None = None
    metadata_version: str | None = None
    source_days: list[SourceDay] | None = None
    mean_prediction: float | None = None
    metrics: Metrics | None = None
    unseen_share: float | None = None
    input_dir: str | None = None
    calibration_method: str = "none"
    labelled: bool = False
    others: dict[str, Any] = field(default_factory=dict)

    def lines(self, predictions: str | None = None) -> list[str]:
        """``predictions``: where they were written, when known."""
        line = f"scoring     checkpoint {self.checkpoint_version}: {self.rows:,} rows"
        line += f", mean prediction {self.mean_prediction or 0:.4f}"
        if self.metrics:
            line += f", AUC {self.metrics.auc:.4f}"
        lines = [line]
        if self.unseen_share:
            lines.append(f"{INDENT}{self.unseen_share:.1%} of category values unseen in training")
        if predictions:
            lines.append(f"{INDENT}predictions {predictions}")
        return lines

    def tracked(self) -> Tracked:
        return Tracked([], _lineage(self.checkpoint_version, self.metadata_version, self.source_days, "scored_days"))


@dataclass(frozen=True)
class ExportReport(Record):
    """The exported model's files and their check (``export_report``, written by the export node).

    Attributes:
        inputs, output: the served model's tensors by name, shape and meaning.
        encoder_format: the serving encoder's format (``engine.trained.export.ENCODER_FORMAT``).
    """

    onnx_bytes: int
    exported_program_bytes: int
    onnx_check: dict[str, Any]
    checkpoint_version: str | None = None
    metadata_version: str | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    output: dict[str, str] = field(default_factory=dict)
    calibration_method: str = "none"
    encoder_format: str | None = None
    others: dict[str, Any] = field(default_factory=dict)

    def lines(self, onnx: str | None = None) -> list[str]:
        """``onnx``: where the ONNX file was written, when known."""
        lines = [
            f"export      ONNX {self.onnx_bytes / 1e6:.1f} MB (onnxruntime max |difference| "
            f"{self.onnx_check['max_abs_difference']:.1e}), torch.export {self.exported_program_bytes / 1e6:.1f} MB"
        ]
        if onnx:
            lines.append(INDENT + onnx)
        return lines

"""What a run wrote and what it measured, as the short block ``kedro run`` prints at the end (``cli``).

``hooks.SummaryHooks`` fills a ``RunRecord`` with each summarised output as it is saved (and where it went).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from criteo_dlrm.common.schema import NUM_SPARSE
from criteo_dlrm.data.feature_metadata import FeatureMetadata

SUMMARISED = (
    "ingestion_report", "feature_metadata", "training_summary", "evaluation_metrics", "scoring_report",
    "export_report", "predictions", "dlrm_onnx",
)  # fmt: skip


@dataclass
class RunRecord:
    """The outputs one run saved (by catalog name) and the files they went to."""

    version: str | None = None
    saved: dict[str, object] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    # The ingested days by role, as the metadata settings split them (``split_line``).
    split: str | None = None


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _made_or_reused(reused: int, total: int) -> str:
    """``reused``, ``converted`` or ``2 reused, 1 converted``: what a rerun did not have to make again."""
    if reused == total:
        return "reused"
    return "converted" if not reused else f"{reused:,} reused, {total - reused:,} converted"


def _listed(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]}, ... {names[-1]} ({len(names)} days)"


def split_line(split, test_share: float, names: list[str]) -> str:
    """``day_0, day_1 train; day_2 validates (first 50%) and tests (last 50%)``: which ingested day does what,
    in day order (``split``: the metadata settings' ``DaySplit`` of ``names``)."""
    if not split.train:  # one unsplit file: metadata refuses it, naming ingestion.rows_per_day
        return f"{_listed(names)}: one day, which would validate with none left to train (split it into days)"
    parts = [f"{_listed(split.train)} train"]
    if split.test:
        parts += [f"{_listed(split.validation)} validate", f"{_listed(split.test)} test"]
    elif test_share > 0:
        parts.append(
            f"{_listed(split.validation)} validate (first {1 - test_share:.0%}) and test (last {test_share:.0%})"
        )
    else:
        parts.append(f"{_listed(split.validation)} validate (no test rows)")
    unused = [name for name in names if split.role(name) is None]
    if unused:
        parts.append(f"{_listed(unused)} unused")
    return "; ".join(parts)


def _metrics_line(metrics: dict) -> str:
    return (
        f"AUC {metrics['auc']:.4f}, log loss {metrics['log_loss']:.5f}, NE {metrics['normalized_entropy']:.4f}, "
        f"calibration {metrics['calibration']:.3f}"
    )


def _below_prior(metrics: dict) -> str | None:
    if metrics["normalized_entropy"] < 1:
        return None
    return (
        "NE above 1: worse than predicting the average click rate. Likely too few clicks for the vocabularies "
        "and the model (see metadata.min_expected_clicks), or a learning rate too high."
    )


def render(record: RunRecord) -> str:
    """One block of short lines (at most 100 characters each); '' when the run saved nothing summarised."""
    saved, lines = record.saved, []
    if report := saved.get("ingestion_report"):
        days = report["days"]
        lines.append(
            f"ingestion   {_count(len(days), 'day')} ({_made_or_reused(sum(bool(d.get('reused')) for d in days), len(days))}), "
            f"{sum(d['rows'] for d in days):,} rows, {sum(d['rejected'] for d in days):,} rejected"
        )
        if record.split:
            lines.append(f"            {record.split}")
    if stored := saved.get("feature_metadata"):
        metadata = FeatureMetadata.from_dict(stored)
        reused = f"reused version {metadata.counted_in}" if metadata.counted_in else "counted"
        lines.append(
            f"metadata    {reused}: {metadata.rows:,} training rows, CTR {metadata.click_rate:.4f}, "
            f"{sum(metadata.table_sizes):,} embedding rows"
        )
    if summary := saved.get("training_summary"):
        stop = "stopped early" if summary["stopped_early"] else "ran every step"
        target = summary.get("target")
        if target and target["reached"]:
            stop = (
                f"target AUC {target['auc']} at step {target['step']:,}: {target['train_seconds']:,.1f} s of training, "
                f"{target['wall_seconds']:,.1f} s wall"
            )
        resumed = summary.get("resumed_from_step")
        start = f"resumed at step {resumed:,}, " if resumed else ""
        if summary.get("reused_version"):
            start = f"reused version {summary['reused_version']}: "
        lines.append(
            f"training    {start}{summary['steps']:,} steps ({stop}), kept step {summary['best_step']:,}, "
            f"{summary['samples_per_second']:,.0f} samples/s"
        )
        if why := (summary.get("precision") or {}).get("precision_auto"):
            lines += [
                f"            {line}"
                for line in textwrap.wrap(f"precision auto: {summary['precision']['precision']}, {why}", 86)
            ]
        if (lookups := summary.get("lookups_per_row")) and lookups != NUM_SPARSE:
            lines.append(f"            multi-hot: {lookups} lookups a row")
        if target and not target["reached"]:
            lines.append(f"            target AUC {target['auc']} not reached")
        for warning in summary.get("warnings") or ():  # wrapped: the block's lines stay short
            lines += [f"            {line}" for line in textwrap.wrap(f"warning: {warning}", 86)]
        if "evaluation_metrics" not in saved:  # evaluation did not run: say what the kept model measured
            lines.append(f"            validation {_metrics_line(summary['best_validation'])}")
            if warning := _below_prior(summary["best_validation"]):
                lines.append(f"            {warning}")
    if metrics := saved.get("evaluation_metrics"):
        rows = metrics.get("rows_evaluated", "validation")
        lines.append(
            f"evaluation  checkpoint {metrics['checkpoint_version']}, {metrics['model']['rows']:,} {rows} rows of "
            f"{', '.join(metrics['days'])}:"
        )
        lines.append(f"            {_metrics_line(metrics['model'])}")
        if (method := metrics.get("calibration_method", "none")) != "none":
            raw = metrics["model_raw"]
            ece = metrics["calibration_by_decile"]["calibrated"]["expected_calibration_error"]
            lines.append(
                f"            {method} calibration: ECE {ece:.4f}; raw output: log loss {raw['log_loss']:.5f}, "
                f"calibration {raw['calibration']:.3f}"
            )
        lines.append(f"            prior log loss {metrics['prior_baseline']['log_loss']:.5f}")
        if metrics["oracle"]:
            lines[-1] += f"; oracle AUC {metrics['oracle']['auc']:.4f}, log loss {metrics['oracle']['log_loss']:.5f}"
        if warning := _below_prior(metrics["model"]):
            lines.append(f"            {warning}")
    if report := saved.get("scoring_report"):
        line = f"scoring     checkpoint {report['checkpoint_version']}: {report['rows']:,} rows"
        line += f", mean prediction {report['mean_prediction'] or 0:.4f}"
        if report["metrics"]:
            line += f", AUC {report['metrics']['auc']:.4f}"
        lines.append(line)
        if unseen := report.get("unseen_share"):
            lines.append(f"            {unseen:.1%} of category values unseen in training")
        if path := record.paths.get("predictions"):
            lines.append(f"            predictions {path}")
    if export := saved.get("export_report"):
        lines.append(
            f"export      ONNX {export['onnx_bytes'] / 1e6:.1f} MB (onnxruntime max |difference| "
            f"{export['onnx_check']['max_abs_difference']:.1e}), torch.export {export['exported_program_bytes'] / 1e6:.1f} MB"
        )
        if path := record.paths.get("dlrm_onnx"):
            lines.append(f"            {path}")
    if not lines:
        return ""
    return "\n".join([f"Run {record.version}:", *(f"  {line}" for line in lines)])

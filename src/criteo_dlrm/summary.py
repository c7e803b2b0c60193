"""What a run wrote and what it measured, as the short block ``kedro run`` prints at the end (``cli``): the
ingestion and metadata lines here, each report's own (``reports``).

``hooks.SummaryHooks`` fills a ``RunRecord`` with each summarised output as it is saved (and where it went).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from criteo_dlrm.data.source_days import IngestedDay
from criteo_dlrm.engine.trained.reports import fitted

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


def _why_converted(days: list[IngestedDay]) -> list[str]:
    """``converted again: day_0, day_1 (the raw file's size changed)``, a line for each reason days that had a
    conversion were converted again (days converted for the first time are not named)."""
    named: dict[str, list[str]] = {}
    for day in days:
        if why := day.converted_because:
            named.setdefault(why, []).append(Path(day.parquet).stem)
    return [f"            converted again: {_listed(names)} ({why})" for why, names in named.items()]


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


def render(record: RunRecord) -> str:
    """One block of short lines (at most 100 characters each); '' when the run saved nothing summarised."""
    saved, lines = record.saved, []
    if report := saved.get("ingestion_report"):
        days = report.days
        lines.append(
            f"ingestion   {_count(len(days), 'day')} ({_made_or_reused(sum(d.reused for d in days), len(days))}), "
            f"{sum(d.rows for d in days):,} rows, {sum(d.rejected for d in days):,} rejected"
        )
        if record.split:
            lines.append(f"            {record.split}")
        lines += _why_converted(days)
    if metadata := saved.get("feature_metadata"):
        reused = f"reused version {metadata.counted_in}" if metadata.counted_in else "counted"
        if metadata.counted_because:
            reused = f"counted ({metadata.counted_because})"
        lines.append(
            f"metadata    {reused}: {metadata.rows:,} training rows, CTR {metadata.click_rate:.4f}, "
            f"{sum(metadata.table_sizes):,} embedding rows"
        )
    if summary := saved.get("training_summary"):
        lines += summary.lines(evaluated="evaluation_metrics" in saved)
    if metrics := saved.get("evaluation_metrics"):
        lines += metrics.lines()
    if report := saved.get("scoring_report"):
        lines += report.lines(record.paths.get("predictions"))
    if export := saved.get("export_report"):
        lines += export.lines(record.paths.get("dlrm_onnx"))
    if not lines:
        return ""
    # Within 100 columns whatever the values' lengths (1TB's counts, long day names, several days, a warning).
    return "\n".join([f"Run {record.version}:", *(f"  {part}" for line in lines for part in fitted(line))])

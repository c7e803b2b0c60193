"""Lines that were not converted: kept with their line numbers and reasons, and the share a day may have."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from criteo_dlrm.common.errors import DataError, Fix
from criteo_dlrm.common.storage import atomic_file

MAX_REPORTED = 5


class IngestionError(DataError):
    """Raw input that cannot be converted; the message names the file and what to do."""


@dataclass(frozen=True)
class Reject:
    """One input line that was not converted."""

    line: int
    reason: str
    text: str


def describe(rejects: list[Reject], rejects_path: Path) -> str:
    if not rejects:
        return ""
    first = "\n".join(f"  line {r.line}: {r.reason}" for r in rejects[:MAX_REPORTED])
    return f" First bad lines:\n{first}\nEvery rejected line is in {rejects_path}."


def check_rejects(
    source: Path, rows: int, rejects: list[Reject], rejects_path: Path, max_fraction: float, parameter: str
) -> None:
    """Raise ``IngestionError`` when ``source`` has no good row or more bad lines than ``max_fraction`` allows.

    ``parameter``: the setting that allows more (``ingestion.max_reject_fraction``, ``scoring.max_reject_fraction``).
    """
    total = rows + len(rejects)
    if rows == 0:
        raise IngestionError(f"{source}: no valid Criteo row in {total:,} lines." + describe(rejects, rejects_path))
    if len(rejects) > max_fraction * total:
        fix = Fix(params={parameter: float(f"{max(len(rejects) / total * 1.01, 0.001):.3g}")})
        raise IngestionError(
            f"{source}: {len(rejects):,} of {total:,} lines rejected ({len(rejects) / total:.3%}), more than "
            f"{parameter}={max_fraction}."
            + describe(rejects, rejects_path)
            + f"\nFix the file, or accept this share of bad lines: `{fix}`.",
            fix=fix,
        )


def write_rejects(path: Path, source: Path, rejects: list[Reject]) -> None:
    """``file, line, reason, text`` per rejected line, as TSV (written atomically)."""
    with atomic_file(path) as binary:
        handle = io.TextIOWrapper(binary, encoding="utf-8", newline="")
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(["file", "line", "reason", "text"])
        writer.writerows((str(source), r.line, r.reason, r.text) for r in rejects)
        handle.flush()
        handle.detach()  # the binary file stays open for atomic_file to finish

"""Ingestion nodes: thin adapters over ``criteo_dlrm.data.raw``."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from loguru import logger

from criteo_dlrm.data.lineage import day_lineage, made_from
from criteo_dlrm.data.raw import DayReport, convert_day, day_name, parquet_folder
from criteo_dlrm.data.synthetic import SIDECAR_SUFFIX


def _previous_report(source: Path, destination: Path) -> DayReport | None:
    """The report of an earlier conversion still valid for ``source``, or None."""
    if not destination.exists() or not made_from(destination, source):
        return None
    rejects = destination.with_name(destination.stem + ".rejects.tsv")
    rejected = sum(1 for _ in rejects.open()) - 1 if rejects.exists() else 0
    return DayReport(
        source=str(source),
        parquet=str(destination),
        rows=pq.ParquetFile(destination).metadata.num_rows,
        rejected=rejected,
        rejects_file=str(rejects) if rejects.exists() else None,
        input_bytes=source.stat().st_size,
        seconds=0.0,
    )


def convert_raw_days(raw_day_files: list[str], ingestion: dict) -> dict:
    """Convert every raw day file to Parquet in the raw folder's own folder under ``ingestion.output_dir``.

    A day whose Parquet was made from this very raw file (same path, size and modification time, as
    recorded in the Parquet's metadata) is skipped unless ``ingestion.force``.

    Returns:
        The ingestion report: one entry per day, in day order, with its Parquet path, row counts and
        lineage (the Parquet's fingerprint and the raw file it came from).
    """
    raw_dir = Path(raw_day_files[0]).parent
    output_dir = parquet_folder(ingestion["output_dir"], raw_dir)
    days = []
    for source in map(Path, raw_day_files):
        name = day_name(source)
        destination = output_dir / f"{name}.parquet"
        report = None if ingestion.get("force") else _previous_report(source, destination)
        if report is None:
            report = convert_day(
                source,
                destination,
                max_reject_fraction=float(ingestion["max_reject_fraction"]),
                block_size=int(ingestion["block_size_mb"] * (1 << 20)),
            )
        else:
            logger.info("{}: already converted to {} ({:,} rows); skipped", source.name, destination, report.rows)
        entry = {**report.as_dict(), **day_lineage(name, destination)}
        sidecar = source.with_name(name + SIDECAR_SUFFIX)
        entry["click_probability"] = str(sidecar) if sidecar.exists() else None
        days.append(entry)
    return {"raw_dir": str(raw_dir), "parquet_dir": str(output_dir), "days": days}

"""Ingestion nodes: thin adapters over ``criteo_dlrm.data.raw``."""

from __future__ import annotations

from pathlib import Path

from criteo_dlrm.data.lineage import day_lineage
from criteo_dlrm.data.raw import convert_days, day_name, parquet_folder
from criteo_dlrm.data.synthetic import SIDECAR_SUFFIX


def convert_raw_days(raw_day_files: list[str], ingestion: dict) -> dict:
    """Convert every raw day file to Parquet in the raw folder's own folder under ``ingestion.output_dir``.

    Days are converted in ``ingestion.workers`` processes (null: one per core, bounded by free memory).
    A day whose Parquet was made from this very raw file (same path, size and modification time, as
    recorded in the Parquet's metadata) is skipped unless ``ingestion.force``.

    Returns:
        The ingestion report: one entry per day, in day order, with its Parquet path, row counts and
        lineage (the Parquet's fingerprint and the raw file it came from).
    """
    raw_dir = Path(raw_day_files[0]).parent
    output_dir = parquet_folder(ingestion["output_dir"], raw_dir)
    sources = [Path(path) for path in raw_day_files]
    reports = convert_days(
        [(source, output_dir / f"{day_name(source)}.parquet") for source in sources],
        workers=ingestion.get("workers"),
        force=bool(ingestion.get("force")),
        max_reject_fraction=float(ingestion["max_reject_fraction"]),
        block_size=int(ingestion["block_size_mb"] * (1 << 20)),
        rows_per_day=ingestion.get("rows_per_day"),
    )
    days = []
    for report in reports:
        name = Path(report.parquet).stem
        entry = {**report.as_dict(), **day_lineage(name, report.parquet)}
        sidecar = Path(report.source).with_name(name + SIDECAR_SUFFIX)
        entry["click_probability"] = str(sidecar) if sidecar.exists() else None
        days.append(entry)
    return {"raw_dir": str(raw_dir), "parquet_dir": str(output_dir), "days": days}

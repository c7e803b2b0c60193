"""Ingestion nodes: thin adapters over ``criteo_dlrm.data.raw``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from criteo_dlrm.config import IngestionConfig
from criteo_dlrm.data.lineage import day_lineage
from criteo_dlrm.data.raw import convert_days, day_name, parquet_folder, scan_raw_folder
from criteo_dlrm.data.source_days import IngestedDay, IngestionReport
from criteo_dlrm.data.synthetic import SIDECAR_SUFFIX
from criteo_dlrm.spark.engines import preprocessing_engine


def convert_raw_days(ingestion: dict, preprocessing: dict) -> IngestionReport:
    """Convert every raw day file of ``ingestion.raw_dir`` to Parquet, in the raw folder's own folder under
    ``ingestion.output_dir``.

    Days are converted in ``ingestion.workers`` processes (null: one per core, bounded by free memory), or with
    ``preprocessing.engine: spark`` one Spark task per raw file.
    A day whose Parquet was made from this very raw file (same path, size and modification time, as
    recorded in the Parquet's metadata) and is intact is skipped unless ``ingestion.force``.

    Returns:
        The ingestion report: one entry per day, in day order, with its Parquet path, row counts and
        lineage (the Parquet's fingerprint and the raw file it came from), and the files of the raw folder
        that were not used, with the reason.
    """
    config = IngestionConfig.from_dict(ingestion, "ingestion.")
    engine = preprocessing_engine(preprocessing)
    raw = scan_raw_folder(config.raw_dir)
    output_dir = parquet_folder(config.output_dir, raw.folder)
    reports = convert_days(
        [(source, output_dir / f"{day_name(source)}.parquet") for source in raw.days],
        workers=config.workers,
        force=config.force,
        rows_per_day=config.rows_per_day,
        max_reject_fraction=config.max_reject_fraction,
        block_size=config.block_size,
        run=engine.run,
    )
    days = []
    for report in reports:
        name = Path(report.parquet).stem
        sidecar = Path(report.source).with_name(name + SIDECAR_SUFFIX)
        # The day as it is on disk now (the raw file it came from, as its Parquet records), and its conversion.
        lineage = replace(
            day_lineage(name, report.parquet), click_probability=str(sidecar) if sidecar.exists() else None
        )
        days.append(IngestedDay(**vars(lineage), rejected=report.rejected, rejects_file=report.rejects_file,
                                input_bytes=report.input_bytes, seconds=report.seconds, reused=report.reused,
                                converted_because=report.converted_because))  # fmt: skip
    return IngestionReport(raw_dir=str(raw.folder), parquet_dir=str(output_dir), days=days, not_used=raw.ignored)

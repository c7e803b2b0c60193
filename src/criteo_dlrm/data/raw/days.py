"""Converting many raw days: those already converted are reused when intact, the rest run in worker processes.

A day counts as converted only when its Parquet was made from the raw file as it is now (path, size,
modification time), in this project's current format, and every page still passes its checksum (one read of
the day, about 0.1 s per million rows); a damaged or outdated day is converted again.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
from loguru import logger

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.common.locks import exclusive
from criteo_dlrm.common.parallel import Runner, choose_workers, run_parallel, where_tasks_run
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import RawLayout
from criteo_dlrm.common.storage import identity_path
from criteo_dlrm.data import WORKER_MODULES
from criteo_dlrm.data.lineage import content_sample, not_made_from
from criteo_dlrm.data.parquet import open_day, sealed, verify_day, written_by_ingestion
from criteo_dlrm.data.raw.convert import (
    TRAINING_LAYOUT,
    DayReport,
    convert_day,
    rejects_path_of,
    split_day,
    split_manifest_path,
)
from criteo_dlrm.data.raw.files import day_name

# Peak memory of one conversion: a 4 MB block, one 262,144-row group in flight, the interpreter and pyarrow.
CONVERSION_MEMORY = 1 << 30
# Cores one conversion keeps busy by itself (reading, parsing and writing threads: 94% of 2 cores, measured by
# benchmarks/preprocessing.py): by default one worker per that many cores.
CONVERSION_CORES = 2


def _stale(parquet: Path, source: Path, layout: RawLayout | None = None) -> str | None:
    """Why ``parquet`` is not ``source``'s conversion as it is now, in the current format, undamaged (a few words,
    said in the run's summary); None when it is ("" when there is no ``parquet``)."""
    if not parquet.exists():
        return ""
    if why := not_made_from(parquet, source):
        return why
    try:
        day = open_day(parquet, labelled=False)
        if not written_by_ingestion(day):
            return "written in an older format"
        if not sealed(parquet):
            return "half-written (no fingerprint)"
        if layout and day.schema_arrow.names != layout.parquet_schema.names:
            return "in another layout"
        verify_day(parquet)
    except DataError as error:
        logger.warning("{}; converting it again", error)
        return "damaged"
    return None


def _count_rejects(rejects: Path) -> int:
    return sum(1 for _ in rejects.open()) - 1 if rejects.exists() else 0


def convert_or_reuse(
    source: Path,
    destination: Path,
    *,
    force: bool = False,
    layout: RawLayout = TRAINING_LAYOUT,
    **options,
) -> DayReport:
    """``convert_day``, unless ``destination`` is an intact conversion of ``source`` as it is now, in ``layout``.

    ``options`` go to ``convert_day`` (``max_reject_fraction``, ``block_size``, ``progress``, ``parameters``).
    """
    why = "ingestion.force" if force else _stale(destination, source, layout)
    if why is None:
        rejects = rejects_path_of(destination)
        report = DayReport(
            source=str(source),
            parquet=str(destination),
            rows=pq.ParquetFile(destination).metadata.num_rows,
            rejected=_count_rejects(rejects),
            rejects_file=str(rejects) if rejects.exists() else None,
            input_bytes=source.stat().st_size,
            seconds=0.0,
            reused=True,
        )
        logger.info("{}: already converted to {} ({:,} rows); skipped", source.name, destination, report.rows)
        return report
    return replace(convert_day(source, destination, layout=layout, **options), converted_because=why or None)


def split_or_reuse(
    source: Path,
    output_dir: Path,
    rows_per_day: int,
    *,
    force: bool = False,
    **options,
) -> list[DayReport]:
    """``split_day``, unless ``output_dir`` holds intact days split from ``source`` as it is now, ``rows_per_day`` each."""
    name = day_name(source)
    parts = sorted(output_dir.glob(f"{name}_[0-9][0-9][0-9][0-9].parquet"))
    rows = [pq.ParquetFile(part).metadata.num_rows for part in parts]
    if force:
        why = "ingestion.force"
    elif not parts:
        why = ""
    elif why := _split_differs(output_dir, name, source, rows_per_day, [part.name for part in parts]):
        pass
    elif not (all(count == rows_per_day for count in rows[:-1]) and 0 < rows[-1] <= rows_per_day):
        why = f"its days' rows are not {rows_per_day:,} each"
    else:
        why = next((stale for part in parts if (stale := _stale(part, source)) is not None), None)
    if why is None:
        logger.info("{}: already split into {} days in {}; skipped", source.name, len(parts), output_dir)
        rejects = output_dir / f"{name}.rejects.tsv"
        return [
            DayReport(str(source), str(part), count, _count_rejects(rejects) if index == 0 else 0,
                      str(rejects) if index == 0 and rejects.exists() else None, 0, 0.0, reused=True)
            for index, (part, count) in enumerate(zip(parts, rows, strict=True))
        ]  # fmt: skip
    return [
        replace(report, converted_because=why or None)
        for report in split_day(source, output_dir, rows_per_day, **options)
    ]


def _split_differs(output_dir: Path, name: str, source: Path, rows_per_day: int, parts: list[str]) -> str | None:
    """Why the split's manifest does not name exactly ``parts``, made from ``source`` as it is now with
    ``rows_per_day`` (None when it does): a part removed since (the last one too, whose absence row counts cannot
    show) is made again, never taken for a split into fewer days."""
    try:
        manifest = json.loads(split_manifest_path(output_dir, name).read_text())
        stat = source.stat()
    except (OSError, ValueError):
        return "its split's manifest cannot be read"
    if manifest.get("source") != identity_path(source):
        return f"split from {manifest.get('source')}"
    if manifest.get("rows_per_day") != rows_per_day:
        return f"split at ingestion.rows_per_day={manifest.get('rows_per_day')}"
    if (manifest.get("size"), manifest.get("mtime_ns")) != (stat.st_size, stat.st_mtime_ns):
        return "the raw file's size or modification time changed"
    if manifest.get("sample") != content_sample(source):  # rewritten with its size and time kept
        return "the raw file's content changed"
    if manifest.get("parts") != parts:
        missing = sorted(set(manifest.get("parts") or ()) - set(parts))
        logger.warning("{}: the split's days {} are missing; splitting {} again", output_dir, missing, source.name)
        return "some of its days are missing"
    return None


def convert_days(
    pairs: list[tuple[Path, Path]],
    *,
    workers: int | None = None,
    layouts: list[RawLayout] | None = None,
    force: bool = False,
    rows_per_day: int | None = None,
    run: Runner = run_parallel,
    **options,
) -> list[DayReport]:
    """``convert_or_reuse`` for each ``(source, destination)``, whole days in parallel worker processes (or, with
    ``run=criteo_dlrm.spark.tasks.run_on_spark``, one Spark task per raw file).

    Args:
        pairs: raw files and their Parquet destinations.
        workers: processes; None: one per ``CONVERSION_CORES`` cores, bounded by free memory
            (``CONVERSION_MEMORY`` each) and by the data (one per 2 million rows).
        layouts: one per pair (default: labelled, no line numbers).
        force: convert every day again.
        rows_per_day: split each file into days of that many rows (``split_day``).
        run: where the tasks run (``common.parallel.Runner``).
        options: for ``convert_day`` (``max_reject_fraction``, ``block_size``, ``parameters``); a progress bar
            per file is shown with one worker only.

    Returns:
        The reports in the order of ``pairs`` (a split file gives one per day it became); results are
        the same whatever the number of workers.

    Raises:
        IngestionError: the first day that fails, after the other workers stopped (no partial output).
    """
    # About 80 bytes of gzip (about 250 of plain text) per row: the size only decides the default worker count.
    rows_guess = sum(Path(source).stat().st_size // (80 if str(source).endswith(".gz") else 250) for source, _ in pairs)
    workers = choose_workers(workers, len(pairs), CONVERSION_MEMORY, rows_guess, CONVERSION_CORES)
    options = {**options, "progress": False} if workers > 1 or run is not run_parallel else options
    convert = partial(_convert_task, force=force, rows_per_day=rows_per_day, **options)
    tasks = [(*pair, layout) for pair, layout in zip(pairs, layouts or [TRAINING_LAYOUT] * len(pairs), strict=True)]
    reports: list[list[DayReport]] = [[] for _ in pairs]
    started = time.perf_counter()
    with contextlib.ExitStack() as locks:
        for folder in sorted({Path(destination).parent for _, destination in pairs}):
            locks.enter_context(exclusive(folder, "the Parquet days"))
        _convert_all(convert, tasks, workers, reports, started, len(pairs), run)
    return [report for converted in reports for report in converted]


def _convert_all(convert, tasks: list, workers: int, reports: list, started: float, files: int, run: Runner) -> None:
    with progress_bar(files, f"converting ({where_tasks_run(run, workers)})", "file") as bar:
        for index, converted in run(convert, tasks, workers, preload=WORKER_MODULES):
            reports[index] = converted
            rows = sum(r.rows for done in reports for r in done)
            bar.set_postfix(
                rows=f"{rows:,}", rows_per_s=f"{rows / (time.perf_counter() - started):,.0f}", refresh=False
            )
            bar.update(1)


def _convert_task(
    source: Path,
    destination: Path,
    layout: RawLayout,
    force: bool,
    rows_per_day: int | None,
    **options,
) -> list[DayReport]:
    if rows_per_day:
        return split_or_reuse(source, destination.parent, rows_per_day, force=force, **options)
    return [convert_or_reuse(source, destination, force=force, layout=layout, **options)]

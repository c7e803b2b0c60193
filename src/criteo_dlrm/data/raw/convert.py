"""Converting one raw day file into typed Parquet, streaming, or one big file into several days.

The file is read block by block (``reader``), parsed column-wise (``parsing``) and written as Parquet row
groups with page checksums; rows that fail go to a rejects file with their line numbers. Memory stays at a
block and one row group whatever the file's size. Output appears only when the whole file converted within
the tolerated share of bad lines: parts are staged under unique names and renamed into place at the end.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from loguru import logger

from criteo_dlrm.common.errors import Fix
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import RawLayout
from criteo_dlrm.common.storage import (
    create_exclusive,
    disk_full_error,
    identity_path,
    is_disk_full,
    staging_path,
    sync_folder,
    write_bytes_atomically,
)
from criteo_dlrm.data.lineage import content_sample, source_metadata
from criteo_dlrm.data.parquet import WRITE_OPTIONS, fingerprint_path, seal_day
from criteo_dlrm.data.raw.files import RAW_READ_ERRORS, day_name, open_raw
from criteo_dlrm.data.raw.parsing import parse_batch
from criteo_dlrm.data.raw.reader import LineTracker, csv_reader
from criteo_dlrm.data.raw.rejects import IngestionError, Reject, check_rejects, write_rejects
from criteo_dlrm.data.raw.threads import WriteBehind, read_ahead

ROW_GROUP_ROWS = 1 << 18
TRAINING_LAYOUT = RawLayout()  # labelled, no line numbers


@dataclass
class DayReport:
    """What converting one day file produced."""

    source: str
    parquet: str
    rows: int
    rejected: int
    rejects_file: str | None
    input_bytes: int
    seconds: float
    reused: bool = False  # an intact conversion of the same raw file was there: nothing converted
    # Converted although a conversion was there: why it was not reused (in a few words, said in the summary).
    converted_because: str | None = None


@dataclass(frozen=True)
class ConversionOptions:
    """How a raw file is converted.

    Attributes:
        max_reject_fraction: share of bad lines tolerated; above it the conversion fails.
        block_size: bytes of decompressed text parsed at a time (a line must fit in one block).
        progress: a progress bar (None: only on a terminal).
        parameters: the parameter block these come from (``ingestion`` or ``scoring``), named in messages.
    """

    max_reject_fraction: float = 0.0
    block_size: int = 4 << 20
    progress: bool | None = None
    parameters: str = "ingestion"


class _WriteFailed(Exception):
    """Writing the Parquet output failed (kept apart from failures to read the raw file)."""


class PartWriter:
    """A ParquetWriter for one day's rows, or (``rows_per_file``) for a new file every that many rows.

    File k is staged beside ``path_of(k)`` under a unique name (created exclusively, never through a link) and
    opened on its first row; ``publish`` renames every part into place, ``discard`` deletes them. Call it
    with the schema to use it as a context manager.
    """

    def __init__(
        self, path_of: Callable[[int], Path], rows_per_file: int | None = None, metadata: dict[str, str] | None = None
    ):
        self.path_of, self.rows_per_file = path_of, rows_per_file or float("inf")
        self.metadata = dict(metadata or {})  # added to every file's key-value metadata
        self.schema: pa.Schema | None = None
        self.parts: list[Path] = []  # destinations
        self.staged: list[Path] = []
        self.rows: list[int] = []
        self._writer: pq.ParquetWriter | None = None
        self._handle = None

    def __call__(self, schema: pa.Schema) -> PartWriter:
        self.schema = schema.with_metadata({**(schema.metadata or {}), **self.metadata}) if self.metadata else schema
        return self

    def write_table(self, table: pa.Table) -> None:
        try:
            while table.num_rows:
                if self._writer is None or self.rows[-1] == self.rows_per_file:
                    self._next()
                take = int(min(table.num_rows, self.rows_per_file - self.rows[-1]))
                self._writer.write_table(table.slice(0, take))
                self.rows[-1] += take
                table = table.slice(take)
        except Exception as error:
            raise _WriteFailed(str(error)) from error

    def _next(self) -> None:
        self._close()
        self.parts.append(self.path_of(len(self.parts)))
        self.staged.append(staging_path(self.parts[-1]))
        self.rows.append(0)
        self._handle = create_exclusive(self.staged[-1])
        self._writer = pq.ParquetWriter(self._handle, self.schema, **WRITE_OPTIONS)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._writer = self._handle = None

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._close()
        except Exception as error:
            raise _WriteFailed(str(error)) from error

    def publish(self) -> None:
        """Rename every staged part to its destination and record its fingerprint."""
        for staged, part in zip(self.staged, self.parts, strict=True):
            os.replace(staged, part)
            seal_day(part)
        for folder in {part.parent for part in self.parts}:
            sync_folder(folder)

    def discard(self) -> None:
        if self._handle is not None:
            self._handle.close()
        for staged in self.staged:
            staged.unlink(missing_ok=True)


def _stream_day(
    source: Path, parts: PartWriter, options: ConversionOptions, layout: RawLayout
) -> tuple[int, list[Reject]]:
    """Parse ``source`` block by block into ``parts``; returns (rows written, rejects)."""
    tracker = LineTracker()
    rejects: list[Reject] = []
    rows = rows_seen = pending_rows = 0
    pending: list[pa.RecordBatch] = []
    raw, stream = open_raw(source)
    bar = progress_bar(source.stat().st_size, source.name, "B", options.progress)
    try:
        with parts(layout.parquet_schema.with_metadata(source_metadata(source))) as parquet:
            writer = WriteBehind(parquet)
            try:
                for batch in read_ahead(csv_reader(stream, options.block_size, tracker, layout.raw_columns)):
                    typed, bad = parse_batch(batch)
                    bad_rows = np.array([row for row, _, _ in bad], dtype=np.int64)
                    if bad:
                        lines = tracker.lines(rows_seen, bad_rows)
                        rejects += [
                            Reject(int(line), why, text) for line, (_, why, text) in zip(lines, bad, strict=True)
                        ]
                    if layout.line_numbers:
                        kept = np.setdiff1d(np.arange(batch.num_rows), bad_rows, assume_unique=True)
                        lines = pa.array(tracker.lines(rows_seen, kept))
                        typed = pa.RecordBatch.from_arrays([*typed.columns, lines], schema=layout.parquet_schema)
                    rows_seen += batch.num_rows
                    rows += typed.num_rows
                    pending.append(typed)
                    pending_rows += typed.num_rows
                    if pending_rows >= ROW_GROUP_ROWS:
                        writer.write(pa.Table.from_batches(pending))
                        pending, pending_rows = [], 0
                    bar.update(raw.tell() - bar.n)
                    bar.set_postfix(rows=f"{rows:,}", refresh=False)
                if pending_rows:
                    writer.write(pa.Table.from_batches(pending))
            finally:
                writer.close()
    except _WriteFailed as error:
        cause = error.__cause__ or error
        if is_disk_full(cause):
            raise disk_full_error(parts.parts[-1].parent, f"the Parquet of {source.name}") from cause
        raise IngestionError(f"{source}: writing its Parquet {parts.parts[-1]} failed: {cause}") from cause
    except pa.ArrowInvalid as error:
        if "Empty CSV file" in str(error):
            raise IngestionError(f"{source}: no valid Criteo row: the file is empty.") from error
        if "straddl" in str(error):
            line = int(tracker.lines(rows_seen, np.zeros(1, dtype=np.int64))[0])
            mb = options.block_size / (1 << 20)
            fix = Fix(params={f"{options.parameters}.block_size_mb": max(64, math.ceil(4 * mb))})
            raise IngestionError(
                f"{source}: a line from line {line:,} on is longer than one block of text "
                f"({options.parameters}.block_size_mb={mb:g}). Criteo lines are a few hundred bytes: look at that "
                f"line, or read larger blocks: `{fix}`.",
                fix=fix,
            ) from error
        raise IngestionError(f"{source}: cannot be read as Criteo TSV: {error}") from error
    except RAW_READ_ERRORS as error:  # a truncated or corrupt .gz, a failing disk
        raise IngestionError(
            f"{source}: reading failed after {rows_seen:,} lines ({rows:,} rows converted, {raw.tell():,} of "
            f"{source.stat().st_size:,} bytes read): {error}. The file is damaged or incomplete (an interrupted "
            "download?): fetch it again. No Parquet was written for this day."
        ) from error
    finally:
        bar.close()
        stream.close()
    return rows, sorted(rejects + tracker.malformed, key=lambda reject: reject.line)


def rejects_path_of(destination: Path) -> Path:
    return destination.with_name(destination.name.removesuffix(".parquet") + ".rejects.tsv")


def convert_day(
    source: Path,
    destination: Path,
    *,
    layout: RawLayout = TRAINING_LAYOUT,
    **options,
) -> DayReport:
    """Convert one raw day file into one Parquet file, streaming.

    Memory stays bounded by ``block_size`` and one row group, whatever the file size. The Parquet file
    appears (atomically, with its fingerprint) only when the day converts within ``max_reject_fraction``.

    Args:
        source: ``day_<N>``, ``day_<N>.gz`` or a Kaggle ``train.txt``.
        destination: the Parquet file to write.
        layout: labelled (the default) or not, line numbers kept or not (see ``is_labelled``).
        options: ``ConversionOptions``' fields (``max_reject_fraction``, ``block_size``, ``progress``,
            ``parameters``).

    Raises:
        IngestionError: too many bad lines, or no row at all; the message names the file, the count
            and the first bad lines, and the rejects file holds every one of them.
        DiskFullError: no space left where the Parquet goes.
    """
    started = time.perf_counter()
    destination.parent.mkdir(parents=True, exist_ok=True)
    rejects_path = rejects_path_of(destination)
    parts = PartWriter(lambda _: destination)
    rows, rejects = _convert(source, parts, rejects_path, layout, ConversionOptions(**options))
    report = DayReport(
        source=str(source),
        parquet=str(destination),
        rows=rows,
        rejected=len(rejects),
        rejects_file=str(rejects_path) if rejects else None,
        input_bytes=source.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
    )
    logger.info(
        "{}: {:,} rows -> {} ({:,} rejected) in {:.1f}s ({:,.0f} rows/s)",
        source.name, rows, destination, len(rejects), report.seconds, rows / max(report.seconds, 1e-9),
    )  # fmt: skip
    return report


def _convert(
    source: Path, parts: PartWriter, rejects_path: Path, layout: RawLayout, options: ConversionOptions
) -> tuple[int, list[Reject]]:
    """Stream ``source`` into ``parts``, write its rejects, check their share and publish the parts; on any
    failure the staged parts are deleted, so no output is left behind. Returns (rows written, rejects)."""
    rejects_path.unlink(missing_ok=True)
    try:
        rows, rejects = _stream_day(source, parts, options, layout)
        if rejects:
            write_rejects(rejects_path, source, rejects)
        check_rejects(
            source,
            rows,
            rejects,
            rejects_path,
            options.max_reject_fraction,
            f"{options.parameters}.max_reject_fraction",
        )
        parts.publish()
    except BaseException:
        parts.discard()
        raise
    return rows, rejects


ROWS_PER_DAY_KEY = "criteo_dlrm.rows_per_day"  # in each split part's Parquet metadata: the split's setting


def split_manifest_path(output_dir: Path, name: str) -> Path:
    """``<name>.split.json``: the raw file a split came from, its setting and every part, written last."""
    return output_dir / f"{name}.split.json"


def split_day(source: Path, output_dir: Path, rows_per_day: int, **options) -> list[DayReport]:
    """Convert one big raw file (Kaggle's ``train.txt``) into Parquet days of ``rows_per_day`` rows each,
    ``<name>_0000.parquet``, ``<name>_0001.parquet``, ..., in one streaming pass, rows in file order.

    Rejected lines (with their line numbers in the big file) go to ``<name>.rejects.tsv``; the days appear
    only when the file converts within ``max_reject_fraction``. ``options`` as for ``convert_day``.
    """
    started = time.perf_counter()
    output_dir.mkdir(parents=True, exist_ok=True)
    name = day_name(source)
    rejects_path = output_dir / f"{name}.rejects.tsv"
    manifest = split_manifest_path(output_dir, name)
    manifest.unlink(missing_ok=True)  # written again once every part is in place
    writer = PartWriter(lambda k: output_dir / f"{name}_{k:04d}.parquet", rows_per_day,
                        metadata={ROWS_PER_DAY_KEY: str(rows_per_day)})  # fmt: skip
    rows, rejects = _convert(source, writer, rejects_path, TRAINING_LAYOUT, ConversionOptions(**options))
    for stale in set(output_dir.glob(f"{name}_[0-9][0-9][0-9][0-9].parquet")) - set(writer.parts):
        stale.unlink()  # days of an earlier split with another rows_per_day
        fingerprint_path(stale).unlink(missing_ok=True)
    stat = source.stat()
    write_bytes_atomically(manifest, json.dumps({
        "source": identity_path(source), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
        "sample": content_sample(source), "rows_per_day": rows_per_day, "rows": rows, "parts": [path.name for path in writer.parts],
    }).encode())  # fmt: skip
    seconds = round(time.perf_counter() - started, 3)
    reports = []
    for index, (part, part_rows) in enumerate(zip(writer.parts, writer.rows, strict=True)):
        first = index == 0  # the rejects of the whole file are reported once
        reports.append(
            DayReport(str(source), str(part), part_rows, len(rejects) if first else 0,
                      str(rejects_path) if rejects and first else None, source.stat().st_size if first else 0, seconds)
        )  # fmt: skip
    logger.info(
        "{}: {:,} rows -> {} days of up to {:,} rows in {}", source.name, rows, len(reports), rows_per_day, output_dir
    )
    return reports

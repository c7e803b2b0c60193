"""Which data an artifact was made from, and whether that data is still on disk unchanged.

A day's identity is its Parquet file's fingerprint (a hash of its size and footer: row groups, column
chunk sizes and statistics, and the raw file it was converted from) together with that raw file's
path, size and modification time. Reading the footer costs a few kilobytes whatever the day's size,
so checking every day of a pinned rerun is instant. Metadata, encoded inputs, checkpoints, summaries
and metrics carry these records; a pinned rerun compares them with the disk before any work.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pyarrow.parquet as pq

from criteo_dlrm.common.errors import WHOLE_JOB, DataError, Fix
from criteo_dlrm.common.storage import identity_path
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.source_days import RawSource, SourceDay

_FOOTER_TAIL = 8  # 4-byte little-endian footer length, then b"PAR1"
# Stored in a day's Parquet metadata: 2 = page checksums and a fingerprint sidecar (``data.parquet``). Days
# without it (made before, or by another tool) are converted again by ingestion.
FORMAT_KEY = "criteo_dlrm.parquet_format"
PARQUET_FORMAT = 2


class LineageError(DataError):
    """The data a pinned artifact was made from is gone or has changed."""


def parquet_fingerprint(path: str | Path) -> str:
    """sha256 (first 16 hex digits) of a Parquet file's size and footer."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size - _FOOTER_TAIL)
        footer_length, magic = struct.unpack("<I4s", handle.read(_FOOTER_TAIL))
        if magic != b"PAR1" or footer_length + _FOOTER_TAIL > size:
            raise DataError(f"{path}: not a Parquet file (damaged or truncated).")
        handle.seek(size - _FOOTER_TAIL - footer_length)
        footer = handle.read(footer_length)
    return hashlib.sha256(str(size).encode() + footer).hexdigest()[:16]


# A raw file's content sample: this many bytes at its start, middle and end.
SAMPLE_BLOCK = 1 << 16


def content_sample(path: str | Path) -> str:
    """sha256 (16 hex digits) of a raw file's size and three 64 KiB blocks, at its start, middle and end: a file
    rewritten with the same size and its modification time restored (``cp -p``, ``rsync -t``, ``touch -r``) is
    another file unless those blocks are equal too. Three reads, whatever the file's size (a 4M-row day of 1 GB:
    under 1% of its conversion)."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        for start in sorted({0, max(size // 2 - SAMPLE_BLOCK // 2, 0), max(size - SAMPLE_BLOCK, 0)}):
            handle.seek(start)
            digest.update(handle.read(SAMPLE_BLOCK))
    return digest.hexdigest()[:16]


def source_metadata(source: Path) -> dict[str, str]:
    """Parquet key-value metadata naming the raw file a day is converted from (path, size, mtime, content sample)."""
    stat = source.stat()
    return {
        FORMAT_KEY: str(PARQUET_FORMAT),
        "criteo_dlrm.source": identity_path(source),
        "criteo_dlrm.source_size": str(stat.st_size),
        "criteo_dlrm.source_mtime_ns": str(stat.st_mtime_ns),
        "criteo_dlrm.source_sample": content_sample(source),
    }


# RawSource's fields as a day's Parquet metadata names them (``source_metadata``; ``rows_per_day``: written by
# ``data.raw`` for one of the days a big file was split into), and how each is read.
_STORED_SOURCE = {"path": ("criteo_dlrm.source", str), "size": ("criteo_dlrm.source_size", int),
                  "mtime_ns": ("criteo_dlrm.source_mtime_ns", int), "sample": ("criteo_dlrm.source_sample", str),
                  "rows_per_day": ("criteo_dlrm.rows_per_day", int)}  # fmt: skip


def raw_source(parquet: str | Path) -> RawSource | None:
    """The raw file a Parquet day was converted from, as ingestion recorded it (None for other Parquet; no
    ``sample`` for days converted before it was kept: converted again)."""
    metadata = pq.read_schema(parquet).metadata or {}
    stored = {key.decode(): value.decode() for key, value in metadata.items() if key.startswith(b"criteo_dlrm.")}
    if "criteo_dlrm.source" not in stored:
        return None
    return RawSource(**{
        name: read(stored[key]) for name, (key, read) in _STORED_SOURCE.items() if key in stored
    })  # fmt: skip


def made_from(parquet: Path, source: Path) -> bool:
    """True when ``parquet`` was converted from ``source`` as it is now (same path, size, mtime and content sample;
    the path relative to the project when inside it: ``identity_path``)."""
    return not_made_from(parquet, source) is None


def not_made_from(parquet: Path, source: Path) -> str | None:
    """Why ``parquet`` is not a conversion of ``source`` as it is now, in a few words; None when it is."""
    try:
        recorded = raw_source(parquet)
    except (OSError, ValueError):
        return "its Parquet cannot be read"
    if recorded is None:
        return "its Parquet names no raw file"
    if recorded.path != identity_path(source):
        return f"converted from {recorded.path}"
    stat = source.stat()
    changed = [
        what
        for what, then, now in (("size", recorded.size, stat.st_size),
                                ("modification time", recorded.mtime_ns, stat.st_mtime_ns))
        if then != now
    ]  # fmt: skip
    if changed:
        return f"the raw file's {' and '.join(changed)} changed"
    if recorded.sample is None:
        return "converted before days recorded a sample of their raw file"
    if recorded.sample != content_sample(source):
        return "the raw file's content changed"
    return None


def day_lineage(day: str, parquet: str | Path) -> SourceDay:
    """One Parquet day as it is on disk now."""
    return SourceDay(
        day=day,
        parquet=str(parquet),
        rows=pq.ParquetFile(parquet).metadata.num_rows,
        fingerprint=parquet_fingerprint(parquet),
        source=raw_source(parquet),
    )


def encoded_lineage(
    metadata: FeatureMetadata,
    metadata_version: str | None,
    days: list[SourceDay],
    dense_transform: str = "standardised",
) -> dict:
    """What encoded model-input rows depend on: the vocabularies (and their version), each day's data and the dense
    features' transform (named only when it is not the standardised one, which rows encoded before it had)."""
    return {
        **({"dense_transform": dense_transform} if dense_transform != "standardised" else {}),
        "metadata_version": metadata_version,
        # The table layout (format 2: a row for missing values of its own): rows encoded in another are never reused.
        "metadata_format": metadata.format,
        "vocabulary_sha256": metadata.vocabulary_sha256,
        # row_range: the validation or test part of a day (None: all of it).
        "days": [{key: getattr(day, key) for key in ("day", "rows", "fingerprint", "row_range")} for day in days],
    }


def _raw_state(source: RawSource | None) -> str:
    """'' when the raw file is there as recorded, else what happened to it."""
    if source is None:
        return " Its raw file is unknown (the Parquet was not made by ingestion)."
    path = Path(source.path)
    if not path.exists():
        return f" Its raw file {path} is gone too."
    stat = path.stat()
    if (stat.st_size, stat.st_mtime_ns) != (source.size, source.mtime_ns):
        return f" Its raw file {path} has changed too (size {source.size:,} -> {stat.st_size:,} bytes)."
    if source.sample is not None and content_sample(path) != source.sample:
        return f" Its raw file {path} has changed too (the same size and modification time, other content)."
    return ""


def _only_time_changed(source: RawSource | None) -> bool:
    if source is None or not Path(source.path).exists():
        return False
    stat = Path(source.path).stat()
    return stat.st_size == source.size and stat.st_mtime_ns != source.mtime_ns


# Training on the data as it is now: the whole job, none of the user's pinned versions.
CURRENT_DATA = Fix(pipelines=WHOLE_JOB)


def _split_setting(day: SourceDay, days: list[SourceDay]) -> dict:
    """``{"ingestion.rows_per_day": R}`` when ``day`` is one of the days a big raw file was split into (recorded
    in its lineage, or, for lineage recorded before that, the largest of the recorded days of the same file),
    so that the restore command splits the file as it was split; else nothing."""
    if day.source is not None and day.source.rows_per_day:
        return {"ingestion.rows_per_day": day.source.rows_per_day}
    path = day.source.path if day.source else None
    siblings = [other.rows for other in days if (other.source.path if other.source else None) == path]
    return {"ingestion.rows_per_day": max(siblings)} if len(siblings) > 1 else {}


def check_days(days: list[SourceDay], artifact: str) -> None:
    """Raise ``LineageError`` unless every recorded day is on disk exactly as ``artifact`` recorded it.

    Args:
        days: lineage records (``day_lineage``); records without a fingerprint (artifacts made before
            lineage was recorded) are only checked for existence.
        artifact: what recorded them, for the message (e.g. ``dlrm_checkpoint version 2026-...``).
    """
    problems, fixes = [], []
    for day in days:
        parquet = Path(day.parquet)
        if not parquet.exists():
            change = f"{parquet} no longer exists"
        elif day.fingerprint is not None and parquet_fingerprint(parquet) != day.fingerprint:
            rows = pq.ParquetFile(parquet).metadata.num_rows
            change = f"{parquet} has changed since ({day.rows:,} rows then, {rows:,} now)"
        else:
            continue
        source = day.source
        raw = _raw_state(source)
        if raw and _only_time_changed(source):
            restore = Fix(pipelines="ingestion", params={"ingestion.raw_dir": Path(source.path).parent})
            seconds, nanoseconds = divmod(source.mtime_ns, 10**9)
            fix = (
                f" Its raw file {source.path} has the same size, but another modification time. If only its "
                f"time changed (touch, a copy), give it back (`touch -d @{seconds}.{nanoseconds:09d} "
                f"'{source.path}'`) and restore the day with `{restore}`; otherwise train on the current data "
                f"with `{CURRENT_DATA}`."
            )
            fixes += [restore, CURRENT_DATA]
        elif raw:
            fix = f"{raw} The data it recorded cannot be restored: train on the current data with `{CURRENT_DATA}`."
            fixes.append(CURRENT_DATA)
        else:
            folder = Path(source.path).parent
            restore = Fix(pipelines="ingestion", params={"ingestion.raw_dir": folder, **_split_setting(day, days)})
            fix = f" Restore it from its unchanged raw file with `{restore}`."
            fixes.append(restore)
        problems.append(f"{day.day}: {change}.{fix}")
    if problems:
        raise LineageError(
            f"{artifact} was made from data that is not on disk any more:\n  " + "\n  ".join(problems), fix=fixes
        )

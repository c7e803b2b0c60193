"""Which files of a raw folder are Criteo days, what each day is called, and where its Parquet goes.

Nothing in a raw folder is skipped without a word: every file that is not a day is listed with the reason,
and a file that looks like a day but cannot be read as one (a FIFO, a broken link, a name with spaces) stops
ingestion with what to do, instead of training on the other days as if it were not there.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from isal import igzip
from isal.igzip_lib import IsalError
from loguru import logger

from criteo_dlrm.common.errors import DataError, Fix
from criteo_dlrm.common.schema import NUM_RAW_FIELDS, check_parquet_schema
from criteo_dlrm.common.storage import identity_path
from criteo_dlrm.data.raw.rejects import IngestionError
from criteo_dlrm.data.synthetic import SIDECAR_SUFFIX  # true click probabilities beside a generated day

# day_<N>[.gz], or <name>.txt / <name>.tsv [.gz] where <name> is ASCII letters, digits, '_', '.', '-': a day's name
# is typed in --params and YAML, and names a Parquet file, on every filesystem and shell alike. Matched whole
# (fullmatch), so a name with a trailing newline is not a day.
_DAY_FILE = re.compile(r"(day_[0-9]+|[A-Za-z0-9_.-]+\.(txt|tsv))(\.gz)?")
_LOOKS_LIKE_A_DAY = re.compile(r"(^day)|(\.(txt|tsv|gz)\s*$)", re.IGNORECASE)
NAMING = "day_<N>, day_<N>.gz, <name>.txt[.gz] or <name>.tsv[.gz]"
ORDER = "day_<N> by N, then every other name alphabetically"


@dataclass
class RawFolder:
    """A raw folder's day files (in day order) and every other entry with the reason it is not used."""

    folder: Path
    days: list[Path]
    ignored: dict[str, str] = field(default_factory=dict)


# What this process already said of the entries a raw folder does not use.
_SAID: set[str] = set()


def day_name(path: Path) -> str:
    """``day_3.gz`` -> ``day_3``; ``train.txt`` -> ``train``."""
    name = path.name.removesuffix(".gz")
    return name.removesuffix(".txt").removesuffix(".tsv")


def day_sort_key(name: str) -> tuple[int, str]:
    """The order of days (``ORDER``): ``day_2`` before ``day_10``; other names after the numbered days,
    alphabetically (``train_0000`` before ``train_0001``). The last day in this order validates by default."""
    match = re.fullmatch(r"day_([0-9]+)", name)
    return (int(match.group(1)), name) if match else (1 << 30, name)


def _unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a day file (None: it can)."""
    try:
        mode = path.stat().st_mode  # follows links
    except OSError as error:  # a broken link, a link loop, no permission on the target
        return f"cannot be opened ({error.strerror or error})"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"is {kind}, not a regular file"
    if not os.access(path, os.R_OK):
        return "is not readable (permissions)"
    return None


def _why_ignored(path: Path) -> str | None:
    """Why an entry that is not a day name is not used, or None when it looks like a day (refused instead)."""
    name = path.name
    if name.endswith(SIDECAR_SUFFIX):
        return "true click probabilities of a generated day (read by evaluation, not converted)"
    if name.startswith("."):
        return "hidden file"
    if _LOOKS_LIKE_A_DAY.search(name):
        return None
    return f"not a day file name ({NAMING})"


def scan_raw_folder(raw_dir: str | os.PathLike, parameter: str = "ingestion.raw_dir", others: str = "") -> RawFolder:
    """The day files of ``raw_dir`` and what else is there.

    ``parameter`` names the setting that points here (in messages); ``others``: what else the caller
    accepts instead of day files (in the message when there is none), e.g. ``" or Parquet days (*.parquet)"``.

    Raises:
        IngestionError: the folder is missing or holds no day file, two files claim one day, or an entry
            looks like a day but cannot be read (listing every such entry and its fix at once).
    """
    folder = Path(raw_dir)
    if folder.exists() and not folder.is_dir():
        fix = Fix(params={parameter: folder.parent})
        raise IngestionError(
            f"{parameter}: {folder} is a file, not a folder. Point {parameter} at the folder that holds the day "
            f"files ({NAMING}){others}: `{fix}`",
            fix=fix,
        )
    if not folder.is_dir():
        fix = Fix(params={parameter: "/path/to/criteo"})
        raise IngestionError(
            f"{parameter}: the folder {folder} does not exist. Put Criteo day files ({NAMING}){others} there, or "
            f"point {parameter} at your folder: `{fix}`",
            fix=fix,
        )
    days, ignored, problems = [], {}, []
    for path in sorted(folder.iterdir()):
        if _DAY_FILE.fullmatch(path.name):
            why = _unreadable(path)
            if why is None:
                days.append(path)
            else:
                problems.append(f"{path.name}: {why}; remove it or replace it with the day's file")
        elif (reason := _why_ignored(path)) is not None:
            ignored[path.name] = reason
        else:
            problems.append(
                f"{path.name!r}: looks like a day file but its name is not one ({NAMING}; <name> is ASCII "
                "letters, digits, '_', '.' and '-'): rename it, or move it out of the folder"
            )
    if problems:
        raise IngestionError(f"Raw data folder {folder}:\n  " + "\n  ".join(problems))
    if not days:
        fix = Fix(params={parameter: "/path/to/criteo"})
        raise IngestionError(
            f"{parameter}: the folder {folder} holds no Criteo day file (expected {NAMING}){others}. Point "
            f"{parameter} at the folder that holds them: `{fix}`",
            fix=fix,
        )
    _refuse_two_files_for_one_day(folder, days)
    by_reason: dict[str, list[str]] = {}
    for name, reason in ignored.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        line = f"{folder}: not used ({reason}): {', '.join(names)}"
        if line not in _SAID:  # the check before the run and the node scan the same folder: said once
            _SAID.add(line)
            logger.info(line)
    days = sorted(days, key=lambda p: day_sort_key(day_name(p)))
    names = [day_name(path) for path in days]
    numbered = [name for name in names if day_sort_key(name)[0] < 1 << 30]
    if numbered and len(numbered) < len(names):
        logger.warning(
            "{} mixes day_<N> files with other names; days are ordered {} ({}), so {} comes last and validates "
            "unless metadata.validation_days names another day",
            folder, ORDER, ", ".join(names), names[-1],
        )  # fmt: skip
    return RawFolder(folder, days, ignored)


def _refuse_two_files_for_one_day(folder: Path, days: list[Path]) -> None:
    by_day: dict[str, list[str]] = {}
    for path in days:
        by_day.setdefault(day_name(path), []).append(path.name)
    duplicates = {day: sorted(names) for day, names in by_day.items() if len(names) > 1}
    if duplicates:
        listed = "; ".join(f"{' and '.join(names)} are both {day}" for day, names in sorted(duplicates.items()))
        raise IngestionError(
            f"Raw data folder {folder} holds two files for one day ({listed}): one would overwrite the other's "
            "Parquet and the other day would be trained on twice. Keep one file per day (move the other away)."
        )


def find_scoring_input(
    input_dir: str | os.PathLike, parameter: str = "scoring.input_dir"
) -> tuple[list[Path], list[Path]]:
    """``(raw day files, Parquet days)`` of a folder to score (one of the two is empty): checked before any work
    (``preflight``), so a missing folder or a Parquet file of another layout is refused before export runs.

    Raises:
        IngestionError: the folder is missing or holds neither, or a raw name is refused.
        DataError: a Parquet file that is not a Criteo day (its columns), naming it and the fix.
    """
    folder = Path(input_dir)
    parquet = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    try:
        days = scan_raw_folder(folder, parameter, " or Parquet days (*.parquet)").days
    except IngestionError:
        if not parquet:
            raise
    else:
        for path in days:
            with open_raw(path)[1] as stream:
                if not stream.read(1):
                    raise _empty(path, parameter)
        return days, []
    for path in parquet:
        try:
            check_parquet_schema(pq.read_schema(path), str(path), labelled=False)
            rows = pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowException, DataError) as error:
            raise DataError(
                f"{path} is not a Parquet day this project can score ({str(error).split('. ')[0].split(': ', 1)[-1]}). "
                f"{parameter} takes raw Criteo day files or Parquet days written by ingestion: point it at such a "
                "folder, or move the file out of it."
            ) from error
        if rows == 0:
            raise _empty(path, parameter)
    return [], parquet


def _empty(path: Path, parameter: str) -> IngestionError:
    return IngestionError(
        f"{path} holds no rows: there is nothing to score in it. Move it out of {parameter} (or point {parameter} "
        "at the days to score)."
    )


def find_day_files(raw_dir: str | os.PathLike) -> list[Path]:
    """The raw day files in ``raw_dir``, in day order (``scan_raw_folder``'s days)."""
    return scan_raw_folder(raw_dir).days


def parquet_folder(output_dir: str | os.PathLike, raw_dir: str | os.PathLike) -> Path:
    """Where the Parquet days of ``raw_dir`` go: ``<output_dir>/<raw folder name>-<hash of its path>`` (relative to
    the project when inside it: ``identity_path``; a copy of the project finds its days).

    Each raw folder gets its own Parquet folder, so converting another folder never replaces the days an
    earlier metadata version or checkpoint was made from, and converting the same folder again finds its days.
    """
    folder = Path(raw_dir).resolve()
    return Path(output_dir) / f"{folder.name}-{hashlib.sha256(identity_path(folder).encode()).hexdigest()[:8]}"


# What reading a damaged raw file raises: the system's errors (a failing disk, a .gz whose header is not gzip's), a
# .gz cut short (EOFError) and ISA-L's error on a damaged deflate block.
RAW_READ_ERRORS = (OSError, EOFError, IsalError)


def open_raw(path: Path) -> tuple:
    """``(file, text stream)``: the stream decompresses ``.gz`` files, with ISA-L's inflate (``isal``: 975 MB of
    a 4M-row day in 1.8 s, where zlib's, in pyarrow, took 4.8 s); closing the stream closes the file. A damaged
    ``.gz`` raises one of ``RAW_READ_ERRORS`` as it is read."""
    if path.name.endswith(".gz"):
        stream = igzip.open(path, "rb")
        return stream.fileobj, stream
    raw = pa.OSFile(str(path), "rb")
    return raw, raw


def is_labelled(source: Path) -> bool:
    """Whether a raw day file has labels: its first line has 40 fields (39: Criteo's unlabelled test files)."""
    with open_raw(source)[1] as stream:
        first = stream.read(1 << 16).split(b"\n", 1)[0]
    fields = first.rstrip(b"\r").count(b"\t") + 1
    if fields not in (NUM_RAW_FIELDS, NUM_RAW_FIELDS - 1):
        return True  # the line is bad either way; it is rejected with its field count
    return fields == NUM_RAW_FIELDS

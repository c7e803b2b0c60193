"""The lineage records of the days an artifact was made from (``data.lineage`` makes and checks them): each day's
Parquet file as it was (``SourceDay``), the raw file it was converted from (``RawSource``), and a run's days by
split (``SourceDays``). No pyarrow here: reports and summaries read them at every ``kedro`` command's start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from criteo_dlrm.common.records import Record


@dataclass(frozen=True, kw_only=True)
class RawSource(Record):
    """The raw file a Parquet day was converted from, as ingestion recorded it in the day's metadata: its path
    (relative to the project inside it), size, modification time and content sample (``lineage.content_sample``;
    None for days converted before it was kept); ``rows_per_day``: the split of a big file into days (None: one day)."""

    OMIT_NONE = True

    path: str
    size: int
    mtime_ns: int
    sample: str | None = None
    rows_per_day: int | None = None


@dataclass(frozen=True, kw_only=True)
class SourceDay(Record):
    """One day an artifact was made from (``lineage.day_lineage``): its name, Parquet file, rows and fingerprint
    (None: recorded before fingerprints, checked for existence only), the raw file it came from (None: Parquet not
    made by ingestion); ``row_range``: the part of the day used (``[start, stop)``; None: all of it);
    ``click_probability``: the generated day's true probabilities (the bundled sample's), None otherwise. Stored
    without its unset fields."""

    OMIT_NONE = True

    day: str
    parquet: str | None = None
    rows: int | None = None
    fingerprint: str | None = None
    source: RawSource | None = None
    row_range: list[int] | None = None
    click_probability: str | None = None
    others: dict[str, Any] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        """``day_2[10000:20000]``: the name, with the row range of a part of a day."""
        if self.row_range:
            return f"{self.day}[{self.row_range[0]}:{self.row_range[1]}]"
        return self.day


@dataclass(frozen=True, kw_only=True)
class SourceDays(Record):
    """A run's days by split: those it trained on, validated on and set aside for testing (none in metadata made
    before test splits, or with ``metadata.test_share`` 0)."""

    train: list[SourceDay] = field(default_factory=list)
    validation: list[SourceDay] = field(default_factory=list)
    test: list[SourceDay] = field(default_factory=list)
    others: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> list[SourceDay]:
        return getattr(self, name)


def days_tag(days: list[SourceDay] | None) -> str:
    """``day_0, day_2[10000:20000]``: day names, with the row range of a part of a day."""
    return ", ".join(day.tag for day in days or ())


@dataclass(frozen=True, kw_only=True)
class IngestedDay(SourceDay):
    """A day ingestion converted (or reused): its lineage, and what the conversion did: the lines rejected (and
    where they went), the raw bytes read, the seconds it took; ``reused``: an intact conversion of the same raw
    file was there and nothing was converted; ``converted_because``: why a conversion that was there was not."""

    rejected: int = 0
    rejects_file: str | None = None
    input_bytes: int | None = None
    seconds: float | None = None
    reused: bool = False
    converted_because: str | None = None


@dataclass(frozen=True, kw_only=True)
class IngestionReport(Record):
    """What ingestion made (``ingestion_report``): the raw folder, the folder of its Parquet days, each day in day
    order, and the raw folder's files that were not used, with the reason."""

    raw_dir: str
    parquet_dir: str
    days: list[IngestedDay] = field(default_factory=list)
    not_used: dict[str, str] = field(default_factory=dict)
    others: dict[str, Any] = field(default_factory=dict)

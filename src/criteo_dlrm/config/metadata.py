"""``parameters_metadata.yml``: which days train and validate, and how vocabularies are built."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.base import Checks, Config


@dataclass
class MetadataConfig(Config):
    validation_days: list[str] | None = None
    train_days: list[str] | None = None
    # Day names that test (what evaluation reports on): null splits each validation day instead, its last
    # test_share of rows testing (MLPerf's split of Criteo 1TB's day 23); test_share 0: no test rows.
    test_days: list[str] | None = None
    test_share: float = 0.5
    min_frequency: int = 3
    # Low click rates: a value also needs about this many clicks in expectation (count x training CTR), so the
    # threshold becomes ceil(min_expected_clicks / CTR) when that is larger (0: off).
    min_expected_clicks: float = 3.0
    max_vocabulary_size: int = 1_000_000
    vocabulary_size_overrides: dict[str, int] = field(default_factory=dict)
    use_modulus_hash: bool = False
    modulus_hash_size: int | None = None
    features_per_pass: int = 26
    workers: int | None = None  # processes counting feature groups; None: one per core (bounded by memory)

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        checks.at_least(1, "min_frequency", "max_vocabulary_size")
        checks.at_least(0, "min_expected_clicks")
        checks.at_least(1, "workers", optional=True)
        checks.at_least(3, "modulus_hash_size", optional=True)  # the out-of-vocabulary and missing rows, and one
        if self.modulus_hash_size is not None and not self.use_modulus_hash:
            checks.problems.append(
                f"{prefix}modulus_hash_size is {self.modulus_hash_size:,} but {prefix}use_modulus_hash is false, so "
                f"it would be ignored (tables follow the vocabularies): set {prefix}use_modulus_hash: true, or "
                f"leave {prefix}modulus_hash_size null"
            )
        checks.need(1 <= self.features_per_pass <= len(SPARSE_COLUMNS), "features_per_pass", "must be 1 to 26")
        for name, size in self.vocabulary_size_overrides.items():
            if name not in SPARSE_COLUMNS:
                checks.problems.append(
                    f"{prefix}vocabulary_size_overrides: unknown feature {name!r} (use SPARSE_0 .. SPARSE_25)"
                )
            elif size < 1:
                checks.problems.append(f"{prefix}vocabulary_size_overrides.{name} must be >= 1, got {size}")
        checks.need(0 <= self.test_share < 1, "test_share", "must be at least 0 and below 1")
        for name in ("validation_days", "train_days", "test_days"):
            days = getattr(self, name)
            checks.need(days is None or len(days) > 0, name, "must list at least one day (or be null)")
            checks.need(days is None or len(set(days)) == len(days), name, "lists a day twice")
        for first, second in (("train_days", "validation_days"), ("train_days", "test_days"),
                              ("validation_days", "test_days")):  # fmt: skip
            overlap = sorted(set(getattr(self, first) or ()) & set(getattr(self, second) or ()))
            if overlap:
                checks.problems.append(
                    f"{prefix}{first} and {prefix}{second} both list {overlap}: a day trains, validates or tests, "
                    "one of the three. Change one of them."
                )
        return checks.problems

    def effective_min_frequency(self, ctr: float) -> int:
        """The vocabulary threshold at a training click rate ``ctr``: ``min_frequency``, raised to
        ``ceil(min_expected_clicks / ctr)`` when that is larger. What an embedding learns about a value is bounded
        by the clicks it was seen with, about count x CTR: at a 3% click rate a value seen 10 times holds a third
        of a click, and its embedding is noise (measured: benchmarks, model quality, at 3% and 25% click rates:
        100 at 3%, 12 at 25%)."""
        if not self.min_expected_clicks or not 0 < ctr < 1:
            return self.min_frequency
        return max(self.min_frequency, math.ceil(self.min_expected_clicks / ctr - 1e-9))

    def cap(self, feature: str) -> int:
        return int(self.vocabulary_size_overrides.get(feature, self.max_vocabulary_size))

    def split(self, names: Sequence[str]) -> DaySplit:
        """Which of ``names`` (the days, in day order) train, validate and test: the settings where they are set,
        the defaults otherwise (the last day that does not test validates; every other day trains).

        Raises:
            ConfigError: a day would be in two of the three (whether named or chosen by default), or no day is
                left to train on (unless there is a single day: ``split_days`` names the fix for one file).
        """
        test = list(self.test_days or ())
        validation = list(self.validation_days or [n for n in names if n not in test][-1:])
        train = list(self.train_days or [n for n in names if n not in validation + test])
        problems = []
        roles = {"train": train, "validation": validation, "test": test}
        settings = {"train": "train_days", "validation": "validation_days", "test": "test_days"}
        for first, second in (("train", "validation"), ("train", "test"), ("validation", "test")):
            overlap = [day for day in roles[first] if day in roles[second]]
            if overlap:
                named = [
                    f"metadata.{settings[role]}" if getattr(self, settings[role]) else f"the default {role} day"
                    for role in (first, second)
                ]
                problems.append(f"{' and '.join(named)} both take {overlap}")
        if problems:
            raise ConfigError(
                f"metadata: {'; '.join(problems)} (the days in order: {', '.join(names)}). A day trains, validates or "
                "tests, one of the three: a model measured on rows it was trained on reports a wrong score. By "
                "default the last day validates and tests (its first half validates, its second half tests): take it "
                "out of metadata.train_days, or name the days that validate and test with metadata.validation_days "
                "and metadata.test_days."
            )
        if not train and len(names) > 1:
            raise ConfigError(
                f"metadata: no training day is left (days {list(names)}, validation {validation}, test {test}): leave "
                "at least one day out of metadata.validation_days and metadata.test_days."
            )
        return DaySplit(train, validation, test)


@dataclass(frozen=True)
class DaySplit:
    """Day names by role, each list in day order as given."""

    train: list[str]
    validation: list[str]
    test: list[str]

    def role(self, name: str) -> str | None:
        """``train``, ``validation``, ``test``, ``validation + test`` (a day split in two), or None (unused)."""
        roles = [role for role in ("train", "validation", "test") if name in getattr(self, role)]
        return " + ".join(roles) or None


def check_day_names(config: MetadataConfig, names: list[str], where: str = "the ingested days") -> None:
    """Raise ``ConfigError`` when ``validation_days``, ``train_days`` or ``test_days`` name a day not in ``names``."""
    problems = []
    for setting in ("validation_days", "train_days", "test_days"):
        unknown = [day for day in getattr(config, setting) or () if day not in names]
        if unknown:
            close = {day: difflib.get_close_matches(day, names, n=1) for day in unknown}
            hints = "".join(f" ({day}: did you mean {match[0]}?)" for day, match in close.items() if match)
            problems.append(f"metadata.{setting} names {unknown}, which are not among {where}{hints}")
    if problems:
        shown = ", ".join(names[:30]) + (f", ... ({len(names)} in all)" if len(names) > 30 else "")
        raise ConfigError("; ".join(problems) + f". The days are: {shown}.")

"""``parameters_metadata.yml``: which days train and validate, and how vocabularies are built."""

from __future__ import annotations

import difflib
import math
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

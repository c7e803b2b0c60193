"""``parameters_metadata.yml``: which days train and validate, and how vocabularies are built."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.base import Checks, Config


@dataclass
class MetadataConfig(Config):
    validation_days: list[str] | None = None
    train_days: list[str] | None = None
    min_frequency: int = 3
    # Small data: the threshold becomes small_data_rows / training rows when that is larger (0: off).
    small_data_rows: int = 400_000
    max_vocabulary_size: int = 1_000_000
    vocabulary_size_overrides: dict[str, int] = field(default_factory=dict)
    use_modulus_hash: bool = False
    modulus_hash_size: int | None = None
    features_per_pass: int = 26
    workers: int | None = None  # processes counting feature groups; None: one per core (bounded by memory)

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        checks.at_least(1, "min_frequency", "max_vocabulary_size")
        checks.at_least(0, "small_data_rows")
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
        for name in ("validation_days", "train_days"):
            days = getattr(self, name)
            checks.need(days is None or len(days) > 0, name, "must list at least one day (or be null)")
            checks.need(days is None or len(set(days)) == len(days), name, "lists a day twice")
        overlap = sorted(set(self.train_days or ()) & set(self.validation_days or ()))
        if overlap:
            checks.problems.append(
                f"{prefix}train_days and {prefix}validation_days both list {overlap}: a day either trains or "
                "validates. Change one of them."
            )
        return checks.problems

    def effective_min_frequency(self, training_rows: int) -> int:
        """The vocabulary threshold for ``training_rows`` rows: ``min_frequency``, raised on small data to
        ``small_data_rows / training_rows`` (rounded), since with few rows most values are rare and their
        embeddings mostly noise (measured: benchmarks, model quality)."""
        if not self.small_data_rows or training_rows <= 0:
            return self.min_frequency
        return max(self.min_frequency, round(self.small_data_rows / training_rows))

    def cap(self, feature: str) -> int:
        return int(self.vocabulary_size_overrides.get(feature, self.max_vocabulary_size))


def check_day_names(config: MetadataConfig, names: list[str], where: str = "the ingested days") -> None:
    """Raise ``ConfigError`` when ``validation_days`` or ``train_days`` name a day that is not in ``names``."""
    problems = []
    for setting in ("validation_days", "train_days"):
        unknown = [day for day in getattr(config, setting) or () if day not in names]
        if unknown:
            close = {day: difflib.get_close_matches(day, names, n=1) for day in unknown}
            hints = "".join(f" ({day}: did you mean {match[0]}?)" for day, match in close.items() if match)
            problems.append(f"metadata.{setting} names {unknown}, which are not among {where}{hints}")
    if problems:
        shown = ", ".join(names[:30]) + (f", ... ({len(names)} in all)" if len(names) > 30 else "")
        raise ConfigError("; ".join(problems) + f". The days are: {shown}.")

"""The ingested days split into training, validation and test days (``metadata.*_days``, ``metadata.test_share``),
each with its lineage record: what every later stage checks its rows against."""

from __future__ import annotations

from dataclasses import replace

from criteo_dlrm.common.errors import ConfigError, Fix
from criteo_dlrm.config.metadata import MetadataConfig, check_day_names
from criteo_dlrm.data.lineage import check_days, day_lineage
from criteo_dlrm.data.source_days import SourceDay, SourceDays


def split_days(days: list[SourceDay], config: MetadataConfig) -> SourceDays:
    """Split the ingested days (the ingestion report's) into training, validation and test days (default: the last
    day validates and tests, its first half validating, its second half testing), each as it is on disk now.

    Raises:
        ConfigError: an unknown day name, no day left to train on, or a day too small to split.
        LineageError: a day the ingestion report names is gone or has changed.
    """
    names = [day.day for day in days]
    check_day_names(config, names)
    split = config.split(names)
    train, validation, test = split.train, split.validation, split.test
    if not train:
        # One big file (Kaggle's train.txt has no day structure): split it into 7 days, as Kaggle's 7 days.
        rows_per_day = -(-(days[0].rows or 7) // 7)
        fix = Fix(params={"ingestion.rows_per_day": rows_per_day})
        raise ConfigError(
            f"metadata: the only ingested day, {names[0]}, would validate and none would train. Split the file "
            f"into days: `{fix}` (7 days of {rows_per_day:,} rows; the last one validates and tests).",
            fix=fix,
        )
    by_name = {day.day: day for day in days}
    check_days([by_name[name] for name in train + validation + test], "ingestion_report")
    records = {name: day_lineage(name, by_name[name].parquet) for name in train}
    for name in validation + test:
        records[name] = replace(day_lineage(name, by_name[name].parquet),
                                click_probability=by_name[name].click_probability)  # fmt: skip
    validating = [records[name] for name in validation]
    testing = [records[name] for name in test]
    if not test and config.test_share > 0:
        validating, testing = [], []
        for name in validation:
            rows = records[name].rows
            test_rows = int(rows * config.test_share)
            if test_rows < 1 or test_rows >= rows:
                fix = Fix(params={"metadata.test_share": 0})
                raise ConfigError(
                    f"metadata: the validation day {name} has {rows:,} rows, too few to keep "
                    f"{config.test_share:.0%} of them for testing (metadata.test_share). Name whole test days with "
                    f"metadata.test_days, or report on the validation rows: `{fix}`.",
                    fix=fix,
                )
            validating.append(replace(records[name], row_range=[0, rows - test_rows]))
            testing.append(replace(records[name], row_range=[rows - test_rows, rows]))
    return SourceDays(train=[records[name] for name in train], validation=validating, test=testing)

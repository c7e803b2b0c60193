"""The day split: the default last day halved into validation and test rows, named days, and the refusals."""

from __future__ import annotations

import pytest

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.lineage import parquet_fingerprint
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.data.splits import split_days
from tests.conftest import ingestion_report


@pytest.mark.parametrize(
    ("validation", "train", "message"),
    [
        (["day_9"], None, r"metadata.validation_days names \['day_9'\], which are not among the ingested days"),
        (["day_1"], ["day_0", "day_1"], r"train_days and metadata.validation_days both list \['day_1'\]"),
        (["day_0", "day_1", "day_2"], None, "no training day is left"),
    ],
)
def test_day_split_errors_say_what_to_change(validation, train, message, tmp_path):
    days = ingestion_report(tmp_path).days
    with pytest.raises(ValueError, match=message):
        split_days(days, MetadataConfig.from_dict({"validation_days": validation, "train_days": train}, "metadata."))


def test_by_default_the_last_day_validates_on_its_first_half_and_tests_on_its_second(tmp_path):
    days = ingestion_report(tmp_path, days=3).days
    split = split_days(days, MetadataConfig())
    train, validation, test = split.train, split.validation, split.test
    assert [d.day for d in train] == ["day_0", "day_1"] and all(d.row_range is None for d in train)
    rows = days[2].rows
    assert [(d.day, d.row_range) for d in validation] == [("day_2", [0, rows - rows // 2])]
    assert [(d.day, d.row_range) for d in test] == [("day_2", [rows - rows // 2, rows])]
    assert validation[0].fingerprint == test[0].fingerprint == parquet_fingerprint(days[2].parquet)


def test_test_days_test_whole_and_test_share_zero_turns_the_split_off(tmp_path):
    days = ingestion_report(tmp_path, days=4).days
    split = split_days(days, MetadataConfig(test_days=["day_3"]))
    assert [d.day for d in split.train] == ["day_0", "day_1"], "the last day that does not test validates"
    assert [d.day for d in split.validation] == ["day_2"] and [d.day for d in split.test] == ["day_3"]
    assert all(d.row_range is None for d in split.validation + split.test)
    split = split_days(days, MetadataConfig(test_share=0))
    assert [d.day for d in split.validation] == ["day_3"] and split.validation[0].row_range is None
    assert split.test == []


def test_a_day_too_small_to_split_is_refused_with_the_setting_that_turns_the_split_off(tmp_path):
    days = ingestion_report(tmp_path, days=2).days
    with pytest.raises(
        ValueError, match=r"day_1 has 2,000 rows, too few .* `kedro run --params=metadata.test_share=0`"
    ):
        split_days(days, MetadataConfig(test_share=0.0001))
    with pytest.raises(ValueError, match=r"validation_days and metadata.test_days both list \['day_1'\]"):
        MetadataConfig.from_dict({"validation_days": ["day_1"], "test_days": ["day_1"]}, "metadata.")


def test_single_file_is_refused_with_a_hint(tmp_path):
    with pytest.raises(ValueError, match=r"kedro run --params=ingestion.rows_per_day=1429` \(7 days of 1,429 rows"):
        split_days([SourceDay(day="train", rows=10_000)], MetadataConfig())


def test_every_split_whether_named_or_by_default_gives_each_day_one_role_at_most():
    from criteo_dlrm.common.errors import ConfigError

    names = ["day_0", "day_1", "day_2", "day_3"]
    cases = [
        {}, {"train_days": ["day_0"]}, {"validation_days": ["day_1"]}, {"test_days": ["day_3"]},
        {"train_days": ["day_3"]}, {"test_days": ["day_2"], "train_days": ["day_0", "day_3"]},
        {"validation_days": ["day_0"], "train_days": ["day_0", "day_1"]}, {"test_days": ["day_0", "day_1", "day_2"]},
        {"validation_days": ["day_3"], "test_days": ["day_2"], "train_days": ["day_2"]},
    ]  # fmt: skip
    for settings in cases:
        try:
            split = MetadataConfig(**settings).split(names)
        except ConfigError:
            continue
        roles = [*split.train, *split.validation, *split.test]
        assert len(roles) == len(set(roles)), (settings, split)
        assert split.train and split.validation, (settings, split)
    with pytest.raises(ConfigError, match=r"the default validation day both take \['day_3'\]"):
        MetadataConfig(train_days=["day_3"]).split(names)
    with pytest.raises(ConfigError, match=r"metadata.train_days and the default validation day both take \['day_3'\]"):
        MetadataConfig(test_days=["day_2"], train_days=["day_0", "day_3"]).split(names)

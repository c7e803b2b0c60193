import json

import numpy as np
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.lineage import parquet_fingerprint
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.datasets import FeatureVocabulariesDataset
from criteo_dlrm.pipelines.metadata import create_pipeline
from criteo_dlrm.pipelines.metadata.nodes import split_days

PARAMS = {
    "validation_days": None,
    "train_days": None,
    "min_frequency": 2,
    "min_expected_clicks": 0,
    "max_vocabulary_size": 1000,
    "vocabulary_size_overrides": {},
    "use_modulus_hash": False,
    "modulus_hash_size": None,
    "features_per_pass": 13,
}


def _report(tmp_path, days=3):
    model, entries = ClickModel(seed=1), []
    for day in range(days):
        write_day(tmp_path / f"day_{day}", 2000, day=day, model=model)
        report = convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet")
        entries.append({"day": f"day_{day}", **report.as_dict(), "click_probability": None})
    return {"raw_dir": str(tmp_path), "days": entries}


def test_pipeline_trains_on_all_but_the_last_day_and_round_trips_vocabularies(tmp_path):
    catalog = DataCatalog(
        {
            "ingestion_report": MemoryDataset(_report(tmp_path)),
            "params:metadata": MemoryDataset(PARAMS),
            "feature_metadata": MemoryDataset(),
            "feature_vocabularies": FeatureVocabulariesDataset(filepath=str(tmp_path / "vocab.npz")),
        }
    )
    SequentialRunner().run(create_pipeline(), catalog)
    metadata = catalog.load("feature_metadata")
    assert [d["day"] for d in metadata["source_days"]["train"]] == ["day_0", "day_1"]
    assert [d["day"] for d in metadata["source_days"]["validation"]] == ["day_2"]
    assert metadata["label"]["rows"] == 4000 and metadata["parameters"]["min_frequency"] == 2
    json.dumps(metadata)  # must be JSON-ready
    loaded = catalog.load("feature_vocabularies")
    assert set(loaded.arrays) == set(metadata["sparse"])
    assert all(len(loaded.arrays[n]) == metadata["sparse"][n]["vocabulary_size"] for n in loaded.arrays)
    assert loaded.arrays["SPARSE_0"].dtype == np.int64


@pytest.mark.parametrize(
    ("validation", "train", "message"),
    [
        (["day_9"], None, r"metadata.validation_days names \['day_9'\], which are not among the ingested days"),
        (["day_1"], ["day_0", "day_1"], r"train_days and metadata.validation_days both list \['day_1'\]"),
        (["day_0", "day_1", "day_2"], None, "no training day is left"),
    ],
)
def test_day_split_errors_say_what_to_change(validation, train, message, tmp_path):
    days = _report(tmp_path)["days"]
    with pytest.raises(ValueError, match=message):
        split_days(days, MetadataConfig.from_dict({"validation_days": validation, "train_days": train}, "metadata."))


def test_by_default_the_last_day_validates_on_its_first_half_and_tests_on_its_second(tmp_path):
    days = _report(tmp_path, days=3)["days"]
    train, validation, test = split_days(days, MetadataConfig())
    assert [d["day"] for d in train] == ["day_0", "day_1"] and all("row_range" not in d for d in train)
    rows = days[2]["rows"]
    assert [(d["day"], d["row_range"]) for d in validation] == [("day_2", [0, rows - rows // 2])]
    assert [(d["day"], d["row_range"]) for d in test] == [("day_2", [rows - rows // 2, rows])]
    assert validation[0]["fingerprint"] == test[0]["fingerprint"] == parquet_fingerprint(days[2]["parquet"])


def test_test_days_test_whole_and_test_share_zero_turns_the_split_off(tmp_path):
    days = _report(tmp_path, days=4)["days"]
    train, validation, test = split_days(days, MetadataConfig(test_days=["day_3"]))
    assert [d["day"] for d in train] == ["day_0", "day_1"], "the last day that does not test validates"
    assert [d["day"] for d in validation] == ["day_2"] and [d["day"] for d in test] == ["day_3"]
    assert all("row_range" not in d for d in validation + test)
    _, validation, test = split_days(days, MetadataConfig(test_share=0))
    assert [d["day"] for d in validation] == ["day_3"] and "row_range" not in validation[0] and test == []


def test_a_day_too_small_to_split_is_refused_with_the_setting_that_turns_the_split_off(tmp_path):
    days = _report(tmp_path, days=2)["days"]
    with pytest.raises(
        ValueError, match=r"day_1 has 2,000 rows, too few .* `kedro run --params=metadata.test_share=0`"
    ):
        split_days(days, MetadataConfig(test_share=0.0001))
    with pytest.raises(ValueError, match=r"validation_days and metadata.test_days both list \['day_1'\]"):
        MetadataConfig.from_dict({"validation_days": ["day_1"], "test_days": ["day_1"]}, "metadata.")


def test_single_file_is_refused_with_a_hint(tmp_path):
    with pytest.raises(ValueError, match=r"kedro run --params=ingestion.rows_per_day=1429` \(7 days of 1,429 rows"):
        split_days([{"day": "train", "rows": 10_000}], MetadataConfig())


@pytest.mark.slow
def test_kedro_session_runs_ingestion_and_metadata(project):
    bootstrap_project(project)
    with KedroSession.create(project_path=project) as session:
        session.run(pipeline_names=["ingestion", "metadata"])
    [metadata_file] = (project / "data/04_feature/feature_metadata.json").glob("*/feature_metadata.json")
    [vocab_file] = (project / "data/04_feature/feature_vocabularies.npz").glob("*/feature_vocabularies.npz")
    assert metadata_file.parent.name == vocab_file.parent.name, "saved as one version"
    metadata = json.loads(metadata_file.read_text())
    assert metadata["label"]["rows"] == 40_000 and metadata["source_days"]["validation"][0]["day"] == "day_2"

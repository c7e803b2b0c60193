import json
import logging

import numpy as np
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from criteo_dlrm.datasets import FeatureVocabulariesDataset, PreviousVersionDataset
from criteo_dlrm.pipelines.metadata import create_pipeline
from tests.conftest import ingestion_report

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


def _no_previous(tmp_path) -> dict:
    return {
        f"previous_{name}": PreviousVersionDataset({"type": kind, "filepath": str(tmp_path / "none" / name)})
        for name, kind in (("feature_metadata", "criteo_dlrm.datasets.JSONDataset"),
                           ("feature_vocabularies", "criteo_dlrm.datasets.FeatureVocabulariesDataset"))
    }  # fmt: skip


def test_pipeline_trains_on_all_but_the_last_day_and_round_trips_vocabularies(tmp_path):
    catalog = DataCatalog(
        {
            "ingestion_report": MemoryDataset(ingestion_report(tmp_path)),
            "params:metadata": MemoryDataset(PARAMS),
            "params:preprocessing": MemoryDataset({"engine": "local"}),
            "feature_metadata": MemoryDataset(),
            "feature_vocabularies": FeatureVocabulariesDataset(filepath=str(tmp_path / "vocab.npz")),
            **_no_previous(tmp_path),
        }
    )
    SequentialRunner().run(create_pipeline(), catalog)
    metadata = catalog.load("feature_metadata")
    assert [d.day for d in metadata.source_days.train] == ["day_0", "day_1"]
    assert [d.day for d in metadata.source_days.validation] == ["day_2"]
    assert metadata.rows == 4000 and metadata.parameters["min_frequency"] == 2
    json.dumps(metadata.to_dict())  # its stored form must be JSON-ready
    loaded = catalog.load("feature_vocabularies")
    assert set(loaded.arrays) == set(metadata.sparse)
    assert all(len(loaded.arrays[n]) == metadata.sparse[n]["vocabulary_size"] for n in loaded.arrays)
    assert loaded.arrays["SPARSE_0"].dtype == np.int64


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


@pytest.mark.slow
def test_a_rerun_with_the_same_days_and_parameters_reuses_the_metadata_and_says_so(project, caplog):
    """A rerun of the same command counted the metadata again into a new version, so the rows encoded from it
    and the run trained on it were made again from zero (issue 45, item 1)."""
    bootstrap_project(project)
    folder = project / "data/04_feature/feature_metadata.json"
    for params in ({}, {}, {"metadata": {"min_frequency": 5}}):
        with KedroSession.create(project_path=project, runtime_params=params) as session:
            caplog.set_level(logging.INFO)  # after Kedro configured logging for the session
            session.run(pipeline_names=["ingestion", "metadata"])
    first, second, third = (
        json.loads((path / "feature_metadata.json").read_text()) for path in sorted(folder.iterdir())
    )
    versions = sorted(path.name for path in folder.iterdir())
    assert "counted_in" not in first and second["counted_in"] == versions[0]
    assert {k: v for k, v in second.items() if k not in ("counted_in", "content_sha256")} == {
        k: v for k, v in first.items() if k != "content_sha256"
    }, "the same content"
    assert "counted_in" not in third and third["parameters"]["min_frequency"] == 5
    assert "counted_because" not in first and "counted_because" not in second, "nothing to compare, then reused"
    assert third["counted_because"] == f"version {versions[1]} was counted with other metadata.min_frequency"
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert f"feature metadata: reused version {versions[0]} (counted in {versions[0]} from the same days" in text
    assert f"counting afresh (version {versions[1]} was counted with other metadata.min_frequency)" in text
    vocabularies = [
        np.load(path / "feature_vocabularies.npz")
        for path in sorted((project / "data/04_feature/feature_vocabularies.npz").iterdir())
    ]
    assert all(np.array_equal(vocabularies[0][name], vocabularies[1][name]) for name in vocabularies[0].files)

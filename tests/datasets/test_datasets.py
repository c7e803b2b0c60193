from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from kedro.io.core import Version

from criteo_dlrm.common.locks import LockedError, exclusive
from criteo_dlrm.data.encoding import EncodedDays, FeatureEncoder
from criteo_dlrm.data.feature_metadata import FeatureVocabularies
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.datasets import EncodedArraysDataset, FeatureVocabulariesDataset, JSONDataset, TorchCheckpointDataset
from tests.conftest import stored_checkpoint
from tests.faults import encoded_rows, fails_with, refused


def _versioned(cls, path, load=None, save=None):
    return cls(filepath=str(path), version=Version(load, save))


def test_checkpoint_round_trip_restores_optimizer_state(tmp_path):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint = stored_checkpoint(
        model_state=model.state_dict(), optimizer_state=optimizer.state_dict(), step=7, config={"a": [1, 2]}
    )
    _versioned(TorchCheckpointDataset, tmp_path / "ckpt.pt", save="2026-01-01T00.00.00.000Z").save(checkpoint)
    loaded = _versioned(TorchCheckpointDataset, tmp_path / "ckpt.pt").load()
    assert (
        loaded.version == "2026-01-01T00.00.00.000Z" and loaded.step == 7 and loaded.others["config"] == {"a": [1, 2]}
    )
    fresh = torch.optim.Adam(torch.nn.Linear(3, 1).parameters())
    fresh.load_state_dict(loaded.optimizer_state)
    torch.testing.assert_close(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_checkpoints_load_with_weights_only(tmp_path):
    # Any object outside tensors and plain containers is refused at load: no code runs from the file.
    _versioned(TorchCheckpointDataset, tmp_path / "c.pt", save="2026-01-01T00.00.00.000Z").save(
        stored_checkpoint(object=ValueError("x"))
    )
    with pytest.raises(Exception, match="[Ww]eights only"):
        _versioned(TorchCheckpointDataset, tmp_path / "c.pt").load()


def test_a_failed_write_leaves_the_previous_version_intact(tmp_path):
    _versioned(TorchCheckpointDataset, tmp_path / "c.pt", save="2026-01-01T00.00.00.000Z").save(
        stored_checkpoint(step=1)
    )

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(Exception, match="disk full"):
        _versioned(TorchCheckpointDataset, tmp_path / "c.pt", save="2026-01-02T00.00.00.000Z").save(
            stored_checkpoint(step=Unpicklable())
        )
    assert _versioned(TorchCheckpointDataset, tmp_path / "c.pt").load().step == 1
    assert not list(tmp_path.rglob("*.partial"))


def test_vocabularies_round_trip_with_their_version(tmp_path):
    arrays = {"SPARSE_0": np.array([5, 3, 9], dtype=np.int64), "SPARSE_1": np.zeros(0, dtype=np.int64)}
    _versioned(FeatureVocabulariesDataset, tmp_path / "v.npz", save="2026-01-01T00.00.00.000Z").save(
        FeatureVocabularies(arrays)
    )
    _versioned(FeatureVocabulariesDataset, tmp_path / "v.npz", save="2026-02-01T00.00.00.000Z").save(
        {"SPARSE_0": np.array([1])}
    )
    pinned = _versioned(FeatureVocabulariesDataset, tmp_path / "v.npz", load="2026-01-01T00.00.00.000Z").load()
    assert pinned.version == "2026-01-01T00.00.00.000Z" and pinned.arrays["SPARSE_0"].tolist() == [5, 3, 9]
    latest = _versioned(FeatureVocabulariesDataset, tmp_path / "v.npz").load()
    assert latest.version == "2026-02-01T00.00.00.000Z" and latest.arrays["SPARSE_0"].tolist() == [1]


def test_encoded_arrays_load_memory_mapped(tmp_path):
    arrays = EncodedArrays(
        np.array([0, 1], np.float32), np.ones((2, 13), np.float32), np.arange(52, dtype=np.int32).reshape(2, 26)
    )
    dataset = EncodedArraysDataset(path=str(tmp_path / "features"))
    assert not dataset.exists()
    dataset.save(arrays)
    loaded = dataset.load()
    assert isinstance(loaded.sparse, np.memmap)
    np.testing.assert_array_equal(loaded.sparse, arrays.sparse)


def test_encoded_days_are_encoded_straight_into_the_dataset(tiny_features, tmp_path):

    encoder = FeatureEncoder.from_metadata(tiny_features["metadata"], tiny_features["vocabularies"].arrays)
    days = EncodedDays(encoder, [d.parquet for d in tiny_features["metadata"].source_days.train])
    assert len(days) == 3000
    dataset = EncodedArraysDataset(path=str(tmp_path / "features"))
    dataset.save(days)
    loaded = dataset.load()
    np.testing.assert_array_equal(loaded.sparse, tiny_features["train"].sparse)
    np.testing.assert_array_equal(loaded.labels, tiny_features["train"].labels)
    assert not (tmp_path / "features.partial").exists()


def _stored_training_days(tiny_features, folder):
    """(encoder, Parquet days, lineage, dataset) of the sample's training days, encoded into ``folder``."""
    encoder = FeatureEncoder.from_metadata(tiny_features["metadata"], tiny_features["vocabularies"].arrays)
    paths = [d.parquet for d in tiny_features["metadata"].source_days.train]
    lineage = tiny_features["train"].lineage
    dataset = EncodedArraysDataset(path=str(folder))
    dataset.save(EncodedDays(encoder, paths, lineage))
    return encoder, paths, lineage, dataset


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", ""])
def test_a_damaged_lineage_of_the_encoded_rows_is_named_and_the_next_save_encodes_them_again(
    tiny_features, tmp_path, damage
):
    """A damaged lineage.json ended in a 267-line traceback, and the same command failed again: loading names it with
    the command that encodes again; saving (that command's encoding) encodes the rows again."""
    encoder, paths, lineage, dataset = _stored_training_days(tiny_features, tmp_path / "features")
    (tmp_path / "features" / "lineage.json").write_text(damage)
    message = refused(dataset.load, tmp_path / "features" / "lineage.json")
    assert "Encode the rows again: `kedro run --pipelines=training`" in message
    dataset.save(EncodedDays(encoder, paths, lineage))
    assert dataset.load().lineage == lineage, "encoded again, its lineage written again"


def test_encoded_days_are_reused_only_when_their_lineage_matches(tiny_features, tmp_path, monkeypatch):
    encoder, paths, lineage, dataset = _stored_training_days(tiny_features, tmp_path / "features")
    assert dataset.load().lineage == lineage
    written = (tmp_path / "features" / "sparse.npy").stat().st_mtime_ns

    encodings = []
    monkeypatch.setattr(
        EncodedDays,
        "write",
        lambda self, folder: encodings.append(folder) or self.encoder.encode_days(self.paths, into=folder),
    )
    dataset.save(EncodedDays(encoder, paths, lineage))
    assert encodings == [] and (tmp_path / "features" / "sparse.npy").stat().st_mtime_ns == written, "reused"

    newer = {**lineage, "metadata_version": "2026-02-02T00.00.00.000Z"}
    dataset.save(EncodedDays(encoder, paths, newer))
    assert len(encodings) == 1 and dataset.load().lineage == newer, "other vocabularies: encoded again"
    other_days = {**newer, "days": [{**newer["days"][0], "fingerprint": "0" * 16}]}
    dataset.save(EncodedDays(encoder, paths, other_days))
    assert len(encodings) == 2, "other Parquet days: encoded again"


def test_previews_carry_kedro_viz_s_type_names_without_kedro_datasets_private_module():
    import inspect

    from criteo_dlrm.datasets import JSONDataset
    from criteo_dlrm.datasets.figure_dataset import FigureDataset
    from tests.conftest import PROJECT_ROOT

    names = {str(inspect.signature(cls.preview).return_annotation) for cls in (JSONDataset, FigureDataset)}
    assert names == {"JSONPreview", "ImagePreview"}, "the names kedro-viz renders by"
    assert not [p for p in (PROJECT_ROOT / "src").rglob("*.py") if "from kedro_datasets._" in p.read_text()]


def test_vocabularies_holding_a_pickled_object_are_refused_naming_the_file_even_with_a_recomputed_digest(tmp_path):
    """Issue 46 item 7: a code-running feature_vocabularies.npz with its sidecar recomputed ended in a raw
    DatasetError."""
    import hashlib
    import os

    import numpy as np
    from kedro.io.core import Version

    from criteo_dlrm.common.storage import DamagedFileError
    from criteo_dlrm.datasets import FeatureVocabulariesDataset

    class RunsCode:
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "ran"),)

    path = tmp_path / "feature_vocabularies.npz"
    FeatureVocabulariesDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save(
        {"SPARSE_0": np.arange(3)}
    )
    file = path / "2026-01-01T00.00.00.000Z" / "feature_vocabularies.npz"
    with file.open("wb") as handle:
        np.savez(handle, SPARSE_0=np.array([RunsCode()], dtype=object), allow_pickle=True)
    (file.parent / (file.name + ".sha256")).write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    from criteo_dlrm.cli import user_error

    with pytest.raises(Exception) as caught:  # Kedro wraps it; `kedro run` says the project's message
        FeatureVocabulariesDataset(str(path), version=Version("2026-01-01T00.00.00.000Z", None)).load()
    found = user_error(caught.value)
    assert isinstance(found, DamagedFileError) and f"{file} is not vocabularies this project wrote" in str(found)
    assert not (tmp_path / "ran").exists()


def test_metadata_edited_with_its_file_digest_written_again_is_refused(tmp_path):
    """Issue 46 item 4: feature_metadata.json with one statistic changed and its .sha256 recomputed trained a
    different model without a word (checkpoints carry a content digest inside; metadata did not)."""
    import hashlib
    import json

    from criteo_dlrm.cli import user_error
    from criteo_dlrm.common.storage import DamagedFileError
    from criteo_dlrm.datasets import JSONDataset

    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z"), content_digest=True).save(
        {"label": {"ctr": 0.25}}
    )
    file = path / "2026-01-01T00.00.00.000Z" / "feature_metadata.json"
    stored = json.loads(file.read_text())
    assert JSONDataset(str(path), version=Version("2026-01-01T00.00.00.000Z", None), content_digest=True).load() == {
        "label": {"ctr": 0.25}
    }
    stored["label"]["ctr"] = 0.5
    file.write_text(json.dumps(stored, indent=1) + "\n")
    (file.parent / (file.name + ".sha256")).write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    with pytest.raises(Exception) as caught:
        JSONDataset(str(path), version=Version("2026-01-01T00.00.00.000Z", None), content_digest=True).load()
    found = user_error(caught.value)
    assert isinstance(found, DamagedFileError) and f"{file} is damaged: its content is not what was written" in str(
        found
    )


def test_concurrent_saves_of_one_dataset_folder_never_mix(converted_day, tmp_path):
    dataset, days = encoded_rows(converted_day, tmp_path)
    other, _ = encoded_rows(converted_day, tmp_path)
    with exclusive(tmp_path / "train_features", "the encoded rows train_features"):
        fails_with(LockedError, lambda: other.save(days), f"being written by process {os.getpid()}")
    dataset.save(days)
    assert len(dataset.load()) == 3000


def test_json_reports_are_refused_when_damaged(tmp_path):
    path = tmp_path / "evaluation_metrics.json"
    JSONDataset(str(path), version=Version(None, None)).save({"auc": 0.7})
    [file] = path.glob("*/evaluation_metrics.json")
    file.write_text(json.dumps({"auc": 0.9}))
    assert "is damaged" in refused(JSONDataset(str(path), version=Version(None, None)).load, file)


def test_feature_metadata_without_its_digest_is_refused(tmp_path):
    path = tmp_path / "feature_metadata.json"
    JSONDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save({"label": {"ctr": 0.25}})
    [file] = path.glob("*/feature_metadata.json")
    file.write_text(json.dumps({"label": {"ctr": 0.03}}))
    Path(f"{file}.sha256").unlink()
    assert "has no digest" in refused(JSONDataset(str(path), version=Version(None, None)).load, file)


def test_a_json_dataset_of_a_record_gives_the_record_and_stores_its_stored_form(tmp_path):
    """Issue 60 item 4: nodes turned what the catalog held into records (``from_dict``) and back (``to_dict``);
    a dataset with ``record`` does it, so a node gets and gives the record."""
    from criteo_dlrm.datasets import JSONDataset
    from criteo_dlrm.engine.trained.reports import ScoringReport

    path, version = tmp_path / "scoring_report.json", "2026-01-01T00.00.00.000Z"
    record = ScoringReport(rows=3, checkpoint_version="c1", source_days=[SourceDay(day="day_0", parquet="d.parquet")])
    dataset = JSONDataset(
        str(path), version=Version(None, version), record="criteo_dlrm.engine.trained.reports.ScoringReport"
    )
    dataset.save(record)
    stored = json.loads((path / version / "scoring_report.json").read_text())
    assert stored == record.to_dict() and stored["source_days"] == [{"day": "day_0", "parquet": "d.parquet"}]
    loaded = JSONDataset(
        str(path), version=Version(version, None), record="criteo_dlrm.engine.trained.reports.ScoringReport"
    ).load()
    assert loaded == record and isinstance(loaded.source_days[0], SourceDay)
    assert JSONDataset(str(path), version=Version(version, None)).load() == stored, "without a record: the JSON"

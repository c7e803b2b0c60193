"""Checkpoints: the content digest, and checkpoints of the earlier format still evaluate, score and export."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from kedro.io.core import Version

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.source_days import SourceDays
from criteo_dlrm.datasets import TorchCheckpointDataset
from criteo_dlrm.engine.trained.checkpoint import load_checkpoint, model_from_checkpoint, save_atomically
from criteo_dlrm.engine.trained.export import serving_encoder
from criteo_dlrm.engine.trained.scoring import probabilities
from criteo_dlrm.models import DLRM, DLRMConfig
from criteo_dlrm.models.torchrec_embeddings import grouped_tables, split_tables
from tests.conftest import stored_checkpoint, tiny_model_config, with_altered_vocabulary
from tests.faults import refused


def test_the_in_progress_checkpoint_carries_a_digest_of_what_was_written(tmp_path):
    path = tmp_path / "progress.pt"
    weights = torch.arange(100.0)
    save_atomically({"weights": weights, "step": 7}, path)
    assert load_checkpoint(path)["step"] == 7
    data = path.read_bytes()
    stored = weights.numpy().tobytes()
    assert data.count(stored) == 1
    edited = weights.clone()
    edited[3] = 0.5  # a byte-level edit of a tensor: a file torch still loads, not what was written
    path.write_bytes(data.replace(stored, edited.numpy().tobytes()))
    assert torch.load(path, weights_only=True)["weights"][3] == 0.5
    with pytest.raises(DamagedFileError, match=f"{path} is damaged"):
        load_checkpoint(path)
    state = torch.load(path, weights_only=True)
    torch.save(state, path)  # rewritten by other means: no digest at all
    with pytest.raises(DamagedFileError, match=f"{path} has no content digest"):
        load_checkpoint(path)


class _HostCopies(torch.overrides.TorchFunctionMode):
    """Counts the calls that copy a tensor to the host or read its bytes there (on a GPU, each a copy)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("cpu", "numpy", "to", "contiguous", "tolist"):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_a_checkpoint_is_written_in_one_pass_its_digest_the_zip_s_comment(tmp_path):
    import hashlib
    import zipfile

    path = tmp_path / "progress.pt"
    state = {"tables": [torch.randn(50, 4), torch.randn(30, 4)], "step": 3, "dense": {"w": torch.ones(4, 2)}}
    with _HostCopies() as copies:
        save_atomically(state, path)
    # Only torch.save's own write reads the tensors: nothing copies them first (each a second copy off a GPU).
    assert copies.calls == []
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:  # Python's own zip reader finds the digest as the archive's comment
        assert archive.comment == hashlib.sha256(data[:-66]).hexdigest().encode()
        assert archive.testzip() is None
    loaded = load_checkpoint(path, mmap=True)
    assert loaded["step"] == 3 and torch.equal(loaded["tables"][1], state["tables"][1])
    path.write_bytes(data[:-1] + (b"0" if data[-1:] != b"0" else b"1"))  # the digest itself damaged
    with pytest.raises(DamagedFileError, match=f"{path} is damaged"):
        load_checkpoint(path)


def test_an_in_progress_checkpoint_of_format_4_with_the_content_digest_inside_still_resumes(tmp_path):
    from criteo_dlrm.engine.trained.checkpoint import DIGEST_KEY, state_digest

    path = tmp_path / "progress.pt"
    state = {"weights": torch.arange(10.0), "step": 4}
    torch.save({**state, DIGEST_KEY: state_digest(state)}, path)  # as the project wrote it before format 5
    loaded = load_checkpoint(path)
    assert loaded["step"] == 4 and DIGEST_KEY not in loaded
    torch.save({**state, "step": 5, DIGEST_KEY: state_digest(state)}, path)
    with pytest.raises(DamagedFileError, match=f"{path} is damaged"):
        load_checkpoint(path)


def test_the_untrained_model_predicts_the_training_click_rate():
    torch.manual_seed(0)
    config = tiny_model_config([50] * 26, initial_ctr=0.03)
    model = DLRM(config).eval()
    dense = torch.randn(2000, 13)
    sparse = torch.randint(0, 50, (2000, 26))
    predicted = probabilities(model, dense, sparse)
    assert float(predicted.mean()) == pytest.approx(0.03, rel=0.25), "at the prior, not at 0.5"
    assert float(DLRM(tiny_model_config([50] * 26)).eval()(dense, sparse).sigmoid().mean()) > 0.3


def _legacy(checkpoint: dict, vocabularies: list[np.ndarray]) -> dict:
    """The same model as a checkpoint of format 1: bottom_mlp / top_mlp, flat size names, and tables whose row 0
    is missing-or-unseen with the vocabulary from row 1 (the missing row dropped)."""
    config = DLRMConfig.from_dict(checkpoint["model_config"])
    tables = split_tables(checkpoint["model_state"], config)
    legacy_tables = {f: torch.cat([table[:1], table[2:]]) for f, table in tables.items()}
    legacy_config = dataclasses.replace(config, table_sizes=[s - 1 for s in config.table_sizes])
    state = {k: v for k, v in checkpoint["model_state"].items() if not k.startswith("embeddings.")}
    state = {k.replace("dense_mlp.", "bottom_mlp.").replace("prediction_mlp.", "top_mlp."): v for k, v in state.items()}
    state.update(grouped_tables(legacy_tables, legacy_config))
    flat = {
        "table_sizes": legacy_config.table_sizes,
        "embedding_dims": config.sparse_embedding_sizes,
        "dense_hidden_sizes": config.dense_mlp.hidden_layer_sizes,
        "dense_output_size": config.dense_mlp.output_size,
        "prediction_hidden_sizes": config.prediction_hidden_sizes,
        "interaction": config.interaction,
        "dcn_layers": 3,
        "dcn_rank": 64,
    }
    encoder = FeatureEncoder(legacy_config.table_sizes, np.zeros(13), np.ones(13), vocabularies, missing_row=False)
    encoder_state = encoder.state_dict()
    del encoder_state["missing_row"]
    return {"format": 1, "model_state": state, "model_config": flat, "encoder": encoder_state}


def test_a_checkpoint_of_the_earlier_format_scores_the_rows_it_scored(tmp_path):
    torch.manual_seed(1)
    vocabularies = [np.arange(10, 10 + 6)] * 26
    config = tiny_model_config(
        [8] * 26,
        sparse_embedding_sizes=4,
        dense_mlp={"hidden_layer_sizes": [8], "output_size": 4},
        prediction_hidden_sizes=[8],
    )
    model = DLRM(config).eval()
    encoder = FeatureEncoder(config.table_sizes, np.zeros(13), np.ones(13), vocabularies)
    current = {"model_state": model.state_dict(), "model_config": config.to_dict(), "encoder": encoder.state_dict()}
    legacy = _legacy(current, vocabularies)
    path = tmp_path / "legacy.pt"
    torch.save(legacy, path)
    loaded = torch.load(path, weights_only=True)
    old_model, old_encoder = model_from_checkpoint(loaded), FeatureEncoder.from_state_dict(loaded["encoder"])
    assert old_encoder.missing_row is False and old_model.config.table_sizes == [7] * 26
    rng = np.random.default_rng(0)
    raw = rng.choice(np.r_[np.arange(10, 16), [99]], size=(300, 26))  # known values and an unseen one, no missing
    dense = torch.randn(300, 13)
    new_rows = torch.from_numpy(np.stack([encoder.encode_sparse_column(f, raw[:, f]) for f in range(26)], 1))
    old_rows = torch.from_numpy(np.stack([old_encoder.encode_sparse_column(f, raw[:, f]) for f in range(26)], 1))
    torch.testing.assert_close(
        probabilities(old_model, dense, old_rows.long()), probabilities(model, dense, new_rows.long())
    )
    exported = np.load(io.BytesIO(serving_encoder(old_encoder)))
    assert (int(exported["unseen_row"]), int(exported["missing_row"]), int(exported["first_row"])) == (0, 0, 1)


def test_a_checkpoint_s_model_config_is_a_dlrm_config_read_from_any_format():
    """Issue 60 item 4: the record holds the DLRM's sizes as a ``DLRMConfig`` (read from the format-1 flat names
    too) and builds its model from it; the stored form is the current format's dict."""
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint

    torch.manual_seed(2)
    vocabularies = [np.arange(10, 16)] * 26
    config = tiny_model_config(
        [8] * 26, sparse_embedding_sizes=4, dense_mlp={"hidden_layer_sizes": [8], "output_size": 4}
    )
    model = DLRM(config).eval()
    legacy = _legacy({"model_state": model.state_dict(), "model_config": config.to_dict()}, vocabularies)
    checkpoint = Checkpoint.from_dict({**legacy, "step": 5, "metadata": {"version": "v1"}})
    assert isinstance(checkpoint.model_config, DLRMConfig)
    assert checkpoint.model_config == dataclasses.replace(config, table_sizes=[7] * 26, initial_ctr=None)
    assert checkpoint.to_dict()["model_config"] == checkpoint.model_config.to_dict()
    dense, sparse = torch.randn(20, 13), torch.randint(0, 7, (20, 26))
    torch.testing.assert_close(
        probabilities(checkpoint.model(), dense, sparse), probabilities(model_from_checkpoint(legacy), dense, sparse)
    )


def test_a_checkpoint_is_read_through_one_object_that_checks_its_encoder(tiny_checkpoint):
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint
    from criteo_dlrm.engine.trained.scoring import VocabularyMismatchError

    stored = tiny_checkpoint.to_dict()
    checkpoint = Checkpoint.from_dict(stored, version="2026-11-30T01.00.00.000Z")
    assert checkpoint.source == "dlrm_checkpoint version 2026-11-30T01.00.00.000Z"
    assert checkpoint.step == stored["step"] and checkpoint.calibration_method == "platt"
    assert checkpoint.source_days == SourceDays.from_dict(stored["metadata"]["source_days"])
    assert checkpoint.encoder().table_sizes == checkpoint.model().config.table_sizes
    uncalibrated = Checkpoint.from_dict({k: v for k, v in stored.items() if k != "calibration"}, named="old.pt")
    assert not uncalibrated.calibrated and uncalibrated.calibration_method == "none"
    assert uncalibrated.calibration().method == "none"
    damaged = dataclasses.replace(with_altered_vocabulary(tiny_checkpoint, 0), named="x.pt")
    with pytest.raises(VocabularyMismatchError, match="x.pt: its vocabularies"):
        damaged.encoder()


def test_a_checkpoint_is_a_record_whose_stored_form_round_trips_and_keeps_what_it_does_not_know(tiny_checkpoint):
    from criteo_dlrm.engine.trained.checkpoint import CHECKPOINT_FORMAT, Checkpoint, TrainedWith
    from criteo_dlrm.engine.trained.reports import Metrics, Validation

    stored = tiny_checkpoint.to_dict()
    checkpoint = Checkpoint.from_dict({**stored, "written_by_a_later_version": 7}, version="v9")
    assert checkpoint.version == "v9" and checkpoint.others == {"written_by_a_later_version": 7}
    assert isinstance(checkpoint.trained_with, TrainedWith) and checkpoint.encoder_state is stored["encoder"]
    assert isinstance(checkpoint.best_validation, Metrics) and all(
        isinstance(v, Validation) for v in checkpoint.history
    )
    assert checkpoint.calibration_state is stored["calibration"] and checkpoint.format == CHECKPOINT_FORMAT
    again = checkpoint.to_dict()
    assert "version" not in again and again.pop("written_by_a_later_version") == 7
    records = ("model_config", "metadata", "best_validation", "history")
    assert again.keys() == stored.keys() and all(again[key] == stored[key] for key in records), "records written back"
    assert all(again[key] is stored[key] for key in stored if key not in records), "the rest kept as it was read"
    with pytest.raises(dataclasses.FrozenInstanceError):
        checkpoint.step = 1


def test_a_checkpoint_with_overwritten_bytes_is_refused_naming_it(tmp_path):
    path = tmp_path / "dlrm_checkpoint.pt"
    TorchCheckpointDataset(str(path), version=Version(None, None)).save(stored_checkpoint(weights=torch.randn(50_000)))
    [file] = path.glob("*/dlrm_checkpoint.pt")
    with open(file, "r+b") as handle:
        handle.seek(file.stat().st_size // 2)
        handle.write(b"\xff" * 256)
    message = refused(TorchCheckpointDataset(str(path), version=Version(None, None)).load, file)
    assert "is damaged" in message


def _saved_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A versioned checkpoint saved as training saves it: ``(its file, the dataset's path)``."""
    path = tmp_path / "dlrm_checkpoint.pt"
    state = stored_checkpoint(format=3, model_state={"w": torch.arange(6.0)}, calibration={"method": "platt", "a": 1.5})
    TorchCheckpointDataset(str(path), version=Version(None, "2026-01-01T00.00.00.000Z")).save(state)
    [file] = path.glob("*/dlrm_checkpoint.pt")
    return file, path


def _edit_calibration(file: Path) -> None:
    """Rewrite the calibration's ``a`` by other means (torch.save: no digest inside)."""
    state = torch.load(file, weights_only=True)
    state["calibration"]["a"] = 9.0
    torch.save(state, file)


def _edit_calibration_in_place(file: Path) -> None:
    """The calibration's ``a`` edited in the file's bytes (the pickle's float), the digest at its end kept."""
    import struct

    data = file.read_bytes()
    assert data.count(b"G" + struct.pack(">d", 1.5)) == 1
    file.write_bytes(data.replace(b"G" + struct.pack(">d", 1.5), b"G" + struct.pack(">d", 9.0)))


def test_a_checkpoint_edited_and_stripped_of_its_digest_is_refused(tmp_path):
    file, path = _saved_checkpoint(tmp_path)
    _edit_calibration(file)
    Path(f"{file}.sha256").unlink()
    message = refused(TorchCheckpointDataset(str(path), version=Version(None, None)).load, file)
    assert "has no digest" in message and "--load-versions" in message


def test_a_checkpoint_rewritten_with_a_fresh_file_digest_is_refused_by_the_digest_inside(tmp_path):
    import hashlib

    file, path = _saved_checkpoint(tmp_path)
    _edit_calibration_in_place(file)
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    assert "content is not what was written" in refused(
        TorchCheckpointDataset(str(path), version=Version(None, None)).load, file
    )
    _edit_calibration(file)  # and rewritten by torch.save, without the digest inside
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    assert "lost the content digest" in refused(
        TorchCheckpointDataset(str(path), version=Version(None, None)).load, file
    )


def test_a_checkpoint_of_format_2_without_a_digest_inside_still_loads_on_its_file_digest(tmp_path):
    import hashlib

    path = tmp_path / "dlrm_checkpoint.pt"
    file = path / "2025-01-01T00.00.00.000Z" / "dlrm_checkpoint.pt"
    file.parent.mkdir(parents=True)
    torch.save(stored_checkpoint(format=2, model_state={"w": torch.ones(2)}).to_dict(), file)
    Path(f"{file}.sha256").write_text(hashlib.sha256(file.read_bytes()).hexdigest())
    loaded = TorchCheckpointDataset(str(path), version=Version(None, None)).load()
    assert loaded.format == 2 and torch.equal(loaded.model_state["w"], torch.ones(2))


def test_a_digest_is_compared_whatever_its_case(tmp_path):
    file, path = _saved_checkpoint(tmp_path)
    sidecar = Path(f"{file}.sha256")
    sidecar.write_text(sidecar.read_text().upper() + "\n")
    loaded = TorchCheckpointDataset(str(path), version=Version(None, None)).load()
    assert loaded.calibration_state["a"] == 1.5 and "content_sha256" not in loaded.others

"""The checks before a run are keyed on the node functions a pipeline runs, not on node names."""

from __future__ import annotations

import errno
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kedro.io import DataCatalog
from kedro.io.core import Version
from kedro.pipeline import Node, Pipeline

from criteo_dlrm.common.errors import ConfigError, DataError
from criteo_dlrm.common.storage import DiskFullError
from criteo_dlrm.config import EvaluationConfig
from criteo_dlrm.data.raw import IngestionError
from criteo_dlrm.datasets import JSONDataset
from criteo_dlrm.pipelines.evaluation.nodes import evaluate_checkpoint
from criteo_dlrm.preflight import check_before_run
from tests.faults import fails_with


def _evaluation(name: str) -> Pipeline:
    outputs = ["evaluation_metrics", "roc_curve_plot", "calibration_plot", "score_histogram_plot"]
    return Pipeline([Node(evaluate_checkpoint, ["dlrm_checkpoint", "params:evaluation"], outputs, name=name)])


@pytest.mark.parametrize("name", ["evaluate_checkpoint", "my_own_evaluation"])
def test_a_node_keeps_its_checks_whatever_it_is_named(name):
    configs = {"evaluation": EvaluationConfig(device="cuda:99")}
    with pytest.raises(ConfigError, match="evaluation.device"):
        check_before_run(configs, _evaluation(name), DataCatalog({}))


def test_a_pipeline_without_the_node_is_not_checked_for_it():
    configs = {"evaluation": EvaluationConfig(device="cuda:99")}
    check_before_run(configs, Pipeline([]), DataCatalog({}))


def test_metadata_and_vocabularies_of_two_runs_are_refused_before_training(tmp_path):
    from criteo_dlrm.datasets import FeatureVocabulariesDataset
    from criteo_dlrm.preflight import MismatchedVersionsError, check_same_run

    for version in ("2026-01-01T00.00.00.000Z", "2026-01-02T00.00.00.000Z"):
        JSONDataset(str(tmp_path / "m.json"), version=Version(None, version)).save({"v": version})
        FeatureVocabulariesDataset(str(tmp_path / "v.npz"), version=Version(None, version)).save({"SPARSE_0": [1]})
    pinned = JSONDataset(str(tmp_path / "m.json"), version=Version("2026-01-01T00.00.00.000Z", None))
    latest = FeatureVocabulariesDataset(str(tmp_path / "v.npz"), version=Version(None, None))
    with pytest.raises(MismatchedVersionsError, match="feature_vocabularies:2026-01-01T00.00.00.000Z"):
        check_same_run(pinned, latest)


def _run_in_session(project: Path, params: dict, pipelines: list[str] | None = None) -> None:
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(project)
    with KedroSession.create(project, runtime_params=params) as session:
        session.run(pipeline_names=pipelines)


@pytest.mark.parametrize(
    ("train_days", "overlap"), [(["day_0", "day_2"], "day_2"), (["day_2"], "day_2"), (["day_1", "day_2"], "day_2")]
)
def test_training_days_that_take_the_default_validation_day_are_refused_before_ingestion(project, train_days, overlap):
    from criteo_dlrm.common.errors import ConfigError

    message = fails_with(
        ConfigError,
        lambda: _run_in_session(project, {"metadata": {"train_days": train_days}, "training": {"num_epochs": 1}}),
        rf"metadata.train_days and the default validation day both take \['{overlap}'\]",
    )
    assert "metadata.validation_days" in message
    assert not (project / "data/02_intermediate").exists() or not list(
        (project / "data/02_intermediate").rglob("*.parquet")
    )


def test_tables_too_large_in_modulus_hash_mode_are_refused_before_ingestion(project):
    from criteo_dlrm.common.errors import ConfigError

    params = {"metadata": {"use_modulus_hash": True, "modulus_hash_size": 200_000_000}}
    message = fails_with(ConfigError, lambda: _run_in_session(project, params), r"need [\d,.]+ GB")
    assert "metadata.modulus_hash_size" in message
    assert not list((project / "data").rglob("*.parquet")), "refused before ingestion"


def test_tables_too_large_in_an_existing_metadata_version_name_the_metadata_rerun(project, monkeypatch):
    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.common.memory import MemoryRoom
    from criteo_dlrm.engine import memory

    _run_in_session(project, {"metadata": {"max_vocabulary_size": 5}}, ["ingestion", "metadata"])
    # A room smaller than the run (the parts are counted on a copy of the model with tables of two rows, which a
    # billion-wide layer would make real): the refusal, not the size, is the subject.
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(100_000_000, "the test's room"))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 0)
    message = fails_with(ConfigError, lambda: _run_in_session(project, {}, ["training"]), r"more than the test's room")
    assert "feature_metadata version" in message and "--pipelines=metadata,training" in message


def test_tables_this_run_counts_are_checked_before_encoding_and_encoding_alone_is_not_checked(project, monkeypatch):
    """The tables' sizes are known once this run's metadata stage has counted them: their memory is checked then,
    before any row is encoded; encoding alone (``--nodes=encode_features``) holds no table and is not checked."""
    from kedro.framework.session import KedroSession

    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.common.memory import MemoryRoom
    from criteo_dlrm.engine import memory

    # Room for a training batch's lookups (a few MB), not for the tables with what training holds besides.
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(100_000_000, "the test's room"))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 0)
    message = fails_with(ConfigError, lambda: _run_in_session(project, {}), r"more than the test's room")
    assert "tables and their optimiser state (1 process(es))" in message
    assert list((project / "data/04_feature/feature_metadata.json").iterdir()), "counted first"
    assert not (project / "data/05_model_input").exists() or not any((project / "data/05_model_input").rglob("*.npy"))

    with KedroSession.create(project) as session:
        session.run(pipeline_names=["training"], node_names=["encode_features"])
    assert (project / "data/05_model_input/train_features/labels.npy").exists()


def _preflight(pipeline: str, params: dict, tmp_path: Path, monkeypatch) -> None:
    """``preflight.check_before_run`` for ``kedro run --pipelines=<pipeline> --params=...``, in ``tmp_path``."""
    from kedro.io import DataCatalog
    from kedro.pipeline import Pipeline

    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import PIPELINE_ORDER, _pipeline
    from criteo_dlrm.preflight import check_before_run

    monkeypatch.chdir(tmp_path)
    names = PIPELINE_ORDER if pipeline == "__default__" else [pipeline]
    check_before_run(parse_parameters(params), sum((_pipeline(n) for n in names), Pipeline([])), DataCatalog())


@pytest.mark.parametrize("case", ["missing folder", "foreign parquet"])
def test_a_scoring_input_that_cannot_be_scored_is_refused_before_any_work(tmp_path, monkeypatch, case):
    import pyarrow as pa

    folder = tmp_path / "to_score"
    if case == "foreign parquet":
        folder.mkdir()
        pq.write_table(pa.table({"user": [1, 2], "item": [3, 4]}), folder / "clicks.parquet")
        match, kind = r"clicks.parquet is not a Parquet day this project can score .*scoring.input_dir takes", DataError
    else:
        match, kind = r"scoring.input_dir: the folder .*to_score does not exist", IngestionError
    with pytest.raises(kind, match=match) as refused:
        _preflight("scoring", {"scoring": {"input_dir": str(folder)}}, tmp_path, monkeypatch)
    assert "ingestion.force" not in str(refused.value), "no ingestion fix for a scoring input"


def test_more_training_processes_than_cores_on_the_cpu_are_refused(tmp_path, monkeypatch):
    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.common.parallel import available_cores

    params = {"training": {"device": "cpu", "distributed": {"nproc_per_node": available_cores() + 1}}}
    with pytest.raises(
        ConfigError, match=rf"nproc_per_node={available_cores() + 1} starts .* at most {available_cores()}"
    ):
        _preflight("training", params, tmp_path, monkeypatch)
    _preflight(
        "training",
        {"training": {"device": "cpu", "distributed": {"nproc_per_node": available_cores()}}},
        tmp_path,
        monkeypatch,
    )


def test_every_folder_a_run_writes_is_checked_before_the_first_node(tmp_path, monkeypatch):
    from criteo_dlrm.common import storage
    from criteo_dlrm.common.storage import NotWritableError

    real = storage.create_exclusive

    def read_only(path):
        if "08_reporting" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path)

    monkeypatch.setattr(storage, "create_exclusive", read_only)
    with pytest.raises(NotWritableError, match=r"data/08_reporting/tensorboard is not writable \(Read-only file sys"):
        _preflight("__default__", {}, tmp_path, monkeypatch)
    assert not list(tmp_path.rglob("*.parquet"))


def test_the_folders_checked_are_every_output_folder_of_the_whole_job(project):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import register_pipelines
    from criteo_dlrm.preflight import _output_folders

    bootstrap_project(project)
    with KedroSession.create(project) as session:
        context = session.load_context()
        folders = _output_folders(
            parse_parameters(context.params), register_pipelines()["__default__"], context.catalog
        )
    named = {str(Path(folder)).split("data/", 1)[-1] for folder in folders}
    for expected in ("02_intermediate", "04_feature/feature_metadata.json", "05_model_input", "06_models/in_progress",
                     "06_models/dlrm_checkpoint.pt", "08_reporting/tensorboard", "08_reporting/evaluation_metrics.json"):  # fmt: skip
        assert expected in named, (expected, named)


@pytest.mark.parametrize("setting", ["ingestion.output_dir", "training.in_progress_dir"])
def test_an_output_folder_that_is_a_file_is_refused_naming_the_setting(tmp_path, monkeypatch, setting):
    from criteo_dlrm.common.storage import NotWritableError

    block, field = setting.split(".")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotWritableError, match=rf"a_file is a file, where this run needs a folder .* point {setting}"):
        _preflight("__default__", {block: {field: str(tmp_path / "a_file")}}, tmp_path, monkeypatch)


def test_predictions_that_cannot_fit_are_refused_before_the_export_runs(tmp_path, monkeypatch):
    """A full predictions folder was found only when the predictions were written, after the ONNX export."""
    import shutil as real_shutil

    from kedro.io import DataCatalog

    from criteo_dlrm.common import storage
    from criteo_dlrm.datasets import BinaryFileDataset

    raw = tmp_path / "to_score"
    raw.mkdir()
    line = "\t".join(["1", *["5"] * 13, *["68fd1e64"] * 26]) + "\n"
    (raw / "day_0").write_text(line * 2000)  # 2,000 lines of 262 bytes: at least 524 rows counted, 4 bytes each
    predictions = tmp_path / "full_disk" / "predictions.parquet"
    usage = real_shutil.disk_usage

    def full(path):
        found = usage(path)
        return found._replace(free=1000) if "full_disk" in str(path) else found

    monkeypatch.setattr(storage.shutil, "disk_usage", full)
    catalog = DataCatalog({"predictions": BinaryFileDataset(str(predictions), version=Version(None, None))})
    from criteo_dlrm.config import parse_parameters
    from criteo_dlrm.pipeline_registry import _pipeline
    from criteo_dlrm.preflight import check_before_run

    monkeypatch.chdir(tmp_path)
    configs = parse_parameters({"scoring": {"input_dir": str(raw), "parquet_dir": str(tmp_path / "staged")}})
    with pytest.raises(DiskFullError) as refused:
        check_before_run(configs, _pipeline("scoring"), catalog)
    message = str(refused.value)
    assert f"No space left on {predictions} while writing the predictions of 524 rows or more" in message
    assert "(1.0 kB free; it needs 2.1 kB)" in message
    check_before_run(configs, _pipeline("scoring"), DataCatalog())  # the staging folder has room


def test_a_multi_hot_size_no_batch_can_look_up_is_refused_before_any_node(tmp_path, monkeypatch):
    """One multi-hot size of 1e9 grew the kedro process to 20 GB until the kernel killed it (rc 137, no message):
    the lookups a training batch needs are counted before any node runs, the table sizes not needed for it."""
    hots = [1] * 26
    hots[20] = 1_000_000_000
    params = {"training": {"device": "cpu", "multi_hot_sizes": hots}}
    with pytest.raises(ConfigError, match=r"looks up 1,000,000,025 table rows a row .* Lower training.multi_hot_sizes"):
        _preflight("training", params, tmp_path, monkeypatch)
    hots[20] = 100  # MLPerf's largest
    _preflight("training", {"training": {"device": "cpu", "multi_hot_sizes": hots}}, tmp_path, monkeypatch)


def test_a_batch_whose_lookups_cannot_fit_is_refused_with_a_batch_that_fits(monkeypatch):
    import torch

    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.engine import memory

    config = TrainingConfig.from_dict({"batch_size": {"train": 1_000_000}})
    monkeypatch.setattr(memory, "memory_room", lambda: type("Room", (), {"available": 0, "where": "the test's room"}))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: memory.lookup_bytes(config) // 10)
    with pytest.raises(ConfigError) as refused:
        memory.check_lookup_memory(config, torch.device("cpu"))
    [fix] = refused.value.fixes
    smaller = TrainingConfig.from_dict({"batch_size": {"train": fix.params["training.batch_size.train"]}})
    memory.check_lookup_memory(smaller, torch.device("cpu"))  # the suggested batch fits

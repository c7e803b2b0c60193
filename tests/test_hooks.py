"""The project's hooks one by one, called as Kedro calls them, on a small catalog of real datasets."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.io import DataCatalog, MemoryDataset
from kedro.io.core import Version
from kedro.pipeline import node, pipeline

from criteo_dlrm import hooks
from criteo_dlrm.common.errors import WHOLE_JOB, Fix
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.source_days import IngestedDay, IngestionReport
from criteo_dlrm.datasets import JSONDataset

VERSION = "2026-12-03T10.00.00.000Z"


def _json(tmp_path, name: str, version: str | None = VERSION) -> JSONDataset:
    return JSONDataset(filepath=str(tmp_path / f"{name}.json"), version=Version(None, version))


def _incomplete(dataset: JSONDataset) -> set[str]:
    """The versions of ``dataset`` whose folder still holds the marker of a run that began them."""
    return {Path(folder).name for folder in dataset.incomplete_versions()}


def _two_outputs(left: dict, right: dict) -> tuple[dict, dict]:
    return left, right


def test_a_node_s_versions_are_incomplete_until_every_output_is_stored_and_an_unwritten_one_goes_on_error(tmp_path):
    step = node(_two_outputs, ["a", "b"], ["first", "second"], name="two")
    catalog = DataCatalog({"first": _json(tmp_path, "first"), "second": _json(tmp_path, "second")})
    versions = hooks.OutputVersionHooks()
    versions.after_catalog_created(catalog, VERSION)
    versions.before_node_run(step)
    assert all(_incomplete(catalog.get(name)) == {VERSION} for name in ("first", "second"))
    catalog.save("first", {"x": 1})
    versions.after_dataset_saved("first", step)
    assert _incomplete(catalog.get("first")) == {VERSION}, "one output stored of two: not complete yet"
    catalog.save("second", {"y": 2})
    versions.after_dataset_saved("second", step)
    assert not any(_incomplete(catalog.get(name)) for name in ("first", "second"))

    later = "2026-12-03T11.00.00.000Z"
    failing = DataCatalog({"first": _json(tmp_path, "first", later), "second": _json(tmp_path, "second", later)})
    versions.after_catalog_created(failing, later)
    versions.before_node_run(step)
    failing.save("first", {"x": 3})
    versions.on_node_error(RuntimeError("the node failed"), step)
    assert _incomplete(failing.get("first")) == {later}, "what it wrote in part stays marked"
    assert later not in failing.get("second").versions(), "a version it never wrote to is removed"


def test_the_in_progress_checkpoint_goes_only_once_every_output_of_training_is_stored(monkeypatch):
    finished = []
    from criteo_dlrm.engine.training import recipe

    monkeypatch.setattr(recipe, "finish_run", finished.append)  # imported by the hook when it runs
    training = node(_two_outputs, ["a", "b"], ["dlrm_checkpoint", "training_summary"], name="train_dlrm")
    other = node(_two_outputs, ["a", "b"], ["feature_metadata", "feature_vocabularies"], name="metadata")
    in_progress = hooks.InProgressCheckpointHooks()
    in_progress.before_node_run(training)
    in_progress.after_dataset_saved("training_summary", {"in_progress_checkpoint": "p.pt"}, training)
    assert finished == [], "the checkpoint is not stored yet: a rerun must still resume"
    in_progress.after_dataset_saved("feature_metadata", {}, other)
    assert finished == []
    in_progress.after_dataset_saved("dlrm_checkpoint", {"step": 3}, training)
    assert finished == [{"in_progress_checkpoint": "p.pt"}]


def test_the_summary_records_what_was_saved_where_and_the_split_of_the_ingested_days(tmp_path):
    parameters = hooks.ParameterHooks()
    parameters.configs = {"metadata": MetadataConfig()}
    summary = hooks.SummaryHooks(parameters)
    ingestion = JSONDataset(filepath=str(tmp_path / "ingestion_report.json"), version=Version(None, VERSION),
                            record="criteo_dlrm.data.source_days.IngestionReport")  # fmt: skip
    catalog = DataCatalog({"ingestion_report": ingestion, "other": MemoryDataset()})
    summary.after_catalog_created(catalog, VERSION)
    days = [IngestedDay(day=f"day_{i}", parquet=f"day_{i}.parquet", rows=10) for i in range(3)]
    report = IngestionReport(raw_dir="raw", parquet_dir="parquet", days=days)
    catalog.save("ingestion_report", report)
    summary.after_dataset_saved("ingestion_report", report)
    summary.after_dataset_saved("other", {"not": "summarised"})
    record = summary.record
    assert record.version == VERSION and record.saved == {"ingestion_report": report}
    assert record.paths["ingestion_report"] == catalog.get("ingestion_report").version_path(VERSION)
    assert record.split == "day_0, day_1 train; day_2 validate (first 50%) and test (last 50%)"


class _Engine:
    settings_key = None

    def __init__(self) -> None:
        self.calls: list = []

    def start(self, settings: dict) -> None:
        self.calls.append(("start", settings))

    def stop(self) -> None:
        self.calls.append("stop")


def test_the_preprocessing_engine_starts_only_for_a_pipeline_that_preprocesses_and_stops_after_it():
    from criteo_dlrm.pipelines.evaluation.pipeline import create_pipeline as evaluation
    from criteo_dlrm.pipelines.ingestion.pipeline import create_pipeline as ingestion

    engine_hooks = hooks.PreprocessingEngineHooks(hooks.ParameterHooks())
    engine_hooks.engine = engine = _Engine()
    engine_hooks.before_pipeline_run(evaluation())
    engine_hooks.after_pipeline_run()
    assert engine.calls == [], "evaluation preprocesses nothing: no session is started"
    engine_hooks.before_pipeline_run(ingestion())
    engine_hooks.on_pipeline_error()
    engine_hooks.on_pipeline_error()
    assert engine.calls == [("start", {}), "stop"], "started once, stopped once, also when the run failed"


def test_a_run_whose_inputs_no_run_wrote_names_the_pipelines_to_run_first_as_fixes(tmp_path):
    preflight = hooks.PreflightHooks(hooks.ParameterHooks())
    catalog = DataCatalog({"dlrm_checkpoint": MemoryDataset()})
    wants = pipeline([node(lambda checkpoint: checkpoint, "dlrm_checkpoint", "evaluation_metrics", name="evaluate")])
    with pytest.raises(hooks.MissingInputError) as raised:
        preflight.before_pipeline_run({}, wants, catalog)
    first, whole = raised.value.fixes
    assert whole == Fix(pipelines=WHOLE_JOB)
    assert first.pipelines[-1] == "training" and "ingestion" in first.pipelines
    assert f"Run `{first}` first, or `kedro run` for the whole job." in str(raised.value)

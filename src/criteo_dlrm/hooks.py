"""The project's Kedro hooks: each a short adapter over the module that does the work.

- after the context: loguru into Kedro's logging (``logs``);
- after the catalog: every parameter checked and typed (``config``), the run version handed to nodes;
- before the run: what can be known to fail is refused (``preflight``), missing inputs are named with the
  pipelines that make them (``pipeline_registry``);
- around each node: its versioned outputs are marked incomplete until all of them are saved, so a killed run
  never leaves a half set of versions as the latest;
- after saving: outputs recorded for the run summary (``summary``), and a finished run's in-progress
  checkpoint removed once its checkpoint is safely stored.
"""

from __future__ import annotations

import os
import socket

from kedro.framework.hooks import hook_impl

from criteo_dlrm.common.commands import WHOLE_JOB, kedro_run
from criteo_dlrm.common.errors import UserError
from criteo_dlrm.config import parse_parameters
from criteo_dlrm.datasets.versioned_file import VersionedFileDataset
from criteo_dlrm.engine.recipe import finish_run
from criteo_dlrm.logs import bridge_loguru, configure_console
from criteo_dlrm.pipeline_registry import missing_inputs, pipelines_to_run_first, producers_of
from criteo_dlrm.preflight import check_before_run, report_incomplete_versions
from criteo_dlrm.summary import SUMMARISED, RunRecord, split_line

RUN_VERSION = "run_version"


class MissingInputError(UserError, RuntimeError):
    """A pipeline was asked to run before the pipeline that produces its inputs."""


class MissingVersionError(UserError, LookupError):
    """``--load-versions`` pinned a version that was never written."""


def _missing_version_message(name: str, version: str, dataset) -> str:
    versions = dataset.versions() if isinstance(dataset, VersionedFileDataset) else []
    where = getattr(dataset, "_filepath", name)
    if not versions:
        return f"{name} version {version} does not exist: no run has written {name} yet (nothing in {where})."
    shown = ", ".join(versions[-10:])
    more = f" (the last 10 of {len(versions)})" if len(versions) > 10 else ""
    return (
        f"{name} version {version} does not exist. The versions in {where}{more}, oldest first: {shown}. "
        f"Pin one of them with --load-versions={name}:<version>, or leave {name} out for the newest."
    )


def _split_of(metadata, report: dict) -> str | None:
    """The summary's line saying which ingested day trains, validates and tests (None: the split is refused,
    and metadata says why when it runs)."""
    names = [day["day"] for day in report["days"]]
    try:
        return split_line(metadata.split(names), metadata.test_share, names)
    except UserError:
        return None


class ProjectHooks:
    def __init__(self) -> None:
        self.record = RunRecord()
        self._configs: dict = {}
        self._catalog = None
        self._saved_by_node: dict[str, set[str]] = {}

    # First of every plugin's: a parameter typo is refused before kedro-mlflow opens its store (seconds).
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        bridge_loguru()
        configure_console()
        self._configs = parse_parameters(context.params)

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        # Training names its TensorBoard folder after this, so the folder matches the checkpoint version.
        catalog[RUN_VERSION] = save_version
        self._catalog = catalog
        self.record = RunRecord(version=save_version)

    # First of every plugin's: a run refused here never opened an MLflow run (kedro-mlflow opens one in its own
    # before_pipeline_run, and Kedro calls on_pipeline_error, which would close it, only for a failing node).
    @hook_impl(tryfirst=True)
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        # Raw inputs (no pipeline makes them) report their own problem when loaded.
        missing = [name for name in missing_inputs(pipeline, catalog) if producers_of(name)]
        if missing:
            pinned = run_params.get("load_versions") or {}
            wrong = [_missing_version_message(n, pinned[n], catalog.get(n)) for n in missing if n in pinned]
            if wrong:
                raise MissingVersionError("\n".join(wrong))
            first = pipelines_to_run_first(missing, catalog)
            raise MissingInputError(
                f"This run needs {', '.join(missing)}, which no earlier run has written. "
                f"Run `{kedro_run(first)}` first, or `{kedro_run(WHOLE_JOB)}` for the whole job."
            )
        check_before_run(self._configs, pipeline, catalog)
        report_incomplete_versions(catalog, sorted(pipeline.inputs()))

    def _versioned_outputs(self, node) -> list[tuple[str, VersionedFileDataset]]:
        outputs = [(name, self._catalog.get(name)) for name in node.outputs] if self._catalog is not None else []
        return [
            (name, ds) for name, ds in outputs if isinstance(ds, VersionedFileDataset) and ds.resolve_save_version()
        ]

    @hook_impl
    def before_node_run(self, node) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "run": self.record.version, "node": node.name}
        for _, dataset in self._versioned_outputs(node):
            dataset.mark_incomplete(dataset.resolve_save_version(), owner)
        self._saved_by_node[node.name] = set()

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        # Versions the node never wrote to are removed; what it wrote in part stays marked incomplete.
        for _, dataset in self._versioned_outputs(node):
            dataset.discard_if_empty(dataset.resolve_save_version())

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        if dataset_name in SUMMARISED:
            self.record.saved[dataset_name] = data
            dataset = self._catalog.get(dataset_name) if self._catalog is not None else None
            if isinstance(dataset, VersionedFileDataset) and dataset.resolve_save_version():
                path = dataset.version_path(dataset.resolve_save_version())
                self.record.paths[dataset_name] = os.path.relpath(path) if path.startswith(os.getcwd()) else path
        if dataset_name == "ingestion_report" and "metadata" in self._configs:
            self.record.split = _split_of(self._configs["metadata"], data)
        saved = self._saved_by_node.setdefault(node.name, set())
        saved.add(dataset_name)
        if saved >= set(node.outputs):  # every output of the node is stored: its versions are complete
            for _, dataset in self._versioned_outputs(node):
                dataset.mark_complete(dataset.resolve_save_version())
            if "training_summary" in node.outputs and "training_summary" in self.record.saved:
                finish_run(self.record.saved["training_summary"])  # the checkpoint is stored: nothing to resume

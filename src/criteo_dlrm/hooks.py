"""The project's Kedro hooks, one class per concern, each a short adapter over the module that does the work.

- ``ConsoleHooks``: loguru into Kedro's logging, one line per record (``logs``);
- ``ParameterHooks``: every parameter checked and typed (``config``) before any plugin opens anything; the run
  version handed to nodes;
- ``PreflightHooks``: what can be known to fail is refused before the run (``preflight``), missing inputs are
  named with the pipelines that make them (``pipeline_registry``);
- ``OutputVersionHooks``: a node's versioned outputs are marked incomplete until all of them are saved, so a
  killed run never leaves a half set of versions as the latest;
- ``InProgressCheckpointHooks``: a finished run's in-progress checkpoint removed once its checkpoint is stored;
- ``SummaryHooks``: outputs recorded for the run's summary (``summary``);
- ``PreprocessingEngineHooks``: what ``preprocessing.engine`` needs for a run (``criteo_dlrm.spark.engines``;
  Spark: the session from ``conf/*/spark.yml``), started for a run that preprocesses and stopped after it.

``project_hooks()`` builds them in the order Kedro is to call them (``settings.HOOKS``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from kedro.config import MissingConfigException
from kedro.framework.hooks import hook_impl

from criteo_dlrm.common.errors import WHOLE_JOB, ConfigError, Fix, UserError
from criteo_dlrm.config import parse_parameters
from criteo_dlrm.data.source_days import IngestionReport
from criteo_dlrm.datasets.versioned_file import VersionedFileDataset
from criteo_dlrm.logs import prepare_console
from criteo_dlrm.pipeline_registry import missing_inputs, pipelines_to_run_first, producers_of
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


def _split_of(metadata, report: IngestionReport) -> str | None:
    """The summary's line saying which ingested day trains, validates and tests (None: the split is refused,
    and metadata says why when it runs)."""
    names = [day.day for day in report.days]
    try:
        return split_line(metadata.split(names), metadata.test_share, names)
    except UserError:
        return None


class ConsoleHooks:
    """A session created with ``KedroSession.create`` itself (a script, a test), not through
    ``settings.SESSION_CLASS``, gets the command's console too, from its context on."""

    @hook_impl(tryfirst=True)
    def after_context_created(self) -> None:
        prepare_console()


class ParameterHooks:
    """Holds the run's typed configurations (``configs``) for the hooks that check or summarise with them."""

    def __init__(self) -> None:
        self.configs: dict = {}

    # First of every plugin's: a parameter typo is refused before kedro-mlflow opens its store (seconds).
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        self.configs = parse_parameters(context.params)

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        # Training names its TensorBoard folder after this, so the folder matches the checkpoint version.
        catalog[RUN_VERSION] = save_version


class PreflightHooks:
    def __init__(self, parameters: ParameterHooks) -> None:
        self.parameters = parameters
        self._version: str | None = None
        self._counts_its_own_tables = False

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        self._version = save_version

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
            first, whole = Fix(pipelines=tuple(pipelines_to_run_first(missing, catalog))), Fix(pipelines=WHOLE_JOB)
            raise MissingInputError(
                f"This run needs {', '.join(missing)}, which no earlier run has written. "
                f"Run `{first}` first, or `{whole}` for the whole job.",
                fix=[first, whole],
            )
        # Imported by the run that needs it (the checks read every pipeline's settings and the training engine's
        # memory count): a kedro command that runs nothing starts without torch.
        from criteo_dlrm.preflight import (
            check_before_run,
            counts_its_own_tables,
            pin_versions,
            report_incomplete_versions,
        )

        check_before_run(self.parameters.configs, pipeline, catalog)
        self._counts_its_own_tables = counts_its_own_tables(self.parameters.configs, pipeline)
        report_incomplete_versions(catalog, sorted(pipeline.inputs()))
        if self._version is not None:
            pin_versions(catalog, pipeline, self._version, run_params.get("load_versions") or {})

    # Before any other plugin's (no output marked incomplete yet): the tables this run counted are checked before
    # they are encoded, where training follows; encoding alone does not hold them.
    @hook_impl(tryfirst=True)
    def before_node_run(self, node, inputs) -> None:
        if self._counts_its_own_tables:
            from criteo_dlrm.preflight import check_counted_tables

            check_counted_tables(self.parameters.configs, node, inputs)


class OutputVersionHooks:
    def __init__(self) -> None:
        self._catalog = None
        self._version: str | None = None
        self._saved_by_node: dict[str, set[str]] = {}

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        self._catalog, self._version = catalog, save_version

    def _versioned_outputs(self, node) -> list[VersionedFileDataset]:
        outputs = [self._catalog.get(name) for name in node.outputs] if self._catalog is not None else []
        return [ds for ds in outputs if isinstance(ds, VersionedFileDataset) and ds.resolve_save_version()]

    @hook_impl
    def before_node_run(self, node) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "run": self._version, "node": node.name}
        for dataset in self._versioned_outputs(node):
            dataset.mark_incomplete(dataset.resolve_save_version(), owner)
        self._saved_by_node[node.name] = set()

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        # Versions the node never wrote to are removed; what it wrote in part stays marked incomplete.
        for dataset in self._versioned_outputs(node):
            dataset.discard_if_empty(dataset.resolve_save_version())

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, node) -> None:
        saved = self._saved_by_node.setdefault(node.name, set())
        saved.add(dataset_name)
        if saved >= set(node.outputs):  # every output of the node is stored: its versions are complete
            for dataset in self._versioned_outputs(node):
                dataset.mark_complete(dataset.resolve_save_version())


class InProgressCheckpointHooks:
    """Until a run's checkpoint is stored, a rerun resumes from its in-progress checkpoint; then it goes."""

    def __init__(self) -> None:
        self._saved: set[str] = set()  # the training node's outputs stored so far (names only: not the checkpoint)
        self._summary: dict | None = None

    @hook_impl
    def before_node_run(self, node) -> None:
        if "training_summary" in node.outputs:
            self._saved, self._summary = set(), None

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        if "training_summary" not in node.outputs:
            return
        self._saved.add(dataset_name)
        if dataset_name == "training_summary":
            self._summary = data
        if self._saved >= set(node.outputs):
            from criteo_dlrm.engine.training.recipe import finish_run  # imported by a run that trained

            finish_run(self._summary)  # the checkpoint is stored: nothing to resume
            self._saved, self._summary = set(), None


class SummaryHooks:
    """Fills ``record`` (``summary.RunRecord``) with the summarised outputs as they are saved, and where they went."""

    def __init__(self, parameters: ParameterHooks) -> None:
        self.parameters = parameters
        self.record = RunRecord()
        self._catalog = None

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        self._catalog = catalog
        self.record = RunRecord(version=save_version)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        if dataset_name in SUMMARISED:
            self.record.saved[dataset_name] = data
            dataset = self._catalog.get(dataset_name) if self._catalog is not None else None
            if isinstance(dataset, VersionedFileDataset) and dataset.resolve_save_version():
                path = dataset.version_path(dataset.resolve_save_version())
                self.record.paths[dataset_name] = os.path.relpath(path) if path.startswith(os.getcwd()) else path
        configs = self.parameters.configs
        if dataset_name == "ingestion_report" and "metadata" in configs:
            self.record.split = _split_of(configs["metadata"], data)


class PreprocessingEngineHooks:
    """What the run's preprocessing engine needs for a run (``spark.engines``; Spark: its session), configured the
    Kedro way: its settings file's keys (``spark.yml``: Spark properties, as Kedro's PySpark starter) read when the
    context is created, the engine started after the preflight checks and only when the pipeline has a
    preprocessing node, and stopped after the run."""

    def __init__(self, parameters: ParameterHooks) -> None:
        self.parameters = parameters
        self.engine = None
        self.settings: dict = {}
        self.started = False

    @hook_impl
    def after_context_created(self, context) -> None:
        from criteo_dlrm.spark.engines import preprocessing_engine

        self.engine = preprocessing_engine(self.parameters.configs["preprocessing"])
        if self.engine.settings_key is not None:
            key = self.engine.settings_key
            try:
                self.settings = context.config_loader[key]
            except (KeyError, MissingConfigException):
                self.settings = {}
            except Exception as error:  # Kedro's loader on a file it cannot merge (a list, say): omegaconf's words
                from criteo_dlrm.spark.session import BACK

                raise ConfigError(
                    f"conf/base/{key}.yml (or conf/local's, or --env's) is not a mapping of settings, one `key: value` "
                    f"a line (`spark.driver.memory: 4g`, not `- spark.driver.memory: 4g`); Kedro's loader says: "
                    f"{str(error).splitlines()[0]}. Fix the file, {BACK}.",
                    fix=BACK,
                ) from error
            if not isinstance(self.settings, Mapping):
                self.settings = {}  # an empty file

    @hook_impl
    def before_pipeline_run(self, pipeline) -> None:
        from criteo_dlrm.preflight import preprocesses

        if self.engine is not None and preprocesses(pipeline):
            self.engine.start(self.settings)
            self.started = True

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._stop()

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.started:
            self.engine.stop()
            self.started = False


def project_hooks() -> tuple:
    """The project's hooks, sharing the parsed parameters. Kedro (pluggy) calls the hooks of one phase last
    registered first, so they are listed in the reverse of the order they run: the console before the
    parameters (after the context), the summary, then the versions made complete, then the in-progress
    checkpoint removed (after each save: never removed before its checkpoint's version is complete)."""
    parameters = ParameterHooks()
    return (
        PreprocessingEngineHooks(parameters),
        InProgressCheckpointHooks(),
        OutputVersionHooks(),
        SummaryHooks(parameters),
        PreflightHooks(parameters),
        parameters,
        ConsoleHooks(),
    )

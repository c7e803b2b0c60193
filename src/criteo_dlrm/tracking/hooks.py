"""What each tracked run logs to MLflow beyond kedro-mlflow's parameters, as the outputs are saved.

kedro-mlflow (configured in ``conf/base/mlflow.yml``) starts one MLflow run per ``kedro run`` and logs every
parameter a node reads, flattened as ``--params`` names them (``training.batch_size.train``). This hook adds:

- metrics: the validation history (``validation_log_loss`` … at each validation's step), the training figures
  (``training_steps``, ``kept_step``, ``samples_per_second``, ``processes``) and the evaluation's metrics on its
  rows (``test_auc``, ``test_log_loss``, ``test_expected_calibration_error``, the raw output's, the prior's);
- artifacts: the plots and the JSON reports, each under its catalog name;
- tags: the lineage (``checkpoint_version``, ``metadata_version``, the days trained, validated and tested on)
  and the device;
- the model: the checkpoint as an MLflow pyfunc model (``tracking.model``), with its signature.

Everything is logged from the Kedro process once, whatever number of training processes ran. Before the
run, a tracking server that does not answer stops it with what to do (``check_tracking_server``).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from kedro.framework.hooks import hook_impl
from loguru import logger

from criteo_dlrm.common.errors import Fix, UserError, user_error
from criteo_dlrm.common.storage import NotWritableError, check_writable
from criteo_dlrm.data.source_days import SourceDays, days_tag
from criteo_dlrm.datasets.versioned_file import VersionedFileDataset
from criteo_dlrm.engine.trained.reports import EvaluationReport, ScoringReport, Tracked, TrainingSummary

if TYPE_CHECKING:
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint

# The one switch: CRITEO_DLRM_TRACKING=off runs without kedro-mlflow and without this hook (settings.py).
SWITCH = "CRITEO_DLRM_TRACKING"
# A run without tracking: the user's command with the switch off.
NO_TRACKING = Fix(environment={SWITCH: "off"})
ARTIFACTS = (
    "ingestion_report", "feature_metadata", "training_summary", "evaluation_metrics", "roc_curve_plot",
    "calibration_plot", "score_histogram_plot", "scoring_report", "export_report",
)  # fmt: skip


class TrackingServerError(UserError, ConnectionError):
    """The MLflow tracking server named in mlflow.yml does not answer."""


def run_name_pipelines(names: list[str] | None) -> str:
    """What a run ran, for its MLflow name and ``pipelines`` tag: ``ingestion+metadata+training+evaluation`` for
    the whole job (none named), else the names given."""
    from criteo_dlrm.pipeline_registry import PIPELINE_ORDER

    chosen = [name for name in names or () if name != "__default__"] or list(PIPELINE_ORDER)
    return "+".join(chosen)


def tracking_enabled() -> bool:
    """False when ``CRITEO_DLRM_TRACKING`` is ``off`` (or ``0``, ``false``, ``no``)."""
    return os.environ.get(SWITCH, "on").strip().lower() not in ("off", "0", "false", "no")


def check_tracking_server(uri: str, timeout: float = 5.0) -> None:
    """Raise ``TrackingServerError`` when ``uri`` is an HTTP(S) tracking server that does not answer its health
    check within ``timeout`` seconds (MLflow itself would retry for minutes, after the run did its work)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            return
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            return  # it answered: a server behind authentication may refuse /health
        raise TrackingServerError(
            f"{uri} (server.mlflow_tracking_uri in conf/*/mlflow.yml, or MLFLOW_TRACKING_URI) answered HTTP "
            f"{error.code} to MLflow's health check ({uri.rstrip('/')}/health): it is not an MLflow tracking "
            f"server, or the address's path is wrong. Point mlflow_tracking_uri at the server (conf/local/mlflow.yml), "
            f"or run without tracking: `{NO_TRACKING}`.",
            fix=NO_TRACKING,
        ) from None
    except (OSError, ValueError) as error:
        raise TrackingServerError(
            f"The MLflow tracking server {uri} (server.mlflow_tracking_uri in conf/*/mlflow.yml, or "
            f"MLFLOW_TRACKING_URI) does not answer: {getattr(error, 'reason', error)}. Start it, point "
            f"mlflow_tracking_uri elsewhere (conf/local/mlflow.yml), or run without tracking: "
            f"`{NO_TRACKING}`.",
            fix=NO_TRACKING,
        ) from None


def _lineage_tags(
    days: SourceDays | None, metadata_version: str | None, checkpoint_version: str | None = None
) -> dict[str, str]:
    days = days or SourceDays()
    tags = {f"{split}_days": days_tag(days.split(split)) for split in ("train", "validation", "test")}
    tags["metadata_version"] = metadata_version or ""
    if checkpoint_version:
        tags["checkpoint_version"] = checkpoint_version
    return {key: value for key, value in tags.items() if value}


# The reports whose figures and tags are logged, by dataset (``reports``: each says what it logs).
REPORTS = {"training_summary": TrainingSummary, "evaluation_metrics": EvaluationReport, "scoring_report": ScoringReport}


def _log(tracked: Tracked) -> None:
    import mlflow

    for values, step in tracked.metrics:
        if values:
            mlflow.log_metrics(values, step=step)
    mlflow.set_tags(tracked.tags)


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


class TrackingHooks:
    def __init__(self) -> None:
        self.project: Path | None = None  # the project of the session being created
        self._catalog = None
        self._version: str | None = None
        self._run_id: str | None = None
        self._saved = False
        self._sigterm = None  # the SIGTERM handler this run replaced (``_watch_for_an_end``)

    def project_path(self) -> str:
        """``${project_path:}`` in mlflow.yml: the project folder of the session being created (the working
        folder before one is). An absolute store path, because MLflow caches a store by its URI: a relative
        ``sqlite:///data/...`` would keep writing into the first project a process opened (a notebook, tests)."""
        return str(self.project or Path.cwd())

    @hook_impl(tryfirst=True)  # before kedro-mlflow sets up the tracking server it names
    def after_context_created(self, context) -> None:
        self.project = Path(context.project_path)
        # MLflow draws a progress bar for every artifact it copies: noise between the run's log lines.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        patterns = context.config_loader.config_patterns
        patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])
        try:
            server = context.config_loader["mlflow"].get("server", {})
        except Exception:  # noqa: BLE001 - no mlflow.yml: kedro-mlflow's defaults, nothing to check here
            return
        uri = server.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith("sqlite:///"):  # SQLite creates the database file, not its folder (made here)
            store = Path(uri.removeprefix("sqlite:///"))
            try:
                check_writable(
                    store.parent, f"MLflow's tracking store {store}", "server.mlflow_tracking_uri (conf/*/mlflow.yml)"
                )
            except NotWritableError as error:
                raise NotWritableError(
                    f"{error} Or run without tracking: `{NO_TRACKING}`.", fix=[*error.fixes, NO_TRACKING]
                ) from None
            if store.exists() and not os.access(store, os.W_OK):
                raise NotWritableError(
                    f"MLflow's tracking store {store} is read-only: make it writable, point "
                    f"server.mlflow_tracking_uri (conf/local/mlflow.yml) elsewhere, or run without tracking: "
                    f"`{NO_TRACKING}`.",
                    fix=NO_TRACKING,
                )
        check_tracking_server(uri)

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        self._catalog, self._version = catalog, save_version

    @hook_impl
    def before_pipeline_run(self, run_params: dict) -> None:
        import mlflow

        run = mlflow.active_run()
        self._run_id = run.info.run_id if run is not None else None
        self._saved = False
        if run is None:
            return
        self._watch_for_an_end()
        mlflow.set_tag("kedro_run_version", self._version)
        # kedro-mlflow names a run after its pipelines (mlflow.yml run.name null): the run version names every
        # versioned output of the run and heads its summary, so it names the MLflow run too, with what it ran.
        pipelines = "+".join(run_params.get("pipeline_names") or ["__default__"])
        mlflow.set_tag("pipelines", run_name_pipelines(run_params.get("pipeline_names")))
        if run.info.run_name == pipelines:
            mlflow.set_tag("mlflow.runName", f"{self._version} {run_name_pipelines(run_params.get('pipeline_names'))}")

    @hook_impl(trylast=True)  # after kedro-mlflow's, which ends the run
    def after_pipeline_run(self) -> None:
        import mlflow

        self._end_own_runs(mlflow)

    def _watch_for_an_end(self) -> None:
        """A run that neither finishes nor fails, but ends (Ctrl-C: Kedro's hooks see no error, and MLflow's
        exit handler marked it FINISHED; SIGTERM, a scheduler's: nothing ran at all, RUNNING forever) is marked
        KILLED as the process exits. SIGTERM exits through Python's exit (code 143) so that it can be; its
        handler is this run's only (restored when the run ends)."""
        import atexit
        import signal
        import threading

        atexit.unregister(self._end_killed)
        atexit.register(self._end_killed)  # after MLflow's registration: run before its FINISHED
        if threading.current_thread() is threading.main_thread() and self._sigterm is None:
            current = signal.getsignal(signal.SIGTERM)
            if current in (signal.SIG_DFL, None):
                self._sigterm = current
                signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def _end_killed(self) -> None:
        import mlflow

        if self._run_id is None:  # it finished or failed (``_end_own_runs``), or never started
            return
        ended = False
        while (run := mlflow.active_run()) is not None and run.info.run_id == self._run_id:
            mlflow.end_run(status="KILLED")
            ended = True
        if not ended:  # not the active run here: ended by its id
            mlflow.MlflowClient().set_terminated(self._run_id, status="KILLED")
        self._run_id = None

    @hook_impl(trylast=True)  # after kedro-mlflow's, which ends the run as FAILED
    def on_pipeline_error(self, error: Exception) -> None:
        """A run refused before it saved anything (a node's check of its inputs, before any work) leaves no
        MLflow run behind: it measured nothing. Runs that failed otherwise, or after saving, stay FAILED."""
        import mlflow

        if self._run_id and not self._saved and user_error(error) is not None:
            mlflow.delete_run(self._run_id)
        self._end_own_runs(mlflow)

    def _end_own_runs(self, mlflow) -> None:
        # kedro-mlflow 2.0.3 restarts the run before each node, and with MLflow 3 each restart stays on MLflow's
        # stack of active runs: end them, or the next session in this process (a notebook, a test) logs into
        # this run.
        while self._run_id and (run := mlflow.active_run()) is not None and run.info.run_id == self._run_id:
            mlflow.end_run()
        self._run_id = None
        if self._sigterm is not None:
            import signal
            import threading

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None

    def _path(self, name: str) -> str | None:
        dataset = self._catalog.get(name) if self._catalog is not None else None
        return dataset.saved_path() if isinstance(dataset, VersionedFileDataset) else None

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        import mlflow

        if mlflow.active_run() is None:  # this pipeline's tracking is off (mlflow.yml: disable_tracking)
            return
        self._saved = True
        if dataset_name == "feature_metadata":
            mlflow.set_tags(_lineage_tags(data.source_days, self._version))
        elif dataset_name in REPORTS:
            _log(data.tracked())
        elif dataset_name == "dlrm_checkpoint":
            mlflow.set_tags(_lineage_tags(data.source_days, data.metadata_version, self._version))
            self._log_model(data)
        if dataset_name in ARTIFACTS and (path := self._path(dataset_name)):
            mlflow.log_artifact(path, artifact_path=dataset_name)

    def _log_model(self, checkpoint: Checkpoint) -> None:
        from criteo_dlrm.tracking.model import example_rows, log_checkpoint_model

        path = self._path("dlrm_checkpoint")
        parquet = next((day.parquet for day in checkpoint.source_days.validation), None)
        if path is None or parquet is None:
            return
        uri = log_checkpoint_model(path, example_rows(parquet))
        logger.info("MLflow model {} (load it with mlflow.pyfunc.load_model)", uri)

"""Project settings (see https://docs.kedro.org/en/stable/configure/configuration_basics/)."""

from criteo_dlrm.hooks import project_hooks
from criteo_dlrm.log_filters import quiet_on_import
from criteo_dlrm.logs import ConsoleSession
from criteo_dlrm.tracking.deferred_hook import DeferredMlflowHook
from criteo_dlrm.tracking.hooks import TrackingHooks, tracking_enabled

# Sessions that filter the warnings no user can act on and print one line per log record from their first
# line (criteo_dlrm/logs.py; the ``kedro`` command does the same before it loads plugins: ``kedro.init``).
SESSION_CLASS = ConsoleSession

# Experiment tracking (kedro-mlflow, conf/base/mlflow.yml) is on unless CRITEO_DLRM_TRACKING=off: then neither
# kedro-mlflow's hook nor ours runs, and MLflow is never imported. kedro-mlflow's hook is registered here, last (so
# it is called first, as its entry point's would be), in its deferred form: MLflow is imported when a pipeline
# starts, not by every command that makes a session (``kedro catalog``, ``kedro viz``).
_tracking = TrackingHooks()  # also resolves ${project_path:} in mlflow.yml (tracking on or off)
if tracking_enabled():
    HOOKS = (*project_hooks(), _tracking, DeferredMlflowHook(enabled=True))
    # kedro-mlflow's pyfunc class makes MLflow warn when it is first imported (log_filters). A process that reads
    # these settings but is no session of ours (kedro viz's server, a plain KedroSession) reads them before it
    # starts a run, which imports it: from here on it is imported quietly, when it is (a command that starts no
    # run, kedro --help, never imports MLflow).
    quiet_on_import("kedro_mlflow.mlflow.kedro_pipeline_model")
else:
    HOOKS = (*project_hooks(), DeferredMlflowHook(enabled=False))  # holds kedro-mlflow's entry point unloaded

CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/local (or --env) parameters are merged into conf/base key by key: overriding one nested value
    # keeps its siblings instead of replacing the whole pipeline block.
    "merge_strategy": {"parameters": "soft", "mlflow": "soft"},
    # ${project_path:} in mlflow.yml: the tracking store's absolute place inside the project.
    "custom_resolvers": {"project_path": _tracking.project_path},
    # spark.yml: the Spark session's properties (read by hooks.PreprocessingEngineHooks when preprocessing.engine is spark).
    "config_patterns": {"spark": ["spark*", "spark*/**"]},
}

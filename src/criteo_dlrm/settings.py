"""Project settings (see https://docs.kedro.org/en/stable/configure/configuration_basics/)."""

from criteo_dlrm.hooks import project_hooks
from criteo_dlrm.logs import configure_console, quiet_known_warnings
from criteo_dlrm.tracking.hooks import TrackingHooks, tracking_enabled

# The one thing done at import: Kedro imports this module before anything else of the project and before it
# loads its plugins (kedro-mlflow imports MLflow, which warns at import), and a Kedro CLI hook would run only
# after both. So the warnings no user can act on are filtered here, and log lines come one per line outside a
# terminal from the first line of a command (``hooks.ConsoleHooks`` does both again for a session created
# without the CLI).
quiet_known_warnings()
configure_console()

# Experiment tracking (kedro-mlflow, conf/base/mlflow.yml) is on unless CRITEO_DLRM_TRACKING=off: then neither
# kedro-mlflow's hook nor ours runs, and MLflow is never imported.
_tracking = TrackingHooks()  # also resolves ${project_path:} in mlflow.yml (tracking on or off)
if tracking_enabled():
    HOOKS = (*project_hooks(), _tracking)
else:
    HOOKS = project_hooks()
    DISABLE_HOOKS_FOR_PLUGINS = ("kedro-mlflow", "kedro_mlflow")  # its names on PyPI and in its wheel

CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/local (or --env) parameters are merged into conf/base key by key: overriding one nested value
    # keeps its siblings instead of replacing the whole pipeline block.
    "merge_strategy": {"parameters": "soft", "mlflow": "soft"},
    # ${project_path:} in mlflow.yml: the tracking store's absolute place inside the project.
    "custom_resolvers": {"project_path": _tracking.project_path},
    # spark.yml: the Spark session's properties (read by hooks.SparkHooks when preprocessing.engine is spark).
    "config_patterns": {"spark": ["spark*", "spark*/**"]},
}

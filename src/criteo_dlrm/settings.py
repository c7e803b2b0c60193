"""Project settings (see https://docs.kedro.org/en/stable/configure/configuration_basics/)."""

import logging
import warnings

from criteo_dlrm.hooks import ProjectHooks
from criteo_dlrm.logs import configure_console
from criteo_dlrm.tracking.hooks import TrackingHooks, project_path, tracking_enabled

# Kedro 1.7 calls OmegaConf's deprecated register_new_resolver: three warnings per command that no user
# of this project can act on.
warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)
# kedro-mlflow's own pyfunc class (for pipeline_ml_factory, unused here) has no type hints: MLflow says so, with
# raw terminal colour codes, at every import. MLflow raises it under a filter of its own (a warnings filter of
# ours never applies), through the "py.warnings" logger Kedro's logging captures warnings into.
logging.getLogger("py.warnings").addFilter(
    lambda record: "Add type hints to the `predict` method" not in record.getMessage()
)

# Log lines one per line outside a terminal, above the progress bars on one, from the first line of a run.
configure_console()

# Experiment tracking (kedro-mlflow, conf/base/mlflow.yml) is on unless CRITEO_DLRM_TRACKING=off: then neither
# kedro-mlflow's hook nor ours runs, and MLflow is never imported.
if tracking_enabled():
    HOOKS = (ProjectHooks(), TrackingHooks())
else:
    HOOKS = (ProjectHooks(),)
    DISABLE_HOOKS_FOR_PLUGINS = ("kedro-mlflow", "kedro_mlflow")  # its names on PyPI and in its wheel

CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/local (or --env) parameters are merged into conf/base key by key: overriding one nested value
    # keeps its siblings instead of replacing the whole pipeline block.
    "merge_strategy": {"parameters": "soft", "mlflow": "soft"},
    # ${project_path:} in mlflow.yml: the tracking store's absolute place inside the project.
    "custom_resolvers": {"project_path": project_path},
}

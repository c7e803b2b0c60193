"""Project settings (see https://docs.kedro.org/en/stable/configure/configuration_basics/)."""

from criteo_dlrm.hooks import ProjectHooks

HOOKS = (ProjectHooks(),)

CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
}

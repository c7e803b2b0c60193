"""Project settings (see https://docs.kedro.org/en/stable/configure/configuration_basics/)."""

import warnings

from criteo_dlrm.hooks import ProjectHooks
from criteo_dlrm.logs import configure_console

# Kedro 1.7 calls OmegaConf's deprecated register_new_resolver: three warnings per command that no user
# of this project can act on.
warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)

# Log lines one per line outside a terminal, above the progress bars on one, from the first line of a run.
configure_console()

HOOKS = (ProjectHooks(),)

CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/local (or --env) parameters are merged into conf/base key by key: overriding one nested value
    # keeps its siblings instead of replacing the whole pipeline block.
    "merge_strategy": {"parameters": "soft"},
}

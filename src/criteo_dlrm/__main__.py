"""criteo-dlrm file for ensuring the package is executable
as `criteo-dlrm` and `python -m criteo_dlrm`
"""

import sys
from pathlib import Path
from typing import Any

from kedro.framework.cli.utils import find_run_command
from kedro.framework.project import configure_project

from criteo_dlrm.logs import prepare_console


def main(*args, **kwargs) -> Any:
    package_name = Path(__file__).parent.name
    prepare_console()  # what ``kedro``'s ``kedro.init`` entry point does, before the plugins' commands load
    configure_project(package_name)

    interactive = hasattr(sys, "ps1")
    kwargs["standalone_mode"] = not interactive

    run = find_run_command(package_name)
    return run(*args, **kwargs)


if __name__ == "__main__":
    main()

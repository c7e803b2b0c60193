"""Where log lines go: loguru into Kedro's ``logging``, and a console handler that never wraps or collides.

On a terminal, Kedro's rich handler (colours, and log lines printed above tqdm's bars instead of through
them). Elsewhere (a pipe, a file, CI) one plain line per message, never wrapped at 80 columns, so a path or a
command in a message can be copied whole.

Nothing here runs at import. ``prepare_console`` sets it all up, and three of Kedro's own extension points call
it, each before the first line or warning of the entry it covers:

- ``on_kedro_command``, the ``kedro.init`` entry point (pyproject.toml): every ``kedro`` command in this
  project, first, before Kedro loads its plugins' commands (kedro-mlflow's import makes MLflow warn);
- ``ConsoleSession``, ``settings.SESSION_CLASS``: every session Kedro creates (``kedro run``, ``%load_ext
  kedro.ipython`` in a notebook, the ``criteo-dlrm`` script), before it loads plugin hooks and configuration;
- ``hooks.ConsoleHooks``: a session code creates itself with ``KedroSession.create`` (a script, a test;
  kedro-viz only with ``--include-hooks``: its server process otherwise runs no project hook, and prints the
  known warnings at its start).
"""

from __future__ import annotations

import logging
import os
import sys
import tomllib
from pathlib import Path

import yaml
from kedro.framework.session import KedroSession
from loguru import logger

from criteo_dlrm.common.commands import current_invocation
from criteo_dlrm.log_filters import UnactionableWarnings, ignore_warnings, quiet_child_processes


class _PropagateHandler(logging.Handler):
    """Hands loguru records to the standard logger of the same module name, which Kedro configures."""

    def emit(self, record: logging.LogRecord) -> None:
        fixes = getattr(record, "extra", {}).get("fixes")
        if fixes:  # a line that shows a fix alone (``logger.bind(fixes=...)``) shows it merged into the user's command
            record.msg, record.args = current_invocation().render(record.getMessage(), fixes), ()
        logging.getLogger(record.name).handle(record)


def bridge_loguru() -> None:
    """Route loguru through ``logging`` so ``conf/logging.yml`` decides where our messages go."""
    logger.remove()
    logger.add(_PropagateHandler(), format="{message}", level="DEBUG")


# Libraries whose lines about a failing run only repeat or misdirect a user error's message (Kedro's "Node ...
# failed with error", its ``--from-nodes`` hint, kedro-mlflow's "was closed because of an error", once per run
# it restarted): ``kedro run`` prints the message once, last, with the fix.
_REPEATERS = ("kedro", "kedro_mlflow")


def not_about_a_user_error(record: logging.LogRecord) -> bool:
    """False for a Kedro or kedro-mlflow record logged while a ``UserError`` is being handled (loggers run in
    the thread that raised, inside its ``except``)."""
    if record.name.split(".")[0] not in _REPEATERS:
        return True
    from criteo_dlrm.common.errors import user_error

    return user_error(sys.exc_info()[1]) is None


class ConsoleHandler(logging.Handler):
    """Kedro's rich handler on a terminal, printing above tqdm's bars; one unwrapped line per record otherwise."""

    def __init__(self, rich: logging.Handler) -> None:
        super().__init__(rich.level)
        self._terminal = sys.stdout.isatty()
        self._handler = rich
        if not self._terminal:
            self._handler = logging.StreamHandler(sys.stdout)
            self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))
        self.addFilter(lambda record: all(f.filter(record) for f in rich.filters))
        self.addFilter(not_about_a_user_error)

    def emit(self, record: logging.LogRecord) -> None:
        if self._terminal:
            from tqdm import tqdm

            with tqdm.external_write_mode(file=sys.stdout):  # clears the bars, prints, redraws them
                self._handler.handle(record)
        else:
            self._handler.handle(record)


def configure_console() -> None:
    """Put a ``ConsoleHandler`` in place of each rich handler ``conf/logging.yml`` gave the root logger."""
    from kedro.logging import RichHandler

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, RichHandler):
            root.removeHandler(handler)
            root.addHandler(ConsoleHandler(handler))


def quiet_known_warnings() -> None:
    """Filter the warnings no user of this project can act on (``log_filters``): as warnings here, and on the
    ``py.warnings`` logger Kedro's logging captures them into (MLflow's is issued under a warnings filter of its
    own, so only the logger's filter drops it)."""
    ignore_warnings()
    captured = logging.getLogger("py.warnings")
    if not any(isinstance(f, UnactionableWarnings) for f in captured.filters):
        captured.addFilter(UnactionableWarnings())


def prepare_console() -> None:
    """The known warnings filtered, loguru routed into ``logging``, the console handler in place (idempotent)."""
    quiet_known_warnings()
    bridge_loguru()
    configure_console()


PACKAGE = __name__.split(".")[0]


def on_kedro_command() -> None:
    """Kedro's ``kedro.init`` entry point: when the ``kedro`` command runs in this project, from its root folder or
    any folder inside it, the console prepared and the project's root made the working directory.

    The root, because every relative path this project keeps (the catalog's, the parameters', those recorded in
    the lineage) is relative to it: from ``notebooks/`` a rerun checked the lineage's paths against the wrong
    folder and refused, and a suggested command wrote a second copy of the data there.

    Kedro calls every installed package's ``kedro.init`` entry point for every command, whichever project it runs
    in, so this acts only where the working directory's project (``[tool.kedro]`` in its ``pyproject.toml``) is
    this package."""
    from kedro.utils import find_kedro_project

    root = find_kedro_project(Path.cwd())
    if root is None:
        return
    try:
        package = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["kedro"]["package_name"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return  # not a readable project: Kedro itself says so
    if package == PACKAGE:
        from criteo_dlrm.tracking.commands import defer_mlflow_commands

        defer_mlflow_commands()  # before Kedro loads the plugins' commands: ``kedro --help`` without MLflow
        quiet_child_processes(os.environ)  # kedro viz's server, a process of its own, is never prepared here
        moved = Path.cwd().resolve() != root.resolve()
        if moved:
            os.chdir(root)
            _project_logging()
        prepare_console()
        if moved:
            logger.info("working in the project's folder {} (relative paths are the project's)", root)


def _project_logging(root: Path = Path()) -> None:
    """The project's ``conf/logging.yml`` (``root``: the project's folder), which Kedro looked for in the folder
    the command or the notebook's kernel started in (unless ``KEDRO_LOGGING_CONFIG`` names a file)."""
    from kedro.framework.project import configure_logging

    path = Path(root) / "conf" / "logging.yml"
    if "KEDRO_LOGGING_CONFIG" not in os.environ and path.is_file():
        configure_logging(yaml.safe_load(path.read_text(encoding="utf-8")))


class ConsoleSession(KedroSession):
    """``settings.SESSION_CLASS``: a ``KedroSession`` whose ``create`` prepares the console first, so the warnings
    of loading plugin hooks and configuration are filtered and every line is one line."""

    @classmethod
    def create(cls, *args, **kwargs) -> KedroSession:
        root = kwargs.get("project_path") or (args[0] if args else None)
        if root is not None and Path(root).resolve() != Path.cwd().resolve():
            _project_logging(Path(root))  # a notebook's kernel in notebooks/: the project's logging, not Kedro's
        prepare_console()
        return super().create(*args, **kwargs)

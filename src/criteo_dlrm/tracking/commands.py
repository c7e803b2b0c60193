"""kedro-mlflow's ``kedro mlflow`` commands, imported when one of them runs instead of by every ``kedro`` command.

Kedro imports each plugin's command module whenever a ``kedro`` command starts, to list its commands, and
kedro-mlflow's (``kedro_mlflow.framework.cli.cli``) imports MLflow at its top: 1.6 s of ``kedro --help``'s
3.2 s on two cores, paid by ``kedro viz``, ``kedro catalog`` and every mistyped command too.

``defer_mlflow_commands`` (called by ``logs.on_kedro_command``, Kedro's ``kedro.init`` entry point, which runs
before Kedro loads the plugins' commands) puts a stand-in for that module in ``sys.modules``. Its ``commands``
group holds one ``mlflow`` group with kedro-mlflow's own help line; listing or running what is inside it
(``kedro mlflow --help``, ``kedro mlflow ui``) imports kedro-mlflow's module and hands the work to its group, so
each command behaves exactly as kedro-mlflow defines it. Any other name read from the stand-in is read from the
real module, imported then.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import click

MODULE = "kedro_mlflow.framework.cli.cli"
# kedro-mlflow's help line for its group (``mlflow_commands``' docstring), shown by ``kedro --help``.
HELP = "Use mlflow-specific commands inside kedro project."


def _real_module() -> types.ModuleType:
    if isinstance(sys.modules.get(MODULE), _StandIn):
        del sys.modules[MODULE]
    return importlib.import_module(MODULE)


def _real_group() -> click.Group:
    """kedro-mlflow's ``mlflow`` group (its module imported now)."""
    return _real_module().mlflow_commands


class _DeferredGroup(click.Group):
    """``kedro mlflow``: its help line without MLflow; its commands kedro-mlflow's, imported when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return _real_group().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _real_group().get_command(ctx, cmd_name)


class _StandIn(types.ModuleType):
    """The module Kedro imports for kedro-mlflow's commands, until any other name of it is read."""

    def __getattr__(self, name: str):
        return getattr(_real_module(), name)


def defer_mlflow_commands() -> None:
    """Put the stand-in in place, unless kedro-mlflow's command module is imported already or not installed."""
    if MODULE in sys.modules or importlib.util.find_spec("kedro_mlflow") is None:
        return
    stand_in = _StandIn(MODULE, __doc__)
    stand_in.__file__ = __file__

    @click.group(name="Mlflow")
    def commands() -> None:
        """Kedro plugin for interactions with mlflow."""

    commands.add_command(_DeferredGroup(name="mlflow", help=HELP))
    stand_in.commands = commands
    sys.modules[MODULE] = stand_in

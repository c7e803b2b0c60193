"""``kedro run`` for this project: Kedro's own command, with three changes a user sees.

- ``--params`` takes list values: commas inside brackets do not split
  (``--params="training.dense_mlp.hidden_layer_sizes=[128,64],training.seed=3"``).
- A user error (``criteo_dlrm.common.errors.UserError``: missing inputs, bad parameters, bad raw data, a
  version that does not exist) ends the run with its message and fix as the last lines and exit
  code 1, without a traceback; ``--verbose`` shows the full traceback.
- A run that finishes prints its summary (what was written, the final metrics) as one block.

Kedro picks this module's ``cli`` group over its built-in commands (see Kedro's "add or modify CLI
commands").
"""

from __future__ import annotations

from typing import Any

import click
from kedro.framework.cli.project import run as kedro_run
from omegaconf import OmegaConf

from criteo_dlrm.common.errors import UserError


def split_params(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Kedro's ``--params`` parsing (OmegaConf dot-list), except that commas inside ``[...]`` or ``{...}``
    stay in their value instead of splitting it."""
    if isinstance(value, dict):  # from a --config file
        return value
    items, depth, current = [], 0, ""
    for char in value:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    dot_list = []
    for item in filter(str.strip, [*items, current]):
        key, equals, val = item.partition("=")
        if not equals or not key.strip():
            ctx.fail(f"Invalid format of `--params` option: item `{item}` must be key=value.")
        dot_list.append(f"{key.strip()}={val}")
    return OmegaConf.to_container(OmegaConf.from_dotlist(dot_list))


def user_error(error: BaseException | None) -> UserError | None:
    """The first ``UserError`` in ``error``'s chain of causes (Kedro wraps dataset and node errors)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class UserErrorExit(click.ClickException):
    """Shows a user error's message alone, in red, and exits with code 1."""

    def __init__(self, error: UserError):
        super().__init__(f"{type(error).__name__}: {error}")

    def show(self, file: Any = None) -> None:
        click.secho(f"\n{self.message}\n(Full traceback: add --verbose.)", err=True, fg="red")


def _options() -> list[click.Parameter]:
    options = []
    for option in kedro_run.params:
        if option.name == "params":
            option = click.Option(
                ["--params"],
                type=click.UNPROCESSED,
                default="",
                callback=split_params,
                help=f"{option.help} Lists work: key=[1,2].",
            )
        options.append(option)
    options.append(click.Option(["--verbose", "-v"], is_flag=True, help="Show full tracebacks of user errors."))
    return options


@click.group(name="criteo-dlrm")
def cli() -> None:
    """criteo-dlrm's commands (Kedro's ``run`` with clear user errors and list parameters)."""


@cli.command(name="run", params=_options(), help=kedro_run.help)
@click.pass_context
def run(ctx: click.Context, verbose: bool, **kwargs: Any) -> Any:
    from criteo_dlrm.hooks import run_summary

    try:
        result = ctx.invoke(kedro_run, **kwargs)
    except Exception as error:
        found = user_error(error)
        if found is None or verbose:
            raise
        raise UserErrorExit(found) from None
    summary = run_summary()
    if summary:
        click.echo("\n" + summary)
    return result

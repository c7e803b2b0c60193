"""``kedro run`` for this project: Kedro's own command, with three changes a user sees.

- ``--params`` takes list values: commas inside brackets do not split
  (``--params="training.dense_mlp.hidden_layer_sizes=[128,64],training.seed=3"``).
- A user error (``criteo_dlrm.common.errors.UserError``: missing inputs, bad parameters, bad raw data, a
  version that does not exist) ends the run with its message and fix as the last lines and exit
  code 1, without a traceback; ``--verbose`` shows the full traceback.
- A misspelt ``--pipelines`` or ``--load-versions`` name, or a pinned dataset without a version, ends with
  a message naming what exists, not a traceback.
- A run that finishes prints its summary (what was written, the final metrics) as one block.

Kedro picks this module's ``cli`` group over its built-in commands (see Kedro's "add or modify CLI
commands").
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import click
import yaml
from kedro.framework.cli.project import run as kedro_run
from loguru import logger
from omegaconf import OmegaConf

from criteo_dlrm.common.commands import Invocation, dotted, invoked
from criteo_dlrm.common.errors import ConfigError, UserError, user_error
from criteo_dlrm.pipeline_registry import PIPELINE_ORDER, PIPELINES
from criteo_dlrm.summary import render


def _closest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def check_pipelines(names: list[str]) -> None:
    """Refuse a pipeline name the project does not have, naming the ones it has."""
    known = [*PIPELINES, "__default__"]
    unknown = [f"{name!r}{_closest(name, known)}" for name in names if name not in known]
    if unknown:
        raise ConfigError(f"No pipeline named {', '.join(unknown)}. The pipelines: {', '.join(PIPELINES)}.")


_MERGE = "tag:yaml.org,2002:merge"
# OmegaConf's limit on the nodes aliases expand to (its default ``max_yaml_expanded_nodes``).
EXPANDED_NODES_AT_MOST = 10_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (where YAML keeps the last silently); merge
    keys (``<<: *base``) work as in YAML, a key of the mapping itself overriding a merged one."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def _expanded_nodes(value, limit: int) -> int:
    """How many nodes ``value`` has with every alias expanded, counting up to ``limit`` + 1 at most."""
    count, stack = 0, [value]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def yaml_problem(path: Path, text: str) -> str | None:
    """What makes ``text`` (the file ``path``) unreadable as this project's YAML, with its line and column; None
    when it reads: a syntax error, a tag that would construct a Python object, a key given twice, aliases that
    expand beyond what OmegaConf reads."""
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        if "could not determine a constructor for the tag" in problem:
            problem += " (configuration holds plain values: strings, numbers, lists and mappings; tags are not read)"
        return f"{path}{where}: {problem}"
    if _expanded_nodes(value, EXPANDED_NODES_AT_MOST) > EXPANDED_NODES_AT_MOST:
        return (
            f"{path}: its aliases (*name) expand to more than {EXPANDED_NODES_AT_MOST:,} values, more than Kedro's "
            "configuration loader (OmegaConf) reads; write the values out, or use fewer levels of aliases"
        )
    return None


def check_environment(conf_source: Path, env: str | None) -> None:
    """Refuse an ``--env`` with no folder in ``conf_source``, naming the environments there (Kedro went on without
    it and failed hundreds of lines later, in MLflow's tracking store); say, in the log, that conf/local is left
    out when another environment is asked for and conf/local holds settings (Kedro's rule, silent otherwise)."""
    if not env:
        return
    known = (
        sorted(p.name for p in conf_source.iterdir() if p.is_dir() and p.name != "base") if conf_source.is_dir() else []
    )
    if not (conf_source / env).is_dir():
        raise ConfigError(
            f"No environment {env!r}{_closest(env, known)}: {conf_source} has no folder {env}. The environments: "
            f"{', '.join(known) or 'none besides base'}."
        )
    local = conf_source / "local"
    if env != "local" and local.is_dir() and any(local.glob("**/*.y*ml")):
        logger.info("--env={}: conf/{} is read over conf/base; conf/local's settings are left out", env, env)


def check_conf_files(conf_source: Path, env: str | None) -> None:
    """Refuse, before Kedro reads them, configuration files of this run's environments (``base`` and ``env``,
    ``local`` by default) that are not UTF-8, not YAML, or give a key twice: naming the file, line and column."""
    problems = []
    for folder in (conf_source / "base", conf_source / (env or "local")):
        for path in sorted([*folder.glob("**/*.yml"), *folder.glob("**/*.yaml")]) if folder.is_dir() else []:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as error:
                line = data[: error.start].count(b"\n") + 1
                problems.append(
                    f"{path}, line {line}: byte 0x{data[error.start]:02x} is not UTF-8; save the file as UTF-8"
                )
                continue
            if problem := yaml_problem(path, text):
                problems.append(problem)
    if problems:
        raise ConfigError(
            "Configuration files Kedro cannot read:\n  "
            + "\n  ".join(problems)
            + "\nFix them and run the same command again."
        )


def versioned_datasets(conf_source: Path = Path("conf")) -> dict[str, str]:
    """The catalog's versioned datasets (what ``--load-versions`` can pin) and their folders, from
    ``conf/*/catalog*.yml``."""
    found = {}
    for path in sorted(conf_source.glob("*/catalog*.yml")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if problem := yaml_problem(path, text):  # the run's own check names it with the others
            raise UserErrorExit(ConfigError(f"A configuration file Kedro cannot read: {problem}. Fix it and run "
                                            "the same command again."))  # fmt: skip
        for name, entry in (yaml.load(text, Loader=_UniqueKeyLoader) or {}).items():  # noqa: S506 - a safe loader
            if isinstance(entry, dict) and entry.get("versioned"):
                found[name] = str(entry.get("filepath", name))
    return dict(sorted(found.items()))


def split_load_versions(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, str]:
    """``dataset:version,...`` -> ``{dataset: version}``; a dataset the catalog does not version, or a missing
    version, is refused naming the datasets and where their versions are."""
    folders = versioned_datasets()
    known = list(folders)
    pinned, problems = {}, []
    for item in filter(None, (part.strip() for part in (value or "").split(","))):
        name, colon, version = item.partition(":")
        if known and name not in known:
            problems.append(f"{name!r} is not a versioned dataset{_closest(name, known)}")
        elif not colon or not version:
            problems.append(f"{name}: no version given; use {name}:<version> (the versions: ls {folders.get(name)})")
        else:
            pinned[name] = version
    if problems:
        raise UserErrorExit(
            ConfigError(
                f"--load-versions={value}: " + "; ".join(problems) + f". The versioned datasets: {', '.join(known)}."
            )
        )
    return pinned


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


class UserErrorExit(click.ClickException):
    """Shows a user error's message alone, in red, and exits with code 1."""

    def __init__(self, error: UserError, invocation: Invocation | None = None):
        message = (invocation or Invocation()).render(str(error), error.fixes)
        super().__init__(f"{type(error).__name__}: {message}")

    def show(self, file: Any = None) -> None:
        click.secho(f"\n{self.message}\n(Full traceback: add --verbose.)", err=True, fg="red")


def _options() -> list[click.Parameter]:
    options = []
    for option in kedro_run.params:
        if option.name == "load_versions":
            option = click.Option(
                list(option.opts), type=str, multiple=False, default="", callback=split_load_versions, help=option.help
            )
        elif option.name == "params":
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


def invocation(options: dict[str, Any]) -> Invocation:
    """What the user typed, from ``kedro run``'s parsed options: suggested commands start from it."""
    pipelines = [*(options.get("pipelines") or ()), *filter(None, [options.get("pipeline")])]
    return Invocation(
        pipelines=tuple(pipelines),
        params=dotted(options.get("params") or {}),
        load_versions=dict(options.get("load_versions") or {}),
        env=options.get("env"),
    )


def _summary_hooks():
    from criteo_dlrm.hooks import SummaryHooks
    from criteo_dlrm.settings import HOOKS

    return next(hook for hook in HOOKS if isinstance(hook, SummaryHooks))


EPILOG = (
    f"\b\nThis project's pipelines: {', '.join(PIPELINES)}; none named: {', '.join(PIPELINE_ORDER)}, the whole job "
    "(--pipelines=scoring scores new days with the newest checkpoint: docs/scoring.md).\n"
    'Parameters: --params="training.num_epochs=5,training.seed=3"; every one, with its default and range, in '
    "conf/base/parameters_*.yml and docs/parameters.md.\n"
    "Versions: --load-versions=dlrm_checkpoint:<version> (ls data/06_models/dlrm_checkpoint.pt)."
)


@cli.command(name="run", params=_options(), help=kedro_run.help, epilog=EPILOG)
@click.pass_context
def run(ctx: click.Context, verbose: bool, **kwargs: Any) -> Any:
    typed = invocation(kwargs)
    try:
        check_pipelines([*(kwargs.get("pipelines") or []), *filter(None, [kwargs.get("pipeline")])])
        check_environment(Path(kwargs.get("conf_source") or "conf"), kwargs.get("env"))
        check_conf_files(Path(kwargs.get("conf_source") or "conf"), kwargs.get("env"))
        with invoked(typed):
            result = ctx.invoke(kedro_run, **kwargs)
    except Exception as error:
        found = user_error(error)
        if found is None or verbose:
            raise
        raise UserErrorExit(found, typed) from None
    summary = render(_summary_hooks().record)
    if summary:
        click.echo("\n" + summary)
    return result

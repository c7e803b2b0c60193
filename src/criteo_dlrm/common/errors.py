"""Errors a user can fix, shared by the core and the Kedro adapters.

Their message says what is wrong and what to do; ``kedro run`` prints it alone as its last lines (the
full traceback with ``--verbose``), where any other exception keeps its traceback.

Where the fix is a ``kedro run``, the error carries it as data (``Fix``): the message shows the fix alone
(``kedro run --pipelines=ingestion``), which a notebook or a test sees, and the ``kedro run`` command line
(``criteo_dlrm.cli``) shows the user's own command with the fix merged in (``common.commands``). The core
builds a ``Fix``; it never reads how the run was started.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

# ``Fix(pipelines=WHOLE_JOB)``: the whole job on the current data (no --pipelines, none of the user's pinned versions).
WHOLE_JOB = "__default__"


@dataclass(frozen=True)
class Fix:
    """A ``kedro run`` that gets past an error: what changes in the user's command.

    Attributes:
        pipelines: the pipelines to run (empty: the user's own; ``WHOLE_JOB``: the whole job, without the
            user's pinned versions).
        params: dotted parameter names and values, replacing the user's own for the same names.
        defaults: dotted names and values used only where the user's command sets none (a rate that goes with a
            suggested optimiser, unless the user chose one).
        load_versions: datasets to pin, added to the user's pins.
        environment: variables set before the command (``CRITEO_DLRM_TRACKING=off kedro run``).
    """

    pipelines: tuple[str, ...] | str = ()
    params: Mapping[str, object] = field(default_factory=dict)
    defaults: Mapping[str, object] = field(default_factory=dict)
    load_versions: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        """The fix alone, as a user types it: ``kedro run --pipelines=training``."""
        return command(self)

    def to_dict(self) -> dict:
        return {key: list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
                for key, value in asdict(self).items()}  # fmt: skip

    @classmethod
    def from_dict(cls, values: Mapping) -> Fix:
        pipelines = values.get("pipelines", ())
        return cls(**{**values, "pipelines": pipelines if isinstance(pipelines, str) else tuple(pipelines)})


def command(
    fix: Fix,
    pipelines: Sequence[str] = (),
    params: Mapping[str, object] | None = None,
    load_versions: Mapping[str, str] | None = None,
    env: str | None = None,
) -> str:
    """``[VAR=value] kedro run [--pipelines=a,b] [--params=k=v,...] [--load-versions=d:v,...] [--env=e]``: the
    command a user typed (``pipelines``, dotted ``params``, ``load_versions``, ``env``; none: a bare ``kedro run``)
    with ``fix`` merged in, quoted where a shell would split or expand it (a space in a path, a list's brackets)."""
    user_params, user_versions = dict(params or {}), dict(load_versions or {})
    if fix.pipelines == WHOLE_JOB:
        chosen, versions = [], dict(fix.load_versions)
    else:
        chosen = [fix.pipelines] if isinstance(fix.pipelines, str) else list(fix.pipelines or pipelines)
        versions = {**user_versions, **fix.load_versions}
    merged = {**user_params, **fix.params, **{k: v for k, v in fix.defaults.items() if k not in user_params}}
    parts = []
    if chosen:
        parts.append(f"--pipelines={','.join(chosen)}")
    if merged:
        parts.append("--params=" + ",".join(f"{key}={_value(value)}" for key, value in merged.items()))
    if versions:
        parts.append("--load-versions=" + ",".join(f"{name}:{version}" for name, version in versions.items()))
    if env:
        parts.append(f"--env={env}")
    variables = [f"{name}={shlex.quote(str(value))}" for name, value in fix.environment.items()]
    return " ".join([*variables, "kedro run", *map(shlex.quote, parts)])


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


@dataclass(frozen=True)
class Remedy:
    """A sentence saying what to do, showing ``fix`` alone (```kedro run ...```): for code that words an error
    around a fix it is given (``common.storage.reading``)."""

    text: str
    fix: Fix

    def __str__(self) -> str:
        return self.text


Advice = Fix | Remedy | str  # what an error can be given as its fix: a command, a sentence with one, plain words


def fixes_of(advice: Advice | Sequence[Advice]) -> tuple[Fix, ...]:
    """The commands in ``advice``, in order."""
    if isinstance(advice, Fix):
        return (advice,)
    if isinstance(advice, Remedy):
        return (advice.fix,)
    if isinstance(advice, str):
        return ()
    return tuple(fix for item in advice for fix in fixes_of(item))


class UserError(Exception):
    """A problem with the user's data, parameters or order of runs, not a bug: the message is the fix.

    ``fix``: the ``kedro run`` (or runs) that get past it, each shown in the message as ```{fix}``` (the fix
    alone); the command line shows the user's own command with it merged in (a ``Remedy`` gives its fix; plain
    words give none).
    """

    def __init__(self, message: str = "", *, fix: Advice | Sequence[Advice] = ()):
        super().__init__(message)
        self.fixes: tuple[Fix, ...] = fixes_of(fix)


class ConfigError(UserError, ValueError):
    """Inconsistent or missing settings; the message names the values to change."""


class DataError(UserError, ValueError):
    """Input data that is missing, damaged or not what a pinned run recorded; the message names the file."""


def user_error(error: BaseException | None) -> UserError | None:
    """The first ``UserError`` in ``error``'s chain of causes (Kedro wraps dataset and node errors)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None

"""The ``kedro run`` commands that messages suggest: the user's own command line with the fix merged in.

A suggestion that drops the user's arguments runs something else: ``kedro run
--params=ingestion.rows_per_day=1429`` after ``kedro run --params=ingestion.raw_dir=/data/kaggle`` trains on
the bundled sample, not the user's data. So ``cli.run`` records the invocation (``invoked``), and every
suggested command starts from it: the same pipelines (unless the fix names others), every ``--params`` (the
fix's values replacing the user's for the same keys), every ``--load-versions`` and the ``--env``. Outside a
``kedro run`` (a notebook, a test calling a node) there is no invocation and the command is the fix alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

# ``kedro_run(WHOLE_JOB)``: the whole job on the current data (no --pipelines, no pinned versions).
WHOLE_JOB = "__default__"


@dataclass(frozen=True)
class Invocation:
    """What the user typed: ``kedro run`` with these pipelines, parameters (dotted names), versions and env."""

    pipelines: tuple[str, ...] = ()
    params: dict[str, object] = field(default_factory=dict)
    load_versions: dict[str, str] = field(default_factory=dict)
    env: str | None = None


_INVOCATION: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar("kedro_run_invocation", default=None)
# Worker processes (conversion, encoding, training ranks) raise messages too: they read the invocation from here.
_ENVIRONMENT = "CRITEO_DLRM_INVOCATION"


def current_invocation() -> Invocation:
    """The ``kedro run`` this process (or the process that started it) is serving; empty outside one."""
    found = _INVOCATION.get()
    if found is not None:
        return found
    try:
        values = json.loads(os.environ.get(_ENVIRONMENT, "") or "{}")
        return Invocation(tuple(values.get("pipelines", ())), values.get("params", {}), values.get("load_versions", {}),
                          values.get("env"))  # fmt: skip
    except (ValueError, AttributeError, TypeError):
        return Invocation()


def dotted(params: Mapping, prefix: str = "") -> dict[str, object]:
    """``{"training": {"seed": 3}}`` -> ``{"training.seed": 3}`` (lists stay values)."""
    flat: dict[str, object] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(dotted(value, f"{name}."))
        else:
            flat[name] = value
    return flat


@contextlib.contextmanager
def invoked(invocation: Invocation) -> Iterator[None]:
    """Within the block, suggested commands start from ``invocation``."""
    token = _INVOCATION.set(invocation)
    before = os.environ.get(_ENVIRONMENT)
    os.environ[_ENVIRONMENT] = json.dumps(asdict(invocation), default=str)
    try:
        yield
    finally:
        _INVOCATION.reset(token)
        if before is None:
            os.environ.pop(_ENVIRONMENT, None)
        else:
            os.environ[_ENVIRONMENT] = before


def kedro_run(
    pipelines: Sequence[str] | str | None = None,
    params: Mapping[str, object] | None = None,
    load_versions: Mapping[str, str] | None = None,
) -> str:
    """``kedro run [--pipelines=a,b] [--params=k=v,...] [--load-versions=d:v,...] [--env=e]``: the user's command
    with ``pipelines`` (None: the user's own; ``WHOLE_JOB``: none, and no pinned versions), ``params`` and
    ``load_versions`` merged in, as the user types it."""
    user = current_invocation()
    versions = {**user.load_versions, **(load_versions or {})}
    if pipelines == WHOLE_JOB:
        chosen, versions = [], dict(load_versions or {})
    elif pipelines:
        chosen = [pipelines] if isinstance(pipelines, str) else list(pipelines)
    else:
        chosen = list(user.pipelines)
    merged = {**user.params, **(params or {})}
    parts = []
    if chosen:
        parts.append(f"--pipelines={','.join(chosen)}")
    if merged:
        parts.append("--params=" + ",".join(f"{key}={_value(value)}" for key, value in merged.items()))
    if versions:
        parts.append("--load-versions=" + ",".join(f"{name}:{version}" for name, version in versions.items()))
    if user.env:
        parts.append(f"--env={user.env}")
    # Quoted where a shell would split or expand it (a space in a path, the brackets of a list).
    return " ".join(["kedro run", *map(shlex.quote, parts)])


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

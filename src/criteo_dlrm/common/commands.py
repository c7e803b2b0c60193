"""The ``kedro run`` commands that messages suggest, built in one place so their spelling cannot drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def kedro_run(
    pipelines: Sequence[str] | str | None = None,
    params: Mapping[str, object] | None = None,
    load_versions: Mapping[str, str] | None = None,
) -> str:
    """``kedro run [--pipelines=a,b] [--params=k=v,...] [--load-versions=d:v,...]``, as a user types it."""
    parts = ["kedro run"]
    if pipelines:
        parts.append(f"--pipelines={pipelines if isinstance(pipelines, str) else ','.join(pipelines)}")
    if params:
        parts.append("--params=" + ",".join(f"{key}={_value(value)}" for key, value in params.items()))
    if load_versions:
        parts.append("--load-versions=" + ",".join(f"{name}:{version}" for name, version in load_versions.items()))
    return " ".join(parts)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)

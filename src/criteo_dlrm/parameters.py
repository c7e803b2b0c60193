"""Refuse parameter names the project does not know, before anything runs.

The schema is the project's own ``conf/base/parameters_*.yml``: every key a user may set is there with
its default. A misspelt ``--params=training.num_epoch=5`` would otherwise be ignored without a word.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

import yaml

# Set on the command line only (the catalog reads them through ``runtime_params``).
RUNTIME_ONLY = {"ingestion": {"raw_dir": None}}


class ParameterError(ValueError):
    """A parameter name that no pipeline reads."""


def load_schema(conf_base: Path) -> dict:
    """Every parameter key of ``conf/base/parameters*.yml``, with the runtime-only ones."""
    schema: dict = {}
    for path in sorted(conf_base.glob("parameters*.yml")):
        schema.update(yaml.safe_load(path.read_text()) or {})
    for section, keys in RUNTIME_ONLY.items():
        schema.setdefault(section, {}).update(keys)
    return schema


def unknown_parameters(given: Mapping, schema: Mapping, prefix: str = "") -> list[str]:
    """Dotted names in ``given`` that ``schema`` lacks, each with the closest known name when one is near.

    A mapping whose default is empty (e.g. ``vocabulary_size_overrides: {}``) takes any key.
    """
    unknown = []
    for key, value in given.items():
        name = f"{prefix}{key}"
        if key not in schema:
            close = difflib.get_close_matches(str(key), [str(k) for k in schema], n=1)
            unknown.append(name + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
        elif isinstance(schema[key], Mapping) and schema[key] and isinstance(value, Mapping):
            unknown.extend(unknown_parameters(value, schema[key], f"{name}."))
    return unknown


def check_parameters(given: Mapping, schema: Mapping) -> None:
    """Raise ``ParameterError`` listing every unknown parameter name."""
    unknown = unknown_parameters(given, schema)
    if unknown:
        raise ParameterError(
            "Unknown parameter(s): " + "; ".join(unknown) + ". The known ones, with their defaults and "
            "meanings, are in conf/base/parameters_<pipeline>.yml and the README."
        )

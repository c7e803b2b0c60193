"""Refuse parameter names the project does not know, before anything runs.

The schema is the project's own ``conf/base/parameters_*.yml``: every key a user may set is there with
its default. A misspelt ``--params=training.num_epoch=5`` would otherwise be ignored without a word.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

import yaml

from criteo_dlrm.common.errors import ConfigError

# Set on the command line only (the catalog reads them through ``runtime_params``).
RUNTIME_ONLY = {"ingestion": {"raw_dir": None}}
_RUNTIME_NAMES = {f"{section}.{key}" for section, keys in RUNTIME_ONLY.items() for key in keys}


class ParameterError(ConfigError):
    """A parameter name that no pipeline reads, or one that is missing."""


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


def missing_parameters(given: Mapping, schema: Mapping, prefix: str = "") -> list[str]:
    """Dotted names that ``schema`` has and ``given`` lacks (a conf environment that replaced a whole block).

    Runtime-only names and the keys of free-form mappings (empty by default) are never required.
    """
    missing = []
    for key, default in schema.items():
        name = f"{prefix}{key}"
        if key not in given and name not in _RUNTIME_NAMES:
            missing.append(name)
        elif isinstance(default, Mapping) and default and isinstance(given[key], Mapping):
            missing.extend(missing_parameters(given[key], default, f"{name}."))
    return missing


def check_parameters(given: Mapping, schema: Mapping) -> None:
    """Raise ``ParameterError`` listing every unknown and every missing parameter name."""
    problems = []
    if unknown := unknown_parameters(given, schema):
        problems.append("Unknown parameter(s): " + "; ".join(unknown) + ".")
    if missing := missing_parameters(given, schema):
        problems.append(
            "Missing parameter(s): " + ", ".join(missing) + ". A conf environment (conf/local) that sets a "
            "whole block must repeat every key of conf/base, or set only the keys it changes."
        )
    if not problems and isinstance(given.get("training"), Mapping):
        # Types and ranges of the training block too, so `training.num_epochs=abc` stops the run before
        # ingestion and metadata have run, not when training starts.
        from criteo_dlrm.engine.config import TrainingConfig

        config = TrainingConfig.from_dict(given["training"], prefix="training.")
        if config.embedding_backend == "torchrec":  # a missing extra, before hours of preprocessing
            from criteo_dlrm.engine.sharding import require_torchrec

            require_torchrec()
    if problems:
        raise ParameterError(
            " ".join(problems) + " The known ones, with their defaults and meanings, are in "
            "conf/base/parameters_<pipeline>.yml and the README."
        )

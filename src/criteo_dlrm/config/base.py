"""The one mechanism behind every pipeline's settings: dataclasses whose fields are the YAML's keys.

``Config.from_dict(values, prefix)`` builds a config from a parameter block (or any part of it: missing
keys keep the defaults, which are ``conf/base``'s, checked by a test) and reports every problem at once:
unknown keys (with the closest known name), wrong types, numbers that are not finite, values out of range.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from enum import Enum
from typing import Any, Self

from criteo_dlrm.common.errors import ConfigError


@dataclass
class Config:
    """Base class: subclasses are dataclasses and may add range checks in ``problems``."""

    @classmethod
    def from_dict(cls, values: Mapping | None, prefix: str = "") -> Self:
        """Build and check; ``prefix`` (e.g. ``training.``) is put before field names in the messages.

        Raises:
            ConfigError: listing every unknown key, wrong type and out-of-range value.
        """
        problems: list[str] = []
        config = build(cls, values or {}, prefix, problems)
        problems += config.problems(prefix)
        if problems:
            section = prefix.rstrip(".") or cls.__name__
            raise ConfigError(f"Invalid {section} parameters:\n  " + "\n  ".join(problems))
        return config

    def to_dict(self) -> dict:
        """The YAML's values: a choice held as an enum member (e.g. ``EmbeddingBackend.TORCH``) as its value."""
        return asdict(self, dict_factory=lambda items: {k: v.value if isinstance(v, Enum) else v for k, v in items})

    def problems(self, prefix: str = "") -> list[str]:
        """Values out of range (types are checked by ``from_dict``): one message per problem."""
        return []


class Checks:
    """Collects range problems with the field's dotted name and its value: ``Checks(config, prefix)``."""

    def __init__(self, config: Any, prefix: str):
        self.config, self.prefix, self.problems = config, prefix, []

    def need(self, ok: bool, name: str, message: str) -> None:
        if not ok:
            self.problems.append(f"{self.prefix}{name} {message}, got {value_of(self.config, name)!r}")

    def at_least(self, minimum: float, *names: str, optional: bool = False) -> None:
        for name in names:
            value = value_of(self.config, name)
            if not (optional and value is None):
                self.need(
                    value is not None and value >= minimum,
                    name,
                    f"must be >= {minimum}" + (" (or null)" if optional else ""),
                )

    def positive(self, *names: str, optional: bool = False) -> None:
        for name in names:
            value = value_of(self.config, name)
            if not (optional and value is None):
                self.need(
                    value is not None and value > 0, name, "must be positive" + (" (or null)" if optional else "")
                )

    def one_of(self, name: str, choices: Sequence, optional: bool = False) -> None:
        value = value_of(self.config, name)
        self.need(
            value in choices or (optional and value is None),
            name,
            f"must be {'null or ' if optional else ''}one of {tuple(choices)}",
        )


def value_of(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def build(cls: type, values: Any, prefix: str, problems: list[str]) -> Any:
    """An instance of dataclass ``cls`` from a mapping, recording problems instead of raising (a value of the
    wrong type keeps its default)."""
    if not isinstance(values, Mapping):
        problems.append(f"{prefix.rstrip('.')} must be a mapping, got {values!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f" (known: {', '.join(known)})"
            problems.append(f"{prefix}{key} is not a parameter{hint}")
    kwargs = {}
    for name in known:
        if name not in values:
            continue
        kind, value = hints[name], values[name]
        if is_dataclass(kind):
            kwargs[name] = build(kind, value, f"{prefix}{name}.", problems)
        elif not matches(kind, value):
            problems.append(f"{prefix}{name} must be {describe(kind)}, got {value!r}")
        elif not finite(value):
            problems.append(f"{prefix}{name} must be a finite number, got {value!r}")
        elif not fits_int64(value):
            problems.append(f"{prefix}{name} must fit a 64-bit integer (-2**63 to 2**63 - 1), got {value!r}")
        else:
            kwargs[name] = convert(kind, value)
    return cls(**kwargs)


def finite(value: Any) -> bool:
    """No NaN or infinity anywhere in ``value`` (a number, or a list or mapping of them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Mapping):
        return all(finite(v) for v in value.values())
    if is_list(value):
        return all(finite(v) for v in value)
    return True


def fits_int64(value: Any) -> bool:
    """Every whole number in ``value`` (a number, or a list or mapping of them) fits numpy's and torch's int64:
    a larger one passed every range check, then ended in a traceback from deep inside numpy."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63
    if isinstance(value, Mapping):
        return all(fits_int64(v) for v in value.values())
    if is_list(value):
        return all(fits_int64(v) for v in value)
    return True


def is_choice(kind: Any) -> bool:
    """``kind`` is an enum of the values a YAML key may take (e.g. ``EmbeddingBackend``)."""
    return isinstance(kind, type) and issubclass(kind, Enum)


def convert(kind: Any, value: Any) -> Any:
    if is_choice(kind):
        return kind(value)
    if kind is float:
        return float(value)
    if is_list(value):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def matches(kind: Any, value: Any) -> bool:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(matches(option, value) for option in typing.get_args(kind))
    if origin is list:
        (item,) = typing.get_args(kind)
        return is_list(value) and all(matches(item, v) for v in value)
    if origin is dict:
        key, item = typing.get_args(kind)
        return isinstance(value, Mapping) and all(matches(key, k) and matches(item, v) for k, v in value.items())
    if kind is type(None):
        return value is None
    if is_choice(kind):
        return any(value == member.value for member in kind)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def describe(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(option) for option in typing.get_args(kind))
    if origin is list:
        return f"a list of {describe(typing.get_args(kind)[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        key, item = typing.get_args(kind)
        return f"a mapping of {describe(key)} to {describe(item)}"
    if is_choice(kind):
        return f"one of {tuple(member.value for member in kind)}"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))

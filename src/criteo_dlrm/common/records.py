"""Records read from and written as plain values (JSON, a checkpoint's entries, Parquet metadata): dataclasses whose
fields say what each value is, so code reads ``metrics.auc``, not ``metrics["auc"]``.

``Record.from_dict`` builds a record from its stored form: a field typed as another record (or a list, tuple or
dict of them, or one of them or None) is built from its value in turn; fields a stored form lacks take their
defaults (written before the field existed); keys the record does not know are kept in ``others`` when it has that
field (and written again, so reading and writing loses nothing). ``to_dict`` writes the stored form back. A record
with ``OMIT_NONE`` leaves out its unset fields, so records stored before a field existed are written as they were
(their digests, and the lineage compared with them, unchanged).
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import fields
from typing import Any, ClassVar, Self


class Record:
    """A dataclass with a stored form of plain values (subclasses are ``@dataclass``es)."""

    OMIT_NONE: ClassVar[bool] = False

    @classmethod
    def from_dict(cls, values: typing.Mapping[str, Any]) -> Self:
        """The record of its stored form (a record of this class is returned as it is)."""
        if isinstance(values, cls):
            return values
        names = {f.name for f in fields(cls) if f.init} - {"others"}
        known = typed(cls, {key: value for key, value in values.items() if key in names})
        if "others" in {f.name for f in fields(cls)}:
            known["others"] = {key: value for key, value in values.items() if key not in names}
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """The stored form ``from_dict`` reads."""
        values = stored(self, (f.name for f in fields(self) if f.name != "others"))
        if self.OMIT_NONE:
            values = {key: value for key, value in values.items() if value is not None}
        return {**values, **getattr(self, "others", {})}


def typed(cls: type, values: typing.Mapping[str, Any]) -> dict[str, Any]:
    """``values`` of fields of the dataclass ``cls``, each as its field's type says: records built from their
    stored forms (for a dataclass that reads its stored form itself, as ``Record.from_dict`` does)."""
    hints = _hints(cls)
    return {key: _read(hints[key], value) for key, value in values.items()}


def stored(record: Any, names: typing.Iterable[str]) -> dict[str, Any]:
    """The fields ``names`` of a dataclass, records among them written as their stored forms."""
    return {name: _write(getattr(record, name)) for name in names}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(hint: Any, value: Any) -> Any:
    """``value`` as the type ``hint`` names: records built from their dicts, in lists, tuples, dicts and unions."""
    if value is None:
        return None
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        records = [argument for argument in arguments if _is_record(argument) or typing.get_origin(argument)]
        return _read(records[0], value) if len(records) == 1 else value
    if _is_record(hint):
        return hint.from_dict(value) if isinstance(value, typing.Mapping) else value
    if origin in (list, tuple) and arguments and _is_record(arguments[0]):
        return origin(_read(arguments[0], item) for item in value)
    if origin is dict and len(arguments) == 2 and (_is_record(arguments[1]) or typing.get_origin(arguments[1])):
        return {key: _read(arguments[1], item) for key, item in value.items()}
    return value


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Record)


def _write(value: Any) -> Any:
    """``value``'s stored form: records written as theirs, in lists and dicts; anything else as it is (the same
    object: a checkpoint's tensors are never copied)."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)) and any(_holds_records(item) for item in value):
        return [_write(item) for item in value]
    if isinstance(value, dict) and any(_holds_records(item) for item in value.values()):
        return {key: _write(item) for key, item in value.items()}
    return value


def _holds_records(value: Any) -> bool:
    if isinstance(value, Record):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_records(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_records(item) for item in value.values())
    return False

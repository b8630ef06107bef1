"""The records' JSON codec and schema pieces: a `Record` is a frozen dataclass whose JSON object
is its fields in order (`to_json`), read back into an equal record (`from_json`); a field marked
`ABSENT_WHEN_NONE` is left out when None, one marked `NOT_IN_JSON` is not written. `type_schema`
gives the JSON Schema of a field's type, from the same type hints (`record.json_schema` assembles
the report files' schema from it).
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Self

__all__ = [
    "ABSENT_WHEN_NONE",
    "NOT_IN_JSON",
    "Record",
    "RecordError",
    "field_hints",
    "json_fields",
    "record_schema",
    "type_schema",
]


class RecordError(ValueError):
    """JSON that is not what a report of rlx-amp holds (a key missing, a value of another type)."""


#: A field's metadata: the JSON leaves the key out when the value is None.
ABSENT_WHEN_NONE = {"absent_when_none": True}
#: A field's metadata: the field is not in the JSON at all (what the run needs, not the report);
#: read back, it takes its default.
NOT_IN_JSON = {"in_json": False}


def json_fields(cls: Any) -> Iterator[dataclasses.Field[Any]]:
    return (f for f in dataclasses.fields(cls) if f.metadata.get("in_json", True))


class Record:
    """A frozen dataclass whose JSON object is its fields, in order."""

    def to_json(self) -> dict[str, Any]:
        data = {}
        for f in json_fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("absent_when_none"):
                continue
            data[f.name] = _encode(value)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Self:
        if not isinstance(data, Mapping):
            raise RecordError(f"{cls.__name__}: an object was expected, not {type(data).__name__}")
        hints = field_hints(cls)
        values = {}
        for f in json_fields(cls):
            if f.name in data:
                values[f.name] = _decode(hints[f.name], data[f.name], f.name)
            elif not f.metadata.get("absent_when_none"):
                raise RecordError(f"{cls.__name__}: no {f.name!r}")
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def field_hints(cls: type) -> dict[str, Any]:
    """The fields' types of a record class, resolved once."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _encode(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return copy.deepcopy(value)
    return value


#: The JSON types a declared scalar accepts (numbers.Integral/Real: numpy's scalars count too).
_SCALARS: dict[Any, tuple[type, ...]] = {str: (str,), bool: (bool,), int: (numbers.Integral,), float: (numbers.Real,)}


def _decode(kind: Any, value: Any, key: str) -> Any:
    """`value` read as a `kind` (a record, a tuple, a dict, a scalar or an optional one)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType or origin is typing.Union:
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, key)
    if kind is Any:
        return copy.deepcopy(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise RecordError(f"{key}: a list was expected, not {type(value).__name__}")
        return tuple(_decode(args[0], v, key) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise RecordError(f"{key}: an object was expected, not {type(value).__name__}")
        return copy.deepcopy(dict(value))
    if hasattr(kind, "from_json"):
        try:
            return kind.from_json(value)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, RecordError):
                raise
            raise RecordError(f"{key}: {type(e).__name__}: {e}") from None
    accepted = _SCALARS[kind]
    if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
        raise RecordError(f"{key}: {kind.__name__} expected, not {value!r:.60}")
    return value


# -- the schema -------------------------------------------------------------------------------

#: The JSON types of the scalars a record declares.
_SCALAR_SCHEMAS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
}


def type_schema(kind: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a field of type `kind`, records added to `defs` by name."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType or origin is typing.Union:
        (inner,) = [a for a in args if a is not type(None)]
        return {"anyOf": [type_schema(inner, defs), {"type": "null"}]}
    if kind is Any:
        return {}
    if origin is tuple or origin is list:
        return {"type": "array", "items": type_schema(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1], defs)}
    if isinstance(kind, type) and issubclass(kind, Record):
        if kind.__name__ not in defs:
            defs[kind.__name__] = {}  # a placeholder while its fields are read
            defs[kind.__name__] = record_schema(kind, defs)
        return {"$ref": f"#/$defs/{kind.__name__}"}
    if hasattr(kind, "json_schema"):
        return dict(kind.json_schema())
    return dict(_SCALAR_SCHEMAS[kind])


def record_schema(cls: type, defs: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    hints = field_hints(cls)
    properties, required = {}, []
    for f in json_fields(cls):
        properties[f.name] = type_schema(hints[f.name], defs)
        if not f.metadata.get("absent_when_none"):
            required.append(f.name)
    properties.update(extra or {})
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    schema["additionalProperties"] = False
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    return schema

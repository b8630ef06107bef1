"""Type constraints of ops, from `onnx.defs` and (for contrib ops) onnxruntime's registry.

The converter never keeps a hand list of which op admits which type: it asks the schema of the
op at the model's opset which formal parameters share a type variable and which types that
variable admits.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import onnx
import onnx.defs

from rlx_onnx_amp.taxonomy import canonical_domain

__all__ = ["OpSignature", "TypeGroup", "signature"]


@dataclass(frozen=True)
class TypeGroup:
    """The actual inputs/outputs of one node that a schema binds to one type.

    `allowed` is the set of type strings the variable admits; a concrete type in the schema
    (Resize `scales` is `tensor(float)`) is a group of its own with one allowed type.
    """

    var: str
    allowed: frozenset[str]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class OpSignature:
    since_version: int
    groups: tuple[TypeGroup, ...]


def _ort_schemas() -> dict[tuple[str, str], list[object]]:
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return {}
    table: dict[tuple[str, str], list[object]] = {}
    for s in ort_c.get_all_operator_schema():
        table.setdefault((s.domain, s.name), []).append(s)
    return table


@functools.cache
def _ort_table() -> dict[tuple[str, str], list[object]]:
    return _ort_schemas()


def _find_schema(domain: str, op_type: str, opset: int) -> object | None:
    dom = canonical_domain(domain)
    try:
        return onnx.defs.get_schema(op_type, opset, dom)
    except onnx.defs.SchemaError:
        pass
    candidates = [s for s in _ort_table().get((dom, op_type), []) if s.since_version <= opset]  # type: ignore[attr-defined]
    if not candidates:
        return None
    return max(candidates, key=lambda s: s.since_version)  # type: ignore[attr-defined]


def _formal_type(param: object) -> str:
    return str(getattr(param, "type_str", None) or getattr(param, "typeStr"))  # noqa: B009 - ORT spells it typeStr


def _is_variadic(param: object) -> bool:
    return getattr(param.option, "name", str(param.option)).endswith("Variadic")  # type: ignore[attr-defined]


def _is_heterogeneous(param: object) -> bool:
    homogeneous = getattr(param, "is_homogeneous", None)
    if homogeneous is None:
        homogeneous = getattr(param, "isHomogeneous", True)
    return _is_variadic(param) and not homogeneous


def _bind(formals: list[object], count: int) -> Iterable[tuple[int, str, bool]]:
    """(actual index, formal type string, whether the actual has a type of its own)."""
    for i in range(count):
        formal = formals[i] if i < len(formals) else (formals[-1] if formals and _is_variadic(formals[-1]) else None)
        if formal is not None:
            yield i, _formal_type(formal), _is_heterogeneous(formal)


@functools.lru_cache(maxsize=8192)
def _signature(domain: str, op_type: str, opset: int, n_in: int, n_out: int) -> OpSignature | None:
    schema = _find_schema(domain, op_type, opset)
    if schema is None:
        return None
    constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}  # type: ignore[attr-defined]
    members: dict[str, tuple[list[int], list[int]]] = {}
    concrete = 0
    for side, formals, count in ((0, list(schema.inputs), n_in), (1, list(schema.outputs), n_out)):  # type: ignore[attr-defined]
        for index, type_str, own_type in _bind(formals, count):
            key = type_str
            if type_str not in constraints or own_type:
                allowed = constraints.get(type_str, frozenset({type_str}))
                # A concrete type, or a member of a heterogeneous variadic: its own group.
                key = f"{type_str}#{concrete}"
                concrete += 1
                constraints[key] = allowed
            members.setdefault(key, ([], []))[side].append(index)
    groups = tuple(TypeGroup(var, constraints[var], tuple(ins), tuple(outs)) for var, (ins, outs) in members.items())
    return OpSignature(schema.since_version, groups)  # type: ignore[attr-defined]


def signature(domain: str, op_type: str, opset: int, n_inputs: int, n_outputs: int) -> OpSignature | None:
    """Type groups of a node (its domain, op type and input/output counts) under the schema in
    force at `opset`, or None if unknown."""
    return _signature(domain, op_type, opset, n_inputs, n_outputs)

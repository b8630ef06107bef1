"""Typing a node's outputs from its op schema, and the template cache over the decisions.

The decide sweep types the main graph's values from the op schemas as it goes (raising
`Untyped` when a value cannot be typed for certain that way, and the sweep starts over with
onnx's inference). Nodes that repeat an (op, input types, type attribute, output count) share
one `Template`: their output types and the outcome of the rules; most nodes of a large graph
repeat a few dozen of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.schema import OpSignature
from rlx_onnx_amp.taxonomy import KERNEL_GAPS, OpKind, canonical_domain
from rlx_onnx_amp.types import schema_output_types

__all__ = ["OMITTED", "Outcome", "Template", "Templates", "Untyped", "type_outputs"]

#: The type key of an omitted optional input ("" in a node's inputs).
OMITTED = -2

TemplateKey = tuple[object, ...]


class Outcome(NamedTuple):
    """What the list of rules gives a node: the first of them to fire (None: none did, the node is
    lowered) with its reason, or the lowering. What the template cache memoises per key."""

    kind: OpKind | None
    code: str | None  # the rule's
    reason: str | None  # reported (effect KEEPS) only
    precision: Precision | None
    input_types: dict[int, int | None]  # the decision's
    output_types: dict[int, int]
    source: bool  # the rule's effect is FOLLOWS_CONSUMERS
    keepable: bool  # none of the rules above user-keep fired, so a user keep still applies


class Template(NamedTuple):
    """What every node with the same (domain, op, input types, type attribute, output count)
    gets: its output types and its outcome. Shared, never mutated."""

    output_types: tuple[int | None, ...]  # by output index, as the schema gives them
    outcome: Outcome


class Untyped(Exception):
    """Schema typing cannot type a value for certain; onnx's inference must run."""


class Templates:
    """The template cache of one conversion, by `(domain, op, input types, type attribute, output count)`."""

    def __init__(self) -> None:
        self._by_key: dict[TemplateKey, Template] = {}
        #: The template of a key, or None: the dict's own get (a call per node of the graph).
        self.get: Callable[[TemplateKey], Template | None] = self._by_key.get

    @staticmethod
    def type_from(template: Template, outs: list[str], orig: dict[str, int]) -> bool:
        """Type a node's outputs from `template` into `orig`; False when a declared output type
        disagrees with it (the node is then decided alone)."""
        for name, elem in zip(outs, template.output_types):
            if name:
                have = orig.get(name)
                if have is None:
                    orig[name] = elem  # type: ignore[assignment]  # templates type every named output
                elif have != elem:
                    return False
        return True

    def offer(
        self,
        key: TemplateKey,
        derived: list[int | None],
        out_types: list[int | None],
        outs: list[str],
        domain: str,
        op: str,
        outcome: Outcome,
    ) -> None:
        """Keep `outcome` as the template of `key` when the node's typing depends on nothing but
        the key: the schema gave every named output the type it has."""
        named = [k for k, name in enumerate(outs) if name]
        if all(derived[k] is not None and derived[k] == out_types[k] for k in named) and (
            (canonical_domain(domain), op) not in KERNEL_GAPS
        ):
            self._by_key[key] = Template(tuple(derived), outcome)


def type_outputs(
    sig: OpSignature | None,
    attr_type: int | None,
    in_types: list[int | None],
    outs: list[str],
    orig: dict[str, int],
    schema_typing: bool,
    op: str,
) -> tuple[list[int | None], list[int | None]]:
    """A node's output types: what the schema alone says (`derived`: the attribute that types
    them, or what their type variables give) and what each output has (`out_types`: its known
    type, else the derived one, recorded in `orig`). With `schema_typing`, an output nothing
    types raises `Untyped`."""
    derived: list[int | None] = [None] * len(outs)
    if attr_type is not None:
        derived[0] = attr_type
    elif sig is not None:
        derived = schema_output_types(sig, in_types, len(outs))
    out_types: list[int | None] = [None] * len(outs)
    for k, name in enumerate(outs):
        if not name:
            continue
        elem = orig.get(name)
        if elem is None:
            elem = derived[k]
            if elem is None and sig is not None:
                # onnx's inference left it open (contrib ops): a group's known type.
                for g in sig.groups:
                    if k in g.outputs:
                        known = [in_types[j] for j in g.inputs if in_types[j] is not None]
                        known += [out_types[j] for j in g.outputs if out_types[j] is not None]
                        elem = known[0] if known else None
            if elem is None and schema_typing:
                raise Untyped(f"output {name!r} of {op}")
            if elem is not None:
                orig[name] = elem
        out_types[k] = elem
    return derived, out_types

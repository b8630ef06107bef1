"""What the emit pass tells the conversion report: each node's precision and rule, the kept nodes, the counts."""

from __future__ import annotations

import collections

from rlx_onnx_amp.precision import FLOAT_TYPES, Precision, precision_of_elem_type
from rlx_onnx_amp.reports.conversion import KeptNode
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Scope
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, OpKind

__all__ = ["fill_report"]


def fill_report(cx: Conversion, main: Scope) -> None:
    """Fill `cx.report` from the decisions of every scope, in node order (each body right after
    the node that holds it)."""
    report = cx.report
    unknown: list[str] = []
    tally: collections.Counter[tuple[OpKind | None, str, str, str | None]] = collections.Counter()
    decisions, kept, keepable, rules = report.decisions, report.kept_f32, report.keepable, report.rules
    value_of = {p: p.value for p in Precision}  # an Enum's .value is a descriptor call: once per member

    def walk(scope: Scope) -> None:  # node by node, each body right after the node that holds it
        children = scope.children
        for i, d in enumerate(scope.decisions):
            prec = value_of[d.precision] if d.precision is not None else _reported_precision(d, scope)
            tally[(d.kind, d.domain, d.op, prec)] += 1  # counted per kind and op below, once per distinct row
            decisions[d.path] = prec or "none"
            if d.keepable and d.precision is not None:
                keepable[d.path] = (d.label, d.op)
            if d.code is not None:
                rules[d.path] = d.code
            if d.reason:
                kept.append(KeptNode(d.label, d.op, d.reason, d.path, d.code))
            if children and i in children:
                for child in children[i]:
                    walk(child)

    walk(main)
    for (kind, domain, op_type, prec), count in tally.items():
        op = (f"{domain}." if domain not in DEFAULT_DOMAINS else "") + op_type
        report.count_node(kind, op, prec, count)
        if kind is None:
            unknown.append(op)
    report.casts_inserted = cx.casts_inserted
    report.casts_removed = cx.casts_removed
    report.changed = cx.changed
    report.clamped = {k: v.to_json() for k, v in cx.clamped.items()}
    report.unknown_ops = sorted(set(unknown))


def _reported_precision(d: NodeDecision, scope: Scope) -> str | None:
    """The precision a node kept at its original types is reported at: its first float output's
    type, else its first float input's."""
    saw_float = False
    for names in (d.outputs, d.inputs):
        for n in names:
            if n:
                elem = scope.storage_type(n)
                if elem in FLOAT_TYPES:
                    if names is d.outputs or not saw_float:
                        chosen = precision_of_elem_type(elem)
                        return chosen.value if chosen else None
                    saw_float = True
    return None

"""What a conversion did, summarized once its passes ran: the `Conversion` record (each node's
precision and rule, the kept nodes, the counts) and its `NodeIndex` for repair."""

from __future__ import annotations

import collections

from rlx_onnx_amp.cost import Cost
from rlx_onnx_amp.precision import FLOAT_TYPES, Precision, precision_of_elem_type
from rlx_onnx_amp.reports.record import ByteCounts, KeptNode, NodeIndex, Nodes
from rlx_onnx_amp.reports.record import Conversion as ConversionRecord
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Scope
from rlx_onnx_amp.rewrite.rules import REASON_CODES
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, OpKind

__all__ = ["summarize", "why_not_keepable"]


def summarize(cx: Conversion, main: Scope, cost: Cost | None = None) -> ConversionRecord:
    """The record of a conversion whose passes ran, from the decisions of every scope in node
    order (each body right after the node that holds it). Its `model`, `output`, `data_files`
    and `proof` are the file layer's to fill (`dataclasses.replace`)."""
    tally: collections.Counter[tuple[OpKind | None, str, str, str | None]] = collections.Counter()
    decisions: dict[str, str] = {}
    keepable: dict[str, tuple[str, str]] = {}
    rules: dict[str, str] = {}
    kept: list[KeptNode] = []
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
    total = 0
    by_precision: dict[str, int] = {**{p.value: 0 for p in Precision}, "none": 0}
    by_kind: dict[str, dict[str, int]] = {}
    by_op: dict[str, dict[str, int]] = {}
    unknown: set[str] = set()
    for (kind, domain, op_type, prec), count in tally.items():
        op = (f"{domain}." if domain not in DEFAULT_DOMAINS else "") + op_type
        key = prec or "none"
        per_op = by_op.setdefault(op, {})
        per_op[key] = per_op.get(key, 0) + count
        total += count
        by_precision[key] = by_precision.get(key, 0) + count
        per_kind = by_kind.setdefault(kind.value if kind else "unknown", {})
        per_kind[key] = per_kind.get(key, 0) + count
        if kind is None:
            unknown.add(op)
    counts = collections.Counter(rules.values())
    return ConversionRecord(
        model="",
        output="",
        policy=cx.policy,
        target=cx.options.target.value,
        nodes=Nodes(total, by_precision),
        by_kind=by_kind,
        by_op=by_op,
        casts_inserted=cx.casts_inserted,
        casts_removed=cx.casts_removed,
        changed=cx.changed,
        kept_f32=tuple(kept),
        # How many nodes each of the rules decided, in the order of the rules; lowered nodes are not counted.
        by_rule={code: counts[code] for code in REASON_CODES if counts[code]},
        clamped={k: v.to_json() for k, v in cx.clamped.items()},
        initializer_bytes=ByteCounts(cx.initializer_bytes_before, cx.initializer_bytes_after),
        unknown_ops=tuple(sorted(unknown)),
        data_files=(),
        cost=cost,
        index=NodeIndex(decisions, rules, keepable),
    )


def why_not_keepable(index: NodeIndex, path: str) -> str | None:
    """None when a keep of node `path` changes the conversion; else why it cannot: the
    deciding rule of the node, from the converter's list of rules."""
    if path in index.keepable:
        return None
    if path not in index.decisions:
        return "no such node"
    code = index.rules.get(path)
    if code is None:
        return "it already keeps its original types"
    return f"rule {code}: {REASON_CODES[code]}"


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

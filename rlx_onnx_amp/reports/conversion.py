"""The conversion report: what the rewrite did, as data with stable JSON keys (docs/reports.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlx_onnx_amp.cost import Cost
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.taxonomy import OpKind

__all__ = ["ConversionReport", "KeptNode"]

@dataclass(frozen=True)
class KeptNode:
    """A node left in its original (f32) types although the policy wanted it lower."""

    node: str
    op: str
    reason: str
    path: str
    code: str | None = None  # rewrite.rules.REASON_CODES

    def to_json(self) -> dict[str, str | None]:
        return {"node": self.node, "op": self.op, "reason": self.reason, "path": self.path, "code": self.code}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeptNode:
        return cls(str(data["node"]), str(data["op"]), str(data["reason"]), str(data["path"]), data.get("code"))


@dataclass
class ConversionReport:
    model: str = ""
    output: str = ""
    policy: Any = None  # rlx_onnx_amp.policy.Policy
    target: str = ""  # the execution provider the model was converted for ("cuda", "cpu")
    nodes_total: int = 0
    by_precision: dict[str, int] = field(default_factory=lambda: {**{p.value: 0 for p in Precision}, "none": 0})
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    by_op: dict[str, dict[str, int]] = field(default_factory=dict)
    casts_inserted: int = 0
    casts_removed: int = 0  # existing Casts that would cast a value to its own type (rule idle-cast)
    kept_f32: list[KeptNode] = field(default_factory=list)
    clamped: dict[str, dict[str, float | int]] = field(default_factory=dict)
    initializer_bytes_before: int = 0
    initializer_bytes_after: int = 0
    unknown_ops: list[str] = field(default_factory=list)
    #: Node path -> precision the node ended at ("none" for nodes without float values).
    decisions: dict[str, str] = field(default_factory=dict)
    #: Node path -> (node label, op type) of the nodes in low precision that a keep
    #: (`ConvertOptions.keep_f32_paths`) would return to their original types: the only nodes
    #: repair may spend an evaluation on. Constant-like nodes, fixed-type ops (Cast), control
    #: flow, unknown ops and nodes already in f32 are not among them.
    keepable: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Node path -> the code of the deciding rule (rewrite.rules.REASON_CODES), for every node one of the rules
    #: stopped from running at its kind's precision, silent rules included.
    rules: dict[str, str] = field(default_factory=dict)
    data_files: list[str] = field(default_factory=list)  # external data files written beside the output
    #: Whether the rewrite changed the model (a Cast inserted or removed, an input rewired, a
    #: value, attribute or weight retyped): False says the output is the input, its weights
    #: perhaps moved to another data file. A node already at its low precision changes nothing.
    changed: bool = True
    cost: Cost | None = None  # what the conversion buys (`rlx_onnx_amp.cost`)
    verify: dict[str, Any] | None = None
    repair: dict[str, Any] | None = None
    #: Why a conversion that verifies by default was written unverified (exit 4), or None.
    unverified: str | None = None
    #: What proved the output sound: "onnx.checker", or onnxruntime loading input and output
    #: alike where the input fails the checker (`api.prove`); None when nothing was checked.
    proof: str | None = None

    def count_node(self, kind: OpKind | None, op: str, precision: str | None, count: int = 1) -> None:
        key = precision or "none"
        per_op = self.by_op.setdefault(op, {})
        per_op[key] = per_op.get(key, 0) + count
        self.nodes_total += count
        self.by_precision[key] = self.by_precision.get(key, 0) + count
        kind_key = kind.value if kind else "unknown"
        per_kind = self.by_kind.setdefault(kind_key, {})
        per_kind[key] = per_kind.get(key, 0) + count

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "output": self.output,
            "policy": self.policy.to_json() if self.policy is not None else None,
            "target": self.target,
            "nodes": {"total": self.nodes_total, "by_precision": dict(self.by_precision)},
            "by_kind": self.by_kind,
            "by_op": self.by_op,
            "casts_inserted": self.casts_inserted,
            "casts_removed": self.casts_removed,
            "changed": self.changed,
            "kept_f32": [k.to_json() for k in self.kept_f32],
            "by_rule": self.by_rule(),
            "clamped": self.clamped,
            "initializer_bytes": {"before": self.initializer_bytes_before, "after": self.initializer_bytes_after},
            "unknown_ops": self.unknown_ops,
            "data_files": self.data_files,
        }
        if self.cost is not None:
            data["cost"] = self.cost.to_json()
        if self.verify is not None:
            data["verify"] = self.verify
        if self.unverified is not None:
            data["unverified"] = self.unverified
        if self.proof is not None:
            data["proof"] = self.proof
        if self.repair is not None:
            data["repair"] = self.repair
        return data

    def by_rule(self) -> dict[str, int]:
        """How many nodes each of the rules decided (`rules`), in the order of their list;
        those that decided none are left out. Lowered nodes are not counted: none of the
        rules stopped them."""
        from rlx_onnx_amp.rewrite.rules import REASON_CODES  # the rules import this module's types

        counts = Counter(self.rules.values())
        return {code: counts[code] for code in REASON_CODES if counts[code]}

    def why_not_keepable(self, path: str) -> str | None:
        """None when a keep of node `path` changes the conversion; else why it cannot: the
        deciding rule of the node, from the converter's list of rules."""
        if path in self.keepable:
            return None
        if path not in self.decisions:
            return "no such node"
        code = self.rules.get(path)
        if code is None:
            return "it already keeps its original types"
        from rlx_onnx_amp.rewrite.rules import REASON_CODES  # the rules import this module's types

        return f"rule {code}: {REASON_CODES[code]}"

"""The converter's `RuleContext`: what the keep rules may ask of one conversion, memoised."""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx
from onnx import ModelProto, NodeProto, helper

from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import TYPE_STR, Precision
from rlx_onnx_amp.ranges import NumericFacts, ValueRange
from rlx_onnx_amp.rewrite.plan import Conversion
from rlx_onnx_amp.rewrite.rules import Lowering, NodeFacts, lower_variables
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS

__all__ = ["MIN_CAST_OPSET", "DecideContext", "default_opset_for"]

#: Inserted Casts need an integer `to` (Cast-6) and a default domain onnxruntime implements (7+).
MIN_CAST_OPSET = 7


class DecideContext:
    """The settings and facts of one conversion that `rules.KEEP_RULES` read (`rules.RuleContext`)."""

    def __init__(self, conversion: Conversion) -> None:
        options = conversion.options
        self._cx = conversion
        self.provider: Target = options.target
        self.policy: Policy = conversion.policy
        self.numeric: NumericFacts = conversion.numeric
        self.value_ranges: Mapping[str, ValueRange] = options.value_ranges
        self.keep_node_patterns = [re.compile(p) for p in options.keep_f32_nodes]
        self.has_user_keeps = bool(options.keep_f32_paths or options.keep_f32_ops or self.keep_node_patterns)
        self._lowerings: dict[tuple[object, ...], Lowering] = {}
        self._cast_blocks: dict[Precision, str | None] = {}

    def opset(self, domain: str) -> int:
        return self._cx.opset(domain)

    def user_keep(self, node: NodeProto, path: str) -> str | None:
        """--keep-f32-op, --keep-f32-node and node paths (repair's keeps): the reason, or None."""
        options = self._cx.options
        if path in options.keep_f32_paths:
            return options.keep_f32_paths[path]
        if node.op_type in options.keep_f32_ops:
            return f"user: --keep-f32-op {node.op_type}"
        for pattern in self.keep_node_patterns:
            if node.name and pattern.search(node.name):
                return f"user: --keep-f32-node {pattern.pattern}"
        return None

    def cast_block(self, target: Precision) -> str | None:
        """Why the Casts around a node lowered to `target` cannot be written at the
        default-domain opset they would live in (None: they can)."""
        if target not in self._cast_blocks:
            self._cast_blocks[target] = _cast_block(cast_opset(self._cx.model, self._cx.opsets), target)
        return self._cast_blocks[target]

    def lowering(self, f: NodeFacts) -> Lowering:
        """`rules.lower_variables` for `f`, memoised: most nodes of a model share a handful of signatures."""
        if f.lowering is not None:
            return f.lowering
        key = (f.domain, f.op, f.sig, tuple(f.in_types), tuple(f.out_types), f.any_inputs, f.target)
        found = self._lowerings.get(key)
        if found is None:
            found = self._lowerings[key] = lower_variables(f)
        f.lowering = found
        return found


def _cast_block(version: int, target: Precision) -> str | None:
    if version < MIN_CAST_OPSET:
        # Cast-1 takes `to` as a string, and onnxruntime implements the default domain from
        # opset 7: the Casts, and the function bodies it expands for low-precision nodes
        # without a kernel, would not load.
        return f"schema: the default-domain opset {version} predates Cast-{MIN_CAST_OPSET}"
    try:
        cast = onnx.defs.get_schema("Cast", version, "")
        allowed = {t for c in cast.type_constraints if c.type_param_str == "T2" for t in c.allowed_type_strs}
    except onnx.defs.SchemaError:
        allowed = set()
    if TYPE_STR[target.elem_type] not in allowed:
        return f"schema: Cast at opset {version} does not admit {target.value}"
    return None


def cast_opset(model: ModelProto, opsets: Mapping[str, int]) -> int:
    """The default-domain opset of the model, or the one the emit pass would add for its Casts."""
    if any(o.domain in DEFAULT_DOMAINS for o in model.opset_import):
        return opsets.get("", 1)
    return default_opset_for(model, opsets.get("ai.onnx.ml"))


def default_opset_for(model: ModelProto, ml: int | None) -> int:
    """The default-domain opset released with the model's IR version (and ai.onnx.ml opset)."""
    ir = model.ir_version
    rows = [row for row in helper.VERSION_TABLE if row[1] <= ir and (ml is None or row[3] == ml)]
    return max((row[2] for row in rows), default=1)

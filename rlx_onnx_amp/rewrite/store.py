"""Sweep 2 of the rewrite: each float value's storage type."""

from __future__ import annotations

import numpy as np
import onnx

from rlx_onnx_amp.passes import Pass, PassResult
from rlx_onnx_amp.precision import F32, FLOAT_TYPES, LOW_TYPES, TYPE_STR, precision_of_elem_type
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Plan, Scope, Stage
from rlx_onnx_amp.schema import signature
from rlx_onnx_amp.taxonomy import SOURCE_VALUE_ATTRIBUTES
from rlx_onnx_amp.tensors import ClampStats
from rlx_onnx_amp.types import initializer_rows

__all__ = ["StorePass"]


class StorePass(Pass[Plan]):
    """Sweep 2: each float value's storage type; sources and initializers take their
    consumers' precision (rule source-follows-consumers).

    Requires decided nodes. Ensures storage types only on float values that were f32, and
    graph inputs (other than IR 3's weights) at their declared type under keep_io_types.
    Modifies the model only to clamp an f32 Constant that its low readers cast down (counted
    in `modified`)."""

    name, needs_stage, gives_stage = "store", Stage.DECIDED, Stage.STORED

    def __init__(self, conversion: Conversion) -> None:
        self.cx = conversion
        self._admitted: dict[tuple[str, str, int, int, int], bool] = {}

    def call(self, plan: Plan) -> PassResult:
        assert plan.main is not None
        self.store_scope(plan.main)
        return PassResult(modified=self.cx.saturated > 0)

    def ensures(self, plan: Plan) -> None:
        for scope in plan.scopes():
            for name, elem in scope.storage.items():
                was = scope.orig.get(name)
                if elem not in FLOAT_TYPES or was not in (F32, elem):
                    self.fail(f"{name!r} stored as {elem}, was {was}: only f32 values change type")
        main = plan.main
        assert main is not None
        if self.cx.options.keep_io_types:
            weights = {t.name for t in main.graph.initializer}  # IR < 4 declares them as inputs too
            for vi in main.graph.input:
                if vi.name not in weights and main.storage.get(vi.name) not in (None, main.orig.get(vi.name)):
                    self.fail(f"graph input {vi.name!r} retyped under keep_io_types")

    def _admits(self, d: NodeDecision, low: int) -> bool:
        """Whether the source's op schema lets its output be `low` (one answer per op and arity)."""
        key = (d.domain, d.op, len(d.inputs), len(d.outputs), low)
        admits = self._admitted.get(key)
        if admits is None:
            sig = signature(d.domain, d.op, self.cx.opset(d.domain), len(d.inputs), len(d.outputs))
            admits = sig is None or all(TYPE_STR.get(low, "") in g.allowed for g in sig.groups if g.outputs)
            self._admitted[key] = admits
        return admits

    def _single_low(self, scope: Scope, name: str) -> int | None:
        wants = scope.wants.get(name, set())
        if len(wants) == 1:
            (elem,) = wants
            if elem in LOW_TYPES:
                return elem
        return None

    def store_scope(self, scope: Scope) -> None:
        is_main = scope.parent is None
        if is_main and not self.cx.options.keep_io_types:
            for vi in scope.graph.input:
                if scope.orig.get(vi.name) == F32 and (low := self._single_low(scope, vi.name)):
                    scope.storage[vi.name] = low
        # The main graph's initializers, as the load read them.
        for _, name, elem in initializer_rows(scope.graph, self.cx.fields if is_main else None):
            if elem == F32 and (low := self._single_low(scope, name)):
                scope.storage[name] = low
        for d in [d for d in scope.decisions if d.source]:
            if not d.outputs or not d.outputs[0]:
                continue
            name = d.outputs[0]
            low = self._single_low(scope, name)
            if scope.orig.get(name) != F32 or not low:
                continue
            if self._admits(d, low):
                scope.storage[name] = low
                d.precision = precision_of_elem_type(low)
                d.output_types[0] = low
            else:
                self._saturate_source(d, low)
        for children in scope.children.values():
            for child in children:
                self.store_scope(child)

    def _saturate_source(self, d: NodeDecision, low: int) -> None:
        """A Constant-like value that must stay f32 (its op cannot hold `low` at this opset)
        while every consumer reads it through one Cast to `low`: finite values past the low
        range would become Inf at that Cast, so they are clamped here, in f32, as narrowing
        would have clamped them (rule source-follows-consumers). A -3.4e38 mask stays a mask."""
        precision = precision_of_elem_type(low)
        attr = next((a for a in d.node.attribute if a.name == SOURCE_VALUE_ATTRIBUTES.get(d.op)), None)
        if precision is None or attr is None or attr.type != onnx.AttributeProto.TENSOR or attr.t.data_type != F32:
            return
        values = self.cx.source.read(attr.t)
        limit = np.float32(precision.info.max_finite)
        past = np.isfinite(values) & (np.abs(values) > limit)
        if not past.any():
            return
        stats = ClampStats(int(past.sum()), float(values[past][np.argmax(np.abs(values[past]))]), 0)
        self.cx.record_clamp(d.outputs[0], stats)
        self.cx.sink.store(attr.t, np.where(past, np.copysign(limit, values), values).astype(np.float32), F32)
        self.cx.saturated += 1


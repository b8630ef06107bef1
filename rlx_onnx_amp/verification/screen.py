"""The range screen: every float value of a model, surfaced as an output of one f32 reference
run, reduced to what the low precision must hold (`ranges.ValueRange`).

The same run gives the cost model its shapes: the main graph's values it fetches, and the inputs
and outputs of every Compute node and Cast whatever their type (`cost.run_values`: an int8
model's MatMulInteger reads and writes no float), as onnxruntime produced them (`shapes`).

Values inside If/Loop/Scan bodies are surfaced as extra outputs of their control-flow node (a
Loop's or Scan's per iteration, stacked), so the screen sees them too; where that cannot run
(a Loop whose body values change shape between iterations), the main graph's values alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from rlx_onnx_amp.cost import run_values
from rlx_onnx_amp.ranges import ValueRange, scoped_name
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS
from rlx_onnx_amp.types import model_types, subgraphs

__all__ = ["ScreenPlan", "expose_body_values"]

_FLOAT = onnx.TensorProto.FLOAT


class ScreenPlan:
    """A copy of a model whose float values are graph outputs, and how to read them back."""

    def __init__(self, model: onnx.ModelProto, outputs: Sequence[str], bodies: bool) -> None:
        types = model_types(model)
        exposed, surfaced = expose_body_values(model, types) if bodies else (model, [])
        main = types.get("", {})
        have = {o.name for o in model.graph.output}
        self.values = [o for n in model.graph.node for o in n.output if o and main.get(o) == _FLOAT]
        #: Surfaced body values: (the control-flow node's extra output, the value's key,
        #: `ranges.scoped_name`: an If's branches may reuse a name).
        self.surfaced = [(out, scoped_name(scope, value)) for out, scope, value in surfaced]
        #: Main-graph values whose shapes the cost model reads (`shapes`).
        self.shaped = list(dict.fromkeys([*outputs, *self.values, *run_values(model)]))
        self.fetch = list(dict.fromkeys([*self.shaped, *(out for out, _ in self.surfaced)]))
        if exposed is model:  # expose_body_values gave a copy already; the main graph alone did not
            exposed = onnx.ModelProto()
            exposed.CopyFrom(model)
        self.model = exposed
        extra = [n for n in self.fetch if n not in have]
        self.model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in extra)

    def shapes(self, fetched: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Main-graph value name -> the shape onnxruntime produced in one run."""
        return {name: tuple(np.shape(fetched[name])) for name in self.shaped if name in fetched}

    def ranges(self, fetched: Mapping[str, np.ndarray], into: dict[str, ValueRange]) -> None:
        """Fold one run's values into `into` (value key, `ranges.scoped_name` -> range over every
        run so far)."""
        for name in self.values:
            _fold(into, name, fetched.get(name))
        for out, value in self.surfaced:
            _fold(into, value, fetched.get(out))


def _fold(into: dict[str, ValueRange], name: str, values: np.ndarray | None) -> None:
    if values is None or np.asarray(values).dtype.kind != "f":
        return
    seen = ValueRange.of(values)
    if seen is not None:
        into[name] = into[name].merge(seen) if name in into else seen


def expose_body_values(
    model: onnx.ModelProto, types: Mapping[str, Mapping[str, int]]
) -> tuple[onnx.ModelProto, list[tuple[str, str, str]]]:
    """A copy of `model` whose If/Loop/Scan nodes (at any depth) surface every f32 value of
    their bodies as extra outputs; (main-graph output name, body scope, value name) for each."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out, _BodySurfacer(types).surface(out.graph, "")


class _BodySurfacer:
    """Adds body values as outputs of their control-flow nodes, level by level (see
    `_expose_body_values`)."""

    def __init__(self, types: Mapping[str, Mapping[str, int]]) -> None:
        self.types = types
        self.counter = iter(range(1 << 30))

    def fresh(self) -> str:
        return f"__rlx_screen_{next(self.counter)}"

    def add_output(self, body: onnx.GraphProto, value: str) -> None:
        if value in {o.name for o in body.output}:  # a graph output already: a copy under a new name
            copy = self.fresh()
            body.node.append(helper.make_node("Identity", [value], [copy]))
            value = copy
        body.output.append(helper.make_tensor_value_info(value, onnx.TensorProto.FLOAT, None))

    def surface(self, graph: onnx.GraphProto, scope: str) -> list[tuple[str, str, str]]:
        """Values of the bodies below `graph` that are now outputs of its nodes."""
        found: list[tuple[str, str, str]] = []
        for i, node in enumerate(graph.node):
            bodies = subgraphs(node)
            if not bodies or node.domain not in DEFAULT_DOMAINS or node.op_type not in ("If", "Loop", "Scan"):
                continue
            per_body = []
            for key, body in bodies:
                bscope = f"{scope}{i}/{key}/"
                own = [o for n in body.node for o in n.output if o and self.types.get(bscope, {}).get(o) == _FLOAT]
                per_body.append((body, [(value, bscope, value) for value in own] + self.surface(body, bscope)))
            items = self._surface_if(per_body) if node.op_type == "If" else self._surface_loop(node, per_body)
            for item in items:
                name = self.fresh()
                node.output.append(name)
                found.append((name, item[1], item[2]))
        return found

    def _surface_if(
        self, per_body: list[tuple[onnx.GraphProto, list[tuple[str, str, str]]]]
    ) -> list[tuple[str, str, str]]:
        """Both branches give every item; the branch not taken gives an empty tensor."""
        all_items = [item for _, items in per_body for item in items]
        for body, items in per_body:
            mine = {id(item) for item in items}
            for item in all_items:
                if id(item) in mine:
                    self.add_output(body, item[0])
                    continue
                empty = self.fresh()
                value = helper.make_tensor(empty, _FLOAT, [0], [])
                body.node.append(helper.make_node("Constant", [], [empty], value=value))
                body.output.append(helper.make_tensor_value_info(empty, _FLOAT, None))
        return all_items

    def _surface_loop(
        self, node: onnx.NodeProto, per_body: list[tuple[onnx.GraphProto, list[tuple[str, str, str]]]]
    ) -> list[tuple[str, str, str]]:
        """A Loop's or Scan's body values, stacked over iterations as scan outputs."""
        ((body, items),) = per_body
        for item in items:
            self.add_output(body, item[0])
        if node.op_type == "Scan" and items:
            for attr in node.attribute:
                if attr.name in ("scan_output_axes", "scan_output_directions"):
                    attr.ints.extend([0] * len(items))
        return items

"""Precision emulation: the original f32 graph, with every value that the converted model holds
in low precision rounded to that precision.

Weights and Constant values are narrowed exactly as the converter narrows them (clamped) and
widened back; computed values get a Cast round trip (f32 -> low -> f32) right after their
producer, under their original name. So an f16 or bf16 conversion gets a drift figure on any
provider that runs f32, including onnxruntime's CPU provider, which computes most f16 ops in f32
and runs no bf16 arithmetic at all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from rlx_onnx_amp.precision import FLOAT_TYPES, precision_of_elem_type
from rlx_onnx_amp.taxonomy import SOURCE_VALUE_ATTRIBUTES
from rlx_onnx_amp.tensors import WeightSink, WeightSource, narrow
from rlx_onnx_amp.types import all_graphs, model_types

__all__ = ["emulate", "low_precision_values"]

_F32 = TensorProto.FLOAT


def low_precision_values(candidate: ModelProto) -> dict[str, int]:
    """Name -> low element type, for every value the candidate holds in f16 or bf16."""
    types = model_types(candidate)
    low: dict[str, int] = {}
    for scope in types.values():
        for name, elem in scope.items():
            if elem in FLOAT_TYPES and elem != _F32:
                low[name] = elem
    for graph in all_graphs(candidate.graph):
        for init in graph.initializer:
            if init.data_type in FLOAT_TYPES and init.data_type != _F32:
                low[init.name] = init.data_type
    # A value widened back to f32 from a low one (a graph output cast back under its original
    # name) carries the low value's rounding.
    for graph in all_graphs(candidate.graph):
        for node in graph.node:
            widened = node.op_type == "Cast" and node.input and node.input[0] in low and node.output[0] not in low
            if widened and next((a.i for a in node.attribute if a.name == "to"), None) == _F32:
                low[node.output[0]] = low[node.input[0]]
    return low


def _narrowed_reads(candidate: ModelProto, low: dict[str, int]) -> dict[str, dict[int, tuple[str, int]]]:
    """Node (by its first output name) -> {input index: (f32 value, low type)} for the inputs
    the candidate feeds through a Cast from an f32 value to low precision: the node computes on
    the rounded value (Inf past the range), though the value itself is held in f32."""
    reads: dict[str, dict[int, tuple[str, int]]] = {}
    for graph in all_graphs(candidate.graph):
        narrowing: dict[str, tuple[str, int]] = {}
        for node in graph.node:
            if node.op_type == "Cast" and node.input and node.input[0] not in low and node.output[0] in low:
                narrowing[node.output[0]] = (node.input[0], low[node.output[0]])
        for node in graph.node:
            if not node.output:
                continue
            for k, name in enumerate(node.input):
                if name in narrowing:
                    reads.setdefault(node.output[0], {})[k] = narrowing[name]
    return reads


def _saturated_sources(candidate: ModelProto, low: dict[str, int]) -> dict[str, TensorProto]:
    """Constant-like values the candidate holds in f32 whose tensor the converter clamped to a
    low range (its op could not hold the low type): output name -> the candidate's tensor."""
    found: dict[str, TensorProto] = {}
    for graph in all_graphs(candidate.graph):
        for node in graph.node:
            attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if not attr_name or not node.output or node.output[0] in low:
                continue
            for attr in node.attribute:
                t = attr.t
                inline = t.data_location != TensorProto.EXTERNAL
                if (
                    attr.name == attr_name
                    and attr.type == onnx.AttributeProto.TENSOR
                    and t.data_type == _F32
                    and inline
                ):
                    found[node.output[0]] = t
    return found


def emulate(
    reference: ModelProto,
    candidate: ModelProto,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    *,
    computed: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[ModelProto, int]:
    """The emulated candidate, and how many values it rounds. Rounded weights go to `sink`.

    With `computed=False` weights and constants are only clamped to the low type's range, as
    converted, and not rounded: the f32 graph then shows the magnitudes the converted model's
    values would take, small values (an epsilon that would flush) included. `progress(done,
    total)` counts initializers rounded.
    """
    low = low_precision_values(candidate)
    narrowed_reads = _narrowed_reads(candidate, low) if computed else {}
    saturated = _saturated_sources(candidate, low)
    model = ModelProto()
    model.CopyFrom(reference)
    source = source or WeightSource(None)
    sink = sink or WeightSink()
    used = {n for g in all_graphs(model.graph) for node in g.node for n in (*node.output, node.name)}
    used |= {t.name for g in all_graphs(model.graph) for t in g.initializer}
    rounded = 0
    ref_types = model_types(reference)
    f32_names = {n for scope in ref_types.values() for n, t in scope.items() if t == _F32}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        return name

    def round_tensor(tensor: TensorProto, elem: int) -> None:
        precision = precision_of_elem_type(elem)
        assert precision is not None
        values = source.read(tensor).astype("float32")
        if computed:
            values = narrow(values, precision)[0].astype("float32")
        else:
            limit = precision.info.max_finite
            values = np.where(np.isfinite(values), np.clip(values, -limit, limit), values).astype("float32")
        sink.store(tensor, values, _F32)

    # Bodies first: rewriting a graph copies its nodes, bodies included, so a body must be
    # final before the graph that holds it is rewritten.
    graphs = list(reversed(all_graphs(model.graph)))
    to_round = sum(1 for g in graphs for t in g.initializer if t.data_type == _F32 and t.name in low)
    for graph in graphs:
        for init in graph.initializer:
            if init.data_type == _F32 and init.name in low:
                round_tensor(init, low[init.name])
                rounded += 1
                if progress is not None:
                    progress(rounded, to_round)
        new_nodes: list[onnx.NodeProto] = []
        read_copies: dict[tuple[str, int], str] = {}  # (f32 value, low type) -> its rounded copy
        for node in graph.node:
            # An f32 value that the candidate casts down for this node: the node reads it rounded.
            for k, (value, elem) in narrowed_reads.get(node.output[0] if node.output else "", {}).items():
                # Only where the reference reads the f32 value itself: an inserted Cast. (A Cast
                # the model had is in the reference too, and its output is rounded already.)
                if k >= len(node.input) or node.input[k] != value:
                    continue
                if (value, elem) not in read_copies:
                    mid = fresh(f"{value}__read_low")
                    back = fresh(f"{value}__read_rounded")
                    new_nodes.append(helper.make_node("Cast", [value], [mid], name=fresh(f"{mid}__down"), to=elem))
                    new_nodes.append(helper.make_node("Cast", [mid], [back], name=fresh(f"{back}__up"), to=_F32))
                    read_copies[(value, elem)] = back
                    rounded += 1
                node.input[k] = read_copies[(value, elem)]
            new_nodes.append(node)
            attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if attr_name and node.output and node.output[0] in saturated:
                # Kept f32 but clamped by the converter for its low consumers: take its value.
                for attr in node.attribute:
                    if attr.name == attr_name and attr.type == onnx.AttributeProto.TENSOR:
                        attr.t.CopyFrom(saturated[node.output[0]])
            if attr_name and node.output and node.output[0] in low:
                attrs = {a.name: a for a in node.attribute}
                if (
                    attr_name in attrs
                    and attrs[attr_name].type == onnx.AttributeProto.TENSOR
                    and attrs[attr_name].t.data_type == _F32
                ):
                    round_tensor(attrs[attr_name].t, low[node.output[0]])
                    rounded += 1
                    continue
            for k, name in enumerate(node.output if computed else ()):
                if name in low and name in f32_names:
                    exact = fresh(f"{name}__exact")
                    node.output[k] = exact
                    mid = fresh(f"{name}__rounded")
                    new_nodes.append(helper.make_node("Cast", [exact], [mid], name=fresh(f"{mid}__down"), to=low[name]))
                    new_nodes.append(helper.make_node("Cast", [mid], [name], name=fresh(f"{name}__up"), to=_F32))
                    rounded += 1
        count = len(graph.node)
        graph.node.extend(new_nodes)
        del graph.node[:count]
    # value_info of renamed values would be stale; shapes are re-inferred by onnxruntime.
    for graph in all_graphs(model.graph):
        graph.ClearField("value_info")
    return model, rounded

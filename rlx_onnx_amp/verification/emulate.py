"""Precision emulation: the original f32 graph, with every value that the converted model holds
in low precision rounded to that precision.

Weights and Constant values take the values the candidate holds: a weight the candidate stores
in low precision is read from the candidate and widened (when its data is given), anything else
is narrowed exactly as the converter narrows it (clamped) and widened back. Computed values
get a Cast round trip (f32 -> low -> f32) right after their producer, under their original name.
So an f16 or bf16 conversion gets a drift figure on any provider that runs f32, including
onnxruntime's CPU provider, which computes most f16 ops in f32 and runs no bf16 arithmetic at
all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from rlx_onnx_amp.precision import LOW_TYPES, precision_of_elem_type
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, SOURCE_VALUE_ATTRIBUTES
from rlx_onnx_amp.tensors import WeightSink, WeightSource, narrow
from rlx_onnx_amp.types import FreshNames, all_graphs, model_types

__all__ = ["emulate", "low_precision_values"]

_F32 = TensorProto.FLOAT


def low_precision_values(candidate: ModelProto) -> dict[str, int]:
    """Name -> low element type, for every value the candidate holds in f16 or bf16."""
    types = model_types(candidate)
    low: dict[str, int] = {}
    for scope in types.values():
        for name, elem in scope.items():
            if elem in LOW_TYPES:
                low[name] = elem
    for graph in all_graphs(candidate.graph):
        for init in graph.initializer:
            if init.data_type in LOW_TYPES:
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


def _source_tensors(model: ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """(output name, tensor) of every Constant-like node whose value is a tensor attribute."""
    for graph in all_graphs(model.graph):
        for node in graph.node:
            attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
            if attr_name and node.output:
                for attr in node.attribute:
                    if attr.name == attr_name and attr.type == onnx.AttributeProto.TENSOR:
                        yield node.output[0], attr.t


def _constants_held(
    candidate: ModelProto, low: dict[str, int]
) -> tuple[dict[str, TensorProto], dict[str, TensorProto]]:
    """The candidate's Constant-like values, in one walk: those it holds as a low-precision
    tensor, and those it holds in f32 (inline) whose tensor the converter clamped to a low
    range because its op could not hold the low type. Each: output name -> the tensor."""
    low_held: dict[str, TensorProto] = {}
    saturated: dict[str, TensorProto] = {}
    for name, t in _source_tensors(candidate):
        if t.data_type in LOW_TYPES:
            low_held[name] = t
        elif name not in low and t.data_type == _F32 and t.data_location != TensorProto.EXTERNAL:
            saturated[name] = t
    return low_held, saturated


def emulate(
    reference: ModelProto,
    candidate: ModelProto,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    *,
    computed: bool = True,
    progress: Callable[[int, int], None] | None = None,
    candidate_source: WeightSource | None = None,
) -> tuple[ModelProto, int]:
    """The emulated candidate, and how many values it rounds. Rounded weights go to `sink`.

    With `candidate_source` (the candidate's weights), a weight the candidate holds in low
    precision is its stored value widened: what the candidate computes with, whichever tool
    wrote it, read at half the bytes and without narrowing again.

    With `computed=False` weights and constants are only clamped to the low type's range, as
    converted, and not rounded: the f32 graph then shows the magnitudes the converted model's
    values would take, small values (an epsilon that would flush) included. `progress(done,
    total)` counts initializers rounded.
    """
    model = ModelProto()
    model.CopyFrom(reference)
    emulation = _Emulation(
        model, reference, candidate, source or WeightSource(None), sink or WeightSink(), computed, candidate_source
    )
    # Bodies first: rewriting a graph copies its nodes, bodies included, so a body must be
    # final before the graph that holds it is rewritten.
    graphs = list(reversed(all_graphs(model.graph)))
    low = emulation.low
    to_round = sum(1 for g in graphs for t in g.initializer if t.data_type == _F32 and t.name in low)
    for graph in graphs:
        for init in graph.initializer:
            if init.data_type == _F32 and init.name in low:
                emulation.round_tensor(init, low[init.name])
                if progress is not None:
                    progress(emulation.rounded, to_round)
        emulation.rewrite(graph)
    # value_info of renamed values would be stale; shapes are re-inferred by onnxruntime.
    for graph in all_graphs(model.graph):
        graph.ClearField("value_info")
    return model, emulation.rounded


class _Emulation:
    """The state of one emulation: the candidate's low values, fresh names, rounded counts."""

    def __init__(
        self,
        model: ModelProto,
        reference: ModelProto,
        candidate: ModelProto,
        source: WeightSource,
        sink: WeightSink,
        computed: bool,
        candidate_source: WeightSource | None = None,
    ) -> None:
        self.low = low_precision_values(candidate)
        self.candidate_source = candidate_source or WeightSource(None)
        # The candidate's low weights by name, where its data can be read, and its low
        # Constant values (always inline) by output name.
        self.held = (
            {t.name: t for g in all_graphs(candidate.graph) for t in g.initializer if t.data_type in LOW_TYPES}
            if candidate_source is not None and computed
            else {}
        )
        low_constants, self.saturated = _constants_held(candidate, self.low)
        self.held_constants = low_constants if computed else {}
        self.narrowed_reads = _narrowed_reads(candidate, self.low) if computed else {}
        self.source, self.sink, self.computed = source, sink, computed
        self.fresh = FreshNames(
            n for g in all_graphs(model.graph) for node in g.node for n in (*node.output, node.name)
        )
        self.fresh.taken |= {t.name for g in all_graphs(model.graph) for t in g.initializer}
        self.f32_names = {n for scope in model_types(reference).values() for n, t in scope.items() if t == _F32}
        self.rounded = 0

    def round_tensor(self, tensor: TensorProto, elem: int, held: TensorProto | None = None) -> None:
        """`tensor` as the candidate holds it at `elem`: `held` (the candidate's own tensor) or
        the candidate's weight of that name widened, else narrowed here and widened."""
        precision = precision_of_elem_type(elem)
        assert precision is not None
        held = held if held is not None else self.held.get(tensor.name)
        if held is not None and held.data_type == elem and held.dims == tensor.dims:
            self.sink.store(tensor, self.candidate_source.read(held).astype(np.float32), _F32)
            self.rounded += 1
            return
        values = self.source.read(tensor).astype("float32")
        if self.computed:
            values = narrow(values, precision)[0].astype("float32")
        else:
            limit = precision.info.max_finite
            values = np.where(np.isfinite(values), np.clip(values, -limit, limit), values).astype("float32")
        self.sink.store(tensor, values, _F32)
        self.rounded += 1

    def rewrite(self, graph: onnx.GraphProto) -> None:
        """Every node of `graph` with the reads, constants and outputs the candidate rounds."""
        new_nodes: list[onnx.NodeProto] = []
        read_copies: dict[tuple[str, int], str] = {}  # (f32 value, low type) -> its rounded copy
        for node in graph.node:
            self._narrow_reads(node, new_nodes, read_copies)
            new_nodes.append(node)
            if self._round_source(node):
                continue
            if self.computed:
                new_nodes += self._round_outputs(node)
        count = len(graph.node)
        graph.node.extend(new_nodes)
        del graph.node[:count]

    def _narrow_reads(
        self, node: onnx.NodeProto, new_nodes: list[onnx.NodeProto], read_copies: dict[tuple[str, int], str]
    ) -> None:
        """An f32 value that the candidate casts down for this node: the node reads it rounded."""
        for k, (value, elem) in self.narrowed_reads.get(node.output[0] if node.output else "", {}).items():
            # Only where the reference reads the f32 value itself: an inserted Cast. (A Cast
            # the model had is in the reference too, and its output is rounded already.)
            if k >= len(node.input) or node.input[k] != value:
                continue
            if (value, elem) not in read_copies:
                mid = self.fresh(f"{value}__read_low")
                back = self.fresh(f"{value}__read_rounded")
                new_nodes.append(helper.make_node("Cast", [value], [mid], name=self.fresh(f"{mid}__down"), to=elem))
                new_nodes.append(helper.make_node("Cast", [mid], [back], name=self.fresh(f"{back}__up"), to=_F32))
                read_copies[(value, elem)] = back
                self.rounded += 1
            node.input[k] = read_copies[(value, elem)]

    def _round_source(self, node: onnx.NodeProto) -> bool:
        """A Constant-like node: the value the candidate holds (clamped, or rounded); True when
        its value was rounded in place (its output needs no round trip)."""
        attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if not (attr_name and node.output):
            return False
        if node.output[0] in self.saturated:
            # Kept f32 but clamped by the converter for its low consumers: take its value.
            for attr in node.attribute:
                if attr.name == attr_name and attr.type == onnx.AttributeProto.TENSOR:
                    attr.t.CopyFrom(self.saturated[node.output[0]])
        if node.output[0] in self.low:
            attrs = {a.name: a for a in node.attribute}
            value = attrs.get(attr_name)
            if value is not None and value.type == onnx.AttributeProto.TENSOR and value.t.data_type == _F32:
                self.round_tensor(value.t, self.low[node.output[0]], self.held_constants.get(node.output[0]))
                return True
        return False

    def _round_outputs(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """Each f32 output the candidate holds low, through a round trip under its own name."""
        added = []
        for k, name in enumerate(node.output):
            if name in self.low and name in self.f32_names:
                exact = self.fresh(f"{name}__exact")
                node.output[k] = exact
                mid = self.fresh(f"{name}__rounded")
                down = helper.make_node("Cast", [exact], [mid], name=self.fresh(f"{mid}__down"), to=self.low[name])
                up = helper.make_node("Cast", [mid], [name], name=self.fresh(f"{name}__up"), to=_F32)
                added += [down, up]
                self.rounded += 1
        return added

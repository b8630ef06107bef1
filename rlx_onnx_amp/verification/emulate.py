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
from rlx_onnx_amp.types import FreshNames, all_graphs, model_types, subgraphs

__all__ = ["emulate", "low_precision_values"]

_F32 = TensorProto.FLOAT


def canonical_scopes(graph: onnx.GraphProto) -> list[tuple[str, str, onnx.GraphProto]]:
    """(canonical path, path, graph) for `graph` and every body in it, outer graphs first. The
    canonical path counts the nodes that hold bodies instead of all nodes ("cf0/else_branch/"),
    so a body has the same one in the reference and in the candidate, whose Casts move node
    indices: values are matched by (canonical path, name), since If branches may reuse a name
    for another value (optimum's merged decoders copy one decoder into both)."""
    found = []

    def walk(g: onnx.GraphProto, canon: str, path: str) -> None:
        found.append((canon, path, g))
        holders = 0
        for i, node in enumerate(g.node):
            bodies = subgraphs(node)
            for key, body in bodies:
                walk(body, f"{canon}cf{holders}/{key}/", f"{path}{i}/{key}/")
            holders += bool(bodies)

    walk(graph, "", "")
    return found


def low_values_by_scope(candidate: ModelProto) -> dict[str, dict[str, int]]:
    """Canonical scope path -> {name: low element type} of the values the candidate holds in
    f16 or bf16 in that graph (its computed values, initializers and widened copies)."""
    types = model_types(candidate)
    found: dict[str, dict[str, int]] = {}
    for canon, path, graph in canonical_scopes(candidate.graph):
        low = {name: elem for name, elem in types.get(path, {}).items() if elem in LOW_TYPES}
        low.update((init.name, init.data_type) for init in graph.initializer if init.data_type in LOW_TYPES)
        # A value widened back to f32 from a low one (a graph output cast back under its
        # original name) carries the low value's rounding.
        for node in graph.node:
            widened = node.op_type == "Cast" and node.input and node.input[0] in low and node.output[0] not in low
            if widened and next((a.i for a in node.attribute if a.name == "to"), None) == _F32:
                low[node.output[0]] = low[node.input[0]]
        found[canon] = low
    return found


def low_precision_values(candidate: ModelProto) -> dict[str, int]:
    """Name -> low element type, for every value the candidate holds in f16 or bf16 (in any of
    its graphs: for feeds and the lowest precision; the emulation matches by scope)."""
    low: dict[str, int] = {}
    for scope in low_values_by_scope(candidate).values():
        low.update(scope)
    return low


def _narrowed_reads(graph: onnx.GraphProto, low: dict[str, int]) -> dict[str, dict[int, tuple[str, int]]]:
    """Node of `graph` (by its first output name) -> {input index: (f32 value, low type)} for
    the inputs the candidate feeds through a Cast from an f32 value to low precision: the node
    computes on the rounded value (Inf past the range), though the value itself is held in f32."""
    reads: dict[str, dict[int, tuple[str, int]]] = {}
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


def _source_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, TensorProto]]:
    """(output name, tensor) of every Constant-like node of `graph` whose value is a tensor attribute."""
    for node in graph.node:
        attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if attr_name and node.output:
            for attr in node.attribute:
                if attr.name == attr_name and attr.type == onnx.AttributeProto.TENSOR:
                    yield node.output[0], attr.t


def _constants_held(
    graph: onnx.GraphProto, low: dict[str, int]
) -> tuple[dict[str, TensorProto], dict[str, TensorProto]]:
    """The Constant-like values of one of the candidate's graphs, in one walk: those it holds as
    a low-precision tensor, and those it holds in f32 (inline) whose tensor the converter
    clamped to a low range because its op could not hold the low type. Each: output name ->
    the tensor."""
    low_held: dict[str, TensorProto] = {}
    saturated: dict[str, TensorProto] = {}
    for name, t in _source_tensors(graph):
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
    graphs = list(reversed(canonical_scopes(model.graph)))
    to_round = sum(
        1 for canon, _, g in graphs for t in g.initializer if t.data_type == _F32 and t.name in emulation.low(canon)
    )
    for canon, path, graph in graphs:
        low = emulation.low(canon)
        for init in graph.initializer:
            if init.data_type == _F32 and init.name in low:
                emulation.round_tensor(init, low[init.name])
                if progress is not None:
                    progress(emulation.rounded, to_round)
        emulation.rewrite(graph, canon, path)
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
        self.low_by_scope = low_values_by_scope(candidate)
        self.candidate_source = candidate_source or WeightSource(None)
        # The candidate's low weights by name, where its data can be read, and its low
        # Constant values (always inline) by output name.
        self.held = (
            {t.name: t for g in all_graphs(candidate.graph) for t in g.initializer if t.data_type in LOW_TYPES}
            if candidate_source is not None and computed
            else {}
        )
        # By canonical scope: the candidate's constants, and the reads it narrows with a Cast.
        self.saturated: dict[str, dict[str, TensorProto]] = {}
        self.held_constants: dict[str, dict[str, TensorProto]] = {}
        self.narrowed_reads: dict[str, dict[str, dict[int, tuple[str, int]]]] = {}
        for canon, _, graph in canonical_scopes(candidate.graph):
            low_constants, self.saturated[canon] = _constants_held(graph, self.low(canon))
            self.held_constants[canon] = low_constants if computed else {}
            self.narrowed_reads[canon] = _narrowed_reads(graph, self.low(canon)) if computed else {}
        self.source, self.sink, self.computed = source, sink, computed
        self.fresh = FreshNames(
            n for g in all_graphs(model.graph) for node in g.node for n in (*node.output, node.name)
        )
        self.fresh.taken |= {t.name for g in all_graphs(model.graph) for t in g.initializer}
        # f32 values by scope: If branches may reuse a name for values of different types
        # (optimum's merged decoders copy one decoder into both), and only an f32 one is rounded.
        self.f32_names = {
            path: {n for n, t in scope.items() if t == _F32} for path, scope in model_types(reference).items()
        }
        self.rounded = 0

    def low(self, canon: str) -> dict[str, int]:
        """The values the candidate holds low in the graph at canonical path `canon`."""
        return self.low_by_scope.get(canon, {})

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

    def rewrite(self, graph: onnx.GraphProto, canon: str = "", path: str = "") -> None:
        """Every node of `graph` (at canonical path `canon`, path `path` in the reference) with
        the reads, constants and outputs the candidate rounds."""
        new_nodes: list[onnx.NodeProto] = []
        read_copies: dict[tuple[str, int], str] = {}  # (f32 value, low type) -> its rounded copy
        low = self.low(canon)
        for node in graph.node:
            self._narrow_reads(node, new_nodes, read_copies, self.narrowed_reads.get(canon, {}))
            new_nodes.append(node)
            if self._round_source(node, canon):
                continue
            if self.computed:
                new_nodes += self._round_outputs(node, low, self.f32_names.get(path, set()))
        count = len(graph.node)
        graph.node.extend(new_nodes)
        del graph.node[:count]

    def _narrow_reads(
        self,
        node: onnx.NodeProto,
        new_nodes: list[onnx.NodeProto],
        read_copies: dict[tuple[str, int], str],
        narrowed: dict[str, dict[int, tuple[str, int]]],
    ) -> None:
        """An f32 value that the candidate casts down for this node: the node reads it rounded."""
        for k, (value, elem) in narrowed.get(node.output[0] if node.output else "", {}).items():
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

    def _round_source(self, node: onnx.NodeProto, canon: str) -> bool:
        """A Constant-like node: the value the candidate holds (clamped, or rounded); True when
        its value was rounded in place (its output needs no round trip)."""
        attr_name = SOURCE_VALUE_ATTRIBUTES.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        if not (attr_name and node.output):
            return False
        saturated, low = self.saturated.get(canon, {}), self.low(canon)
        if node.output[0] in saturated:
            # Kept f32 but clamped by the converter for its low consumers: take its value.
            held = saturated[node.output[0]]
            for attr in node.attribute:
                tensor = attr.t if attr.name == attr_name and attr.type == onnx.AttributeProto.TENSOR else None
                if tensor is not None and tensor.data_type == _F32 and list(tensor.dims) == list(held.dims):
                    tensor.CopyFrom(held)
        if node.output[0] in low:
            attrs = {a.name: a for a in node.attribute}
            value = attrs.get(attr_name)
            if value is not None and value.type == onnx.AttributeProto.TENSOR and value.t.data_type == _F32:
                held_constant = self.held_constants.get(canon, {}).get(node.output[0])
                self.round_tensor(value.t, low[node.output[0]], held_constant)
                return True
        return False

    def _round_outputs(self, node: onnx.NodeProto, low: dict[str, int], f32_names: set[str]) -> list[onnx.NodeProto]:
        """Each f32 output the candidate holds low, through a round trip under its own name."""
        added = []
        for k, name in enumerate(node.output):
            if name in low and name in f32_names:
                exact = self.fresh(f"{name}__exact")
                node.output[k] = exact
                mid = self.fresh(f"{name}__rounded")
                down = helper.make_node("Cast", [exact], [mid], name=self.fresh(f"{mid}__down"), to=low[name])
                up = helper.make_node("Cast", [mid], [name], name=self.fresh(f"{name}__up"), to=_F32)
                added += [down, up]
                self.rounded += 1
        return added

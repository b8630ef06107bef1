"""Element types of every value of a model, without serializing its weights.

Two ways, the first tried first:
- `schema_types`: one pass over the graph in node order, typing each output from the op's
  schema (the input it shares a type variable with, or the one type its variable admits) or
  from a `to`/`value` attribute. No serialization; on a 200,000-node graph about half the time
  of the inference path below (2.5 s against 3.6 to 4.8 s). It gives up (None) on anything it
  cannot type for certain: control flow, sequences, outputs typed by other attributes, unknown ops.
- `infer_types`: onnx's shape inference on a copy of the model's structure in which large
  initializers carry only their type and dims, so a multi-GB model costs no more than its graph.
  Values it cannot type (contrib ops) are typed later by the converter from the op schemas.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import onnx
import onnx.shape_inference
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from rlx_onnx_amp.schema import OpSignature, signature
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, SOURCE_VALUE_ATTRIBUTES, canonical_domain

__all__ = [
    "ATTRIBUTE_TYPED_OUTPUTS",
    "DEFAULT_DIM",
    "GRAPH_OPS",
    "NON_TENSOR",
    "OUTPUT_TYPE_ATTRIBUTE",
    "FreshNames",
    "NodeFields",
    "ScopeTypes",
    "all_graphs",
    "all_tensors",
    "attribute_output_type",
    "concrete_input_shape",
    "constant_type",
    "declared_types",
    "infer_types",
    "initializer_rows",
    "model_types",
    "names_read",
    "opset_versions",
    "schema_output_types",
    "schema_types",
    "structure_copy",
    "subgraphs",
    "tensor_elem_type",
]

logger = logging.getLogger(__name__)

# Initializers up to this many elements keep their data in the structure copy, so shape
# inference can still read shapes and axes from them.
_KEEP_DATA_ELEMENTS = 1 << 16

#: The "element type" recorded for sequence, optional and map values: never retyped.
NON_TENSOR = -1

_SCHEMAS = onnx.defs.get_all_schemas_with_history()
#: The ops of the default domain that have graph attributes.
GRAPH_OPS = frozenset(
    s.name
    for s in _SCHEMAS
    if s.domain == "" and any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in s.attributes.values())
)
#: (domain, op) of the onnx schemas that have tensor attributes (Constant, ConstantOfShape, ...);
#: the other ops of these domains hold no tensors, so their attributes need not be read.
_SCHEMA_DOMAINS = frozenset(s.domain for s in _SCHEMAS)
_TENSOR_OPS = frozenset(
    (s.domain, s.name)
    for s in _SCHEMAS
    if any(a.type in (AttributeProto.TENSOR, AttributeProto.TENSORS) for a in s.attributes.values())
)
#: Op names that hold tensor or graph attributes in some onnx domain: the nodes whose domain
#: and attributes must be read to find tensors and bodies.
_ATTRIBUTE_HOLDER_NAMES = frozenset(op for _, op in _TENSOR_OPS) | GRAPH_OPS

#: Element types of the values of each graph scope, keyed by scope path.
ScopeTypes = dict[str, dict[str, int]]


def opset_versions(model: ModelProto) -> dict[str, int]:
    """The model's opset per domain, the default domain under "" whichever name it imports."""
    return {canonical_domain(o.domain): o.version for o in model.opset_import}


class FreshNames:
    """Names no value or node has yet: `base` itself, else `base_1`, `base_2`, ... Every name
    handed out is taken from then on; `taken` may be added to directly.

    Every base holds `MARK`, and so does every name made from it: a name without the mark can
    never collide, and `take` keeps only the names that hold it (in most graphs none does, and
    a large graph's hundreds of thousands of names cost one string search instead of a set)."""

    MARK = "__"

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken: set[str] = set()
        self.take(taken)

    def take(self, names: Iterable[str]) -> None:
        """Take `names` (those that hold `MARK`)."""
        listed = names if isinstance(names, list) else list(names)
        if self.MARK in "\0".join(listed):  # "\0" joins no two names into a false mark
            self.taken.update(n for n in listed if self.MARK in n)

    def __call__(self, base: str) -> str:
        if self.MARK not in base:
            raise ValueError(f"a fresh name's base holds {self.MARK!r}: {base!r}")
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, GraphProto]]:
    """The graphs held in a node's attributes, with a stable key for each."""
    found: list[tuple[str, GraphProto]] = []
    if (node.op_type not in GRAPH_OPS and node.domain in DEFAULT_DOMAINS) or not node.attribute:
        return found  # of the default domain's ops, only these hold graphs: skip reading attributes
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == AttributeProto.GRAPHS:
            found.extend((f"{attr.name}[{k}]", g) for k, g in enumerate(attr.graphs))
    return found


def scoped_graphs(graph: GraphProto, fields: NodeFields | None = None) -> list[tuple[str, GraphProto]]:
    """Every graph with its scope path ("" for the main graph, "3/body/" for the body of node
    3), outer graphs first: the keys of `model_types`. `fields`: `graph`'s nodes already read."""
    found = []

    def walk(g: GraphProto, scope: str, holders: Iterable[int]) -> None:
        found.append((scope, g))
        nodes = g.node
        for i in holders:
            for key, body in subgraphs(nodes[i]):
                walk(body, f"{scope}{i}/{key}/", range(len(body.node)))

    walk(graph, "", fields.holders if fields is not None else range(len(graph.node)))
    return found


def all_graphs(graph: GraphProto) -> list[GraphProto]:
    """`graph` and every body nested in it, outer graphs first."""
    return [g for g, _ in _graphs_and_tensor_holders(graph)]


def all_tensors(model: ModelProto, fields: NodeFields | None = None) -> Iterator[TensorProto]:
    """Every initializer and tensor attribute (Constant values) of a model, bodies included.
    `fields`: the main graph's nodes already read (`NodeFields`), whose attributes are then
    read once for the passes too (`NodeFields.attributes`)."""
    if fields is None:
        graphs = _graphs_and_tensor_holders(model.graph)
    else:
        indices = _holder_indices(fields)
        yield from model.graph.initializer
        for i in indices:
            yield from (t for _, _, t in fields.attributes(i) if t is not None)
        nodes, ops, domains = fields.nodes, fields.ops, fields.domains
        bodies = _bodies_of((nodes[i], ops[i], domains[i]) for i in indices)
        graphs = [found for body in bodies for found in _graphs_and_tensor_holders(body)]
    for graph, holders in graphs:
        yield from graph.initializer
        for node in holders:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    yield attr.t


def _graphs_and_tensor_holders(graph: GraphProto) -> list[tuple[GraphProto, list[onnx.NodeProto]]]:
    """Each graph (outer first) with its nodes that may hold tensor attributes, in one read of
    each node's op type (and domain where the op type alone cannot tell)."""
    holders = [node for node in graph.node if _may_hold_tensors(node.op_type, node)]
    found = [(graph, holders)]
    for body in _bodies_of((node, node.op_type, node.domain) for node in holders):
        found.extend(_graphs_and_tensor_holders(body))
    return found


def _bodies_of(holders: Iterable[tuple[onnx.NodeProto, str, str]]) -> list[GraphProto]:
    """The graphs the holders, given as (node, op type, domain), hold: of the default domain's
    ops only GRAPH_OPS hold any."""
    return [
        body
        for node, op, domain in holders
        if op in GRAPH_OPS or domain not in DEFAULT_DOMAINS
        for _, body in subgraphs(node)
    ]


def _may_hold_tensors(op: str, node: onnx.NodeProto, domain: str | None = None) -> bool:
    """Whether a node may hold tensor or graph attributes: an op of that name does in some
    onnx domain, or its domain is not one of onnx's (`domain`: the node's, if already read)."""
    if op in _ATTRIBUTE_HOLDER_NAMES:
        return True
    domain = node.domain if domain is None else domain
    return not (domain in DEFAULT_DOMAINS or (domain in _SCHEMA_DOMAINS and (domain, op) not in _TENSOR_OPS))


def _holder_indices(fields: NodeFields) -> list[int]:
    """The indices of the nodes of `fields` that may hold tensor or graph attributes
    (`_may_hold_tensors`): by op name alone where every node is of onnx's default domains."""
    ops, nodes, domains = fields.ops, fields.nodes, fields.domains
    if DEFAULT_DOMAINS.issuperset(domains):  # most graphs: only the holders' names matter
        return [i for i, op in enumerate(ops) if op in _ATTRIBUTE_HOLDER_NAMES]
    return [i for i, op in enumerate(ops) if _may_hold_tensors(op, nodes[i], domains[i])]


def structure_copy(model: ModelProto) -> ModelProto:
    """The model without its weight bytes: large or external initializers keep only their type and dims."""
    stub = ModelProto()
    stub.ir_version = model.ir_version
    stub.opset_import.extend(model.opset_import)
    stub.functions.extend(model.functions)
    graph, src = stub.graph, model.graph
    graph.name = src.name
    graph.node.extend(src.node)
    graph.input.extend(src.input)
    graph.output.extend(src.output)
    graph.value_info.extend(src.value_info)
    for init in src.initializer:
        small = 1
        for d in init.dims:
            small *= d
        if small <= _KEEP_DATA_ELEMENTS and init.data_location != TensorProto.EXTERNAL:
            graph.initializer.append(init)
        else:
            graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
    return stub


#: An attribute as `read_attributes` gives it: its name, its type, its tensor (TENSOR only, else None).
ReadAttribute = tuple[str, int, TensorProto | None]


def read_attributes(node: onnx.NodeProto) -> tuple[ReadAttribute, ...]:
    """A node's attributes as (name, type, the tensor of a TENSOR attribute else None)."""
    read = []
    for a in node.attribute:
        kind = a.type
        read.append((a.name, kind, a.t if kind == AttributeProto.TENSOR else None))
    return tuple(read)


class NodeFields(NamedTuple):
    """Each node's op type, domain, inputs, outputs and name, read once from a graph's protobuf,
    with the node itself: the reads are the slow part of a sweep (a 200,000-node graph's
    inputs and outputs take about 0.6 s to copy out), so the passes of one conversion share one
    read of the main graph."""

    ops: list[str]
    domains: list[str]
    inputs: list[list[str]]
    outputs: list[list[str]]
    names: list[str]
    nodes: list[onnx.NodeProto]
    #: The indices of the nodes that may hold graphs (`subgraphs` reads their attributes): of
    #: the default domain's ops only GRAPH_OPS do, any other domain's op may.
    holders: list[int]
    #: Node index -> its attributes, once read (`attributes`).
    attribute_cache: dict[int, tuple[ReadAttribute, ...]]
    #: The graph's initializers, with each one's name and element type: the passes read them
    #: half a dozen times before the emit pass changes any.
    initializers: list[TensorProto]
    initializer_names: list[str]
    initializer_types: list[int]

    def attributes(self, i: int) -> tuple[ReadAttribute, ...]:
        """Node i's attributes as (name, type, the tensor of a TENSOR attribute else None), read
        from the protobuf once: the load, the weights' facts and the typing all read the
        Constants' values (on a graph of many small Constants, each read costs as much as
        the rest of a Constant's typing)."""
        found = self.attribute_cache.get(i)
        if found is None:
            found = self.attribute_cache[i] = read_attributes(self.nodes[i])
        return found

    @classmethod
    def read(cls, graph: GraphProto) -> NodeFields:
        ops: list[str] = []
        domains: list[str] = []
        inputs: list[list[str]] = []
        outputs: list[list[str]] = []
        names: list[str] = []
        nodes = list(graph.node)
        op, domain, read_in, read_out, name = ops.append, domains.append, inputs.append, outputs.append, names.append
        # One walk: each node's wrapper is made once. A slice copies a repeated field to a
        # list twice as fast as list().
        for n in nodes:
            op(n.op_type)
            domain(n.domain)
            read_in(n.input[:])
            read_out(n.output[:])
            name(n.name)
        if GRAPH_OPS.isdisjoint(ops) and DEFAULT_DOMAINS.issuperset(domains):  # most graphs: set checks only
            holders = []
        else:
            holders = [i for i, op in enumerate(ops) if op in GRAPH_OPS or domains[i] not in DEFAULT_DOMAINS]
        initializers = list(graph.initializer)
        weights = [(t.name, t.data_type) for t in initializers]
        return cls(
            ops, domains, inputs, outputs, names, nodes, holders, {}, initializers,
            [name for name, _ in weights], [elem for _, elem in weights],
        )


def initializer_rows(graph: GraphProto, fields: NodeFields | None = None) -> Iterable[tuple[TensorProto, str, int]]:
    """Each initializer of `graph` with its name and element type, in order: from `fields`, the
    graph's own `NodeFields` where they were read, else from the graph."""
    if fields is not None:
        return zip(fields.initializers, fields.initializer_names, fields.initializer_types)
    return ((t, t.name, t.data_type) for t in graph.initializer)


def sort_topologically(graph: GraphProto, outer: frozenset[str] = frozenset(), fields: NodeFields | None = None) -> int:
    """Put `graph`'s nodes (and its bodies', at any depth) in an order where each node comes
    after the producers of what it reads, its bodies' reads of this graph's values included;
    the nodes already in order keep it. onnxruntime loads a model whose nodes are out of order
    and the checker refuses it; the rewrite, which types values in node order, needs them in
    order. Returns how many graphs were reordered; a graph whose reads cannot all be met (a
    cycle, an undefined name) is left as it is, for the checker to name. onnx itself has no
    sort over a GraphProto (onnx-ir sorts its own IR, which a round trip would re-serialize).
    `fields`: the graph's nodes already read (`NodeFields`)."""
    read = fields if fields is not None else NodeFields.read(graph)
    defined = set(outer) | {i.name for i in graph.input} | set(read.initializer_names) | {""}
    nodes = read.nodes
    reordered = 0
    known = set(defined)
    in_order = True
    holders = set(read.holders)
    has, add = known.issuperset, known.update
    # The common case, in order: one pass of set checks (a body's reads only at its holder).
    for i, (ins, outs) in enumerate(zip(read.inputs, read.outputs)):
        if not has(_reads(nodes[i]) if holders and i in holders else ins):
            in_order = False
            break
        add(outs)
    if holders:
        known.update(itertools.chain.from_iterable(read.outputs))  # for the bodies: every value of this graph
    if not in_order and _sort_nodes(graph, nodes, defined):
        reordered += 1
        read = NodeFields.read(graph)
        nodes = read.nodes
    if holders:
        names = frozenset(known)
        for i in read.holders:
            for _, body in subgraphs(nodes[i]):
                reordered += sort_topologically(body, names)
    return reordered


def _sort_nodes(graph: GraphProto, nodes: list[onnx.NodeProto], defined: set[str]) -> bool:
    """Sort the graph's nodes so that each follows its producers, the nodes in order keeping
    their order; whether they moved (not when a read cannot be met: a cycle, an undefined name)."""
    needs = [_reads(node) for node in nodes]
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waits = [{producer[n] for n in reads if n in producer and n not in defined} for reads in needs]
    readers: dict[int, list[int]] = {}
    for i, deps in enumerate(waits):
        for j in deps:
            readers.setdefault(j, []).append(i)
    ready = [i for i, deps in enumerate(waits) if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers.get(i, ()):
            waits[k].discard(i)
            if not waits[k]:
                heapq.heappush(ready, k)
    if len(order) != len(nodes) or order == sorted(order):
        return False
    position = {i: rank for rank, i in enumerate(order)}
    keys = iter([position[i] for i in range(len(nodes))])
    graph.node.sort(key=lambda _: next(keys))
    return True


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs and what its bodies read from outside them."""
    reads = set(node.input)
    for _, body in subgraphs(node):
        inside: set[str] = set()
        for graph in all_graphs(body):  # what the body and its own bodies define
            inside |= {i.name for i in graph.input} | {t.name for t in graph.initializer}
            inside |= {o for n in graph.node for o in n.output}
        reads |= names_read(body) - inside
    return reads


def names_read(graph: GraphProto) -> set[str]:
    """Every value name the nodes of `graph` and of its bodies read."""
    read: set[str] = set()
    for node in graph.node:
        read.update(node.input)
        for _, body in subgraphs(node):
            read |= names_read(body)
    return read


#: A symbolic axis of a graph input not given by `--shape`: the first axis gets 1 (a batch),
#: the others this (verification's synthesized inputs and the cost model use the same rule).
DEFAULT_DIM = 8


def concrete_input_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    """The shape a graph input gets when the user names none."""
    return tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if axis == 0 else DEFAULT_DIM)
        for axis, d in enumerate(vi.type.tensor_type.shape.dim)
    )


def _collect(graph: GraphProto, path: str, out: ScopeTypes) -> None:
    types: dict[str, int] = {}
    for init in graph.initializer:
        types[init.name] = init.data_type
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
        elif vi.type.WhichOneof("value") in ("sequence_type", "optional_type", "map_type"):
            types[vi.name] = NON_TENSOR
    out[path] = types
    for i, node in enumerate(graph.node):
        for key, sub in subgraphs(node):
            _collect(sub, f"{path}{i}/{key}/", out)


def infer_types(model: ModelProto) -> ScopeTypes:
    """Element types of the values of every scope."""
    stub = structure_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=False)
    except Exception as e:
        logger.info("onnx shape inference failed (%s); typing from schemas alone", e)
        inferred = stub
    out: ScopeTypes = {}
    _collect(inferred.graph, "", out)
    return out


#: Element types by the names type strings use: `float`, `float16`, `int64`, ...
_TYPE_NAMES = {TensorProto.DataType.Name(v).lower(): v for v in TensorProto.DataType.values()}
#: Ops whose output type is the value of an attribute (a TensorProto.DataType).
OUTPUT_TYPE_ATTRIBUTE = {"Cast": "to", "BitCast": "to"}


def tensor_elem_type(type_str: str | None) -> int | None:
    """The element type of a type string such as `tensor(float16)`; None for other strings."""
    if type_str and type_str.startswith("tensor(") and type_str.endswith(")"):
        return _TYPE_NAMES.get(type_str[len("tensor(") : -1])
    return None


#: The element type each of a Constant's value attributes gives (`value` is its tensor's).
_CONSTANT_VALUE_TYPES = {
    "value_float": TensorProto.FLOAT,
    "value_floats": TensorProto.FLOAT,
    "value_int": TensorProto.INT64,
    "value_ints": TensorProto.INT64,
    "value_string": TensorProto.STRING,
    "value_strings": TensorProto.STRING,
}


def constant_type(node: onnx.NodeProto, attributes: Sequence[ReadAttribute] | None = None) -> int | None:
    """The element type of a Constant's or ConstantOfShape's value (a float 0 when it has none);
    `attributes`: the node's, already read (`read_attributes`)."""
    for name, _, tensor in attributes if attributes is not None else read_attributes(node):
        if name == "value" and tensor is not None:
            return tensor.data_type
        if name in _CONSTANT_VALUE_TYPES:
            return _CONSTANT_VALUE_TYPES[name]
    return TensorProto.FLOAT if node.op_type == "ConstantOfShape" else None


#: Default-domain ops whose first output's type an attribute gives (Constant's value, Cast's `to`).
ATTRIBUTE_TYPED_OUTPUTS = frozenset(SOURCE_VALUE_ATTRIBUTES) | frozenset(OUTPUT_TYPE_ATTRIBUTE)


def attribute_output_type(
    node: onnx.NodeProto, op: str, attributes: Sequence[ReadAttribute] | None = None
) -> int | None:
    """The type an attribute gives the first output of a node of `ATTRIBUTE_TYPED_OUTPUTS`;
    None when it gives none (a Cast without `to`). `attributes`: a Constant's, already read."""
    if op in SOURCE_VALUE_ATTRIBUTES:
        return constant_type(node, attributes)
    name = OUTPUT_TYPE_ATTRIBUTE[op]
    return next((a.i for a in node.attribute if a.name == name), None) or None


def schema_output_types(sig: OpSignature, in_types: Sequence[int | None], n_outputs: int) -> list[int | None]:
    """The output types the schema alone gives a node: per type variable, the one type its
    inputs have, or the one type the variable admits; None where neither says."""
    elems: list[int | None] = [None] * n_outputs
    for g in sig.groups:
        known = {in_types[k] for k in g.inputs if in_types[k] is not None}
        if len(known) == 1:
            (elem,) = known
        elif not known and len(g.allowed) == 1:
            elem = tensor_elem_type(next(iter(g.allowed)))
        else:
            elem = None
        for k in g.outputs:
            elems[k] = elem
    return elems


def declared_types(graph: GraphProto, fields: NodeFields | None = None) -> dict[str, int] | None:
    """The element types a graph declares (initializers, inputs, value_info, outputs), or None
    when it declares a sequence, optional or map (those need onnx's inference). `fields`: the
    graph's, already read (`NodeFields`)."""
    types = {name: elem for _, name, elem in initializer_rows(graph, fields)}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type":
            if vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        elif kind is not None:
            return None
    return types


def schema_types(model: ModelProto) -> ScopeTypes | None:
    """Element types of the main graph's values from op schemas alone, or None when a value
    cannot be typed that way for certain (then `infer_types` must run)."""

    graph = model.graph
    opsets = opset_versions(model)
    declared = declared_types(graph)
    if declared is None:
        return None  # sequences, optionals, maps: onnx's inference knows them
    types: dict[str, int] = declared
    templates: dict[tuple[object, ...], list[int | None]] = {}
    for node in graph.node:
        op, domain = node.op_type, node.domain
        outs = node.output[:]
        default_domain = domain in DEFAULT_DOMAINS
        if default_domain and op in ATTRIBUTE_TYPED_OUTPUTS:
            elem = attribute_output_type(node, op)
            if elem is None:
                return None
            types[outs[0]] = elem
            continue
        if subgraphs(node):
            return None  # control flow: bodies need onnx's inference
        ins = node.input[:]
        key = (domain, op, tuple(types.get(n, 0) if n else -1 for n in ins), len(outs))
        elems = templates.get(key)
        if elems is None:
            sig = signature(
                "" if default_domain else domain,
                op,
                opsets.get("" if default_domain else domain, 1),
                len(ins),
                len(outs),
            )
            if sig is None:
                return None
            elems = schema_output_types(sig, [types.get(n) if n else None for n in ins], len(outs))
            templates[key] = elems  # the same op on the same input types types its outputs alike
        for name, elem in zip(outs, elems):
            if not name:
                continue
            if elem is None:
                if name not in types:
                    return None
                continue
            types.setdefault(name, elem)  # a declared type stands
    return {"": types}


def model_types(model: ModelProto) -> ScopeTypes:
    """Element types of the values of every scope: from schemas when that types everything,
    else from onnx's inference."""
    fast = schema_types(model)
    if fast is not None:
        return fast
    logger.debug("schema typing gave up; running onnx shape inference")
    return infer_types(model)

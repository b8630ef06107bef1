"""What a conversion buys: a cost model from shapes, in every conversion report.

From a converted model and concrete input shapes (`--shape`, else the verifier's defaults:
symbolic first axis 1, other symbolic axes `types.DEFAULT_DIM`), by onnx shape inference:

- multiply-accumulates of the Compute ops (`MAC_FORMULAS`: MatMul, Gemm, Conv, ConvTranspose,
  Einsum, attention ops), and the share that runs in low precision (a node runs low when its
  first float output is f16 or bf16);
- float weight elements (initializers and Constant values) and the share stored low;
- Casts between float types, and the bytes they read and write per inference where their shape
  is known;
- precision islands: groups of low-precision nodes connected by low-precision values, each
  entered and left through Casts.

Nodes whose shapes inference cannot give (an unknown op upstream, a data-dependent length)
are counted in `unknown_macs_nodes` / `unknown_cast_nodes`, never guessed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import onnx

from rlx_onnx_amp.precision import FLOAT_TYPES, Precision, precision_of_elem_type
from rlx_onnx_amp.taxonomy import canonical_domain
from rlx_onnx_amp.types import all_graphs, all_tensors, concrete_input_shape, structure_copy

__all__ = ["MAC_FORMULAS", "Cost", "estimate_cost", "policy_hint"]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]
#: (node, input shapes, output shapes) -> multiply-accumulates, or None when a shape is missing.
MacFormula = Callable[[onnx.NodeProto, Sequence[Shape | None], Sequence[Shape | None]], int | None]


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _matmul(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    a, out = ins[0], outs[0]
    if a is None or out is None or not a:
        return None
    return _numel(out) * a[-1]


def _gemm(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    a, out = ins[0], outs[0]
    if a is None or out is None or len(a) != 2:
        return None
    trans_a = next((attr.i for attr in node.attribute if attr.name == "transA"), 0)
    return _numel(out) * a[0 if trans_a else 1]


def _conv(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    w, out = ins[1] if len(ins) > 1 else None, outs[0]
    if w is None or out is None or len(w) < 2:
        return None
    return _numel(out) * _numel(w[1:])  # each output element: C_in/group x kernel


def _conv_transpose(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    x, w = ins[0], ins[1] if len(ins) > 1 else None
    if x is None or w is None or len(w) < 2:
        return None
    return _numel(x) * _numel(w[1:])  # each input element: C_out/group x kernel


def _einsum(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    """The product of every index's extent (an ellipsis counts the broadcast extents once)."""
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if len(terms) != len(ins) or any(s is None for s in ins):
        return None
    extents: dict[str, int] = {}
    ellipsis: Shape = ()
    for term, shape in zip(terms, ins):
        assert shape is not None
        letters = term.replace("...", "")
        rest = len(shape) - len(letters)
        if "..." in term:
            cut = term.index("...")
            dims = shape[cut : cut + rest]
            if len(dims) > len(ellipsis):
                ellipsis = dims
            shape = shape[:cut] + shape[cut + rest :]
        for letter, extent in zip(letters, shape):
            extents[letter] = max(extents.get(letter, 1), extent)
    return math.prod(extents.values()) * _numel(ellipsis)


def _attention(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    """Scores and weighted sum: 2 x batch x query length x key length x hidden (all heads);
    com.microsoft.Attention adds its QKV projection (input x weights)."""
    q, out = ins[0], outs[0]
    if q is None or out is None:
        return None
    if node.op_type == "Attention" and node.domain == "com.microsoft":
        w = ins[1] if len(ins) > 1 else None
        if w is None or len(q) != 3:
            return None
        batch, seq, _ = q
        hidden = out[-1]
        return _numel(q) * w[-1] + 2 * batch * seq * seq * hidden
    k = ins[1] if len(ins) > 1 else None
    if k is None or len(q) != len(k) or len(q) not in (3, 4):
        return None
    if len(q) == 4:  # (batch, heads, length, head size)
        return 2 * _numel(q) * k[2]
    return 2 * _numel(q) * k[1]  # (batch, length, hidden)


#: (domain, op type) -> its multiply-accumulates from the shapes of its inputs and outputs.
MAC_FORMULAS: Mapping[tuple[str, str], MacFormula] = {
    ("", "MatMul"): _matmul,
    ("", "MatMulInteger"): _matmul,
    ("", "Gemm"): _gemm,
    ("", "Conv"): _conv,
    ("", "ConvTranspose"): _conv_transpose,
    ("", "Einsum"): _einsum,
    ("", "Attention"): _attention,
    ("com.microsoft", "Attention"): _attention,
    ("com.microsoft", "MultiHeadAttention"): _attention,
    ("com.microsoft", "FusedMatMul"): _matmul,
    ("com.microsoft", "FusedConv"): _conv,
}


@dataclass
class Cost:
    """The cost figures of one converted model (JSON key `cost`)."""

    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    macs: int = 0  # multiply-accumulates per inference of the nodes whose shapes are known
    macs_low: int = 0
    unknown_macs_nodes: int = 0  # Compute nodes whose shapes inference could not give
    weight_elements: int = 0  # float weight elements (initializers and Constant values)
    weight_elements_low: int = 0
    casts: int = 0  # Cast nodes from one float type to another
    cast_bytes: int = 0  # bytes those Casts read and write per inference, where shapes are known
    unknown_cast_nodes: int = 0
    islands: int = 0  # connected groups of low-precision nodes

    @property
    def mac_low_share(self) -> float | None:
        return self.macs_low / self.macs if self.macs else None

    @property
    def weight_low_share(self) -> float | None:
        return self.weight_elements_low / self.weight_elements if self.weight_elements else None

    def to_json(self) -> dict[str, Any]:
        return {
            "input_shapes": self.input_shapes,
            "macs": self.macs,
            "macs_low": self.macs_low,
            "mac_low_share": self.mac_low_share,
            "unknown_macs_nodes": self.unknown_macs_nodes,
            "weight_elements": self.weight_elements,
            "weight_elements_low": self.weight_elements_low,
            "weight_low_share": self.weight_low_share,
            "casts": self.casts,
            "cast_bytes": self.cast_bytes,
            "unknown_cast_nodes": self.unknown_cast_nodes,
            "islands": self.islands,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cost:
        """The figures `to_json` wrote (a report's `cost`); the shares follow from them."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})


#: The hint's thresholds: a policy that leaves less than this share of the MACs low ...
HINT_MAX_LOW_SHARE = 0.1
#: ... while inserting at least this many Casts, buys little for what the Casts cost.
HINT_MIN_CASTS = 20


def policy_hint(cost: Cost, casts_inserted: int, policy: str) -> str | None:
    """One line when the policy keeps almost every multiply-accumulate in f32 yet adds many
    Casts; None otherwise. The policy's meaning never changes: this only names alternatives."""
    share = cost.mac_low_share
    if share is None or share >= HINT_MAX_LOW_SHARE or casts_inserted < HINT_MIN_CASTS:
        return None
    return (
        f"{policy} runs {share:.0%} of the multiply-accumulates in low precision and inserts {casts_inserted} "
        "Casts; for speed try --policy always-f16 --repair, or a --map that lowers compute"
    )


def _value_facts(graphs: Sequence[onnx.GraphProto], wanted: set[str]) -> tuple[dict[str, Shape], dict[str, int]]:
    """Value name -> element type, in `graphs`; and -> concrete shape for the `wanted` names
    whose shape is fully known."""
    shapes: dict[str, Shape] = {}
    types: dict[str, int] = {}
    for g in graphs:
        for vi in (*g.input, *g.output, *g.value_info):
            tt = vi.type.tensor_type  # an empty message for non-tensor types: elem_type 0
            name = vi.name
            types[name] = tt.elem_type
            if name in wanted and tt.HasField("shape"):
                dims = tt.shape.dim
                if all(d.HasField("dim_value") for d in dims):
                    shapes[name] = tuple(d.dim_value for d in dims)
        for t in g.initializer:
            types[t.name] = t.data_type
            if t.name in wanted:
                shapes[t.name] = tuple(t.dims)
    return shapes, types


def _concrete_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    inits = {t.name for t in model.graph.initializer}
    return {
        vi.name: list(shapes[vi.name]) if vi.name in shapes else list(concrete_input_shape(vi))
        for vi in model.graph.input
        if vi.name not in inits and vi.type.HasField("tensor_type")
    }


def _is_low(elem: int | None) -> bool:
    precision = precision_of_elem_type(elem) if elem is not None else None
    return precision is not None and precision is not Precision.F32


def estimate_cost(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None) -> Cost:
    """The cost figures of `model` (converted, or a dry run whose initializers carry their new
    element types) for concrete input `shapes` (symbolic axes not named get the verifier's
    defaults). Never raises on a model shape inference cannot follow: what it cannot see is
    counted as unknown."""
    cost = Cost(input_shapes=_concrete_inputs(model, shapes or {}))
    light = structure_copy(model)
    for init in light.graph.initializer:  # a dry run's narrowed weights still hold f32 bytes
        precision = precision_of_elem_type(init.data_type)
        size = _numel(tuple(init.dims)) * precision.info.np_dtype.itemsize if precision is not None else None
        if init.raw_data and size is not None and len(init.raw_data) != size:
            init.CopyFrom(onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims))
    for vi in light.graph.input:
        if vi.name in cost.input_shapes:
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for extent in cost.input_shapes[vi.name]:
                dims.dim.add().dim_value = extent
    # A declared symbolic shape would hide the concrete one inference gives (and one without a
    # shape stops inference from filling it in): such declarations go, their types are kept aside.
    declared: dict[str, int] = {}
    concrete = []
    for vi in light.graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            concrete.append(vi)
        else:
            declared[vi.name] = vi.type.tensor_type.elem_type
    if declared:
        light.graph.ClearField("value_info")
        light.graph.value_info.extend(concrete)
    try:
        light = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises several types here; the figures then cover what the model declares
        logger.info("cost: shape inference stopped (%s); counting only what the model declares", e)
    graphs = all_graphs(model.graph)
    counted = [
        node
        for graph in graphs
        for node in graph.node
        if node.op_type == "Cast" or (canonical_domain(node.domain), node.op_type) in MAC_FORMULAS
    ]
    wanted = {name for node in counted for name in (*node.input, *node.output)}
    known, types = _value_facts(all_graphs(light.graph), wanted)
    for name, elem in declared.items():
        types.setdefault(name, elem)
    for t in all_tensors(model):
        if t.data_type in FLOAT_TYPES:
            n = _numel(tuple(t.dims))
            cost.weight_elements += n
            cost.weight_elements_low += n if _is_low(t.data_type) else 0
    for node in counted:
        _count_node(node, known, types, cost)
    cost.islands = _islands([(n.op_type, list(n.input), list(n.output)) for n in model.graph.node], types)
    return cost


def _count_node(node: onnx.NodeProto, known: Mapping[str, Shape], types: Mapping[str, int], cost: Cost) -> None:
    domain = canonical_domain(node.domain)
    formula = MAC_FORMULAS.get((domain, node.op_type))
    if formula is not None:
        macs = formula(node, [known.get(i) if i else None for i in node.input], [known.get(o) for o in node.output])
        if macs is None:
            cost.unknown_macs_nodes += 1
        else:
            cost.macs += macs
            cost.macs_low += macs if _is_low(types.get(node.output[0])) else 0
    elif node.op_type == "Cast" and domain == "":
        src, dst = types.get(node.input[0]), types.get(node.output[0])
        if src in FLOAT_TYPES and dst in FLOAT_TYPES:
            cost.casts += 1
            shape = known.get(node.output[0]) or known.get(node.input[0])
            if shape is None:
                cost.unknown_cast_nodes += 1
                return
            sizes = [precision_of_elem_type(t).info.np_dtype.itemsize for t in (src, dst)]  # type: ignore[union-attr]
            cost.cast_bytes += _numel(shape) * sum(sizes)


def _islands(nodes: Sequence[tuple[str, list[str], list[str]]], types: Mapping[str, int]) -> int:
    """Connected groups of main-graph nodes (op type, inputs, outputs) that compute in low
    precision (Casts and Constant-like nodes without inputs excluded), joined where one reads
    the other's output."""
    low_types = {t for t in FLOAT_TYPES if _is_low(t)}
    producer: dict[str, int] = {}
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (op, inputs, outputs) in enumerate(nodes):  # graph order: producers come first
        if op == "Cast" or not any(inputs) or not any(types.get(o) in low_types for o in outputs if o):
            continue
        parent[i] = i
        for name in inputs:
            j = producer.get(name)
            if j is not None:
                parent[root(i)] = root(j)
        for o in outputs:
            if o and types.get(o) in low_types:
                producer[o] = i
    return len({root(i) for i in parent})

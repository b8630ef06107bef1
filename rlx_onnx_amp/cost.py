"""What a conversion buys: a cost model from shapes, in every conversion report.

From a converted model and concrete input shapes (`--shape`, else the verifier's defaults:
symbolic first axis 1, other symbolic axes `types.DEFAULT_DIM`). Where the model ran (the
reference run and its range screen, `verification.reference`), the shapes are those onnxruntime
produced for every value the cost model reads (`run_values`; `ConvertOptions.value_shapes`), so
no inference is needed and no optional dependency matters. Only what the run did not see (the
model did not run: `--no-verify`, `inspect`; values inside control-flow bodies) comes from onnx's
shape inference, then, where `sympy` is installed, onnxruntime's symbolic inference (which knows
the contrib ops onnx's does not):

- multiply-accumulates of the Compute ops (`MAC_FORMULAS`: MatMul, Gemm, Conv, ConvTranspose,
  Einsum, attention ops, the recurrent ones, and the quantized ones), per precision class
  (`macs_by_precision`): f16 or bf16 when the node's first float output is; int8 or int4 for
  quantized compute (`QUANTIZED_COMPUTE`: MatMulInteger, QLinearConv, MatMulNBits and the like,
  and a MatMul, Gemm or Conv whose weight comes through a dequantization: a DequantizeLinear,
  or a Cast of an integer weight); f32 otherwise. Every class but f32 counts as low: an int8
  model is already as low as a conversion can take it;
- float weight elements (initializers and Constant values) and the share stored low, and the
  weight bytes per precision class (`weight_bytes`: f32, f16, bf16; int8 and int4 for the
  integer weights quantized compute reads);
- Casts between float types, and the bytes they read and write per inference where their shape
  is known;
- precision islands: groups of low-precision nodes connected by low-precision values, each
  entered and left through Casts.

Nodes whose shapes neither the run nor inference gives (an unknown op upstream, a
data-dependent length) are counted in `unknown_macs_nodes` / `unknown_cast_nodes`, never
guessed; `run_shaped_nodes` says how many Compute nodes were counted at the run's shapes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import onnx

from rlx_onnx_amp.errors import first_line
from rlx_onnx_amp.precision import FLOAT_TYPES, Precision, precision_of_elem_type
from rlx_onnx_amp.taxonomy import DEQUANTIZE_STEPS, canonical_domain
from rlx_onnx_amp.tensors import tensor_nbytes
from rlx_onnx_amp.types import all_graphs, all_tensors, concrete_input_shape, schema_types, structure_copy

__all__ = [
    "MAC_CLASSES",
    "MAC_FORMULAS",
    "QUANTIZED_COMPUTE",
    "Cost",
    "estimate_cost",
    "no_gain",
    "policy_hint",
    "run_values",
    "short_count",
]

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


def _qlinear_conv(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    return _conv(node, [ins[0], ins[3] if len(ins) > 3 else None], outs)  # x, x_scale, x_zp, w, ...


def _recurrent(gates: int) -> MacFormula:
    """LSTM (4 gates), GRU (3), RNN (1): per step, per direction, gates x hidden x (input + hidden)
    for each batch row; the shapes are X (seq, batch, input) and W (directions, gates*hidden, input)."""

    def macs(node: onnx.NodeProto, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
        x, w = ins[0], ins[1] if len(ins) > 1 else None
        if x is None or w is None or len(x) != 3 or len(w) != 3:
            return None
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
        directions, rows, inputs = w
        hidden = rows // gates
        return directions * seq * batch * gates * hidden * (inputs + hidden)

    return macs


#: (domain, op type) -> its multiply-accumulates from the shapes of its inputs and outputs.
MAC_FORMULAS: Mapping[tuple[str, str], MacFormula] = {
    ("", "MatMul"): _matmul,
    ("", "MatMulInteger"): _matmul,
    ("", "ConvInteger"): _conv,
    ("", "QLinearMatMul"): _matmul,
    ("", "QLinearConv"): _qlinear_conv,
    ("", "LSTM"): _recurrent(4),
    ("", "GRU"): _recurrent(3),
    ("", "RNN"): _recurrent(1),
    ("com.microsoft", "DynamicQuantizeLSTM"): _recurrent(4),
    ("com.microsoft", "DynamicQuantizeMatMul"): _matmul,
    ("com.microsoft", "MatMulIntegerToFloat"): _matmul,
    ("com.microsoft", "MatMulNBits"): _matmul,
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


#: The precision classes multiply-accumulates and weights are counted in; every one but f32 is low.
MAC_CLASSES = ("f32", "f16", "bf16", "int8", "int4")
#: An integer element type of quantized weights -> its class.
_INTEGER_CLASSES: dict[int, str] = {
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "int8",
    onnx.TensorProto.INT4: "int4",
    onnx.TensorProto.UINT4: "int4",
}


def _nbits_class(node: onnx.NodeProto) -> str:
    bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
    return "int4" if bits <= 4 else "int8"


#: Compute ops that multiply integers -> their class (MatMulNBits by its `bits`), and the
#: input that holds their quantized weight.
QUANTIZED_COMPUTE: Mapping[tuple[str, str], tuple[Callable[[onnx.NodeProto], str], int]] = {
    ("", "MatMulInteger"): (lambda n: "int8", 1),
    ("", "ConvInteger"): (lambda n: "int8", 1),
    ("", "QLinearMatMul"): (lambda n: "int8", 3),
    ("", "QLinearConv"): (lambda n: "int8", 3),
    ("com.microsoft", "DynamicQuantizeLSTM"): (lambda n: "int8", 1),
    ("com.microsoft", "DynamicQuantizeMatMul"): (lambda n: "int8", 1),
    ("com.microsoft", "MatMulIntegerToFloat"): (lambda n: "int8", 1),
    ("com.microsoft", "MatMulNBits"): (_nbits_class, 1),
}
#: Float Compute ops whose weight (this input) may come through a dequantization.
_WEIGHT_INPUT = {("", "MatMul"): 1, ("", "Gemm"): 1, ("", "Conv"): 1, ("com.microsoft", "FusedMatMul"): 1}
#: Walking up from a weight to its integer tensor: the dequantization's steps, and the float
#: Casts a conversion puts between them.
_DEQUANTIZE_WALK = DEQUANTIZE_STEPS | {"Cast"}


def _dequantized_class(name: str, producers: Mapping[str, onnx.NodeProto], types: Mapping[str, int]) -> str | None:
    """The class of the integer weight `name` is dequantized from: a DequantizeLinear of it,
    or a Cast of it to float followed by scale arithmetic; None when it is not."""
    for _ in range(6):  # a few steps: Cast, Sub(zero point), Mul(scale), Reshape, Transpose
        node = producers.get(name)
        if node is None or canonical_domain(node.domain) != "":
            return None
        if node.op_type == "DequantizeLinear":
            return _INTEGER_CLASSES.get(types.get(node.input[0], 0))
        if node.op_type == "Cast" and types.get(node.input[0], 0) in _INTEGER_CLASSES:
            return _INTEGER_CLASSES[types[node.input[0]]]
        if node.op_type not in _DEQUANTIZE_WALK:
            return None
        name = node.input[0]
    return None


def _quantized_weights(graphs: Sequence[onnx.GraphProto], types: Mapping[str, int]) -> dict[str, str]:
    """Integer initializer name -> its class, for those that quantized compute or a
    dequantization reads."""
    found: dict[str, str] = {}
    for graph in graphs:
        inits = {t.name for t in graph.initializer}
        for node in graph.node:
            key = (canonical_domain(node.domain), node.op_type)
            if key in QUANTIZED_COMPUTE:
                of, index = QUANTIZED_COMPUTE[key]
                if len(node.input) > index and node.input[index] in inits:
                    found[node.input[index]] = of(node)
            elif key in (("", "DequantizeLinear"), ("", "Cast")) and node.input and node.input[0] in inits:
                cls = _INTEGER_CLASSES.get(types.get(node.input[0], 0))
                if cls is not None:
                    found[node.input[0]] = cls
    return found


@dataclass
class Cost:
    """The cost figures of one converted model (JSON key `cost`)."""

    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    macs: int = 0  # multiply-accumulates per inference of the nodes whose shapes are known
    macs_low: int = 0  # those in any class but f32 (quantized compute included)
    #: MACs per precision class (`MAC_CLASSES`), every class present.
    macs_by_precision: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MAC_CLASSES, 0))
    unknown_macs_nodes: int = 0  # Compute nodes whose shapes neither the run nor inference gave
    run_shaped_nodes: int = 0  # Compute nodes counted at the shapes the reference run produced
    weight_elements: int = 0  # float weight elements (initializers and Constant values)
    weight_elements_low: int = 0
    #: Weight bytes per precision class: float initializers and Constant values by their type,
    #: integer ones that quantized compute or a dequantization reads as int8 or int4.
    weight_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MAC_CLASSES, 0))
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

    @property
    def quantized(self) -> bool:
        """Whether integer compute runs in the model (int8 or int4 MACs): already low."""
        return bool(self.macs_by_precision.get("int8") or self.macs_by_precision.get("int4"))

    def to_json(self) -> dict[str, Any]:
        return {
            "input_shapes": self.input_shapes,
            "macs": self.macs,
            "macs_low": self.macs_low,
            "mac_low_share": self.mac_low_share,
            "macs_by_precision": self.macs_by_precision,
            "unknown_macs_nodes": self.unknown_macs_nodes,
            "run_shaped_nodes": self.run_shaped_nodes,
            "weight_elements": self.weight_elements,
            "weight_elements_low": self.weight_elements_low,
            "weight_low_share": self.weight_low_share,
            "weight_bytes": self.weight_bytes,
            "casts": self.casts,
            "cast_bytes": self.cast_bytes,
            "unknown_cast_nodes": self.unknown_cast_nodes,
            "islands": self.islands,
        }

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The JSON Schema of `to_json` (the report's `cost`)."""
        count = {"type": "integer", "minimum": 0}
        share = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
        shapes = {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}}
        classes = {"type": "object", "properties": dict.fromkeys(MAC_CLASSES, count), "required": list(MAC_CLASSES),
                   "additionalProperties": False}
        properties: dict[str, Any] = {
            "input_shapes": shapes, "mac_low_share": share, "weight_low_share": share,
            "macs_by_precision": classes, "weight_bytes": classes,
        }
        for f in fields(Cost):
            properties.setdefault(f.name, count)
        order = list(Cost().to_json())
        return {
            "type": "object",
            "properties": {k: properties[k] for k in order},
            "required": order,
            "additionalProperties": False,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cost:
        """The figures `to_json` wrote (a report's `cost`); the shares follow from them."""
        # Reports written before the precision classes: every MAC and weight byte uncounted there.
        # Reports written before shapes came from the run: none did.
        empty = {
            "macs_by_precision": dict.fromkeys(MAC_CLASSES, 0),
            "weight_bytes": dict.fromkeys(MAC_CLASSES, 0),
            "run_shaped_nodes": 0,
        }
        return cls(**{f.name: data.get(f.name, empty.get(f.name)) for f in fields(cls)})


#: The hint's thresholds: a policy that leaves less than this share of the MACs low ...
HINT_MAX_LOW_SHARE = 0.1
#: ... while inserting at least this many Casts, buys little for what the Casts cost.
HINT_MIN_CASTS = 20


def policy_hint(cost: Cost, casts_inserted: int, policy: str) -> str | None:
    """One line when the policy lowers none of the multiply-accumulates (whatever it costs in
    Casts), or almost none while adding many Casts; None otherwise, and always for `auto` and
    for a model whose compute is quantized already. The policy's meaning never changes: this
    only names the one to run for speed and memory."""
    share = cost.mac_low_share
    if share is None or cost.quantized or policy == "auto":
        return None
    if cost.macs_low == 0:
        return (
            f"{policy} lowers none of the {short_count(cost.macs)} multiply-accumulates (every Compute node stays "
            "f32), so the model is no smaller or faster; try --policy auto"
        )
    if share < HINT_MAX_LOW_SHARE and casts_inserted >= HINT_MIN_CASTS:
        return (
            f"{policy} runs {share:.0%} of the multiply-accumulates in low precision and inserts {casts_inserted} "
            "Casts; for speed try --policy auto"
        )
    return None


#: `auto` searches only where the f32 MACs a conversion could lower are at least this share.
NO_GAIN_SHARE = 0.01


def no_gain(cost: Cost) -> str | None:
    """Why an f16 search cannot gain on a model of this cost (its f32 MACs none or under
    `NO_GAIN_SHARE` of them all, every MAC known: an int8 or int4 model is as low as it goes),
    or None where it can or the MACs are not all known."""
    if not cost.macs or cost.unknown_macs_nodes:
        return None
    f32 = cost.macs_by_precision["f32"]
    if f32 >= NO_GAIN_SHARE * cost.macs:
        return None
    low = {cls: n for cls, n in cost.macs_by_precision.items() if cls != "f32" and n}
    classes = "/".join(sorted(low, key=lambda c: -low[c]))
    share = 1 - f32 / cost.macs
    return f"{share:.1%} of MACs are {classes} already; no f16 search"


def short_count(n: float) -> str:
    """1234567 -> 1.23 M: MAC and byte counts at a glance."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f}"


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
                if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):  # -1: declared unknown
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


def _inferred(model: onnx.ModelProto, input_shapes: Mapping[str, list[int]]) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A weightless copy of `model` with `input_shapes` and the shapes onnx's inference gives
    from them; and the element types of the values whose declared symbolic shape was dropped."""
    light = structure_copy(model)
    for init in light.graph.initializer:  # a dry run's narrowed weights still hold f32 bytes
        precision = precision_of_elem_type(init.data_type)
        size = _numel(tuple(init.dims)) * precision.info.np_dtype.itemsize if precision is not None else None
        if init.raw_data and size is not None and len(init.raw_data) != size:
            init.CopyFrom(onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims))
    for vi in light.graph.input:
        if vi.name in input_shapes:
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for extent in input_shapes[vi.name]:
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
    return light, declared


def _counted(graphs: Sequence[onnx.GraphProto]) -> list[onnx.NodeProto]:
    """The nodes the cost model counts: Compute nodes and Casts."""
    return [
        node
        for graph in graphs
        for node in graph.node
        if node.op_type == "Cast" or (canonical_domain(node.domain), node.op_type) in MAC_FORMULAS
    ]


def run_values(model: onnx.ModelProto) -> list[str]:
    """The main-graph values whose shapes the cost model reads (the inputs and outputs of its
    Compute nodes and Casts, any element type), less the initializers and graph inputs, whose
    shapes are known without a run: what a reference run surfaces for `ConvertOptions.value_shapes`."""
    graph = model.graph
    given = {t.name for t in graph.initializer} | {vi.name for vi in graph.input}
    names = (name for node in _counted([graph]) for name in (*node.input, *node.output))
    return list(dict.fromkeys(n for n in names if n and n not in given))


def estimate_cost(
    model: onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seen: Mapping[str, Sequence[int]] | None = None,
) -> Cost:
    """The cost figures of `model` (converted, or a dry run whose initializers carry their new
    element types) for concrete input `shapes` (symbolic axes not named get the verifier's
    defaults). `seen`: value name -> the shape a run of the reference at those input shapes
    produced (`ConvertOptions.value_shapes`); inference fills in only what it lacks. Never
    raises on a model shape inference cannot follow: what it cannot see is counted as unknown."""
    cost = Cost(input_shapes=_concrete_inputs(model, shapes or {}))
    graphs = all_graphs(model.graph)
    counted = _counted(graphs)
    wanted = {name for node in counted for name in (*node.input, *node.output)}
    # The element types (and the shapes the run did not see) from onnx's inference.
    light, declared = _inferred(model, cost.input_shapes)
    inferred, types = _value_facts(all_graphs(light.graph), wanted)
    from_run = _run_shapes(model, cost.input_shapes, seen or {}, wanted)
    known = {**inferred, **from_run}
    if _missing(counted, known):
        # onnx's inference stops at ops it has no function for (onnxruntime's contrib ops:
        # MatMulNBits, the fused attention); onnxruntime's symbolic inference knows them,
        # where sympy is installed (not a dependency: a run's shapes need neither).
        symbolic = _symbolic_shapes(light)
        if symbolic is not None:
            more, _ = _value_facts(all_graphs(symbolic.graph), wanted)
            known = {**more, **known}
    for name, elem in declared.items():
        types.setdefault(name, elem)
    if any(o and not types.get(o) for node in counted for o in node.output[:1]):
        # Past an op onnx's inference has no function for (a contrib op), op schemas still type
        # the values: an f16 MatMul after com.microsoft Gelu is f16.
        for name, elem in ((schema_types(model) or {}).get("", {})).items():
            if not types.get(name):
                types[name] = elem
    quantized = _quantized_weights(graphs, types)
    for t in all_tensors(model):
        if t.data_type in FLOAT_TYPES:
            n = _numel(tuple(t.dims))
            cost.weight_elements += n
            cost.weight_elements_low += n if _is_low(t.data_type) else 0
            cost.weight_bytes[_float_class(t.data_type)] += tensor_nbytes(t)
        elif t.name in quantized:
            cost.weight_bytes[quantized[t.name]] += tensor_nbytes(t)
    producers = {o: node for graph in graphs for node in graph.node for o in node.output}
    for node in counted:
        if _count_node(node, known, types, cost, producers) and node.output[0] in from_run:
            cost.run_shaped_nodes += 1
    cost.islands = _islands([(n.op_type, list(n.input), list(n.output)) for n in model.graph.node], types)
    return cost


def _missing(counted: Sequence[onnx.NodeProto], known: Mapping[str, Shape]) -> bool:
    """Whether a Compute node's first output has no known shape (inference may give it)."""
    return any(o and o not in known for n in counted if n.op_type != "Cast" for o in n.output[:1])


def _run_shapes(
    model: onnx.ModelProto, inputs: Mapping[str, list[int]], seen: Mapping[str, Sequence[int]], wanted: set[str]
) -> dict[str, Shape]:
    """The `wanted` shapes of `seen` (a run's), carried across the Casts a conversion inserts
    (a Cast's output has its input's shape), or none when the run's input shapes are not those
    counted at (`--shape` naming other sizes than a `--inputs` file holds)."""
    if not seen:
        return {}
    if any(name in seen and tuple(seen[name]) != tuple(dims) for name, dims in inputs.items()):
        logger.info("cost: the run's input shapes are not those counted at; its value shapes go unused")
        return {}
    known = {name: tuple(int(d) for d in dims) for name, dims in seen.items()}
    casts = [n for n in model.graph.node if n.op_type == "Cast" and n.input and n.output]
    for order in (casts, casts[::-1]):  # forward, then back: chains of inserted Casts either way
        for node in order:
            src, dst = node.input[0], node.output[0]
            if src in known and dst not in known:
                known[dst] = known[src]
            elif dst in known and src not in known:
                known[src] = known[dst]
    return {name: shape for name, shape in known.items() if name in wanted}


def _float_class(elem: int | None) -> str:
    precision = precision_of_elem_type(elem) if elem is not None else None
    return precision.value if precision is not None else "f32"


def _mac_class(node: onnx.NodeProto, types: Mapping[str, int], producers: Mapping[str, onnx.NodeProto]) -> str:
    """The precision class a Compute node multiplies in (`MAC_CLASSES`)."""
    key = (canonical_domain(node.domain), node.op_type)
    if key in QUANTIZED_COMPUTE:
        return QUANTIZED_COMPUTE[key][0](node)
    out = _float_class(types.get(node.output[0]))
    if out != "f32" or key not in _WEIGHT_INPUT or len(node.input) <= _WEIGHT_INPUT[key]:
        return out
    return _dequantized_class(node.input[_WEIGHT_INPUT[key]], producers, types) or out


def _symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """`model` with the shapes onnxruntime's symbolic shape inference gives, or None where it
    cannot (it raises on graphs it does not follow: then the unknown stay unknown)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # Its `infer_shapes` as written, less the last step: where a shape stays unknown it saves
        # the model into the working directory and raises, and the shapes it found are what
        # the cost model wants (nothing is written outside the paths a run was given).
        inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
        inference._preprocess(_stubs_as_inputs(model))
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        return inference.out_mp_
    except Exception as e:  # any failure leaves the figures to what onnx's inference gave
        logger.info("cost: onnxruntime's symbolic shape inference stopped (%s)", first_line(e))
        return None


def _stubs_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (a weightless copy) with the initializers that lost their bytes as graph inputs
    of their type and dims: symbolic inference folds what reads only constants, and cannot fold
    a tensor without its bytes (a Cast -> Mul dequantization of an int8 weight stopped it)."""
    stubs = [t for t in model.graph.initializer if not _has_bytes(t)]
    if not stubs:
        return model
    names = {t.name for t in stubs}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [t for t in copy.graph.initializer if t.name not in names]
    copy.graph.ClearField("initializer")
    copy.graph.initializer.extend(kept)
    declared = {vi.name for vi in copy.graph.input}
    copy.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in stubs if t.name not in declared
    )
    return copy


def _has_bytes(t: onnx.TensorProto) -> bool:
    """Whether the tensor holds its values (or has none to hold), here or in an external file."""
    return (
        _numel(tuple(t.dims)) == 0
        or t.data_location == onnx.TensorProto.EXTERNAL
        or bool(t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data)
        or bool(t.string_data)
    )


def _count_node(
    node: onnx.NodeProto,
    known: Mapping[str, Shape],
    types: Mapping[str, int],
    cost: Cost,
    producers: Mapping[str, onnx.NodeProto],
) -> bool:
    """Add `node`'s figures to `cost`; whether it is a Compute node whose MACs were counted."""
    domain = canonical_domain(node.domain)
    formula = MAC_FORMULAS.get((domain, node.op_type))
    if formula is not None:
        macs = formula(node, [known.get(i) if i else None for i in node.input], [known.get(o) for o in node.output])
        if macs is None:
            cost.unknown_macs_nodes += 1
            return False
        cls = _mac_class(node, types, producers)
        cost.macs += macs
        cost.macs_by_precision[cls] += macs
        cost.macs_low += macs if cls != "f32" else 0
        return True
    if node.op_type == "Cast" and domain == "":
        src, dst = types.get(node.input[0]), types.get(node.output[0])
        if src in FLOAT_TYPES and dst in FLOAT_TYPES:
            cost.casts += 1
            shape = known.get(node.output[0]) or known.get(node.input[0])
            if shape is None:
                cost.unknown_cast_nodes += 1
                return False
            sizes = [precision_of_elem_type(t).info.np_dtype.itemsize for t in (src, dst)]  # type: ignore[union-attr]
            cost.cast_bytes += _numel(shape) * sum(sizes)
    return False


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

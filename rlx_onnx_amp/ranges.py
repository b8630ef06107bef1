"""What values a low precision cannot hold, known before the rewrite (docs/design.md, rules
dequantize-arithmetic, weight-range and range-screen).

Three facts the keep rules read:

- **Weights past the range.** The largest finite magnitude of every float weight (initializer,
  Constant or ConstantOfShape value), read once and only when one of the keep rules reads it: a weight of 1e7 that
  a BatchNormalization divides by is not something f16 may clamp to 65504.
- **Mask sentinels.** A weight whose out-of-range values only mark positions to ignore may be
  clamped: one that reaches, through mask arithmetic and data movement, only Softmax /
  LogSoftmax (an additive attention mask: -1e9 or the f32 minimum), or that Where, Min or Max
  read directly. Two such weights that meet in one Add, Sub or Mul are not sentinels: their
  clamped sum passes the range again. The values computed from sentinels are *tainted*: the
  range screen does not keep nodes for them, since the candidate holds them clamped.
- **Value ranges** from one f32 reference run (`ValueRange`, filled by the range screen in
  `rlx_onnx_amp.verification.screen`): a node whose output or input passes its precision's
  range, or reads a value that flushes to zero where zero is singular, stays f32.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import GraphProto, NodeProto, TensorProto

from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.taxonomy import (
    DEFAULT_DOMAINS,
    DEQUANTIZE_STEPS,
    SOURCE_VALUE_ATTRIBUTES,
    OpKind,
    canonical_domain,
    copies_values,
    kind_of,
)
from rlx_onnx_amp.tensors import WeightSource, is_external
from rlx_onnx_amp.types import NodeFields, ReadAttribute, initializer_rows, names_read, scoped_graphs, subgraphs

__all__ = [
    "INTEGER_ACCUMULATORS",
    "MASK_ENDS",
    "MASK_PATH_OPS",
    "MASK_READERS",
    "MASK_SINKS",
    "ZERO_SINGULAR_INPUTS",
    "NumericFacts",
    "ValueRange",
    "scoped_name",
]

logger = logging.getLogger(__name__)

_F32 = TensorProto.FLOAT
#: Inline float weights up to this size are scanned together (`NumericFacts._maxima`).
_BATCHED_BYTES = 1 << 16
#: Exponent types whose values a Pow's singularity check reads.
_NUMERIC_EXPONENTS = frozenset(
    {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64}
)

#: Ops whose integer output is an accumulator (sums of products of 8-bit values: 1e5 and
#: more); the float arithmetic that dequantizes it belongs to the quantized region.
INTEGER_ACCUMULATORS: frozenset[tuple[str, str]] = frozenset(
    {("", "MatMulInteger"), ("", "ConvInteger"), ("com.microsoft", "MatMulInteger16")}
)
#: Ops that produce a quantization scale at run time (output index): the scale's arithmetic
#: (its product with the weight's scale) is dequantization too.
RUNTIME_SCALES: Mapping[str, int] = {"DynamicQuantizeLinear": 1}

#: Where a mask sentinel may end: ops that map a huge negative score to zero weight.
MASK_SINKS: frozenset[str] = frozenset({"Softmax", "LogSoftmax"})
#: Readers that select or bound with a sentinel directly (Where(c, x, -1e9), Max(x, f32 min)).
MASK_READERS: frozenset[str] = frozenset({"Where", "Min", "Max"})
#: Ops a mask passes through on its way to a sink: its arithmetic ((1 - m) * -1e9) and data
#: movement (Unsqueeze, Expand, ...: `taxonomy.VALUE_EXACT_OPS`).
MASK_PATH_OPS: frozenset[str] = frozenset(
    {"Add", "Sub", "Mul", "Neg", "Cast", "Tile", "Trilu", "Where", "Min", "Max", "ScatterND", "ScatterElements"}
)
#: Readers where a mask's path may end: they read its shape only, or compare it (`mask ==
#: min`, as transformers builds masks: a clamped sentinel equals the clamped constant it came from).
MASK_ENDS: frozenset[str] = frozenset({"Shape", "Size", "Equal"})
#: Arithmetic where two sentinels meeting give a value past the range again.
_COMBINING_OPS = frozenset({"Add", "Sub", "Mul"})

#: Inputs at which a zero is singular: a value that flushes to zero there becomes Inf or NaN.
ZERO_SINGULAR_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Div": (1,),
    "Reciprocal": (0,),
    "Log": (0,),
    "Sqrt": (0,),
    "Pow": (0,),
}


@dataclass(frozen=True, slots=True)
class ValueRange:
    """What one f32 reference run saw of a value (over every input set)."""

    max_abs: float  # the largest finite magnitude (0.0: none)
    min_nonzero: float  # the smallest finite non-zero magnitude (inf: none)

    @classmethod
    def of(cls, values: np.ndarray) -> ValueRange | None:
        """The range of a float array; None when it holds no finite value."""
        v = np.abs(np.asarray(values, dtype=np.float32).reshape(-1))
        finite = v[np.isfinite(v)]
        if not finite.size:
            return None
        nonzero = finite[finite != 0]
        return cls(float(finite.max()), float(nonzero.min()) if nonzero.size else float("inf"))

    def merge(self, other: ValueRange) -> ValueRange:
        return ValueRange(max(self.max_abs, other.max_abs), min(self.min_nonzero, other.min_nonzero))

    def overflows(self, precision: Precision) -> bool:
        return self.max_abs >= precision.info.overflow_at

    def flushes(self, precision: Precision) -> bool:
        return self.min_nonzero < precision.info.smallest_subnormal / 2


def scoped_name(scope: str, name: str) -> str:
    """How the facts and `ConvertOptions.value_ranges` key a value: its name, after the path of
    the body that defines it ("3/then_branch/"; "" in the main graph). If branches may reuse a
    name for another value (optimum's merged decoders copy one decoder into both)."""
    return scope + name


_TENSOR = onnx.AttributeProto.TENSOR


def _source_tensor(
    node: NodeProto, op: str | None = None, attributes: Sequence[ReadAttribute] | None = None
) -> TensorProto | float | None:
    """A Constant-like node's value: its tensor attribute, or its `value_float`; None for
    any other form (`value_floats` is read by `NumericFacts._max_of`). `op`, `attributes`: the
    node's op type and attributes, already read (`types.NodeFields`)."""
    attr_name = SOURCE_VALUE_ATTRIBUTES[op or node.op_type]
    if attributes is not None:
        for name, _, tensor in attributes:
            if name == attr_name and tensor is not None:
                return tensor
            if name == "value_float":
                break  # a float, which the read leaves in the node
        else:
            return None
    for attr in node.attribute:
        name = attr.name  # each read of a field makes a Python object: once
        if name == attr_name:
            if attr.type == _TENSOR:
                return attr.t
        elif name == "value_float":
            return attr.f
    return None


class NumericFacts:
    """The facts of one model that the numeric keep rules read, each computed on first use.
    Values are keyed by `scoped_name`."""

    def __init__(self, model: onnx.ModelProto, source: WeightSource, fields: NodeFields | None = None) -> None:
        """`fields`: the main graph's nodes already read (`types.NodeFields`), to read them once."""
        self.model = model
        self.source = source
        self._fields = fields
        self._graphs = scoped_graphs(model.graph, fields)
        self._weights: dict[str, TensorProto | NodeProto] | None = None
        self._weight_max: dict[str, float] | None = None  # key -> largest finite magnitude, once read
        self._scope_of: dict[str, str] = {}  # weight key -> the path of the graph holding it
        self._consumers: dict[int, dict[str, list[tuple[NodeProto, int]]]] = {}
        self._sentinels: dict[Precision, tuple[frozenset[str], frozenset[str]]] = {}
        self._singular: frozenset[str] | None = None
        self._dequantized: dict[str, frozenset[tuple[str, str]]] | None = None
        self._shape_values: frozenset[str] | None = None
        # One walk over every graph: the Constant-like weights, and whether integer accumulators
        # (rule dequantize-arithmetic) are there at all.
        accumulators = {op for _, op in INTEGER_ACCUMULATORS}
        # (path, node, its output) of each Constant-like node, and the main graph's ones'
        # indices in `fields` by key, whose attributes `fields` reads once.
        self._sources: list[tuple[str, NodeProto, str]] = []
        self._source_index: dict[str, int] = {}
        self.has_accumulators = False
        scales: list[str] = []
        wanted = frozenset(SOURCE_VALUE_ATTRIBUTES) | accumulators | frozenset(RUNTIME_SCALES)
        for path, graph in self._graphs:
            read = fields if fields is not None and not path else None  # the main graph's, read once
            nodes = read.nodes if read is not None else graph.node
            ops = read.ops if read is not None else [n.op_type for n in nodes]
            for i in [i for i, op in enumerate(ops) if op in wanted]:
                node, op = nodes[i], ops[i]
                domain = read.domains[i] if read is not None else node.domain
                if op in SOURCE_VALUE_ATTRIBUTES and domain in DEFAULT_DOMAINS:
                    outs = read.outputs[i] if read is not None else node.output
                    if outs:
                        self._sources.append((path, node, outs[0]))
                        if read is not None:
                            self._source_index[scoped_name(path, outs[0])] = i
                elif op in accumulators:
                    self.has_accumulators = True
                elif op in RUNTIME_SCALES and domain in DEFAULT_DOMAINS:
                    ins = read.inputs[i] if read is not None else node.input
                    if ins:
                        scales.append(scoped_name(path, ins[0]))
        #: Values that DynamicQuantizeLinear quantizes at run time: their producers belong to the
        #: quantized region (a value rounded to f16 first lands in other quantization bins).
        self.quantized_at_run_time = frozenset(scales if self.has_accumulators else ())

    # -- weight dequantization -------------------------------------------------------------
    def dequantized(self) -> Mapping[str, frozenset[tuple[str, str]]]:
        """Value key -> the (domain, op) of the Compute nodes it finally feeds, for every value
        of a weight's dequantization: a Cast of an integer initializer to float, or a
        DequantizeLinear of one, and the arithmetic and reshaping after it (`DEQUANTIZE_STEPS`),
        where each reader is such a step or a Compute node (rule dequantize-follows-consumer).
        Computed on first use."""
        if self._dequantized is None:
            self._dequantized = {}
            for path, graph in self._graphs:
                self._dequantized.update(_dequantized_in(graph, path, self._consumers_of(graph)))
        return self._dequantized

    def shape_values(self) -> frozenset[str]:
        """Keys of the float values that only compute a shape, a size or an index: every reader
        is a Cast to an integer type, or a node whose outputs all are such values (rule
        shape-arithmetic: `num_positions ** 0.5` cast to int64 for a Resize's sizes).
        Computed on first use."""
        if self._shape_values is None:
            found: set[str] = set()
            for path, graph in self._graphs:
                found |= _shape_values_in(graph, path, self._consumers_of(graph))
            self._shape_values = frozenset(found)
        return self._shape_values

    # -- weights ---------------------------------------------------------------------------
    def _weight_table(self) -> dict[str, TensorProto | NodeProto]:
        """Float weights by key: initializers and Constant-like nodes, bodies included."""
        if self._weights is None:
            table: dict[str, TensorProto | NodeProto] = {}
            for path, graph in self._graphs:
                # The main graph's, as the load read them.
                for init, name, elem in initializer_rows(graph, None if path else self._fields):
                    if elem == _F32:
                        key = scoped_name(path, name)
                        table[key], self._scope_of[key] = init, path
            for path, node, out in self._sources:
                key = scoped_name(path, out)
                table[key], self._scope_of[key] = node, path
            self._weights = table
        return self._weights

    def weight_max(self, key: str) -> float | None:
        """The largest finite magnitude of the float weight `key`; None when it is no weight."""
        return self._maxima().get(key)

    def any_past_range(self, precision: Precision) -> bool:
        """Whether some float weight of the model passes `precision`'s range (rule weight-range
        costs nothing per node where none does)."""
        limit = precision.info.max_finite
        return any(v > limit for v in self._maxima().values())

    def _maxima(self) -> dict[str, float]:
        """Every float weight's largest finite magnitude, by key, read once: the small inline
        tensors (most of a large graph's) in one numpy pass, the others one by one in chunks."""
        if self._weight_max is not None:
            return self._weight_max
        self._weight_max = found_max = {}
        table = self._weight_table()
        small: list[tuple[str, bytes]] = []
        for key, holder in table.items():
            found: float | None
            tensor = holder if isinstance(holder, TensorProto) else self._source_value(key, holder)
            if isinstance(tensor, TensorProto):
                if tensor.data_type != _F32:
                    continue
                if not is_external(tensor):
                    raw = tensor.raw_data  # each read of the field copies the bytes
                    if 0 < len(raw) <= _BATCHED_BYTES:
                        small.append((key, raw))
                        continue
                found = self.source.max_finite_abs(tensor)
            elif isinstance(tensor, float):  # value_float: a float32 already
                found = abs(tensor) if math.isfinite(tensor) else 0.0
            else:
                found = self._max_of(holder)
            if found is not None:
                found_max[key] = found
        if small:
            values = np.abs(np.frombuffer(b"".join(raw for _, raw in small), dtype=np.float32))
            values = np.where(np.isfinite(values), values, np.float32(0))
            starts = np.cumsum([0] + [len(raw) // 4 for _, raw in small[:-1]])
            found_max.update(zip([key for key, _ in small], np.maximum.reduceat(values, starts).tolist()))
        return found_max

    def _source_value(self, key: str, node: NodeProto) -> TensorProto | float | None:
        """`_source_tensor` of Constant-like weight `key`, from the attributes `fields` read
        where it is in the main graph."""
        i = self._source_index.get(key)
        if i is None or self._fields is None:
            return _source_tensor(node)
        return _source_tensor(node, self._fields.ops[i], self._fields.attributes(i))

    def _max_of(self, holder: TensorProto | NodeProto) -> float | None:
        if isinstance(holder, TensorProto):
            return self.source.max_finite_abs(holder)
        for attr in holder.attribute:
            if attr.name == "value_floats":
                values = np.asarray(list(attr.floats), dtype=np.float32)
                finite = np.abs(values[np.isfinite(values)])
                return float(finite.max()) if finite.size else 0.0
        return None

    def past_range(self, key: str, precision: Precision) -> float | None:
        """The weight's largest finite magnitude when it passes `precision`'s range, else None."""
        found = self.weight_max(key)
        return found if found is not None and found > precision.info.max_finite else None

    def singular_inputs(self, node: NodeProto, scope: str = "") -> tuple[int, ...]:
        """The inputs of `node` where a zero is singular (`ZERO_SINGULAR_INPUTS`); a Pow's
        base only when its exponent is not a weight known to hold no negative value (x**2 of
        an RMSNorm is 0 at 0, nothing singular)."""
        found = ZERO_SINGULAR_INPUTS.get(node.op_type, ()) if node.domain in DEFAULT_DOMAINS else ()
        if found and node.op_type == "Pow" and len(node.input) > 1 and self._nonnegative(scope, node.input[1]):
            return ()
        return found

    def singular_reads(self) -> frozenset[str]:
        """Every value (key) some node of its own graph reads where zero is singular."""
        if self._singular is None:
            self._singular = frozenset(
                scoped_name(path, node.input[k])
                for path, graph in self._graphs
                for node in graph.node
                for k in self.singular_inputs(node, path)
                if k < len(node.input) and node.input[k]
            )
        return self._singular

    def _nonnegative(self, scope: str, name: str) -> bool:
        holder = self._weight_table().get(scoped_name(scope, name)) or self._weight_table().get(name)
        if holder is None:  # an integer or double exponent: any initializer of that name
            inits = (t for _, g in self._graphs for t in g.initializer)
            holder = next((t for t in inits if t.name == name), None)
        if isinstance(holder, TensorProto) and holder.data_type in _NUMERIC_EXPONENTS:
            values = np.asarray(self.source.read(holder))
            return bool(values.size) and bool(np.all(values >= 0))
        return False

    # -- sentinels -------------------------------------------------------------------------
    def is_sentinel(self, key: str, precision: Precision) -> bool:
        return key in self._sentinel_sets(precision)[0]

    def tainted(self, key: str, precision: Precision) -> bool:
        """Whether value `key` is computed from a clamped mask sentinel (or is one)."""
        return key in self._sentinel_sets(precision)[1]

    def _sentinel_sets(self, precision: Precision) -> tuple[frozenset[str], frozenset[str]]:
        found = self._sentinels.get(precision)
        if found is None:
            found = self._sentinels[precision] = self._find_sentinels(precision)
        return found

    def _find_sentinels(self, precision: Precision) -> tuple[frozenset[str], frozenset[str]]:
        """(sentinel weights, the values computed from them) for one precision, as keys."""
        sentinels: set[str] = set()
        tainted: set[str] = set()
        table = self._weight_table()
        for path, graph in self._graphs:
            consumers = self._consumers_of(graph)
            outputs = {o.name for o in graph.output} | _read_in_bodies(graph)
            names = [key[len(path) :] for key in table if self._scope_of[key] == path]
            candidates = [n for n in names if self.past_range(scoped_name(path, n), precision) is not None]
            reached: dict[str, list[str]] = {}  # value -> the candidates it is computed from
            closures: dict[str, set[str]] = {}
            for name in candidates:
                closure = _mask_closure(name, consumers, outputs)
                if closure is not None:
                    closures[name] = closure
                    for value in closure:
                        reached.setdefault(value, []).append(name)
            met = _meeting(closures, reached, consumers)
            for name, closure in closures.items():
                if name not in met:
                    sentinels.add(scoped_name(path, name))
                    tainted |= {scoped_name(path, value) for value in closure}
        if sentinels:
            logger.debug("mask sentinels (clamped to %s): %s", precision.value, sorted(sentinels))
        return frozenset(sentinels), frozenset(tainted)

    def _consumers_of(self, graph: GraphProto) -> dict[str, list[tuple[NodeProto, int]]]:
        found = self._consumers.get(id(graph))
        if found is None:
            found = {}
            for node in graph.node:
                for k, name in enumerate(node.input):
                    if name:
                        found.setdefault(name, []).append((node, k))
            self._consumers[id(graph)] = found
        return found


def _mask_closure(
    name: str, consumers: Mapping[str, list[tuple[NodeProto, int]]], outputs: set[str]
) -> set[str] | None:
    """The values computed from weight `name` on its way to mask sinks, or None when one of
    its paths ends anywhere else (a graph output, a body, an op that is no mask arithmetic).
    What Where, Min or Max make of the weight read directly is followed too, for the values it
    taints, but where those go does not decide whether the weight is a sentinel."""
    closure = {name}
    pending = [(name, True)]  # (value, whether its paths decide)
    while pending:
        value, decides = pending.pop()
        if value in outputs:
            if decides:
                return None
            continue
        for node, k in consumers.get(value, ()):
            op = node.op_type
            through = node.domain in DEFAULT_DOMAINS and (op in MASK_PATH_OPS or copies_values(node.domain, op))
            if node.domain in DEFAULT_DOMAINS and (op in MASK_SINKS or op in MASK_ENDS):
                continue
            if not through or (op == "Where" and k == 0):
                if decides:
                    return None
                continue
            direct = decides and value == name and op in MASK_READERS  # selects or bounds with the sentinel
            for out in node.output:
                if out and out not in closure:
                    closure.add(out)
                    pending.append((out, decides and not direct))
    return closure


def _meeting(
    closures: Mapping[str, set[str]],
    reached: Mapping[str, list[str]],
    consumers: Mapping[str, list[tuple[NodeProto, int]]],
) -> set[str]:
    """Sentinel candidates whose paths meet another's in one Add, Sub or Mul."""
    met: set[str] = set()
    for name, closure in closures.items():
        for value in closure:
            for node, _ in consumers.get(value, ()):
                if node.op_type not in _COMBINING_OPS:
                    continue
                others = {c for i in node.input if i and i != value for c in reached.get(i, ()) if c != name}
                if others:
                    met.add(name)
                    met |= others
    return met


def _graphs(graph: GraphProto) -> Iterable[GraphProto]:
    yield graph
    for node in graph.node:
        for _, body in subgraphs(node):
            yield from _graphs(body)


def _read_in_bodies(graph: GraphProto) -> set[str]:
    return {name for node in graph.node for _, body in subgraphs(node) for name in names_read(body)}


_INTEGER_WEIGHTS = frozenset({
    TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT16, TensorProto.UINT16,
})


def _dequantized_in(
    graph: GraphProto, path: str, consumers: Mapping[str, list[tuple[NodeProto, int]]]
) -> dict[str, frozenset[tuple[str, str]]]:
    """`NumericFacts.dequantized` for one graph whose readers are `consumers`."""
    integers = {t.name for t in graph.initializer if t.data_type in _INTEGER_WEIGHTS}
    if not integers:
        return {}
    starts = [
        node.output[0]
        for node in graph.node
        if node.input and node.input[0] in integers and node.output and canonical_domain(node.domain) == ""
        and node.op_type in ("Cast", "DequantizeLinear")
    ]
    finals: dict[str, frozenset[tuple[str, str]] | None] = {}

    def settle(value: str) -> None:
        """finals[v]: the Compute nodes v finally feeds, None where it feeds anything else, for
        `value` and the steps below it; those below first, with a stack of its own, not a
        recursion as deep as the chain."""
        stack, expanded = [value], set()
        while stack:
            current = stack[-1]
            if current in finals:
                stack.pop()
                continue
            below = [r.output[0] for r, _ in consumers.get(current, ()) if _is_step(r) and r.output]
            pending = [o for o in below if o not in finals]
            if pending and current not in expanded:  # a second visit finds them settled (a graph has no cycle)
                expanded.add(current)
                stack.extend(pending)
                continue
            stack.pop()
            found: set[tuple[str, str]] = set()
            for reader, _ in consumers.get(current, ()):
                key = (canonical_domain(reader.domain), reader.op_type)
                fed = finals.get(reader.output[0]) if _is_step(reader) and reader.output else None
                if fed is not None:
                    found |= fed
                elif kind_of(*key) is OpKind.COMPUTE and not _is_step(reader):
                    found.add(key)
                else:  # it feeds something else (or a step that does)
                    found.clear()
                    break
            finals[current] = frozenset(found) if found else None

    for start in starts:
        settle(start)
    return {scoped_name(path, v): ops for v, ops in finals.items() if ops}


def _is_step(node: NodeProto) -> bool:
    """A step of a dequantization (`DEQUANTIZE_STEPS`, default domain)."""
    return canonical_domain(node.domain) == "" and node.op_type in DEQUANTIZE_STEPS


_INTEGER_TYPES = frozenset({
    TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
    TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64,
})


def _shape_values_in(graph: GraphProto, path: str, consumers: Mapping[str, list[tuple[NodeProto, int]]]) -> set[str]:
    """`NumericFacts.shape_values` for one graph whose readers are `consumers` (its outputs are
    never shape values: a graph output is read by whoever runs the model)."""
    readers = {name: [node for node, _ in read] for name, read in consumers.items()}
    outputs = {o.name for o in graph.output}
    known: dict[str, bool] = {}

    def to_integer(node: NodeProto) -> bool:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return node.op_type == "Cast" and canonical_domain(node.domain) == "" and to in _INTEGER_TYPES

    def shape_only(value: str) -> bool:
        """Read only by Casts to an integer and by nodes whose every output is shape-only
        (`known` holds those outputs already: the walk below goes against the graph's order)."""
        return value not in outputs and bool(readers.get(value)) and all(
            to_integer(r) or (r.op_type != "Cast" and all(o and known.get(o, False) for o in r.output))
            for r in readers.get(value, ())
        )

    starts = [o for node in graph.node for o in node.output if o and any(to_integer(r) for r in readers.get(o, ()))]
    if not starts:
        return set()
    # From the last node to the first, so a value's readers are settled before it: a loop, not a
    # recursion as deep as the graph (a 6-layer BERT export is deeper than Python's stack).
    for node in reversed(graph.node):
        for o in node.output:
            if o:
                known[o] = shape_only(o)
    # Walk up from the values cast to integers: only their producers' inputs can be shape values.
    pending, seen = list(starts), set()
    producer = {o: node for node in graph.node for o in node.output if o}
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        node = producer.get(value)
        if node is not None:
            pending.extend(i for i in node.input if i)
    return {scoped_name(path, v) for v in seen if (known[v] if v in known else shape_only(v))}

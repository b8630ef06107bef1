"""The mixed-precision rewrite (docs/design.md, "Rewrite rules").

The rewrite is three passes with contracts (`DecidePass`, `StorePass`, `EmitPass`; see
`rlx_onnx_amp.passes`), each a sweep over every graph scope (main graph and If/Loop/Scan bodies)
of one `Plan`:

1. **Decide.** Each node gets a precision from its op kind through the policy, unless a rule of
   `KEEP_RULES` stops it (the first that fires, in that order, decides: `Cast` keeps its `to`,
   Constant/ConstantOfShape are sources that follow their readers, a user keep, a kernel
   gap...); the type variables of a lowered node are lowered unless a rule of `VARIABLE_RULES`
   keeps one (Resize `scales`: rule type-variable).
2. **Store.** Each float value gets a storage type: node outputs from their producer's
   decision; initializers and Constant values are narrowed in place when every consumer wants
   the same low precision (rule source-follows-consumers); graph inputs and outputs keep their type (rule io-types).
3. **Emit.** Each consumer reads each input at the type it requires; a mismatch is served by
   one Cast per (value, type) in each scope (rule one-cast-per-value), or by the input of an existing widening
   Cast (a chain that adds nothing is folded). Graph outputs computed in low precision get a
   Cast back under their original name (rule names-kept).

Names of original values are kept on the values that carried them, so a verifier can compare
any intermediate tensor by name.

Cost: every sweep is linear in nodes and edges. The decide sweep also types the main graph's
values from the op schemas as it goes (starting over with onnx's inference when a value cannot
be typed that way: control flow, sequences, attribute-typed outputs), and nodes that repeat an
(op, input types, type attribute) share one template for output types and decision. Casts are
appended where they are made and sorted into place once; small weights and Constant values are
narrowed together in one numpy pass (`tensors.NarrowBatch`).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import gc
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, helper

from rlx_onnx_amp.cost import estimate_cost
from rlx_onnx_amp.errors import InputError, first_line
from rlx_onnx_amp.kernels import Target, kernel_block
from rlx_onnx_amp.passes import Pass, PassResult, run_passes
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import FLOAT_TYPES, LOW_TYPES, PRECISIONS, Precision, precision_of_elem_type
from rlx_onnx_amp.ranges import INTEGER_ACCUMULATORS, RUNTIME_SCALES, NumericFacts, ValueRange, scoped_name
from rlx_onnx_amp.reports.conversion import REASON_CODES, ConversionReport, KeptNode
from rlx_onnx_amp.schema import OpSignature, TypeGroup, signature
from rlx_onnx_amp.taxonomy import (
    ANY_FLOAT_INPUTS,
    ATTRIBUTE_TYPED_VARS,
    DEFAULT_DOMAINS,
    FIXED_TYPE_OPS,
    KERNEL_GAPS,
    QDQ_CONSUMERS,
    QDQ_PRODUCERS,
    SOURCE_VALUE_ATTRIBUTES,
    TYPE_ATTRIBUTES,
    TYPED_TENSOR_ATTRIBUTES,
    OpKind,
    canonical_domain,
    kind_of,
)
from rlx_onnx_amp.tensors import (
    SMALL_TENSOR_ELEMENTS,
    ClampStats,
    NarrowBatch,
    WeightSink,
    WeightSource,
    is_external,
    narrow,
    tensor_nbytes,
)
from rlx_onnx_amp.types import (
    ATTRIBUTE_TYPED_OUTPUTS,
    GRAPH_OPS,
    NON_TENSOR,
    FreshNames,
    ScopeTypes,
    all_tensors,
    attribute_output_type,
    declared_types,
    infer_types,
    names_read,
    opset_versions,
    schema_output_types,
    sort_topologically,
    subgraphs,
)

__all__ = [
    "ConvertOptions",
    "DecidePass",
    "EmitPass",
    "KeepRule",
    "NodeDecision",
    "Plan",
    "Stage",
    "StorePass",
    "VariableRule",
    "conversion_passes",
    "convert_model",
]

logger = logging.getLogger(__name__)

_F32 = TensorProto.FLOAT
#: Ops (besides sources) whose attributes carry a type or a tensor that follows the node's precision.
_ATTRIBUTE_RETYPED_OPS = frozenset(TYPED_TENSOR_ATTRIBUTES) | frozenset(TYPE_ATTRIBUTES)
_TYPE_STR = {info.elem_type: info.type_str for info in PRECISIONS.values()}
_TYPE_NAME = {info.elem_type: info.onnx_name for info in PRECISIONS.values()}
#: Inserted Casts need an integer `to` (Cast-6) and a default domain onnxruntime implements (7+).
_MIN_CAST_OPSET = 7


@dataclass(frozen=True)
class ConvertOptions:
    """What the user can say besides the policy."""

    keep_io_types: bool = True
    keep_f32_ops: frozenset[str] = frozenset()
    keep_f32_nodes: tuple[str, ...] = ()  # regular expressions on node names
    #: Node paths (see `NodeDecision.path`) kept in f32, with the reason to report.
    keep_f32_paths: dict[str, str] = field(default_factory=dict)
    #: The execution provider the model is meant for: a node whose op has no kernel there for
    #: its low precision stays f32 (see `kernels`).
    target: Target = Target.CUDA
    #: Concrete input shapes for the cost model (`--shape`); symbolic axes not named here get
    #: the verifier's defaults.
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Fill `ConversionReport.cost`: one shape inference over the graph (about 2.5 s per
    #: 100,000 nodes); the CLI turns it off when nothing would show it (-q and no report file).
    cost: bool = True
    #: Check every pass's contract (`rlx_onnx_amp.passes`): onnx's full checker on the result
    #: and a second conversion of it that must change nothing, among others. For tests and
    #: for a model that looks mis-converted; a broken promise raises PassContractError.
    check_contracts: bool = False
    #: Value key (`ranges.scoped_name`: its name, after the path of the body defining it) -> what
    #: one f32 reference run saw of it (the range screen, `verification.screen`): rule
    #: range-screen keeps the nodes whose values pass the range.
    value_ranges: Mapping[str, ValueRange] = field(default_factory=dict)


@dataclass(slots=True)
class NodeDecision:
    """What the rewrite does to one node."""

    path: str  # stable id: node index in its graph, prefixed by the path of its scope
    node: NodeProto
    kind: OpKind | None
    # The node's fields, read once from the protobuf (field access there is slow).
    op: str = ""
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    precision: Precision | None = None  # the low precision it runs at; None: original types
    input_types: dict[int, int | None] = field(default_factory=dict)  # required; None: any
    output_types: dict[int, int] = field(default_factory=dict)
    reason: str | None = None  # why it was kept, when the policy wanted it lower
    source: bool = False  # a Constant-like node whose type follows its consumers
    keepable: bool = False  # the policy wants it lower, so a user keep (rule user-keep) applies to it
    code: str | None = None  # the deciding rule of `KEEP_RULES` (`report.REASON_CODES`); None: lowered

    @property
    def label(self) -> str:
        return self.node.name or f"{self.op}@{self.path}"


class _Scope:
    """One graph (main or body) and what the sweeps learn about its values."""

    def __init__(self, graph: GraphProto, path: str, parent: _Scope | None, types: dict[str, int]) -> None:
        self.graph = graph
        self.path = path
        self.parent = parent
        self.orig: dict[str, int] = dict(types)  # element types before the rewrite
        self.storage: dict[str, int] = {}  # element types after
        self.defined: set[str] = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        #: Values whose storage type follows what their consumers want (graph inputs,
        #: initializers, Constant-like outputs): the only ones whose `wants` are recorded.
        self.tracked: set[str] = set(self.defined)
        self.producer: dict[str, NodeDecision] = {}
        self.wants: dict[str, set[int]] = {}
        self.decisions: list[NodeDecision] = []
        self.children: dict[int, list[_Scope]] = {}
        self.rename: dict[str, str] = {}
        self.cast_cache: dict[tuple[str, int], str] = {}
        self.positions: list[int] = []  # sort keys of the graph's nodes while emit_scope runs
        self.quantized_inputs: set[str] = set()  # values read by QuantizeLinear
        self.folded: set[str] = set()  # Cast outputs some reader skipped (a Cast chain folded)
        self.has_qdq = False  # this scope or an enclosing one holds Q/DQ nodes

    def in_qdq_region(self, inputs: list[str], outputs: list[str]) -> bool:
        if not self.has_qdq:
            return False
        if any(n in self.quantized_inputs for n in outputs):
            return True
        for name in inputs:
            scope = self.owner(name) if name else None
            producer = scope.producer.get(name) if scope else None
            if producer is not None and producer.op in QDQ_PRODUCERS:
                return True
        return False

    def owner(self, name: str) -> _Scope | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.defined:
                return scope
            scope = scope.parent
        return None

    def orig_type(self, name: str) -> int | None:
        scope = self.owner(name)
        return scope.orig.get(name) if scope else None

    def storage_type(self, name: str) -> int | None:
        scope = self.owner(name)
        if scope is None:
            return None
        return scope.storage.get(name, scope.orig.get(name))


class _Outcome(NamedTuple):
    """What the list of rules gives a node: the first of them to fire (None: none did, the node is
    lowered) with its reason, or the lowering. What the template cache memoises per key."""

    kind: OpKind | None
    code: str | None  # the rule's
    reason: str | None  # reported (effect KEEPS) only
    precision: Precision | None
    input_types: dict[int, int | None]  # the decision's
    output_types: dict[int, int]
    source: bool  # the rule's effect is FOLLOWS_CONSUMERS
    keepable: bool  # none of the rules above user-keep fired, so a user keep still applies


class _Template(NamedTuple):
    """What every node with the same (domain, op, input types, type attribute, output count)
    gets: its output types and its outcome. Shared, never mutated."""

    output_types: tuple[int | None, ...]  # by output index, as the schema gives them
    outcome: _Outcome


class _Untyped(Exception):
    """Schema typing cannot type a value for certain; onnx's inference must run."""


#: The type key of an omitted optional input ("" in a node's inputs).
_OMITTED = -2


def _is_float(elem: int | None) -> bool:
    return elem in FLOAT_TYPES


@dataclass(frozen=True, slots=True)
class _Lowering:
    """What lowering a node's type variables to the target gives (`VARIABLE_RULES`)."""

    inputs: tuple[int, ...]  # input indices to lower
    outputs: tuple[int, ...]  # output indices to lower
    variables: tuple[str, ...]  # the lowered type variables
    not_admitted: tuple[str, ...]  # float variables kept by rule type-variable, sorted
    others: tuple[tuple[str, str], ...]  # kept float variables and their type, for the kernel lookup

    @property
    def lowers(self) -> bool:
        return bool(self.inputs or self.outputs)


@dataclass(slots=True)
class _NodeFacts:
    """What the keep rules read about a node whose values are typed. Only the per-node rules
    read its path; the others' outcome is shared by every node of its template key."""

    node: NodeProto
    path: str
    scope: _Scope | None  # None: the per-node rules, over a decision from the template cache
    op: str
    domain: str
    ins: list[str]
    outs: list[str]
    in_types: list[int | None]
    out_types: list[int | None]
    sig: OpSignature | None
    has_subgraph: bool
    kind: OpKind | None = None
    target: Precision | None = None  # the policy's precision for its kind (None: unknown op)
    any_inputs: tuple[int, ...] = ()  # inputs read at any float type (Cast's, Shape's)
    lowering: _Lowering | None = None  # once one of the rules asked for it (`DecidePass.lowering`)


class Effect(enum.Enum):
    """What a keep rule, once it fires, does to its node."""

    FOLLOWS_CONSUMERS = "follows consumers"  # a source: its type is its readers' (the store pass)
    KEEPS_SILENTLY = "keeps silently"  # keeps its types; the policy did not want it lower
    KEEPS = "keeps"  # keeps its types although the policy wanted it lower: reported in kept_f32


@dataclass(frozen=True)
class KeepRule:
    """One reason a node does not run at its kind's precision: `check` returns the reason, or None."""

    code: str  # report.REASON_CODES
    check: Callable[[DecidePass, _NodeFacts], str | None]
    effect: Effect = Effect.KEEPS
    per_node: bool = False  # reads the node's name or path: applied over the template cache


def _source(cv: DecidePass, f: _NodeFacts) -> str | None:
    """Constant and ConstantOfShape take the precision their readers want."""
    return "source" if f.op in SOURCE_VALUE_ATTRIBUTES and f.domain in DEFAULT_DOMAINS else None


def _fixed_type(cv: DecidePass, f: _NodeFacts) -> str | None:
    """Cast, CastLike and BitCast keep the type they make; readers at another get a Cast after."""
    return "keeps its `to`" if f.op in FIXED_TYPE_OPS else None


def _non_tensor(cv: DecidePass, f: _NodeFacts) -> str | None:
    """Sequence and optional values keep their types."""
    holds = NON_TENSOR in f.in_types or NON_TENSOR in f.out_types
    return "sequence/optional values keep their types" if holds else None


def _control_flow(cv: DecidePass, f: _NodeFacts) -> str | None:
    """If/Loop/Scan keep their interface types; their bodies are rewritten."""
    return "control-flow: interface keeps its types, bodies are rewritten" if f.has_subgraph else None


def _unknown_op(cv: DecidePass, f: _NodeFacts) -> str | None:
    """An op the taxonomy lacks keeps its types."""
    return f"unknown op {f.node.domain + '.' if f.node.domain else ''}{f.node.op_type}" if f.kind is None else None


def _policy_f32(cv: DecidePass, f: _NodeFacts) -> str | None:
    """The policy runs the node's kind at f32; the rules below see only nodes it lowers."""
    return f"policy: {f.kind} runs at f32" if f.target is Precision.F32 else None


def _user_keep_rule(cv: DecidePass, f: _NodeFacts) -> str | None:
    """--keep-f32-op, --keep-f32-node and node paths (repair's keeps)."""
    return cv._user_keep(f.node, f.path)


def _cast_unavailable(cv: DecidePass, f: _NodeFacts) -> str | None:
    """The Casts around the node cannot be written at the model's default-domain opset."""
    assert f.target is not None
    return cv._cast_block(f.target)


def _kernel_gap_rule(cv: DecidePass, f: _NodeFacts) -> str | None:
    """onnxruntime has a known gap its registry cannot show (`KERNEL_GAPS`)."""
    gap = _kernel_gap(f.node) if (canonical_domain(f.domain), f.op) in KERNEL_GAPS else None
    return f"kernel: {gap}" if gap else None


def _qdq_region(cv: DecidePass, f: _NodeFacts) -> str | None:
    """A node between DequantizeLinear and QuantizeLinear runs quantized."""
    assert f.scope is not None
    if f.scope.in_qdq_region(f.ins, f.outs):
        return "qdq: reads DequantizeLinear or feeds QuantizeLinear (onnxruntime runs it quantized)"
    return None


def _no_schema(cv: DecidePass, f: _NodeFacts) -> str | None:
    """No schema for the op at the model's opset: nothing says what it admits."""
    return f"no schema for {f.op} at opset {cv.cx.opset(f.domain)}" if f.sig is None else None


def _schema_admits(cv: DecidePass, f: _NodeFacts) -> str | None:
    """Rule type-variable keeps every float variable, so nothing is lowered."""
    assert f.sig is not None and f.target is not None
    lowering = cv.lowering(f)
    if lowering.lowers or not lowering.not_admitted:
        return None
    variables = ", ".join(lowering.not_admitted)
    return f"schema: {f.op}-{f.sig.since_version} does not admit {f.target.value} for {variables}"


def _kernel_table(cv: DecidePass, f: _NodeFacts) -> str | None:
    """The target has no kernel for the lowered combination of types (`kernels.kernel_block`)."""
    assert f.sig is not None and f.target is not None
    lowering = cv.lowering(f)
    if not lowering.lowers:
        return None
    return kernel_block(
        cv.cx.options.target,
        f.target,
        canonical_domain(f.domain),
        f.op,
        f.sig.since_version,
        lowering.variables,
        lowering.others,
        f.op in TYPE_ATTRIBUTES and f.domain in DEFAULT_DOMAINS,
    )


def _nothing_to_lower(cv: DecidePass, f: _NodeFacts) -> str | None:
    """No type variable holds f32 values to lower (integers, bool, or values already low)."""
    return None if cv.lowering(f).lowers else "nothing to lower"


def _dequantize_arithmetic(cv: DecidePass, f: _NodeFacts) -> str | None:
    """It dequantizes an integer accumulator or a run-time scale, or makes what DynamicQuantizeLinear quantizes."""
    # MatMulInteger's and ConvInteger's int32 sums of 8-bit products reach 1e5 and more: the f32
    # arithmetic around a dynamically quantized op belongs to the quantized region, as QDQ's
    # does (rule qdq-region); a value rounded to f16 before DynamicQuantizeLinear lands in
    # other quantization bins.
    assert f.scope is not None
    quantized = cv.cx.numeric.quantized_at_run_time
    for name in f.outs:
        if scoped_name(f.scope.path, name) in quantized:
            return f"dequantize: makes {name!r}, which DynamicQuantizeLinear quantizes (rounding it moves the bins)"
    for name in f.ins:
        owner = f.scope.owner(name) if name else None
        producer = owner.producer.get(name) if owner is not None else None
        if producer is None or producer.domain not in DEFAULT_DOMAINS:
            continue
        if producer.op in RUNTIME_SCALES and producer.outputs.index(name) == RUNTIME_SCALES[producer.op]:
            return f"dequantize: reads {producer.op}'s run-time scale {name!r}"
        if producer.op == "Cast" and producer.inputs and producer.inputs[0]:
            inner = owner.producer.get(producer.inputs[0]) if owner is not None else None
            if inner is not None and (canonical_domain(inner.domain), inner.op) in INTEGER_ACCUMULATORS:
                return f"dequantize: reads the f32 Cast of {inner.op}'s integer accumulator {producer.inputs[0]!r}"
    return None


def _weight_range(cv: DecidePass, f: _NodeFacts) -> str | None:
    """It reads a weight past its precision's range that is no mask sentinel (`ranges.NumericFacts.is_sentinel`)."""
    # Clamping a 1e7 running variance to 65504 would rescale what the node computes; clamping an
    # additive -1e9 attention mask changes nothing a Softmax gives.
    assert f.target is not None and f.scope is not None
    numeric = cv.cx.numeric
    for name in f.ins:
        key = _key(f.scope, name) if name else ""
        worst = numeric.past_range(key, f.target) if name else None
        if worst is not None and not numeric.is_sentinel(key, f.target):
            return f"weight: {name!r} holds {worst:.4g}, past {f.target.value}'s {f.target.info.max_finite:g}"
    return None


def _low_precisions(policy: Policy) -> set[Precision]:
    """The precisions below f32 that `policy` runs some kind at."""
    return {policy.precision_for(kind) for kind in OpKind} - {Precision.F32}


def _key(scope: _Scope, name: str) -> str:
    """`ranges.scoped_name` of a value a node of `scope` reads: keyed by the scope defining it."""
    owner = scope.owner(name)
    return scoped_name(owner.path if owner is not None else "", name)


def _range_screen(cv: DecidePass, f: _NodeFacts) -> str | None:
    """On the reference run it makes or reads values past its precision's range, or flushing where zero is singular."""
    # `ConvertOptions.value_ranges`, from one f32 run (`verification.reference`); values computed
    # from a clamped mask sentinel are not screened: the candidate holds them clamped.
    assert f.target is not None and f.scope is not None
    ranges, numeric, target = cv.cx.options.value_ranges, cv.cx.numeric, f.target
    singular = numeric.singular_inputs(f.node, f.scope.path)
    for k, name in enumerate(f.ins):
        key = _key(f.scope, name) if name else ""
        seen = ranges.get(key) if name else None
        if seen is None or numeric.tainted(key, target):
            continue
        if seen.overflows(target):
            return f"screen: reads {name!r}, which reaches {seen.max_abs:.4g} (past {target.value}'s range)"
        if k in singular and seen.flushes(target):
            return f"screen: reads {name!r} where zero is singular, and its values flush to zero in {target.value}"
    for name in f.outs:
        key = scoped_name(f.scope.path, name)
        seen = ranges.get(key) if name else None
        if seen is None or numeric.tainted(key, target):
            continue
        if seen.overflows(target):
            return f"screen: makes {name!r}, which reaches {seen.max_abs:.4g} (past {target.value}'s range)"
        if key in numeric.singular_reads() and seen.flushes(target):
            return f"screen: makes {name!r}, read where zero is singular; its values flush to zero in {target.value}"
    return None


#: Every reason a node does not simply run at its kind's precision, in precedence order: the
#: first that fires decides, and a node none of them stops is lowered. This order is the only
#: place precedence is decided (docs/design.md, "Keep rules").
KEEP_RULES: tuple[KeepRule, ...] = (
    KeepRule("source-follows-consumers", _source, Effect.FOLLOWS_CONSUMERS),
    KeepRule("cast-keeps-to", _fixed_type, Effect.KEEPS_SILENTLY),
    KeepRule("non-tensor", _non_tensor),
    KeepRule("control-flow", _control_flow),
    KeepRule("unknown-op", _unknown_op),
    KeepRule("policy-f32", _policy_f32, Effect.KEEPS_SILENTLY),
    KeepRule("user-keep", _user_keep_rule, per_node=True),
    KeepRule("cast-unavailable", _cast_unavailable),
    KeepRule("kernel-gap", _kernel_gap_rule),
    KeepRule("qdq-region", _qdq_region),
    KeepRule("no-schema", _no_schema),
    KeepRule("schema-admits", _schema_admits),
    KeepRule("kernel-table", _kernel_table),
    KeepRule("nothing-to-lower", _nothing_to_lower, Effect.KEEPS_SILENTLY),
    # What the values say, for nodes the rules above lower: the node's inputs and producers.
    KeepRule("dequantize-arithmetic", _dequantize_arithmetic, per_node=True),
    KeepRule("weight-range", _weight_range, per_node=True),
    KeepRule("range-screen", _range_screen, per_node=True),
)
RULES_BY_CODE = {r.code: r for r in KEEP_RULES}
_RULE_ORDER = {rule.code: i for i, rule in enumerate(KEEP_RULES)}
#: The rules `DecidePass._outcome` applies; the per-node ones are applied over the template cache.
_NODE_INDEPENDENT_RULES = tuple(r for r in KEEP_RULES if not r.per_node)
_PER_NODE_RULES = tuple(r for r in KEEP_RULES if r.per_node)
#: A node decided by one of the rules past this index, or lowered, is one a user keep can return to f32.
_KEEPABLE_FROM = min(_RULE_ORDER[r.code] for r in _PER_NODE_RULES)


@dataclass(frozen=True, slots=True)
class _GroupFacts:
    """What the variable rules read about one type variable of a node the policy lowers."""

    group: TypeGroup
    known: frozenset[int]  # the element types its values have (unknown ones left out)
    target: Precision
    attribute_typed: bool


@dataclass(frozen=True)
class VariableRule:
    """One reason a type variable of a lowered node keeps its type (its inputs and outputs
    stay as they are; the node lowers its other variables): `check` says whether it applies."""

    code: str
    check: Callable[[_GroupFacts], bool]


def _attribute_typed(g: _GroupFacts) -> bool:
    """An attribute fixes the variable's type (LayerNormalization's U follows `stash_type`)."""
    return g.attribute_typed


def _other_type(g: _GroupFacts) -> bool:
    """Its values are not float, not known, or already at another precision than the target."""
    return not g.known or not g.known <= {_F32, g.target.elem_type}


def _not_admitted(g: _GroupFacts) -> bool:
    """The schema does not admit the low type for it (Resize's `scales` is `tensor(float)`)."""
    return _F32 in g.known and _TYPE_STR[g.target.elem_type] not in g.group.allowed


#: Every reason a type variable keeps its type when its node is lowered, in order; a variable
#: that none of them keeps is lowered. When every float variable is kept by `type-variable`, the node
#: keeps its types with code schema-admits.
VARIABLE_RULES: tuple[VariableRule, ...] = (
    VariableRule("attribute-typed", _attribute_typed),
    VariableRule("other-type", _other_type),
    VariableRule("type-variable", _not_admitted),
)


class _Conversion:
    """What the three passes of one conversion share: the model, the policy and options, the
    weights' source and sink, fresh names, and what they count for the report and for their
    honest `modified`."""

    def __init__(
        self,
        model: ModelProto,
        policy: Policy,
        options: ConvertOptions,
        source: WeightSource,
        sink: WeightSink,
        report: ConversionReport,
        weights: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.weights = weights
        self.progress = progress
        self.model = model
        self.policy = policy
        self.options = options
        self.source = source
        self.sink = sink
        self.report = report
        self.opsets = opset_versions(model)
        self.fresh = FreshNames()
        self.casts_inserted = 0
        self.casts_removed = 0  # rule idle-cast
        # What the passes changed in the protobuf, so that each says so honestly (`passes`):
        self.edits = 0  # rewired inputs, renamed outputs, retyped values, attributes and weights
        self.saturated = 0  # f32 sources clamped to the low range (the store pass)
        self.relocated = False  # unconverted weights moved into the sink's file
        self.clamped: dict[str, ClampStats] = {}
        self.numeric = NumericFacts(model, source)

    @property
    def used_names(self) -> set[str]:
        """Every name a value or node has or will have: the fresh-name generator's."""
        return self.fresh.taken

    @property
    def changed(self) -> bool:
        """A Cast inserted or removed, or an edit: what the report says."""
        return bool(self.casts_inserted or self.casts_removed or self.edits)

    def opset(self, domain: str) -> int:
        return self.opsets.get(canonical_domain(domain), 1)

    def collect_names(self, graph: GraphProto) -> None:
        """Names of the graph's declared values; node names and outputs are added while deciding."""
        for vi in (*graph.input, *graph.output, *graph.value_info):
            self.used_names.add(vi.name)
        self.used_names.update(t.name for t in graph.initializer)

    def record_clamp(self, name: str, stats: ClampStats) -> None:
        if stats.clamped or stats.flushed:
            self.clamped[name] = stats
            if stats.clamped:
                logger.info("%s: %d values clamped (worst %g)", name, stats.clamped, stats.worst)


class Stage(enum.IntEnum):
    """Where a plan stands: each pass needs one stage and leaves the plan at the next."""

    NEW = 0
    DECIDED = 1  # every node has its decision
    STORED = 2  # every float value has its storage type
    EMITTED = 3  # the model is rewritten


@dataclass
class Plan:
    """The rewrite's decisions beside the model they are about: the main scope holds each
    node's `NodeDecision`, each value's original and storage type, and its bodies' scopes."""

    model: ModelProto
    main: _Scope | None = None
    stage: int = Stage.NEW

    def scopes(self) -> Iterator[_Scope]:
        """The main scope and every body's, each body after the scope that holds it."""
        pending = [self.main] if self.main is not None else []
        while pending:
            scope = pending.pop()
            yield scope
            for children in scope.children.values():
                pending.extend(children)


class DecidePass(Pass[Plan]):
    """Sweep 1: each node's precision, or the rule of `KEEP_RULES` that stops it.

    Requires a graph with nodes or outputs. Ensures one decision per node, in node order, in
    every scope; a reason exactly when the deciding rule's effect is KEEPS, a source exactly
    when it is FOLLOWS_CONSUMERS; lowered only float values that were f32 or already at the
    node's precision. Does not modify the model."""

    name, needs_stage, gives_stage = "decide", Stage.NEW, Stage.DECIDED

    def __init__(self, conversion: _Conversion) -> None:
        self.cx = conversion
        options, policy = conversion.options, conversion.policy
        self.keep_node_patterns = [re.compile(p) for p in options.keep_f32_nodes]
        user_keeps = bool(options.keep_f32_paths or options.keep_f32_ops or self.keep_node_patterns)
        numeric = conversion.numeric
        # The per-node rules that can fire on this model: the others cost nothing per node.
        active = {
            "user-keep": user_keeps,
            "dequantize-arithmetic": numeric.has_accumulators,
            "weight-range": any(numeric.any_past_range(p) for p in _low_precisions(policy)),
            "range-screen": bool(options.value_ranges),
        }
        self.node_rules = tuple(r for r in _PER_NODE_RULES if active[r.code])
        self.kind_precision = {k: policy.precision_for(k) for k in OpKind}
        self._lowerings: dict[tuple[object, ...], _Lowering] = {}
        self._templates: dict[tuple[object, ...], _Template] = {}
        self._cast_blocks: dict[Precision, str | None] = {}

    def requires(self, plan: Plan) -> None:
        if not plan.model.graph.node and not plan.model.graph.output:
            self.fail("needs a graph with nodes or outputs")

    def call(self, plan: Plan) -> PassResult:
        plan.main = self.decide_model()
        return PassResult(modified=False)

    def ensures(self, plan: Plan) -> None:
        for scope in plan.scopes():
            if len(scope.decisions) != len(scope.graph.node):
                self.fail(f"scope {scope.path!r}: {len(scope.decisions)} decisions for {len(scope.graph.node)} nodes")
            for i, (d, node) in enumerate(zip(scope.decisions, scope.graph.node)):
                if d.path != f"{scope.path}{i}" or d.op != node.op_type:
                    self.fail(f"decision {d.path} ({d.op}) is not about node {i} ({node.op_type}) of {scope.path!r}")
                self._check_decision(scope, d)

    def _check_decision(self, scope: _Scope, d: NodeDecision) -> None:
        rule = RULES_BY_CODE.get(d.code) if d.code is not None else None
        reported = rule is not None and rule.effect is Effect.KEEPS
        if (d.code is not None and (rule is None or d.code not in REASON_CODES)) or (d.reason is not None) != reported:
            self.fail(f"{d.label}: reason {d.reason!r} with code {d.code!r}")
        if d.source != (rule is not None and rule.effect is Effect.FOLLOWS_CONSUMERS):
            self.fail(f"{d.label}: a source exactly when rule source-follows-consumers decided it (code {d.code!r})")
        low = d.precision.elem_type if d.precision is not None else None
        lowered = [(d.inputs[k], t) for k, t in d.input_types.items() if t is not None]
        lowered += [(d.outputs[k], t) for k, t in d.output_types.items()]
        for name, elem in lowered:
            if elem != low or scope.orig_type(name) not in (_F32, low, None):
                self.fail(
                    f"{d.label}: {name!r} lowered to {elem} (node at {d.precision}, value {scope.orig_type(name)})"
                )
        if d.precision is not None and (d.reason is not None or not lowered):
            self.fail(f"{d.label}: at {d.precision.value} with nothing lowered, or with a reason to keep it")

    def decide_model(self) -> _Scope:
        """Sweep 1 over the whole model: the main scope, every node decided."""
        graph = self.cx.model.graph
        self.cx.collect_names(graph)
        names = set(self.cx.used_names)
        declared = declared_types(graph)
        main = _Scope(graph, "", None, declared or {})
        try:
            if declared is None:
                raise _Untyped("a graph input or output is not a tensor")
            self.decide_scope(main, None)  # typed from the schemas as it goes
        except _Untyped as e:
            logger.debug("schema typing gave up (%s); running onnx shape inference", e)
            self.cx.fresh = FreshNames(names)
            types = infer_types(self.cx.model)
            main = _Scope(graph, "", None, types.get("", {}))
            self.decide_scope(main, types)
        return main

    def decide_scope(self, scope: _Scope, types: ScopeTypes | None) -> None:
        """Decide every node of `scope` (and of the bodies it holds) in node order.

        With `types=None` (the main graph of a model without control flow) values are typed
        as the sweep goes, from the op schemas; a value that cannot be typed for certain that
        way raises `_Untyped`, and the caller starts over with onnx's inference.
        """
        nodes = scope.graph.node
        op_types = [n.op_type for n in nodes]  # one read of a field every node needs
        self._scan_qdq(scope, nodes, op_types)
        orig, templates, prefix = scope.orig, self._templates, scope.path
        orig_type = orig.get if scope.parent is None else scope.orig_type  # main-graph names need no scope walk
        # Templates: nodes whose op, input types and type attribute repeat get the same output
        # types and decision; most nodes of a large graph repeat a few dozen of them.
        templated = not scope.has_qdq
        for i, node in enumerate(nodes):
            op = op_types[i]
            domain = node.domain
            ins, outs = node.input[:], node.output[:]  # a slice copies to a list twice as fast as list()
            path = f"{prefix}{i}"
            holds_body = op in GRAPH_OPS or domain not in DEFAULT_DOMAINS
            children = self._bodies(scope, node, path, types) if holds_body else []
            if children:
                scope.children[i] = children
            key_types = (
                tuple(map(orig_type, ins)) if "" not in ins else tuple([orig_type(n) if n else _OMITTED for n in ins])
            )
            # An attribute that types the output is part of the template key.
            attr_type = (
                attribute_output_type(node, op) if op in ATTRIBUTE_TYPED_OUTPUTS and domain in DEFAULT_DOMAINS else None
            )
            key = (domain, op, key_types, attr_type, len(outs))
            template = templates.get(key) if templated and not children else None
            decision = None
            if template is not None:
                decision = self._from_template(template, path, node, op, domain, ins, outs, scope)
            if decision is None:
                decision = self._decide(
                    node,
                    path,
                    scope,
                    children,
                    op,
                    domain,
                    ins,
                    outs,
                    key_types,
                    attr_type,
                    key if templated and not children else None,
                    types is None,
                )
            scope.decisions.append(decision)
            for child in children:
                self.decide_scope(child, types)
                for out in child.graph.output:  # bodies hand back their original types
                    self._want(child, out.name, child.orig_type(out.name))
            self._record(scope, decision, node, ins, outs, orig_type)
        if scope.parent is None:
            for out in scope.graph.output:
                elem = out.type.tensor_type.elem_type if self.cx.options.keep_io_types else None
                self._want(scope, out.name, elem)

    def _scan_qdq(self, scope: _Scope, nodes: Sequence[NodeProto], op_types: list[str]) -> None:
        """Whether the scope (or an enclosing one) holds Q/DQ nodes, and the values QuantizeLinear reads."""
        present = set(op_types)
        scope.quantized_inputs = (
            {n.input[0] for n in nodes if n.op_type in QDQ_CONSUMERS and n.input} if present & QDQ_CONSUMERS else set()
        )
        scope.has_qdq = (
            bool(scope.quantized_inputs)
            or (scope.parent is not None and scope.parent.has_qdq)
            or bool(present & QDQ_PRODUCERS)
        )

    def _bodies(self, scope: _Scope, node: NodeProto, path: str, types: ScopeTypes | None) -> list[_Scope]:
        """The scopes of the bodies `node` holds (If/Loop/Scan, or a custom op with a graph)."""
        children = []
        for attr_key, sub in subgraphs(node):
            if types is None:
                raise _Untyped(f"{node.op_type} holds a graph")
            child_path = f"{path}/{attr_key}/"
            children.append(_Scope(sub, child_path, scope, types.get(child_path, {})))
            self.cx.collect_names(sub)
        return children

    def _from_template(
        self,
        template: _Template,
        path: str,
        node: NodeProto,
        op: str,
        domain: str,
        ins: list[str],
        outs: list[str],
        scope: _Scope,
    ) -> NodeDecision | None:
        """The template's decision for this node, its outputs typed; None when a declared
        output type disagrees with the template (the node is then decided alone)."""
        orig = scope.orig
        for name, elem in zip(outs, template.output_types):
            if name:
                have = orig.get(name)
                if have is None:
                    orig[name] = elem  # type: ignore[assignment]  # templates type every named output
                elif have != elem:
                    return None
        return self._decision(template.outcome, path, node, op, domain, ins, outs, scope)

    def _decision(
        self,
        outcome: _Outcome,
        path: str,
        node: NodeProto,
        op: str,
        domain: str,
        ins: list[str],
        outs: list[str],
        scope: _Scope,
    ) -> NodeDecision:
        """The node's decision from its outcome, then the per-node rules over it."""
        kind, code, reason, precision, input_types, output_types, source, keepable = outcome
        if source:  # store_scope settles a source's precision on its own copy
            input_types, output_types = dict(input_types), dict(output_types)
        decision = NodeDecision(path, node, kind, op, domain, ins, outs, precision, input_types, output_types)
        decision.reason, decision.source, decision.keepable, decision.code = reason, source, keepable, code
        if keepable and self.node_rules:
            self._apply_node_rules(decision, scope)
        return decision

    def _record(
        self,
        scope: _Scope,
        decision: NodeDecision,
        node: NodeProto,
        ins: list[str],
        outs: list[str],
        orig_type: Callable[[str], int | None],
    ) -> None:
        """What the sweep learns from a decided node: its outputs' producer and storage type,
        and the types it reads the values whose storage follows their consumers at."""
        self.cx.used_names.update(outs)
        self.cx.used_names.add(node.name)
        defined, producer, storage, tracked = scope.defined, scope.producer, scope.storage, scope.tracked
        output_types, input_types = decision.output_types, decision.input_types
        for k, name in enumerate(outs):
            if name:
                defined.add(name)
                producer[name] = decision
                if k in output_types:
                    storage[name] = output_types[k]
        if decision.source and outs and outs[0]:
            tracked.add(outs[0])
        # Which types consumers read a value at matters only for values whose storage
        # follows their consumers (initializers, sources; see store_scope).
        nested = scope.parent is not None
        if not nested and tracked.isdisjoint(ins):
            return
        owner: _Scope | None
        for k, name in enumerate(ins):
            if name in tracked:
                owner = scope
            elif nested and name and name not in defined:
                owner = scope.owner(name)
                if owner is None or name not in owner.tracked:
                    continue
            else:
                continue
            elem = input_types[k] if k in input_types else orig_type(name)
            if elem is not None:
                owner.wants.setdefault(name, set()).add(elem)

    def _want(self, scope: _Scope, name: str, elem: int | None) -> None:
        """Record that a consumer reads `name` at `elem` (None: at any type)."""
        owner = scope.owner(name)
        if owner is not None and elem is not None:
            owner.wants.setdefault(name, set()).add(elem)

    def _user_keep(self, node: NodeProto, path: str) -> str | None:
        if path in self.cx.options.keep_f32_paths:
            return self.cx.options.keep_f32_paths[path]
        if node.op_type in self.cx.options.keep_f32_ops:
            return f"user: --keep-f32-op {node.op_type}"
        for pattern in self.keep_node_patterns:
            if node.name and pattern.search(node.name):
                return f"user: --keep-f32-node {pattern.pattern}"
        return None

    def _apply_node_rules(self, d: NodeDecision, scope: _Scope) -> None:
        """The rules that depend on the node itself (its name, its path, the values it reads),
        over a decision that may come from the template cache: one fires when it comes before
        the one that decided (`KEEP_RULES` order is the precedence); the node then keeps its
        original types."""
        decided = _RULE_ORDER.get(d.code or "", len(KEEP_RULES))
        facts = _NodeFacts(d.node, d.path, scope, d.op, d.domain, d.inputs, d.outputs, [], [], None, False, d.kind)
        facts.target = d.precision
        for rule in self.node_rules:
            if _RULE_ORDER[rule.code] >= decided:
                return
            reason = rule.check(self, facts)
            if reason:
                d.precision, d.reason, d.code = None, reason, rule.code
                d.input_types = {k: t for k, t in d.input_types.items() if t is None}  # any-float inputs stay any
                d.output_types = {}
                return

    def _decide(
        self,
        node: NodeProto,
        path: str,
        scope: _Scope,
        children: list[_Scope],
        op: str,
        domain: str,
        ins: list[str],
        outs: list[str],
        key_types: tuple[int | None, ...],
        attr_type: int | None,
        template_key: tuple[object, ...] | None,
        schema_typing: bool,
    ) -> NodeDecision:
        """Type a node's outputs and decide it; store the result as a template when it depends
        on nothing but the template key."""
        in_types = [None if t == _OMITTED else t for t in key_types]
        sig = signature(domain, op, self.cx.opset(domain), len(ins), len(outs))
        # What the schema alone says of the outputs (as schema_types does): the attribute that
        # types them, or what their type variables give.
        derived: list[int | None] = [None] * len(outs)
        if attr_type is not None:
            derived[0] = attr_type
        elif sig is not None:
            derived = schema_output_types(sig, in_types, len(outs))
        orig = scope.orig
        out_types: list[int | None] = [None] * len(outs)
        for k, name in enumerate(outs):
            if not name:
                continue
            elem = orig.get(name)
            if elem is None:
                elem = derived[k]
                if elem is None and sig is not None:
                    # onnx's inference left it open (contrib ops): a group's known type.
                    for g in sig.groups:
                        if k in g.outputs:
                            known = [in_types[j] for j in g.inputs if in_types[j] is not None]
                            known += [out_types[j] for j in g.outputs if out_types[j] is not None]
                            elem = known[0] if known else None
                if elem is None and schema_typing:
                    raise _Untyped(f"output {name!r} of {op}")
                if elem is not None:
                    orig[name] = elem
            out_types[k] = elem
        facts = _NodeFacts(node, path, scope, op, domain, ins, outs, in_types, out_types, sig, bool(children))
        outcome = self._outcome(facts)
        named = [k for k, name in enumerate(outs) if name]
        if (
            template_key is not None
            and all(derived[k] is not None and derived[k] == out_types[k] for k in named)
            and (canonical_domain(domain), op) not in KERNEL_GAPS
        ):
            self._templates[template_key] = _Template(tuple(derived), outcome)
        return self._decision(outcome, path, node, op, domain, ins, outs, scope)

    def _outcome(self, f: _NodeFacts) -> _Outcome:
        """What `KEEP_RULES` give one node whose values are typed: the first of them to fire,
        in their order, or the lowering when none does. The per-node rules are left to
        `_apply_node_rules`, over the template cache."""
        f.kind = kind = kind_of(f.domain, f.op)
        any_inputs: dict[int, int | None] = {k: None for k in ANY_FLOAT_INPUTS.get(f.op, ()) if k < len(f.ins)}
        f.any_inputs = tuple(any_inputs)
        f.target = target = self.kind_precision[kind] if kind is not None else None
        for rule in _NODE_INDEPENDENT_RULES:
            reason = rule.check(self, f)
            if reason:
                reported = reason if rule.effect is Effect.KEEPS else None
                keepable = _RULE_ORDER[rule.code] > _KEEPABLE_FROM
                source = rule.effect is Effect.FOLLOWS_CONSUMERS
                inputs = {} if source else any_inputs
                return _Outcome(kind, rule.code, reported, None, inputs, {}, source, keepable)
        assert target is not None and f.lowering is not None  # the lowering rules asked for it
        low, ins = target.elem_type, f.ins
        input_types: dict[int, int | None] = {**any_inputs, **{k: low for k in f.lowering.inputs if ins[k]}}
        return _Outcome(kind, None, None, target, input_types, {k: low for k in f.lowering.outputs}, False, True)

    def _cast_block(self, target: Precision) -> str | None:
        """Why the Casts around a node lowered to `target` cannot be written at the
        default-domain opset they would live in (None: they can)."""
        if target not in self._cast_blocks:
            version = self._cast_opset()
            reason = None
            if version < _MIN_CAST_OPSET:
                # Cast-1 takes `to` as a string, and onnxruntime implements the default domain
                # from opset 7: the Casts, and the function bodies it expands for low-precision
                # nodes without a kernel, would not load.
                reason = f"schema: the default-domain opset {version} predates Cast-{_MIN_CAST_OPSET}"
            else:
                try:
                    cast = onnx.defs.get_schema("Cast", version, "")
                    allowed = {
                        t for c in cast.type_constraints if c.type_param_str == "T2" for t in c.allowed_type_strs
                    }
                except onnx.defs.SchemaError:
                    allowed = set()
                if _TYPE_STR[target.elem_type] not in allowed:
                    reason = f"schema: Cast at opset {version} does not admit {target.value}"
            self._cast_blocks[target] = reason
        return self._cast_blocks[target]

    def _cast_opset(self) -> int:
        """The default-domain opset of the model, or the one `_ensure_default_opset` would add."""
        if any(o.domain in DEFAULT_DOMAINS for o in self.cx.model.opset_import):
            return self.cx.opset("")
        return _default_opset_for(self.cx.model, self.cx.opsets.get("ai.onnx.ml"))

    def lowering(self, f: _NodeFacts) -> _Lowering:
        """Which type variables of `f`'s node `VARIABLE_RULES` let go to its target: memoized,
        since most nodes of a model share a handful of signatures."""
        if f.lowering is not None:
            return f.lowering
        sig, target = f.sig, f.target
        assert sig is not None and target is not None
        in_types, out_types = tuple(f.in_types), tuple(f.out_types)
        key = (f.domain, f.op, sig, in_types, out_types, f.any_inputs, target)
        found = self._lowerings.get(key)
        if found is None:
            found = self._lowerings[key] = self._lower_variables(f, in_types, out_types)
        f.lowering = found
        return found

    def _lower_variables(
        self, f: _NodeFacts, in_types: tuple[int | None, ...], out_types: tuple[int | None, ...]
    ) -> _Lowering:
        sig, target, any_inputs = f.sig, f.target, f.any_inputs
        assert sig is not None and target is not None
        in_low: list[int] = []
        out_low: list[int] = []
        lowered_vars: list[str] = []
        not_admitted: set[str] = set()
        others: list[tuple[str, str]] = []  # float variables that keep their type, for the kernel lookup
        fixed_vars = ATTRIBUTE_TYPED_VARS.get(f.op, frozenset()) if f.domain in DEFAULT_DOMAINS else frozenset()
        for g in sig.groups:
            members = [in_types[k] for k in g.inputs if k not in any_inputs] + [out_types[k] for k in g.outputs]
            facts = _GroupFacts(g, frozenset(t for t in members if t is not None), target, g.var in fixed_vars)
            var = g.var.split("#")[0]
            kept_by = next((rule.code for rule in VARIABLE_RULES if rule.check(facts)), None)
            if kept_by is None:
                in_low.extend(k for k in g.inputs if k not in any_inputs)
                out_low.extend(g.outputs)
                lowered_vars.append(var)
                continue
            if kept_by == "type-variable":
                not_admitted.add(var)
            if len(facts.known) == 1 and (kept := _TYPE_NAME.get(next(iter(facts.known)))):
                others.append((var, kept))
        return _Lowering(tuple(in_low), tuple(out_low), tuple(lowered_vars), tuple(sorted(not_admitted)), tuple(others))


class StorePass(Pass[Plan]):
    """Sweep 2: each float value's storage type; sources and initializers take their
    consumers' precision (rule source-follows-consumers).

    Requires decided nodes. Ensures storage types only on float values that were f32, and
    graph inputs (other than IR 3's weights) at their declared type under keep_io_types.
    Modifies the model only to clamp an f32 Constant that its low readers cast down (counted
    in `modified`)."""

    name, needs_stage, gives_stage = "store", Stage.DECIDED, Stage.STORED

    def __init__(self, conversion: _Conversion) -> None:
        self.cx = conversion

    def call(self, plan: Plan) -> PassResult:
        assert plan.main is not None
        self.store_scope(plan.main)
        return PassResult(modified=self.cx.saturated > 0)

    def ensures(self, plan: Plan) -> None:
        for scope in plan.scopes():
            for name, elem in scope.storage.items():
                was = scope.orig.get(name)
                if elem not in FLOAT_TYPES or was not in (_F32, elem):
                    self.fail(f"{name!r} stored as {elem}, was {was}: only f32 values change type")
        main = plan.main
        assert main is not None
        if self.cx.options.keep_io_types:
            weights = {t.name for t in main.graph.initializer}  # IR < 4 declares them as inputs too
            for vi in main.graph.input:
                if vi.name not in weights and main.storage.get(vi.name) not in (None, main.orig.get(vi.name)):
                    self.fail(f"graph input {vi.name!r} retyped under keep_io_types")

    def _single_low(self, scope: _Scope, name: str) -> int | None:
        wants = scope.wants.get(name, set())
        if len(wants) == 1:
            (elem,) = wants
            if elem in LOW_TYPES:
                return elem
        return None

    def store_scope(self, scope: _Scope) -> None:
        is_main = scope.parent is None
        if is_main and not self.cx.options.keep_io_types:
            for vi in scope.graph.input:
                if scope.orig.get(vi.name) == _F32 and (low := self._single_low(scope, vi.name)):
                    scope.storage[vi.name] = low
        for init in scope.graph.initializer:
            if init.data_type == _F32 and (low := self._single_low(scope, init.name)):
                scope.storage[init.name] = low
        for d in scope.decisions:
            if d.source and d.outputs and d.outputs[0]:
                name = d.outputs[0]
                low = self._single_low(scope, name)
                sig = signature(d.domain, d.op, self.cx.opset(d.domain), len(d.inputs), len(d.outputs))
                admits = sig is None or all(_TYPE_STR.get(low or 0, "") in g.allowed for g in sig.groups if g.outputs)
                if scope.orig.get(name) == _F32 and low and admits:
                    scope.storage[name] = low
                    d.precision = precision_of_elem_type(low)
                    d.output_types[0] = low
                elif scope.orig.get(name) == _F32 and low:
                    self._saturate_source(d, low)
        for children in scope.children.values():
            for child in children:
                self.store_scope(child)

    def _saturate_source(self, d: NodeDecision, low: int) -> None:
        """A Constant-like value that must stay f32 (its op cannot hold `low` at this opset)
        while every consumer reads it through one Cast to `low`: finite values past the low
        range would become Inf at that Cast, so they are clamped here, in f32, as narrowing
        would have clamped them (rule source-follows-consumers). A -3.4e38 mask stays a mask."""
        import numpy as np

        precision = precision_of_elem_type(low)
        attr = next((a for a in d.node.attribute if a.name == SOURCE_VALUE_ATTRIBUTES.get(d.op)), None)
        if precision is None or attr is None or attr.type != onnx.AttributeProto.TENSOR or attr.t.data_type != _F32:
            return
        values = self.cx.source.read(attr.t)
        limit = np.float32(precision.info.max_finite)
        past = np.isfinite(values) & (np.abs(values) > limit)
        if not past.any():
            return
        stats = ClampStats(int(past.sum()), float(values[past][np.argmax(np.abs(values[past]))]), 0)
        self.cx.record_clamp(d.outputs[0], stats)
        self.cx.sink.store(attr.t, np.where(past, np.copysign(limit, values), values).astype(np.float32), _F32)
        self.cx.saturated += 1


class EmitPass(Pass[Plan]):
    """Sweep 3: the model rewritten: Casts inserted, values, attributes and weights retyped.

    Requires stored types. Ensures a model onnx's full checker accepts (when its weights are
    inline), non-float values and weights at their old types, and idempotence: converting the
    result again under the same policy and options changes nothing (except with node-path
    keeps, whose paths are the input's). `modified` is the report's `changed`, or weights moved
    into the sink's file."""

    name, needs_stage, gives_stage = "emit", Stage.STORED, Stage.EMITTED

    def __init__(self, conversion: _Conversion) -> None:
        self.cx = conversion
        self.fixed: dict[str, int] = {}
        self._output_types: dict[str, int] = {}  # main-graph outputs cast to another type at the end
        # Small float tensors are narrowed together at the end (one numpy pass per precision).
        self.batching = conversion.sink.stores_inline(2 * SMALL_TENSOR_ELEMENTS)  # narrowed tensors are 16-bit
        self._batches: dict[Precision, NarrowBatch] = {}

    def requires(self, plan: Plan) -> None:
        self.fixed = _fixed_types(plan.model)

    def call(self, plan: Plan) -> PassResult:
        assert plan.main is not None
        return PassResult(modified=self.emit_model(plan.main))

    def ensures(self, plan: Plan) -> None:
        model = plan.model
        after = _fixed_types(model)
        moved = {name: (elem, after[name]) for name, elem in self.fixed.items() if after.get(name, elem) != elem}
        if moved:
            self.fail(f"non-f32 values retyped: {moved}")
        if not any(is_external(t) for t in all_tensors(model)):
            try:
                onnx.checker.check_model(model, full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                self.fail(f"the result fails onnx's checker: {first_line(e)}")
        options = self.cx.options
        if not options.keep_f32_paths:
            again, report = ModelProto(), ConversionReport()
            again.CopyFrom(model)
            convert_model(
                again, self.cx.policy, replace(options, cost=False, check_contracts=False), report=report, weights=False
            )
            if report.changed:
                self.fail(
                    f"converting the result again changes it ({report.casts_inserted} Casts inserted, "
                    f"{report.casts_removed} removed)"
                )

    def emit_model(self, main: _Scope) -> bool:
        """Sweep 3 over the whole model, and the report; whether the model's protobuf changed."""
        self.emit_scope(main)
        if self.cx.casts_inserted:
            self._ensure_default_opset()
        self._fill_report(main)
        return self.cx.changed or self.cx.relocated

    def resolve(self, scope: _Scope, name: str, want: int | None, position: int) -> str:
        """The name under which `name` is available at type `want` in `scope`; a Cast it needs
        is appended to the scope's graph with sort key `position` (see emit_scope)."""
        owner = scope if name in scope.defined else scope.owner(name)
        if owner is None:
            return name
        actual = owner.rename.get(name, name) if owner.rename else name
        have = owner.storage.get(name)
        if have is None:
            have = owner.orig.get(name)
        if want is None or have == want or have not in FLOAT_TYPES or want not in FLOAT_TYPES:
            return actual
        key = (name, want)
        if key in scope.cast_cache:
            return scope.cast_cache[key]
        producer = owner.producer.get(name)
        if producer is not None and producer.op == "Cast" and producer.inputs:
            inner = producer.inputs[0]
            inner_type = owner.storage_type(inner)
            if inner_type == want and have == _F32:
                # Cast(low -> f32) read back at low: the chain adds nothing (rule one-cast-per-value).
                owner.folded.add(name)  # the Cast may be left without readers (rule idle-cast)
                result = self.resolve(scope, inner, want, position)
                scope.cast_cache[key] = result
                return result
        precision = precision_of_elem_type(want)
        assert precision is not None
        if producer is None and have == _F32 and self.cx.numeric.past_range(scoped_name(owner.path, name), precision):
            # An f32 weight past the low range, read low here (a mask sentinel: rule weight-range
            # keeps other readers f32): a Cast would make Inf of it, a narrowed copy clamps it.
            copy = self._narrowed_copy(owner, name, want)
            if copy is not None:
                scope.cast_cache[key] = copy
                return copy
        cast_out = self.cx.fresh(f"{name}__{precision.value}")
        self._add_cast(scope, actual, cast_out, self.cx.fresh(f"{cast_out}__cast"), want, position)
        scope.cast_cache[key] = cast_out
        self._value_info(scope, cast_out, want)
        return cast_out

    def _narrowed_copy(self, owner: _Scope, name: str, want: int) -> str | None:
        """A copy of initializer `name` in `owner`'s graph that the store step narrows to `want`
        (clamped and counted, as any narrowed weight); None where there is no such initializer
        or IR < 4 would need it declared as a graph input too."""
        if self.cx.model.ir_version < 4:
            return None
        init = next((t for t in owner.graph.initializer if t.name == name), None)
        if init is None:
            return None
        copy = owner.graph.initializer.add()
        copy.CopyFrom(init)
        precision = precision_of_elem_type(want)
        assert precision is not None
        copy.name = self.cx.fresh(f"{name}__{precision.value}")
        owner.defined.add(copy.name)
        owner.orig[copy.name], owner.storage[copy.name] = _F32, want
        self.cx.edits += 1
        return copy.name

    def _add_cast(self, scope: _Scope, src: str, dst: str, name: str, to: int, position: int) -> None:
        """Append Cast(src) -> dst to the scope's graph; emit_scope sorts it into place."""
        node = scope.graph.node.add()
        node.CopyFrom(_cast_template(to))  # a copy is cheaper than building the node field by field
        node.input[0], node.output[0], node.name = src, dst, name
        scope.positions.append(position)
        self.cx.casts_inserted += 1

    def _value_info(self, scope: _Scope, name: str, elem: int) -> None:
        """Declare the type of a new value (its shape is left to inference)."""
        vi = scope.graph.value_info.add()
        vi.name = name
        vi.type.tensor_type.elem_type = elem

    def emit_scope(self, scope: _Scope) -> None:
        """Rewire every node's inputs to the types it reads them at, inserting Casts.

        Casts are appended to the graph as they are made, each with a sort key (`_slot`): a
        Cast node i reads sorts just before it, a Cast back to a graph output it computes just
        after. One stable sort of the node list by these keys then puts them in place (upb
        sorts the pointers; rebuilding the list would copy every node).
        """
        is_main = scope.parent is None
        count = len(scope.decisions)
        scope.positions = [_slot(i, _NODE) for i in range(count)]
        back = self._rename_low_outputs(scope)
        if is_main:
            self._output_types = {name: want for name, (_, want) in back.items()}
        orig_type = scope.orig.get if is_main else scope.orig_type
        idle: list[NodeProto] = []  # Casts to their input's own type, removed after the sort
        for i, d in enumerate(scope.decisions):
            if scope.children:
                for child in scope.children.get(i, ()):
                    self.emit_scope(child)
            self._rewire_inputs(scope, i, d, orig_type)
            if scope.rename:
                self._rename_outputs(scope, i, d, back)
            if d.precision is not None and (d.source or d.op in _ATTRIBUTE_RETYPED_OPS):
                self._retype_attributes(d, scope)
            if d.op == "Cast" and not d.domain and len(d.inputs) == 1 and d.inputs[0]:
                self._drop_idle_cast(scope, d, idle)
        if not is_main:
            self._resolve_body_outputs(scope, count)
        self._sort_nodes(scope, count)
        if scope.folded:
            idle += self._unread_casts(scope)
        if idle:
            self._remove_nodes(scope, idle)
        self._retype_declarations(scope)
        self._convert_initializers(scope)
        self._run_batches()

    def _rename_low_outputs(self, scope: _Scope) -> dict[str, tuple[str, int]]:
        """Graph outputs computed low are renamed at their producer; the Cast back takes the
        original name (rule names-kept) and goes right after the producer: a consumer of the
        output may follow it. In a body too, whose outputs keep their types: an If branch's
        output often has the name of the If's own output (optimum's merged decoders), and a
        low value under that name would contradict the outer f32 one. Output name -> (its low
        name, the type it goes back to)."""
        back: dict[str, tuple[str, int]] = {}
        is_main = scope.parent is None
        body_types = self._body_output_types(scope) if is_main and not self.cx.options.keep_io_types else {}
        for out in scope.graph.output:
            if is_main:
                want = out.type.tensor_type.elem_type if self.cx.options.keep_io_types else body_types.get(out.name)
            else:
                want = scope.orig_type(out.name)
            have = scope.storage_type(out.name)
            if want and _is_float(have) and have != want and out.name in scope.producer:
                precision = precision_of_elem_type(have or 0)
                low_name = self.cx.fresh(f"{out.name}__{precision.value if precision else 'low'}")
                scope.rename[out.name] = low_name
                scope.cast_cache[(out.name, want)] = out.name
                back[out.name] = (low_name, want)
                self._value_info(scope, low_name, have or 0)
        return back

    def _rewire_inputs(self, scope: _Scope, i: int, d: NodeDecision, orig_type: Callable[[str], int | None]) -> None:
        """Point node i's inputs at the names holding them at the types it reads them at."""
        node, input_types = d.node, d.input_types
        position = _slot(i, _READ)
        for k, name in enumerate(d.inputs):
            if not name:
                continue
            want = input_types[k] if k in input_types else orig_type(name)
            resolved = self.resolve(scope, name, want, position)
            if resolved != name:
                node.input[k] = resolved
                self.cx.edits += 1

    def _body_output_types(self, main: _Scope) -> dict[str, int]:
        """Without keep_io_types, the low type a main-graph output made by If/Loop/Scan takes:
        the one its bodies compute it in (the node's interface stays f32, rule control-flow),
        where every body agrees on one low type."""
        outputs = {o.name for o in main.graph.output}
        found: dict[str, int] = {}
        for i, d in enumerate(main.decisions):
            bodies = main.children.get(i)
            if not bodies or d.code != "control-flow" or d.domain not in DEFAULT_DOMAINS:
                continue
            skip = 1 if d.op == "Loop" else 0  # a Loop body's first output is its condition
            for k, name in enumerate(d.outputs):
                if name not in outputs or main.storage_type(name) != _F32:
                    continue
                types = set()
                for body in bodies:
                    inner = body.graph.output[k + skip].name if k + skip < len(body.graph.output) else None
                    types.add(body.storage_type(inner) if inner else None)
                if len(types) == 1 and (low := types.pop()) in LOW_TYPES:
                    found[name] = low
        return found

    def _rename_outputs(self, scope: _Scope, i: int, d: NodeDecision, back: dict[str, tuple[str, int]]) -> None:
        """Node i's renamed outputs, and the Cast back to a graph output it computes low."""
        rename = scope.rename
        for k, name in enumerate(d.outputs):
            if name in rename:
                d.node.output[k] = rename[name]
                self.cx.edits += 1
                if name in back:
                    low_name, want = back[name]
                    self._add_cast(scope, low_name, name, self.cx.fresh(f"{name}__cast"), want, _slot(i, _BACK))

    def _resolve_body_outputs(self, scope: _Scope, count: int) -> None:
        """Body outputs keep their types; they may be renamed."""
        for out in scope.graph.output:
            want = scope.orig_type(out.name)
            resolved = self.resolve(scope, out.name, want, _slot(count, _READ))  # after every node
            if resolved != out.name:
                out.name = resolved
                self.cx.edits += 1
                if not out.type.HasField("tensor_type") and want is not None:
                    out.type.tensor_type.elem_type = want

    def _sort_nodes(self, scope: _Scope, count: int) -> None:
        """Put the appended Casts in place by their sort keys (see emit_scope)."""
        if len(scope.positions) > count:
            keys = iter(scope.positions)
            scope.graph.node.sort(key=lambda _: next(keys))  # list.sort computes each key once, in list order
            if next(keys, None) is not None:
                raise AssertionError("emit_scope: node sort keys out of step with the node list")

    def _drop_idle_cast(self, scope: _Scope, d: NodeDecision, idle: list[NodeProto]) -> None:
        """Rule idle-cast: an existing Cast whose input now has the type it casts to (an
        auto-mixed output converted again under always-f16) does nothing. Its readers read its
        input instead and it is removed; one that gives a graph output becomes an Identity,
        so the output keeps its name."""
        to = attribute_output_type(d.node, "Cast")
        source = d.inputs[0]
        if to is None or not _is_float(to) or scope.storage_type(source) != to:
            return
        out = d.outputs[0] if d.outputs else ""
        if not out:
            return
        if any(o.name == out for o in scope.graph.output):
            d.node.op_type = "Identity"
            del d.node.attribute[:]
        else:
            scope.rename[out] = d.node.input[0]  # already rewired to the name its input has here
            idle.append(d.node)
        self.cx.casts_removed += 1

    def _unread_casts(self, scope: _Scope) -> list[NodeProto]:
        """Rule idle-cast: the Casts whose every reader now reads past them (a folded chain)."""
        graph = scope.graph
        read = {o.name for o in graph.output}
        for node in graph.node:
            read.update(node.input)
            for _, body in subgraphs(node):
                read |= names_read(body)
        unread = []
        for name in scope.folded - read:
            d = scope.producer.get(name)
            if d is not None and d.op == "Cast":
                unread.append(d.node)
                self.cx.casts_removed += 1
        return unread

    def _remove_nodes(self, scope: _Scope, nodes: list[NodeProto]) -> None:
        """Delete `nodes` from the scope's graph, and the declarations of the values they made."""
        graph = scope.graph
        gone = {id(n) for n in nodes}
        outputs = {o for n in nodes for o in n.output}
        for i in reversed([i for i, n in enumerate(graph.node) if id(n) in gone]):
            del graph.node[i]
        for i in reversed([i for i, vi in enumerate(graph.value_info) if vi.name in outputs]):
            del graph.value_info[i]

    def _retype_attributes(self, d: NodeDecision, scope: _Scope) -> None:
        node = d.node
        elem = d.precision.elem_type if d.precision else _F32
        if d.source:
            attr_name = SOURCE_VALUE_ATTRIBUTES[node.op_type]
            self._retype_source(node, attr_name, d.precision, scope)
            return
        for attr in node.attribute:
            if attr.name in TYPED_TENSOR_ATTRIBUTES.get(node.op_type, ()) and attr.t.data_type == _F32 and d.precision:
                self._narrow_tensor(attr.t, d.precision, f"{d.label}.{attr.name}")
                self.cx.edits += 1
        type_attr = TYPE_ATTRIBUTES.get(node.op_type)
        if type_attr and 0 in d.output_types:
            attrs = {a.name: a for a in node.attribute}
            if type_attr not in attrs:
                node.attribute.append(helper.make_attribute(type_attr, elem))
                self.cx.edits += 1
            elif attrs[type_attr].i != elem:
                attrs[type_attr].i = elem
                self.cx.edits += 1

    def _retype_source(self, node: NodeProto, attr_name: str, precision: Precision | None, scope: _Scope) -> None:
        assert precision is not None
        self.cx.edits += 1  # an f32 value (the store pass lowers no other) becomes low
        attrs = {a.name: a for a in node.attribute}
        if attr_name in attrs and attrs[attr_name].type == onnx.AttributeProto.TENSOR:
            self._narrow_tensor(attrs[attr_name].t, precision, node.output[0])
            return
        # value_float(s) or a ConstantOfShape without value (0.0): becomes a typed tensor.
        if "value_float" in attrs:
            values, dims = [attrs["value_float"].f], []
        elif "value_floats" in attrs:
            values, dims = list(attrs["value_floats"].floats), [len(attrs["value_floats"].floats)]
        else:
            values, dims = [0.0], [1]
        for a in ("value_float", "value_floats", attr_name):
            if a in attrs:
                node.attribute.remove(attrs[a])
        attr = node.attribute.add()  # built in place: make_attribute's checks cost more than the value
        attr.name, attr.type = attr_name, onnx.AttributeProto.TENSOR
        attr.t.name = node.output[0]
        attr.t.dims.extend(dims)
        if self.batching and 0 < len(values) <= SMALL_TENSOR_ELEMENTS:
            self._batch(precision).add_values(attr.t, values, node.output[0])
            return
        import numpy as np

        low, stats = narrow(np.array(values, dtype=np.float32).reshape(dims), precision)
        self.cx.record_clamp(node.output[0], stats)
        self.cx.sink.store(attr.t, low, precision.elem_type)

    def _batch(self, precision: Precision) -> NarrowBatch:
        batch = self._batches.get(precision)
        if batch is None:
            batch = self._batches[precision] = NarrowBatch(precision)
        return batch

    def _narrow_tensor(self, tensor: TensorProto, precision: Precision, label: str) -> None:
        """Narrow a tensor attribute in place: small ones join a batch (see `NarrowBatch`)."""
        if self.batching and self._batch(precision).add(tensor, label):
            return
        low, stats = narrow(self.cx.source.read(tensor), precision)
        self.cx.record_clamp(label, stats)
        self.cx.sink.store(tensor, low, precision.elem_type)

    def _run_batches(self) -> None:
        for batch in self._batches.values():
            for label, stats in batch.run():
                self.cx.record_clamp(label, stats)

    def _retype_declarations(self, scope: _Scope) -> None:
        graph = scope.graph
        storage = scope.storage
        for vi in graph.value_info:
            elem = storage.get(vi.name)
            if elem and vi.type.HasField("tensor_type"):
                self._retype(vi, elem)
        if scope.parent is None and not self.cx.options.keep_io_types:
            for vi in (*graph.input, *graph.output):
                elem = self._output_types.get(vi.name) or scope.storage_type(vi.name)
                if elem and vi.type.HasField("tensor_type") and _is_float(elem):
                    self._retype(vi, elem)
        # IR < 4: initializers are also graph inputs; their declaration follows the weight.
        inits = {t.name for t in graph.initializer}
        for vi in graph.input:
            if vi.name in inits and vi.name in storage:
                self._retype(vi, storage[vi.name])

    def _retype(self, vi: onnx.ValueInfoProto, elem: int) -> None:
        tensor_type = vi.type.tensor_type
        if tensor_type.elem_type != elem:
            tensor_type.elem_type = elem
            self.cx.edits += 1

    def _convert_initializers(self, scope: _Scope) -> None:
        for init in scope.graph.initializer:
            before = tensor_nbytes(init)
            self.cx.report.initializer_bytes_before += before
            target = scope.storage.get(init.name)
            # The precision it is narrowed to (storage types are float types), or None.
            precision = precision_of_elem_type(target) if target is not None and target != init.data_type else None
            if precision is not None:
                self.cx.edits += 1
            if not self.cx.weights:
                if precision is not None:
                    init.data_type = precision.elem_type  # for the cost model only: a dry run's data stays as it was
                    self.cx.report.initializer_bytes_after += before // 4 * precision.info.np_dtype.itemsize
                else:
                    self.cx.report.initializer_bytes_after += before
                continue
            if precision is not None:
                if self.batching and self._batch(precision).add(init, init.name):
                    self.cx.report.initializer_bytes_after += before // 4 * precision.info.np_dtype.itemsize
                    if self.cx.progress is not None:
                        self.cx.progress(before)
                    continue
                stats, written = self.cx.sink.store_narrowed(init, self.cx.source, precision)
                self.cx.record_clamp(init.name, stats)
                self.cx.report.initializer_bytes_after += written
            else:
                moved = is_external(init)
                self.cx.sink.copy_through(init, self.cx.source)
                self.cx.relocated = self.cx.relocated or moved or is_external(init)
                self.cx.report.initializer_bytes_after += before
            if self.cx.progress is not None:
                self.cx.progress(before)

    def _ensure_default_opset(self) -> None:
        """Inserted Casts live in the default domain; a model that imports only another domain
        (ai.onnx.ml) gets the default-domain opset released with it."""
        if any(o.domain in DEFAULT_DOMAINS for o in self.cx.model.opset_import):
            return
        version = _default_opset_for(self.cx.model, self.cx.opsets.get("ai.onnx.ml"))
        self.cx.model.opset_import.append(helper.make_opsetid("", version))
        logger.info("added an import of the default domain at opset %d for the inserted Casts", version)

    def _fill_report(self, main: _Scope) -> None:
        report = self.cx.report
        unknown: list[str] = []
        tally: collections.Counter[tuple[OpKind | None, str, str, str | None]] = collections.Counter()
        decisions, kept, keepable, rules = report.decisions, report.kept_f32, report.keepable, report.rules

        def walk(scope: _Scope) -> None:  # node by node, each body right after the node that holds it
            children = scope.children
            for i, d in enumerate(scope.decisions):
                prec = d.precision.value if d.precision is not None else _reported_precision(d, scope)
                tally[(d.kind, d.domain, d.op, prec)] += 1  # counted per kind and op below, once per distinct row
                decisions[d.path] = prec or "none"
                if d.keepable and d.precision is not None:
                    keepable[d.path] = (d.label, d.op)
                if d.code is not None:
                    rules[d.path] = d.code
                if d.reason:
                    kept.append(KeptNode(d.label, d.op, d.reason, d.path, d.code))
                if children and i in children:
                    for child in children[i]:
                        walk(child)

        walk(main)
        for (kind, domain, op_type, prec), count in tally.items():
            op = (f"{domain}." if domain not in DEFAULT_DOMAINS else "") + op_type
            report.count_node(kind, op, prec, count)
            if kind is None:
                unknown.append(op)
        report.casts_inserted = self.cx.casts_inserted
        report.casts_removed = self.cx.casts_removed
        report.changed = self.cx.changed
        report.clamped = {k: v.to_json() for k, v in self.cx.clamped.items()}
        report.unknown_ops = sorted(set(unknown))


def _fixed_types(model: ModelProto) -> dict[str, int]:
    """The element types of every weight and graph input/output that is not f32, by name."""
    fixed = {t.name: t.data_type for t in all_tensors(model) if t.name and t.data_type != _F32}
    for vi in (*model.graph.input, *model.graph.output):
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if elem and elem != _F32:
            fixed[vi.name] = elem
    return fixed


#: Where an inserted Cast sorts relative to node i (emit_scope): the Casts it reads, the node,
#: the Cast back to a graph output it computes.
_READ, _NODE, _BACK = 0, 1, 2


def _slot(i: int, where: int) -> int:
    return 3 * i + where


@functools.cache
def _cast_template(to: int) -> NodeProto:
    """A Cast to `to` whose input, output and name are placeholders to overwrite."""
    node = NodeProto(op_type="Cast", name="_", input=["_"], output=["_"])
    attr = node.attribute.add()
    attr.name, attr.type, attr.i = "to", onnx.AttributeProto.INT, to
    return node


def _reported_precision(d: NodeDecision, scope: _Scope) -> str | None:
    if d.precision is not None:
        return d.precision.value
    saw_float = False
    for names in (d.outputs, d.inputs):
        for n in names:
            if n:
                elem = scope.storage_type(n)
                if elem in FLOAT_TYPES:
                    if names is d.outputs or not saw_float:
                        chosen = precision_of_elem_type(elem)
                        return chosen.value if chosen else None
                    saw_float = True
    return None


def _default_opset_for(model: ModelProto, ml: int | None) -> int:
    """The default-domain opset released with the model's IR version (and ai.onnx.ml opset)."""
    ir = model.ir_version
    rows = [row for row in helper.VERSION_TABLE if row[1] <= ir and (ml is None or row[3] == ml)]
    return max((row[2] for row in rows), default=1)


def _kernel_gap(node: NodeProto) -> str | None:
    gap = KERNEL_GAPS.get((canonical_domain(node.domain), node.op_type))
    if gap is None:
        return None
    attr_name, values, reason = gap
    if attr_name is None:
        return reason
    for a in node.attribute:
        if a.name == attr_name and a.s.decode() in values:
            return reason
    return None


def convert_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    *,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    report: ConversionReport | None = None,
    weights: bool = True,
    progress: Callable[[int], None] | None = None,
) -> ConversionReport:
    """Rewrite `model` in place under `policy` (resolved at the edge: `api.resolve_policy`);
    returns the conversion report.

    With `weights=False` initializers keep their data but take their new element type (a dry
    run for `inspect`: the model is for counting, not for saving).
    `progress`, if given, is called with the bytes of each initializer once it is written.
    """
    options = options or ConvertOptions()
    report = report or ConversionReport()
    plan, passes = _plan(
        model, policy, options, report, source or WeightSource(None), sink or WeightSink(), weights, progress
    )
    with _gc_paused():
        run_passes(plan, passes, options.check_contracts)
        if options.cost:
            report.cost = estimate_cost(model, options.shapes)
    return report


def conversion_passes(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    report: ConversionReport | None = None,
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    """A new plan for `model` and the three passes that rewrite it in place, weights inline
    (`convert_model` runs them in order): to run, inspect or test one at a time. The emit
    pass fills `report`."""
    return _plan(
        model, policy, options or ConvertOptions(), report or ConversionReport(), WeightSource(None), WeightSink(), True
    )


def _plan(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions,
    report: ConversionReport,
    source: WeightSource,
    sink: WeightSink,
    weights: bool,
    progress: Callable[[int], None] | None = None,
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    report.policy = policy
    report.target = options.target.value
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{report.model or 'model'}: the graph is empty")
    conversion = _Conversion(model, policy, options, source, sink, report, weights, progress)
    # The passes type values in node order: nodes out of order (onnxruntime loads such a model,
    # the checker does not) are put in order first, and the report counts it as a change.
    reordered = sort_topologically(model.graph)
    if reordered:
        logger.info("%d graphs had nodes out of topological order: sorted", reordered)
        conversion.edits += reordered
    return Plan(model), (DecidePass(conversion), StorePass(conversion), EmitPass(conversion))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the sweeps allocate a few objects per node and free
    them by reference counting, but each full collection walks every live one (a fifth of the
    time on a 200,000-node graph)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

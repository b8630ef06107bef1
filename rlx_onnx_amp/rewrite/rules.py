"""The rules that decide a node's precision, as data (docs/design.md, "Keep rules").

`KEEP_RULES` is every reason a node does not simply run at its kind's precision, in precedence
order; `VARIABLE_RULES` every reason one type variable of a lowered node keeps its type. A rule
reads a node's `NodeFacts` and a small `RuleContext`, never the pass that applies it, so each can
be built and tested alone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from onnx import NodeProto

from rlx_onnx_amp.kernels import Target, kernel_block
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import F32, TYPE_NAME, TYPE_STR, Precision
from rlx_onnx_amp.ranges import INTEGER_ACCUMULATORS, RUNTIME_SCALES, ValueRange, scoped_name
from rlx_onnx_amp.schema import OpSignature, TypeGroup
from rlx_onnx_amp.taxonomy import (
    ATTRIBUTE_TYPED_VARS,
    DEFAULT_DOMAINS,
    FIXED_TYPE_OPS,
    KERNEL_GAPS,
    SOURCE_VALUE_ATTRIBUTES,
    TYPE_ATTRIBUTES,
    OpKind,
    canonical_domain,
    kind_of,
)
from rlx_onnx_amp.types import NON_TENSOR

if TYPE_CHECKING:
    from rlx_onnx_amp.rewrite.plan import Scope

__all__ = [
    "KEEP_RULES",
    "REASON_CODES",
    "RULES_BY_CODE",
    "VARIABLE_RULES",
    "Effect",
    "GroupFacts",
    "Keep",
    "KeepRule",
    "Lowering",
    "NodeFacts",
    "RuleContext",
    "VariableRule",
    "kernel_gap",
    "lower_variables",
]


@dataclass(frozen=True, slots=True)
class Lowering:
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
class NodeFacts:
    """What the keep rules read about a node whose values are typed. Only the per-node rules
    read its path; the others' outcome is shared by every node of its template key."""

    node: NodeProto
    path: str
    scope: Scope | None  # None: the per-node rules, over a decision from the template cache
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
    lowering: Lowering | None = None  # once one of the rules asked for it (`RuleContext.lowering`)



class Effect(enum.Enum):
    """What a keep rule, once it fires, does to its node."""

    FOLLOWS_CONSUMERS = "follows consumers"  # a source: its type is its readers' (the store pass)
    KEEPS_SILENTLY = "keeps silently"  # keeps its types; the policy did not want it lower
    KEEPS = "keeps"  # keeps its types although the policy wanted it lower: reported in kept_f32


@dataclass(frozen=True, slots=True)
class Keep:
    """A rule's verdict that it applies to a node, with its reason; one whose check fails
    returns None. A verdict without a reason is an error, never a silent "no" (as an empty
    string was when rules returned `str | None`): onnxscript's `MatchResult` draws the same line."""

    reason: str

    def __post_init__(self) -> None:
        if not self.reason:
            raise ValueError("a keep says why: empty reason")

    @classmethod
    def of(cls, reason: str | None) -> Keep | None:
        """The verdict of a helper that answers a reason or None (`kernels.kernel_block`)."""
        return None if reason is None else cls(reason)


@dataclass(frozen=True)
class KeepRule:
    """One reason a node does not run at its kind's precision: `check` returns its `Keep`, or
    None. A per-node rule's `active` says whether it can fire on a conversion at all (checked
    once per model; where it cannot, it costs nothing per node)."""

    code: str  # stable for reports, repair and tests, whatever the reason's wording
    check: Callable[[RuleContext, NodeFacts], Keep | None]
    effect: Effect = Effect.KEEPS
    per_node: bool = False  # reads the node's name, path or values: applied over the template cache
    active: Callable[[RuleContext], bool] | None = field(default=None, kw_only=True)
    summary: str = field(kw_only=True)  # what the code means, for reports and docs/design.md


class NumericView(Protocol):
    """What the keep rules read of `ranges.NumericFacts`: the model's weights and run-time quantization."""

    @property
    def quantized_at_run_time(self) -> frozenset[str]: ...

    @property
    def has_accumulators(self) -> bool: ...  # MatMulInteger/ConvInteger outputs (rule dequantize-arithmetic)

    def dequantized(self) -> Mapping[str, frozenset[tuple[str, str]]]: ...  # rule dequantize-follows-consumer

    def shape_values(self) -> frozenset[str]: ...  # rule shape-arithmetic

    def any_past_range(self, precision: Precision) -> bool: ...

    def past_range(self, key: str, precision: Precision) -> float | None: ...

    def is_sentinel(self, key: str, precision: Precision) -> bool: ...

    def tainted(self, key: str, precision: Precision) -> bool: ...

    def singular_inputs(self, node: NodeProto, scope: str) -> Collection[int]: ...

    def singular_reads(self) -> frozenset[str]: ...


class RuleContext(Protocol):
    """What the keep rules may ask beyond its node's facts: the conversion's settings and what is
    known of the model's values. `DecideContext` is the converter's; a test can pass its own."""

    # Read-only members: a context may hold any type that answers them (a test's fake numbers).
    @property
    def provider(self) -> Target: ...  # the execution provider the model is converted for

    @property
    def numeric(self) -> NumericView: ...

    @property
    def value_ranges(self) -> Mapping[str, ValueRange]: ...  # ConvertOptions.value_ranges

    @property
    def policy(self) -> Policy: ...

    @property
    def has_user_keeps(self) -> bool: ...  # --keep-f32-op, --keep-f32-node or node paths given

    def opset(self, domain: str) -> int: ...

    def user_keep(self, node: NodeProto, path: str) -> str | None: ...

    def cast_block(self, target: Precision) -> str | None: ...

    def lowering(self, f: NodeFacts) -> Lowering: ...


def _source(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """Constant and ConstantOfShape take the precision their readers want."""
    return Keep("source") if f.op in SOURCE_VALUE_ATTRIBUTES and f.domain in DEFAULT_DOMAINS else None


def _fixed_type(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """Cast, CastLike and BitCast keep the type they make; readers at another get a Cast after."""
    return Keep("keeps its `to`") if f.op in FIXED_TYPE_OPS else None


def _non_tensor(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """Sequence and optional values keep their types."""
    holds = NON_TENSOR in f.in_types or NON_TENSOR in f.out_types
    return Keep("sequence/optional values keep their types") if holds else None


def _control_flow(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """If/Loop/Scan keep their interface types; their bodies are rewritten."""
    return Keep("control-flow: interface keeps its types, bodies are rewritten") if f.has_subgraph else None


def _unknown_op(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """An op the taxonomy lacks keeps its types."""
    if f.kind is not None:
        return None
    return Keep(f"unknown op {f.node.domain + '.' if f.node.domain else ''}{f.node.op_type}")


def _policy_f32(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """The policy runs the node's kind at f32; the rules below see only nodes it lowers."""
    return Keep(f"policy: {f.kind} runs at f32") if f.target is Precision.F32 else None


def _user_keep_rule(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """--keep-f32-op, --keep-f32-node and node paths (repair's keeps)."""
    return Keep.of(ctx.user_keep(f.node, f.path))


def _cast_unavailable(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """The Casts around the node cannot be written at the model's default-domain opset."""
    assert f.target is not None
    return Keep.of(ctx.cast_block(f.target))


def _kernel_gap_rule(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """onnxruntime has a known gap its registry cannot show (`KERNEL_GAPS`)."""
    gap = kernel_gap(f.node) if (canonical_domain(f.domain), f.op) in KERNEL_GAPS else None
    return Keep(f"kernel: {gap}") if gap else None


def _qdq_region(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """A node between DequantizeLinear and QuantizeLinear runs quantized."""
    assert f.scope is not None
    if f.scope.in_qdq_region(f.ins, f.outs):
        return Keep("qdq: reads DequantizeLinear or feeds QuantizeLinear (onnxruntime runs it quantized)")
    return None


def _no_schema(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """No schema for the op at the model's opset: nothing says what it admits."""
    return Keep(f"no schema for {f.op} at opset {ctx.opset(f.domain)}") if f.sig is None else None


def _schema_admits(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """Rule type-variable keeps every float variable, so nothing is lowered."""
    assert f.sig is not None and f.target is not None
    lowering = ctx.lowering(f)
    if lowering.lowers or not lowering.not_admitted:
        return None
    variables = ", ".join(lowering.not_admitted)
    return Keep(f"schema: {f.op}-{f.sig.since_version} does not admit {f.target.value} for {variables}")


def _kernel_table(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """The target has no kernel for the lowered combination of types (`kernels.kernel_block`)."""
    assert f.sig is not None and f.target is not None
    lowering = ctx.lowering(f)
    if not lowering.lowers:
        return None
    return Keep.of(kernel_block(
        ctx.provider,
        f.target,
        canonical_domain(f.domain),
        f.op,
        f.sig.since_version,
        lowering.variables,
        lowering.others,
        f.op in TYPE_ATTRIBUTES and f.domain in DEFAULT_DOMAINS,
    ))


def _nothing_to_lower(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """No type variable holds f32 values to lower (integers, bool, or values already low)."""
    return None if ctx.lowering(f).lowers else Keep("nothing to lower")


def _dequantize_arithmetic(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """It dequantizes an integer accumulator or a run-time scale, or makes what DynamicQuantizeLinear quantizes."""
    # MatMulInteger's and ConvInteger's int32 sums of 8-bit products reach 1e5 and more: the f32
    # arithmetic around a dynamically quantized op belongs to the quantized region, as QDQ's
    # does (rule qdq-region); a value rounded to f16 before DynamicQuantizeLinear lands in
    # other quantization bins.
    assert f.scope is not None
    quantized = ctx.numeric.quantized_at_run_time
    for name in f.outs:
        if scoped_name(f.scope.path, name) in quantized:
            return Keep(
                f"dequantize: makes {name!r}, which DynamicQuantizeLinear quantizes (rounding it moves the bins)"
            )
    for name in f.ins:
        owner = f.scope.owner(name) if name else None
        producer = owner.producer.get(name) if owner is not None else None
        if producer is None or producer.domain not in DEFAULT_DOMAINS:
            continue
        if producer.op in RUNTIME_SCALES and producer.outputs.index(name) == RUNTIME_SCALES[producer.op]:
            return Keep(f"dequantize: reads {producer.op}'s run-time scale {name!r}")
        if producer.op == "Cast" and producer.inputs and producer.inputs[0]:
            inner = owner.producer.get(producer.inputs[0]) if owner is not None else None
            if inner is not None and (canonical_domain(inner.domain), inner.op) in INTEGER_ACCUMULATORS:
                accumulator = producer.inputs[0]
                return Keep(f"dequantize: reads the f32 Cast of {inner.op}'s integer accumulator {accumulator!r}")
    return None


def _shape_arithmetic(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """Its float values only compute a shape, a size or an index."""
    assert f.scope is not None
    shapes = ctx.numeric.shape_values()
    outs = [name for name in f.outs if name]
    if not outs or any(scoped_name(f.scope.path, name) not in shapes for name in outs):
        return None
    return Keep("shape: its value only computes a shape, size or index (a Cast to an integer type reads it)")


def _dequantize_follows_consumer(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """It dequantizes a weight for Compute nodes the policy runs at f32."""
    assert f.scope is not None
    dequantized = ctx.numeric.dequantized()
    consumers: set[tuple[str, str]] = set()
    for name in f.outs:
        feeds = dequantized.get(scoped_name(f.scope.path, name)) if name else None
        if feeds is None:
            return None
        consumers |= feeds
    kinds = {kind_of(*c) for c in consumers}
    if not kinds or any(k is None or ctx.policy.precision_for(k) is not Precision.F32 for k in kinds):
        return None
    ops = ", ".join(sorted({op for _, op in consumers}))
    return Keep(f"dequantize: follows its consumer ({ops}), which the policy runs at f32")


def _weight_range(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """It reads a weight past its precision's range that is no mask sentinel (`ranges.NumericFacts.is_sentinel`)."""
    # Clamping a 1e7 running variance to 65504 would rescale what the node computes; clamping an
    # additive -1e9 attention mask changes nothing a Softmax gives.
    assert f.target is not None and f.scope is not None
    numeric = ctx.numeric
    for name in f.ins:
        key = value_key(f.scope, name) if name else ""
        worst = numeric.past_range(key, f.target) if name else None
        if worst is not None and not numeric.is_sentinel(key, f.target):
            return Keep(f"weight: {name!r} holds {worst:.4g}, past {f.target.value}'s {f.target.info.max_finite:g}")
    return None


def low_precisions(policy: Policy) -> set[Precision]:
    """The precisions below f32 that `policy` runs some kind at."""
    return {policy.precision_for(kind) for kind in OpKind} - {Precision.F32}


def value_key(scope: Scope, name: str) -> str:
    """`ranges.scoped_name` of a value a node of `scope` reads: keyed by the scope defining it."""
    owner = scope.owner(name)
    return scoped_name(owner.path if owner is not None else "", name)


def _range_screen(ctx: RuleContext, f: NodeFacts) -> Keep | None:
    """On the reference run it makes or reads values past its precision's range, or flushing where zero is singular."""
    # `ConvertOptions.value_ranges`, from one f32 run (`verification.reference`); values computed
    # from a clamped mask sentinel are not screened: the candidate holds them clamped.
    assert f.target is not None and f.scope is not None
    ranges, numeric, target = ctx.value_ranges, ctx.numeric, f.target
    singular = numeric.singular_inputs(f.node, f.scope.path)
    for k, name in enumerate(f.ins):
        key = value_key(f.scope, name) if name else ""
        seen = ranges.get(key) if name else None
        if seen is None or numeric.tainted(key, target):
            continue
        if seen.overflows(target):
            return Keep(f"screen: reads {name!r}, which reaches {seen.max_abs:.4g} (past {target.value}'s range)")
        if k in singular and seen.flushes(target):
            return Keep(
                f"screen: reads {name!r} where zero is singular, and its values flush to zero in {target.value}"
            )
    for name in f.outs:
        key = scoped_name(f.scope.path, name)
        seen = ranges.get(key) if name else None
        if seen is None or numeric.tainted(key, target):
            continue
        if seen.overflows(target):
            return Keep(f"screen: makes {name!r}, which reaches {seen.max_abs:.4g} (past {target.value}'s range)")
        if key in numeric.singular_reads() and seen.flushes(target):
            return Keep(
                f"screen: makes {name!r}, read where zero is singular; its values flush to zero in {target.value}"
            )
    return None


#: Every reason a node does not simply run at its kind's precision, in precedence order: the
#: first that fires decides, and a node none of them stops is lowered. This order is the only
#: place precedence is decided (docs/design.md, "Keep rules").
KEEP_RULES: tuple[KeepRule, ...] = (
    KeepRule("source-follows-consumers", _source, Effect.FOLLOWS_CONSUMERS,
             summary="Constant/ConstantOfShape: its values take the precision its readers want"),
    KeepRule("cast-keeps-to", _fixed_type, Effect.KEEPS_SILENTLY,
             summary="an existing Cast, CastLike or BitCast keeps the type it makes"),
    KeepRule("non-tensor", _non_tensor,
             summary="reads or makes sequence/optional values, which keep their types"),
    KeepRule("control-flow", _control_flow,
             summary="If/Loop/Scan: the interface keeps its types, the bodies are rewritten"),
    KeepRule("unknown-op", _unknown_op,
             summary="an op the taxonomy does not know"),
    KeepRule("policy-f32", _policy_f32, Effect.KEEPS_SILENTLY,
             summary="the policy runs its kind at f32"),
    KeepRule("user-keep", _user_keep_rule, per_node=True, active=lambda ctx: ctx.has_user_keeps,
             summary="kept on request: --keep-f32-op, --keep-f32-node, or a node path (repair's keeps)"),
    KeepRule("cast-unavailable", _cast_unavailable,
             summary="the Casts around it cannot be written at the model's default-domain opset"),
    KeepRule("kernel-gap", _kernel_gap_rule,
             summary="onnxruntime has no kernel for it in low precision with these attributes"),
    KeepRule("qdq-region", _qdq_region,
             summary="reads DequantizeLinear or feeds QuantizeLinear: onnxruntime runs it quantized"),
    KeepRule("no-schema", _no_schema,
             summary="no schema for the op at the model's opset"),
    KeepRule("schema-admits", _schema_admits,
             summary="a type variable of its schema does not admit the low type"),
    KeepRule("kernel-table", _kernel_table,
             summary="the target provider has no kernel for the op in the low type"),
    KeepRule("nothing-to-lower", _nothing_to_lower, Effect.KEEPS_SILENTLY,
             summary="none of its type variables holds f32 values (integers, bool, or values already low)"),
    # What the values say, for nodes the rules above lower: the node's inputs and producers.
    KeepRule("dequantize-arithmetic", _dequantize_arithmetic, per_node=True,
             active=lambda ctx: ctx.numeric.has_accumulators,
             summary="dequantizes an integer accumulator (MatMulInteger/ConvInteger) or a run-time scale"),
    KeepRule("shape-arithmetic", _shape_arithmetic, per_node=True, active=lambda ctx: bool(ctx.numeric.shape_values()),
             summary="computes only a shape, a size or an index (its value reaches a Cast to an integer type)"),
    KeepRule("dequantize-follows-consumer", _dequantize_follows_consumer, per_node=True,
             active=lambda ctx: bool(ctx.numeric.dequantized()),
             summary="dequantizes a weight for Compute nodes the policy runs at f32: lowered, it would only add Casts"),
    KeepRule("weight-range", _weight_range, per_node=True,
             active=lambda ctx: any(ctx.numeric.any_past_range(p) for p in low_precisions(ctx.policy)),
             summary="reads a weight past the low type's range that is no mask sentinel (clamping would rescale it)"),
    KeepRule("range-screen", _range_screen, per_node=True, active=lambda ctx: bool(ctx.value_ranges),
             summary="on the reference inputs, it makes or reads values the low type cannot hold"),
)
RULES_BY_CODE = {r.code: r for r in KEEP_RULES}
#: Each rule's code and what it means, in precedence order. `kept_f32[].code` holds those that
#: keep a node the policy wanted lower; the others (a source, a Cast, the policy's own f32,
#: nothing to lower) are silent, and only `rewrite.why_not_keepable` names them.
REASON_CODES: dict[str, str] = {r.code: r.summary for r in KEEP_RULES}
RULE_ORDER = {rule.code: i for i, rule in enumerate(KEEP_RULES)}
#: The rules `decide.DecidePass._outcome` applies; the per-node ones are applied over the template cache.
NODE_INDEPENDENT_RULES = tuple(r for r in KEEP_RULES if not r.per_node)
PER_NODE_RULES = tuple(r for r in KEEP_RULES if r.per_node)
#: A node decided by one of the rules past this index, or lowered, is one a user keep can return to f32.
KEEPABLE_FROM = min(RULE_ORDER[r.code] for r in PER_NODE_RULES)


@dataclass(frozen=True, slots=True)
class GroupFacts:
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
    check: Callable[[GroupFacts], bool]


def _attribute_typed(g: GroupFacts) -> bool:
    """An attribute fixes the variable's type (LayerNormalization's U follows `stash_type`)."""
    return g.attribute_typed


def _other_type(g: GroupFacts) -> bool:
    """Its values are not float, not known, or already at another precision than the target."""
    return not g.known or not g.known <= {F32, g.target.elem_type}


def _not_admitted(g: GroupFacts) -> bool:
    """The schema does not admit the low type for it (Resize's `scales` is `tensor(float)`)."""
    return F32 in g.known and TYPE_STR[g.target.elem_type] not in g.group.allowed


#: Every reason a type variable keeps its type when its node is lowered, in order; a variable
#: that none of them keeps is lowered. When every float variable is kept by `type-variable`, the node
#: keeps its types with code schema-admits.
VARIABLE_RULES: tuple[VariableRule, ...] = (
    VariableRule("attribute-typed", _attribute_typed),
    VariableRule("other-type", _other_type),
    VariableRule("type-variable", _not_admitted),
)


def lower_variables(f: NodeFacts) -> Lowering:
    """Which type variables of `f`'s node `VARIABLE_RULES` let go to its target (its inputs
    and outputs to lower), and which they keep."""
    sig, target, any_inputs = f.sig, f.target, f.any_inputs
    assert sig is not None and target is not None
    in_types, out_types = f.in_types, f.out_types
    in_low: list[int] = []
    out_low: list[int] = []
    lowered_vars: list[str] = []
    not_admitted: set[str] = set()
    others: list[tuple[str, str]] = []  # float variables that keep their type, for the kernel lookup
    fixed_vars = ATTRIBUTE_TYPED_VARS.get(f.op, frozenset()) if f.domain in DEFAULT_DOMAINS else frozenset()
    for g in sig.groups:
        members = [in_types[k] for k in g.inputs if k not in any_inputs] + [out_types[k] for k in g.outputs]
        facts = GroupFacts(g, frozenset(t for t in members if t is not None), target, g.var in fixed_vars)
        var = g.var.split("#")[0]
        kept_by = next((rule.code for rule in VARIABLE_RULES if rule.check(facts)), None)
        if kept_by is None:
            in_low.extend(k for k in g.inputs if k not in any_inputs)
            out_low.extend(g.outputs)
            lowered_vars.append(var)
            continue
        if kept_by == "type-variable":
            not_admitted.add(var)
        if len(facts.known) == 1 and (kept := TYPE_NAME.get(next(iter(facts.known)))):
            others.append((var, kept))
    return Lowering(tuple(in_low), tuple(out_low), tuple(lowered_vars), tuple(sorted(not_admitted)), tuple(others))


def kernel_gap(node: NodeProto) -> str | None:
    """The reason onnxruntime has no low-precision kernel for `node` (`KERNEL_GAPS`), or None."""
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

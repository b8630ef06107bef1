"""Each keep rule and variable rule alone: built from `NodeFacts` and a fake `RuleContext`,
without the decide pass (Model-Optimizer tests its rule classes this way). The end-to-end
examples of each rule, through the converter and onnxruntime, are in tests/test_rules.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import pytest
from onnx import NodeProto, TensorProto, helper

from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.policy import Policy, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.ranges import ValueRange
from rlx_onnx_amp.rewrite.plan import NodeDecision, Scope
from rlx_onnx_amp.rewrite.rules import (
    KEEP_RULES,
    RULES_BY_CODE,
    VARIABLE_RULES,
    GroupFacts,
    Keep,
    Lowering,
    NodeFacts,
    RuleContext,
    lower_variables,
)
from rlx_onnx_amp.schema import TypeGroup, signature
from rlx_onnx_amp.taxonomy import OpKind, kind_of
from rlx_onnx_amp.types import NON_TENSOR

F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
F16 = Precision.F16


@dataclass
class FakeNumeric:
    """What `ranges.NumericFacts` answers, given as data."""

    quantized_at_run_time: frozenset[str] = frozenset()
    past: Mapping[str, float] = field(default_factory=dict)  # value key -> its worst magnitude
    sentinels: frozenset[str] = frozenset()
    tainted_keys: frozenset[str] = frozenset()
    singular: Mapping[str, frozenset[int]] = field(default_factory=dict)  # node name -> singular input indices
    singular_read_keys: frozenset[str] = frozenset()
    has_accumulators: bool = False
    dequantizing: Mapping[str, frozenset[tuple[str, str]]] = field(default_factory=dict)

    def dequantized(self) -> Mapping[str, frozenset[tuple[str, str]]]:
        return self.dequantizing

    shape_keys: frozenset[str] = frozenset()

    def shape_values(self) -> frozenset[str]:
        return self.shape_keys

    def any_past_range(self, precision: Precision) -> bool:
        return bool(self.past)

    def past_range(self, key: str, precision: Precision) -> float | None:
        return self.past.get(key)

    def is_sentinel(self, key: str, precision: Precision) -> bool:
        return key in self.sentinels

    def tainted(self, key: str, precision: Precision) -> bool:
        return key in self.tainted_keys

    def singular_inputs(self, node: NodeProto, scope: str) -> frozenset[int]:
        return self.singular.get(node.name, frozenset())

    def singular_reads(self) -> frozenset[str]:
        return self.singular_read_keys


@dataclass
class FakeContext:
    """A `RuleContext` whose answers a test sets."""

    provider: Target = Target.CUDA
    numeric: FakeNumeric = field(default_factory=FakeNumeric)
    value_ranges: Mapping[str, ValueRange] = field(default_factory=dict)
    opsets: Mapping[str, int] = field(default_factory=lambda: {"": 21})
    keeps: Mapping[str, str] = field(default_factory=dict)  # node name -> the user's reason
    cast_blocked: str | None = None
    policy: Policy = field(default_factory=lambda: policy_from_name("always-f16"))
    asked: list[str] = field(default_factory=list)  # what the rule asked, in order

    @property
    def has_user_keeps(self) -> bool:
        return bool(self.keeps)

    def opset(self, domain: str) -> int:
        self.asked.append(f"opset {domain}")
        return self.opsets.get(domain, 1)

    def user_keep(self, node: NodeProto, path: str) -> str | None:
        self.asked.append(f"user_keep {path}")
        return self.keeps.get(node.name)

    def cast_block(self, target: Precision) -> str | None:
        self.asked.append(f"cast_block {target.value}")
        return self.cast_blocked

    def lowering(self, f: NodeFacts) -> Lowering:
        self.asked.append("lowering")
        if f.lowering is None:
            f.lowering = lower_variables(f)
        return f.lowering


def _facts(
    op: str,
    ins: list[str],
    outs: list[str],
    in_types: Sequence[int | None],
    out_types: Sequence[int | None],
    *,
    domain: str = "",
    opset: int = 21,
    scope: Scope | None = None,
    target: Precision | None = F16,
    has_subgraph: bool = False,
    name: str = "n",
    **attrs: Any,
) -> NodeFacts:
    node = helper.make_node(op, ins, outs, name=name, domain=domain, **attrs)
    sig = signature(domain, op, opset, len(ins), len(outs))
    f = NodeFacts(node, "0", scope, op, domain, ins, outs, list(in_types), list(out_types), sig, has_subgraph)
    f.kind, f.target = kind_of(domain, op), target
    return f


def _check(code: str, f: NodeFacts, ctx: RuleContext | None = None) -> str | None:
    """The rule's reason when it applies (its `Keep`), else None."""
    verdict = RULES_BY_CODE[code].check(ctx or FakeContext(), f)
    return verdict.reason if verdict is not None else None


def _scope(*inputs: tuple[str, int]) -> Scope:
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs], [])
    return Scope(graph, "", None, dict(inputs))


def _produce(scope: Scope, op: str, ins: list[str], outs: list[str], domain: str = "") -> None:
    """Record a node of `scope` that makes `outs`, as the decide sweep would."""
    node = helper.make_node(op, ins, outs, domain=domain)
    d = NodeDecision(str(len(scope.decisions)), node, kind_of(domain, op), op, domain, ins, outs)
    scope.decisions.append(d)
    for name in outs:
        scope.defined.add(name)
        scope.producer[name] = d


ADD = ("Add", ["a", "b"], ["c"], [F, F], [F])


def test_every_rule_has_a_unit_test_here() -> None:
    """A rule added to the list without a test below fails here: a keep rule's test is named
    after its code, a variable rule is a case of test_variable_rules."""
    tested = {name.removeprefix("test_").replace("_", "-") for name in globals() if name.startswith("test_")}
    assert {r.code for r in KEEP_RULES} <= tested, {r.code for r in KEEP_RULES} - tested
    assert {r.code for r in VARIABLE_RULES} <= {code for code, _, _ in _VARIABLE_CASES}


def test_source_follows_consumers() -> None:
    assert _check("source-follows-consumers", _facts("Constant", [], ["k"], [], [F], value_float=1.0))
    assert _check("source-follows-consumers", _facts("ConstantOfShape", ["s"], ["k"], [I64], [F]))
    assert _check("source-follows-consumers", _facts(*ADD)) is None
    # A Constant of another domain is a custom op, no source.
    assert _check("source-follows-consumers", _facts("Constant", [], ["k"], [], [F], domain="custom")) is None


def test_cast_keeps_to() -> None:
    for op in ("Cast", "CastLike"):
        assert _check("cast-keeps-to", _facts(op, ["x"] * (1 + (op == "CastLike")), ["y"], [F, H][: 1 + (op == "CastLike")], [F]))
    assert _check("cast-keeps-to", _facts(*ADD)) is None


def test_non_tensor() -> None:
    seq = _facts("SequenceInsert", ["s", "x"], ["t"], [NON_TENSOR, F], [NON_TENSOR])
    assert _check("non-tensor", seq) == "sequence/optional values keep their types"
    assert _check("non-tensor", _facts(*ADD)) is None


def test_control_flow() -> None:
    assert _check("control-flow", _facts("If", ["c"], ["y"], [TensorProto.BOOL], [F], has_subgraph=True))
    assert _check("control-flow", _facts(*ADD)) is None


def test_unknown_op() -> None:
    f = _facts("Frobnicate", ["x"], ["y"], [F], [F], domain="acme", target=None)
    assert f.kind is None
    assert _check("unknown-op", f) == "unknown op acme.Frobnicate"
    assert _check("unknown-op", _facts(*ADD)) is None


def test_policy_f32() -> None:
    f = _facts("MatMul", ["a", "b"], ["c"], [F, F], [F], target=Precision.F32)
    assert _check("policy-f32", f) == f"policy: {OpKind.COMPUTE} runs at f32"
    assert _check("policy-f32", _facts(*ADD)) is None


def test_user_keep() -> None:
    ctx = FakeContext(keeps={"n": "user: --keep-f32-node ^n$"})
    assert _check("user-keep", _facts(*ADD), ctx) == "user: --keep-f32-node ^n$"
    assert ctx.asked == ["user_keep 0"]
    assert _check("user-keep", _facts(*ADD, name="other"), ctx) is None


def test_cast_unavailable() -> None:
    ctx = FakeContext(cast_blocked="schema: the default-domain opset 6 predates Cast-7")
    assert _check("cast-unavailable", _facts(*ADD), ctx) == ctx.cast_blocked
    assert ctx.asked == ["cast_block f16"]
    assert _check("cast-unavailable", _facts(*ADD)) is None


def test_kernel_gap() -> None:
    assert _check("kernel-gap", _facts("EyeLike", ["x"], ["y"], [F], [F])) == "kernel: onnxruntime has no f16/bf16 EyeLike kernel"
    assert _check("kernel-gap", _facts(*ADD)) is None


def test_qdq_region() -> None:
    scope = _scope(("q", TensorProto.UINT8), ("s", F), ("a", F))
    scope.has_qdq = True
    _produce(scope, "DequantizeLinear", ["q", "s"], ["dq"])
    reason = _check("qdq-region", _facts("Relu", ["dq"], ["r"], [F], [F], scope=scope))
    assert reason is not None and reason.startswith("qdq: ")
    scope.quantized_inputs = {"r2"}  # read by a QuantizeLinear
    assert _check("qdq-region", _facts("Relu", ["a"], ["r2"], [F], [F], scope=scope))
    assert _check("qdq-region", _facts("Relu", ["a"], ["r3"], [F], [F], scope=scope)) is None


def test_no_schema() -> None:
    f = _facts("Relu", ["x"], ["y"], [F], [F], opset=21)
    f.sig = None
    ctx = FakeContext(opsets={"": 3})
    assert _check("no-schema", f, ctx) == "no schema for Relu at opset 3"
    assert _check("no-schema", _facts(*ADD)) is None


def test_schema_admits() -> None:
    # Resize-10's scales are tensor(float) and its X admits f16: X lowers, so the node does.
    resize = _facts("Resize", ["x", "scales"], ["y"], [F, F], [F], opset=10)
    assert _check("schema-admits", resize) is None
    assert resize.lowering is not None and resize.lowering.not_admitted == ("tensor(float)",)
    # A node whose every float variable the schema keeps: a signature of one tensor(float) group.
    only_f32 = _facts("Relu", ["x"], ["y"], [F], [F])
    assert only_f32.sig is not None
    group = TypeGroup("T", frozenset({"tensor(float)"}), (0,), (0,))
    only_f32.sig = type(only_f32.sig)(only_f32.sig.since_version, (group,))
    assert _check("schema-admits", only_f32) == "schema: Relu-14 does not admit f16 for T"


def test_kernel_table() -> None:
    # OneHot-11 on CPU in bf16: values (T3) lower, float indices and depth stay (see test_rules.py).
    onehot = _facts("OneHot", ["i", "depth", "values"], ["y"], [F, F, F], [F], opset=28, target=Precision.BF16)
    reason = _check("kernel-table", onehot, FakeContext(provider=Target.CPU))
    assert reason is not None and "OneHot" in reason
    assert _check("kernel-table", _facts(*ADD)) is None


def test_nothing_to_lower() -> None:
    assert _check("nothing-to-lower", _facts("Add", ["a", "b"], ["c"], [I64, I64], [I64])) == "nothing to lower"
    assert _check("nothing-to-lower", _facts(*ADD)) is None


def test_dequantize_arithmetic() -> None:
    scope = _scope(("a", TensorProto.UINT8), ("b", TensorProto.UINT8), ("x", F))
    _produce(scope, "MatMulInteger", ["a", "b"], ["acc"])
    _produce(scope, "Cast", ["acc"], ["acc_f"])
    _produce(scope, "DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])
    reads_acc = _facts("Mul", ["acc_f", "x"], ["m"], [F, F], [F], scope=scope)
    assert _check("dequantize-arithmetic", reads_acc) == (
        "dequantize: reads the f32 Cast of MatMulInteger's integer accumulator 'acc'"
    )
    reads_scale = _facts("Mul", ["xs", "x"], ["m"], [F, F], [F], scope=scope)
    assert _check("dequantize-arithmetic", reads_scale) == "dequantize: reads DynamicQuantizeLinear's run-time scale 'xs'"
    feeds = _facts("Relu", ["x"], ["r"], [F], [F], scope=scope)
    ctx = FakeContext(numeric=FakeNumeric(quantized_at_run_time=frozenset({"r"})))
    reason = _check("dequantize-arithmetic", feeds, ctx)
    assert reason is not None and reason.startswith("dequantize: makes 'r'")
    assert _check("dequantize-arithmetic", _facts(*ADD, scope=scope)) is None


def test_shape_arithmetic() -> None:
    pow_node = _facts("Pow", ["n", "half"], ["side"], [F, F], [F], scope=_scope(("n", F), ("half", F)))
    assert _check("shape-arithmetic", pow_node, FakeContext(numeric=FakeNumeric(shape_keys=frozenset({"side"})))) == (
        "shape: its value only computes a shape, size or index (a Cast to an integer type reads it)"
    )
    assert _check("shape-arithmetic", pow_node) is None


def test_dequantize_follows_consumer() -> None:
    scope = _scope(("wq", TensorProto.INT8), ("scale", F))
    mul = _facts("Mul", ["w", "scale"], ["wd"], [F, F], [F], scope=scope)
    feeds_matmul = FakeNumeric(dequantizing={"wd": frozenset({("", "MatMul")})})
    auto_mixed = FakeContext(numeric=feeds_matmul, policy=policy_from_name("auto-mixed"))  # Compute at f32
    assert _check("dequantize-follows-consumer", mul, auto_mixed) == (
        "dequantize: follows its consumer (MatMul), which the policy runs at f32"
    )
    assert _check("dequantize-follows-consumer", mul, FakeContext(numeric=feeds_matmul)) is None  # always-f16
    assert _check("dequantize-follows-consumer", _facts(*ADD, scope=scope), auto_mixed) is None  # no dequantization


def test_weight_range() -> None:
    scope = _scope(("w", F), ("mask", F), ("x", F))
    past = FakeNumeric(past={"w": 1e7, "mask": 1e9}, sentinels=frozenset({"mask"}))
    ctx = FakeContext(numeric=past)
    assert _check("weight-range", _facts("Mul", ["x", "w"], ["y"], [F, F], [F], scope=scope), ctx) == (
        "weight: 'w' holds 1e+07, past f16's 65504"
    )
    # A mask sentinel is clamped, not kept.
    assert _check("weight-range", _facts("Add", ["x", "mask"], ["y"], [F, F], [F], scope=scope), ctx) is None
    assert _check("weight-range", _facts("Add", ["x", "x"], ["y"], [F, F], [F], scope=scope), ctx) is None


def test_range_screen() -> None:
    scope = _scope(("x", F), ("d", F))
    seen = {"x": ValueRange(1e6, 1.0), "d": ValueRange(1.0, 1e-9), "y": ValueRange(7e4, 1.0)}
    ctx = FakeContext(value_ranges=seen, numeric=FakeNumeric(singular={"div": frozenset({1})}))
    reads = _facts("Relu", ["x"], ["r"], [F], [F], scope=scope)
    assert _check("range-screen", reads, ctx) == "screen: reads 'x', which reaches 1e+06 (past f16's range)"
    divides = _facts("Div", ["r", "d"], ["q"], [F, F], [F], scope=scope, name="div")
    assert _check("range-screen", divides, ctx) == (
        "screen: reads 'd' where zero is singular, and its values flush to zero in f16"
    )
    makes = _facts("Exp", ["r"], ["y"], [F], [F], scope=scope)
    assert _check("range-screen", makes, ctx) == "screen: makes 'y', which reaches 7e+04 (past f16's range)"
    # Values computed from a clamped mask sentinel are not screened.
    tainted = FakeContext(value_ranges=seen, numeric=FakeNumeric(tainted_keys=frozenset({"x", "y"})))
    assert _check("range-screen", _facts("Exp", ["x"], ["y"], [F], [F], scope=scope), tainted) is None


def _group(known: set[int], allowed: Set[str] = frozenset({"tensor(float)", "tensor(float16)"}), attribute_typed: bool = False) -> GroupFacts:
    return GroupFacts(TypeGroup("T", frozenset(allowed), (0,), (0,)), frozenset(known), F16, attribute_typed)


#: Each variable rule's code, a type variable it keeps and one it lets go.
_VARIABLE_CASES = [
    ("attribute-typed", _group({F}, attribute_typed=True), _group({F})),
    ("other-type", _group({TensorProto.DOUBLE}), _group({F, H})),
    ("type-variable", _group({F}, allowed={"tensor(float)"}), _group({F})),
]


@pytest.mark.parametrize(("code", "keeps", "lowers"), _VARIABLE_CASES)
def test_variable_rules(code: str, keeps: GroupFacts, lowers: GroupFacts) -> None:
    rule = next(r for r in VARIABLE_RULES if r.code == code)
    assert rule.check(keeps) and not rule.check(lowers)


def test_lower_variables_reads_only_the_facts() -> None:
    """Resize-13 in f16: X, Y (T1) and roi (T2) lower, `scales` (tensor(float)) keeps its type
    (rule type-variable) and is named for the kernel lookup; a plain value from the facts alone."""
    f = _facts("Resize", ["x", "roi", "scales"], ["y"], [F, F, F], [F], opset=13)
    assert lower_variables(f) == Lowering(
        inputs=(0, 1), outputs=(0,), variables=("T1", "T2"), not_admitted=("tensor(float)",),
        others=(("tensor(float)", "float"),),
    )
    # roi already f16 beside an f32 X: T2 holds another type than f32 (rule other-type) and stays.
    mixed = _facts("Resize", ["x", "roi", "scales"], ["y"], [F, H, F], [F], opset=13)
    assert lower_variables(mixed).inputs == (0, 1) and lower_variables(mixed).variables == ("T1", "T2")
    bf16_roi = _facts("Resize", ["x", "roi", "scales"], ["y"], [F, TensorProto.BFLOAT16, F], [F], opset=13)
    assert lower_variables(bf16_roi).variables == ("T1",)


def test_a_verdict_without_a_reason_is_an_error_not_a_silent_no() -> None:
    with pytest.raises(ValueError, match="empty reason"):
        Keep("")
    assert Keep.of(None) is None and Keep.of("why") == Keep("why")


@pytest.mark.parametrize(
    "code, idle, busy",
    [
        ("user-keep", FakeContext(), FakeContext(keeps={"n": "asked"})),
        ("dequantize-arithmetic", FakeContext(), FakeContext(numeric=FakeNumeric(has_accumulators=True))),
        ("weight-range", FakeContext(numeric=FakeNumeric(past={"w": 1e9})),
         FakeContext(numeric=FakeNumeric(past={"w": 1e9}), policy=policy_from_name("always-f16"))),
        ("range-screen", FakeContext(), FakeContext(value_ranges={"x": ValueRange(1e9, 1.0)})),
    ],
)
def test_a_per_node_rule_says_itself_when_it_can_fire(code: str, idle: FakeContext, busy: FakeContext) -> None:
    """The rule table, not the pass, says which per-node rules a conversion runs."""
    rule = RULES_BY_CODE[code]
    assert rule.per_node and rule.active is not None
    if code == "weight-range":  # a weight past the range fires only where the policy lowers something
        idle = FakeContext(numeric=idle.numeric, policy=policy_from_name("always-f32"))
    assert not rule.active(idle) and rule.active(busy)

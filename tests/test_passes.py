"""The rewrite as three passes with contracts (rlx_onnx_amp/passes.py, docs/design.md "Passes"):
each runs alone, says honestly whether it modified the model, and its contract catches a
plan or a result that breaks its promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

from fixtures.make_fixtures import BROKEN_IN_F16, COST_CASES, HEALTHY, REPAIR_CASES
from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.passes import Pass, PassContractError, PassResult, fingerprint, run_passes
from rlx_onnx_amp.policy import policy_from_name
from rlx_onnx_amp.rewrite import ConvertOptions, EmitPass, Plan, Stage, conversion_passes, convert_model
from rlx_onnx_amp.rewrite.convert import check_idempotent
from rlx_onnx_amp.rewrite.templates import Template, TemplateKey, Templates
from tests.helpers import POLICIES, feeds_for, run

FIXTURES = {**HEALTHY, **BROKEN_IN_F16, **REPAIR_CASES, **COST_CASES}
LIGHT = sorted((Path(onnx.backend.test.__file__).parent / "data" / "light").glob("*.onnx"))
CHECKED = ConvertOptions(check_contracts=True)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_keeps_every_pass_contract_under_every_policy(name: str) -> None:
    """Contracts on: the checker accepts each result, converting it again changes nothing,
    the report's `changed` matches the model's bytes; and under always-f32, which changes
    nothing, the result computes exactly what the model does."""
    fixture = FIXTURES[name]()
    feeds = feeds_for(fixture, fixture.model)
    reference = run(fixture.model, feeds)
    for policy in POLICIES:
        model = onnx.ModelProto()
        model.CopyFrom(fixture.model)
        report = convert_model(model, policy_from_name(policy), CHECKED)
        assert report.changed == (fingerprint(model) != fingerprint(fixture.model)), policy
        if policy == "always-f32":
            for got, want in zip(run(model, feeds), reference):
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", LIGHT, ids=[p.stem for p in LIGHT])
def test_onnx_light_models_keep_every_pass_contract(path: Path) -> None:
    model = onnx.load(str(path))
    for policy in ("always-f16", "auto-mixed", "auto-mixed-bf16"):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        convert_model(copy, policy_from_name(policy), CHECKED)


def _passes(name: str = "transformer_block", policy: str = "always-f16") -> tuple[onnx.ModelProto, Plan, tuple]:
    model = HEALTHY[name]().model
    plan, passes = conversion_passes(model, policy_from_name(policy), ConvertOptions())
    return model, plan, passes


def test_each_pass_runs_alone_and_says_honestly_whether_it_modified_the_model() -> None:
    model, plan, (decide, store, emit) = _passes()
    before = fingerprint(model)
    assert decide(plan, check=True).modified is False and plan.stage == Stage.DECIDED
    assert fingerprint(model) == before
    scopes = list(plan.scopes())
    assert sum(len(s.decisions) for s in scopes) == sum(len(s.graph.node) for s in scopes) > 0
    assert any(d.precision is not None for d in scopes[0].decisions)  # always-f16 lowers the block
    assert store(plan, check=True).modified is False and plan.stage == Stage.STORED
    assert fingerprint(model) == before and scopes[0].storage  # types chosen, nothing written yet
    assert emit(plan, check=True).modified is True and plan.stage == Stage.EMITTED
    assert fingerprint(model) != before
    assert any(n.op_type == "Cast" for n in model.graph.node)

    # always-f32 decides, stores and emits without touching a byte, and says so.
    model, plan, passes = _passes(policy="always-f32")
    before = fingerprint(model)
    assert run_passes(plan, passes, check=True) is False and fingerprint(model) == before


def test_a_converted_model_converted_again_says_it_changed_nothing() -> None:
    for name in ("transformer_block", "conv_net", "control_flow"):
        once = convert(HEALTHY[name]().model, "always-f16")
        twice, report = convert_and_report(once, "always-f16", check_contracts=True)
        assert not report.changed and twice.SerializeToString() == once.SerializeToString(), name


def test_passes_refuse_to_run_out_of_order() -> None:
    """A pass run on a plan at another stage refuses, naming itself, and leaves the plan and the
    model as they were."""
    model, plan, (decide, store, emit) = _passes()
    before = model.SerializeToString()
    with pytest.raises(PassContractError, match=r"^pass store: "):
        store(plan)
    assert plan.stage == Stage.NEW and plan.main is None
    decide(plan)
    assert plan.stage == Stage.DECIDED
    with pytest.raises(PassContractError, match=r"^pass emit: "):
        emit(plan)
    with pytest.raises(PassContractError, match=r"^pass decide: "):
        decide(plan)
    assert plan.stage == Stage.DECIDED and model.SerializeToString() == before


class _Sneaky(Pass[Plan]):
    """Renames a node but says it modified nothing."""

    name, needs_stage, gives_stage = "sneaky", Stage.NEW, Stage.DECIDED

    def call(self, plan: Plan) -> PassResult:
        plan.model.graph.node[0].name = "renamed"
        return PassResult(modified=False)


def test_a_pass_that_hides_a_modification_breaks_its_contract() -> None:
    model = HEALTHY["conv_net"]().model
    with pytest.raises(PassContractError, match="pass sneaky: says modified=False, but the model changed"):
        _Sneaky()(Plan(model), check=True)
    _Sneaky()(Plan(HEALTHY["conv_net"]().model), check=False)  # contracts off: not checked


def test_the_decide_contract_catches_a_decision_that_lowers_an_integer() -> None:
    _, plan, (decide, _, _) = _passes("transformer_block")
    decide(plan)
    assert plan.main is not None
    reshape = next(d for d in plan.main.decisions if d.op == "Reshape")  # input 1 is int64 shape
    decide.ensures(plan)  # as decided: holds
    reshape.input_types[1] = TensorProto.FLOAT16
    with pytest.raises(PassContractError, match=r"pass decide: .*lowered to 10"):
        decide.ensures(plan)


def test_the_store_contract_catches_an_integer_given_a_low_storage_type() -> None:
    _, plan, (decide, store, _) = _passes("transformer_block")
    decide(plan)
    store(plan)
    assert plan.main is not None
    integer = next(t.name for t in plan.main.graph.initializer if t.data_type == TensorProto.INT64)
    store.ensures(plan)
    plan.main.storage[integer] = TensorProto.FLOAT16
    with pytest.raises(PassContractError, match=f"pass store: '{integer}' stored as 10, was 7"):
        store.ensures(plan)


def _emitted(name: str) -> tuple[onnx.ModelProto, Plan, EmitPass]:
    """A fixture through the three passes, contracts unchecked, the emit pass's `requires` run."""
    model, plan, (decide, store, emit) = _passes(name)
    decide(plan)
    store(plan)
    emit.requires(plan)
    emit(plan)
    return model, plan, emit


def test_the_pipeline_contract_catches_a_result_that_is_not_idempotent() -> None:
    model, _plan, emit = _emitted("conv_net")
    policy, options = emit.cx.policy, emit.cx.options
    check_idempotent(model, policy, options)  # as emitted: holds
    # A Cast of an f32 graph input to f32: valid, but the next conversion removes it.
    model.graph.node.append(helper.make_node("Cast", [model.graph.input[0].name], ["idle"], to=TensorProto.FLOAT))
    with pytest.raises(PassContractError, match="converting the result again changes it"):
        check_idempotent(model, policy, options)


def test_the_emit_contract_catches_a_retyped_integer_and_a_result_the_checker_refuses() -> None:
    model, plan, emit = _emitted("transformer_block")
    emit.ensures(plan)
    integer = next(t for t in model.graph.initializer if t.data_type == TensorProto.INT64)
    integer.data_type = TensorProto.INT32
    with pytest.raises(PassContractError, match=f"pass emit: non-f32 values retyped: .'{integer.name}': .7, 6"):
        emit.ensures(plan)
    integer.data_type = TensorProto.INT64
    model.graph.node[0].input.append("no_such_value")
    with pytest.raises(PassContractError, match="pass emit: the result fails onnx's checker"):
        emit.ensures(plan)


class _CountedTemplates(Templates):
    """The converter's template cache, counting the nodes it decides; with `remember=False` it
    never remembers, so every node is decided by the rule list alone."""

    def __init__(self, remember: bool) -> None:
        super().__init__()
        self.remember, self.hits = remember, 0
        found = self.get

        def get(key: TemplateKey) -> Template | None:
            template = found(key)
            self.hits += template is not None
            return template

        self.get = get

    def offer(self, *args: Any) -> None:
        if self.remember:
            super().offer(*args)


def _decisions(model: onnx.ModelProto, policy: str, templates: bool, **options: Any) -> list[tuple]:
    decisions, _ = _decided(model, policy, templates, **options)
    return decisions


def _decided(model: onnx.ModelProto, policy: str, templates: bool, **options: Any) -> tuple[list[tuple], int]:
    """The decide pass's decisions, and how many nodes the template cache decided."""
    plan, (decide, _, _) = conversion_passes(model, policy_from_name(policy), ConvertOptions(**options))
    decide.templates = counted = _CountedTemplates(remember=templates)
    decide(plan)
    decisions = [
        (d.path, d.precision, d.input_types, d.output_types, d.reason, d.code, d.source, d.keepable)
        for scope in plan.scopes()
        for d in scope.decisions
    ]
    return decisions, counted.hits


def _repeated(n: int = 6) -> onnx.ModelProto:
    """x -> (Constant, Add, Relu, Cast to f32) * n: all but the first four nodes repeat a template."""
    nodes, prev = [], "x"
    for k in range(n):
        nodes += [helper.make_node("Constant", [], [f"c{k}"], value=helper.make_tensor(f"cv{k}", TensorProto.FLOAT, [1], [0.5])),
                  helper.make_node("Add", [prev, f"c{k}"], [f"a{k}"], name=f"add{k}"),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}"], name=f"relu{k}"),
                  helper.make_node("Cast", [f"r{k}"], [f"h{k}"], to=TensorProto.FLOAT)]
        prev = f"h{k}"
    graph = helper.make_graph(nodes, "repeated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("name", [*sorted(FIXTURES), *(p.stem for p in LIGHT)])
def test_the_template_cache_decides_nothing_the_rules_would_not(name: str) -> None:
    """Every decision from the template cache equals the one the rule list gives the node
    alone: the cache memoises the rules' outcome, it does not decide."""
    model = FIXTURES[name]().model if name in FIXTURES else onnx.load(str(LIGHT[[p.stem for p in LIGHT].index(name)]))
    for policy in POLICIES:
        alone, hits = _decided(model, policy, False)
        assert hits == 0  # no template was remembered
        assert _decisions(model, policy, True) == alone, policy


def test_the_template_cache_keeps_per_node_rules_per_node() -> None:
    model = _repeated()
    options = {"keep_f32_nodes": ("^add3$",), "keep_f32_paths": {"6": "repair: kept"}}
    cached, hits = _decided(model, "always-f16", True, **options)
    assert hits == 20  # every node but the first four (the per-node rules still run on them)
    assert cached == _decisions(model, "always-f16", False, **options)
    codes = {path: code for path, _, _, _, _, code, _, _ in cached}
    assert codes["13"] == "user-keep" and codes["6"] == "user-keep" and codes["9"] is None  # add3, relu1, add2
    assert {codes[str(4 * k)] for k in range(6)} == {"source-follows-consumers"}
    assert {codes[str(4 * k + 3)] for k in range(6)} == {"cast-keeps-to"}

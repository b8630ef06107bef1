"""The minimal example of each keep rule and variable rule of docs/design.md, built and
converted: the rule's code in the report (or the variable's type in the plan), the result
valid, and, where onnxruntime can run the model, its outputs against the original's."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp import Conversion, convert_and_report
from rlx_onnx_amp.policy import policy_from_name
from rlx_onnx_amp.rewrite import VARIABLE_RULES, ConvertOptions, conversion_passes, why_not_keepable
from rlx_onnx_amp.rewrite.rules import REASON_CODES
from tests.helpers import assert_close, run

F, H = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes: list[onnx.NodeProto], inputs: list, outputs: list, inits: list | None = None,
           opset: int = 21, extra: tuple = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "rule", inputs, outputs, inits or [])
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra)]
    return helper.make_model(graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports[:1]))


def _codes(model: onnx.ModelProto, policy: str, **options: Any) -> tuple[dict[str, str | None], onnx.ModelProto]:
    """Op type -> the code that kept it, and the converted model (checked by the pass contracts)."""
    out, report = convert_and_report(model, policy, check_contracts=True, **options)
    return {k.op: k.code for k in report.kept_f32}, out


def _same_numbers(model: onnx.ModelProto, out: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = 1e-2) -> None:
    assert_close(run(model, feeds), run(out, feeds), atol=tol, rtol=tol)


X = helper.make_tensor_value_info("x", F, [2, 3])
Y = helper.make_tensor_value_info("y", F, [2, 3])
FEEDS = {"x": np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)}


def _silent(model: onnx.ModelProto, policy: str, op: str) -> tuple[str | None, Conversion, onnx.ModelProto]:
    """The code of the silent rule that decided the `op` node (report.index.rules), the report and
    the converted model; a silent rule keeps no reported reason (kept_f32)."""
    out, report = convert_and_report(model, policy, check_contracts=True)
    path = str(next(i for i, n in enumerate(model.graph.node) if n.op_type == op))
    assert all(k.path != path for k in report.kept_f32)
    return report.index.rules.get(path), report, out


def test_source_follows_consumers() -> None:
    model = _model([helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((2, 3), 0.5, np.float32))),
                    helper.make_node("Add", ["x", "c"], ["y"])], [X], [Y])
    code, report, out = _silent(model, "always-f16", "Constant")
    assert code == "source-follows-consumers"
    assert out.graph.node[0].attribute[0].t.data_type == H  # narrowed in place for its f16 reader
    assert why_not_keepable(report.index, "0") == f"rule source-follows-consumers: {REASON_CODES['source-follows-consumers']}"
    _same_numbers(model, out, FEEDS)


def test_cast_keeps_to() -> None:
    i = helper.make_tensor_value_info("i", TensorProto.INT32, [2, 3])
    model = _model([helper.make_node("Cast", ["i"], ["c"], to=F), helper.make_node("Add", ["c", "c"], ["y"])], [i], [Y])
    code, report, out = _silent(model, "always-f16", "Cast")
    assert code == "cast-keeps-to" and report.index.decisions["1"] == "f16"
    cast, to_low = out.graph.node[0], out.graph.node[1]
    assert cast.op_type == "Cast" and cast.attribute[0].i == F  # it keeps its `to`...
    assert to_low.op_type == "Cast" and to_low.input[0] == "c" and to_low.attribute[0].i == H  # ...a Cast follows it
    assert why_not_keepable(report.index, "0") == f"rule cast-keeps-to: {REASON_CODES['cast-keeps-to']}"
    feeds = {"i": np.arange(-3, 3, dtype=np.int32).reshape(2, 3)}
    _same_numbers(model, out, feeds, tol=0)


def test_policy_f32() -> None:
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], [X], [Y], [w])
    code, report, out = _silent(model, "auto-mixed", "MatMul")
    assert code == "policy-f32" and report.index.decisions == {"0": "f32", "1": "f16"}
    assert why_not_keepable(report.index, "0") == f"rule policy-f32: {REASON_CODES['policy-f32']}"
    _same_numbers(model, out, FEEDS)


def test_nothing_to_lower() -> None:
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [3])
    model = _model([helper.make_node("Add", ["i", "i"], ["y"])], [i], [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    code, report, out = _silent(model, "always-f16", "Add")
    assert code == "nothing-to-lower" and report.index.decisions["0"] == "none" and not report.changed
    feeds = {"i": np.array([1, -2, 3], np.int64)}
    np.testing.assert_array_equal(run(model, feeds)[0], run(out, feeds)[0])


def test_non_tensor() -> None:
    model = _model([helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
                    helper.make_node("SequenceAt", ["s", "zero"], ["y"])], [X], [Y],
                   [numpy_helper.from_array(np.array(0, np.int64), "zero")])
    codes, out = _codes(model, "always-f16")
    assert codes["SequenceConstruct"] == "non-tensor"
    _same_numbers(model, out, FEEDS, tol=0)


def test_control_flow() -> None:
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 3])])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], [X, cond], [Y], [w])
    out, report = convert_and_report(model, "always-f16", check_contracts=True)
    assert {k.op: k.code for k in report.kept_f32}["If"] == "control-flow"
    assert report.index.decisions["0/then_branch/0"] == "f16"  # the MatMul inside goes f16
    for c in (True, False):
        _same_numbers(model, out, {**FEEDS, "c": np.array(c)})


def test_unknown_op() -> None:
    # onnxruntime cannot run a made-up op: structure only.
    model = _model([helper.make_node("Foo", ["x"], ["f"], domain="com.example"), helper.make_node("Relu", ["f"], ["y"])],
                   [X], [Y], extra=(("com.example", 1),))
    model.graph.value_info.append(helper.make_tensor_value_info("f", F, [2, 3]))  # its output type is declared
    out, report = convert_and_report(model, "always-f16")
    assert {k.op: k.code for k in report.kept_f32} == {"Foo": "unknown-op"}
    relu = next(n for n in out.graph.node if n.op_type == "Relu")
    cast = next(n for n in out.graph.node if n.output[0] == relu.input[0])
    assert cast.op_type == "Cast" and cast.input[0] == "f"  # its reader gets a Cast


def test_user_keep() -> None:
    model = _model([helper.make_node("Softmax", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], [X], [Y])
    codes, out = _codes(model, "always-f16", keep_f32_ops=["Softmax"])
    assert codes == {"Softmax": "user-keep"}
    _same_numbers(model, out, FEEDS)


def test_cast_unavailable() -> None:
    # Opset 6 predates what onnxruntime implements: structure only.
    model = _model([helper.make_node("Add", ["x", "x"], ["y"])], [X], [Y], opset=6)
    _, report = convert_and_report(model, "auto-mixed-bf16")
    assert {k.op: k.code for k in report.kept_f32} == {"Add": "cast-unavailable"}


def test_kernel_gap() -> None:
    model = _model([helper.make_node("EyeLike", ["x"], ["e"]), helper.make_node("Add", ["e", "x"], ["y"])], [X], [Y])
    codes, out = _codes(model, "always-f16")
    assert codes == {"EyeLike": "kernel-gap"}
    _same_numbers(model, out, FEEDS)


def test_qdq_region() -> None:
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(0, np.uint8), "z")]
    q = helper.make_tensor_value_info("q", TensorProto.UINT8, [2, 3])
    model = _model([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Relu", ["d"], ["r"]),
                    helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])],
                   [q], [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 3])], inits)
    codes, out = _codes(model, "always-f16")
    assert codes["Relu"] == "qdq-region"
    feeds = {"q": np.arange(6, dtype=np.uint8).reshape(2, 3) * 40}
    np.testing.assert_array_equal(run(model, feeds)[0], run(out, feeds)[0])


def test_no_schema() -> None:
    # Gelu arrived in opset 20: at 17 nothing says what it admits (and onnxruntime cannot load it).
    model = _model([helper.make_node("Gelu", ["x"], ["y"])], [X], [Y], opset=17)
    # Neither the checker nor onnxruntime takes this model: convert() would refuse it (InputError).
    _, report = convert_and_report(model, "always-f16", check=False)
    assert {k.op: k.code for k in report.kept_f32} == {"Gelu": "no-schema"}


def test_schema_admits() -> None:
    scalars = [helper.make_tensor_value_info(n, F, []) for n in ("a", "b", "d")]
    model = _model([helper.make_node("Range", ["a", "b", "d"], ["y"])], scalars,
                   [helper.make_tensor_value_info("y", F, [None])])
    codes, out = _codes(model, "always-f16")
    assert codes == {"Range": "schema-admits"}
    feeds = {"a": np.array(0.5, np.float32), "b": np.array(3.0, np.float32), "d": np.array(0.25, np.float32)}
    _same_numbers(model, out, feeds, tol=0)


def test_kernel_table() -> None:
    # OneHot-28 admits bf16 for its values (T3) only, so the float indices and depth keep their
    # types; onnxruntime's CPU provider has bf16 values only beside integer indices and depth.
    inits = [numpy_helper.from_array(np.array(4, np.float32), "depth"),
             numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "values")]
    idx = helper.make_tensor_value_info("i", F, [3])
    model = _model([helper.make_node("OneHot", ["i", "depth", "values"], ["y"])], [idx],
                   [helper.make_tensor_value_info("y", F, [3, 4])], inits, opset=28)  # bf16 values from OneHot-28
    codes, out = _codes(model, "auto-mixed-bf16", target="cpu")
    assert codes == {"OneHot": "kernel-table"}
    feeds = {"i": np.array([0.0, 3.0, 1.0], np.float32)}
    _same_numbers(model, out, feeds, tol=0)


def _decision(model: onnx.ModelProto, op: str, policy: str = "always-f16"):
    plan, (decide, _, _) = conversion_passes(model, policy_from_name(policy), ConvertOptions())
    decide(plan, check=True)
    assert plan.main is not None
    return next(d for d in plan.main.decisions if d.op == op)


def test_attribute_typed() -> None:
    scale = numpy_helper.from_array(np.ones(3, np.float32), "g")
    outs = [Y, helper.make_tensor_value_info("m", F, [2, 1]), helper.make_tensor_value_info("v", F, [2, 1])]
    model = _model([helper.make_node("LayerNormalization", ["x", "g"], ["y", "m", "v"], stash_type=1)], [X], outs, [scale])
    d = _decision(model, "LayerNormalization")
    assert d.input_types == {0: H, 1: H} and d.output_types == {0: H}  # Mean and InvStdDev (U) keep f32
    _, out = _codes(model, "always-f16")
    _same_numbers(model, out, FEEDS)


def test_other_type() -> None:
    data = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "data")
    idx = helper.make_tensor_value_info("i", TensorProto.INT64, [2])
    model = _model([helper.make_node("Gather", ["data", "i"], ["y"])], [idx], [Y], [data])
    d = _decision(model, "Gather")
    assert d.input_types == {0: H} and d.output_types == {0: H}  # the int64 indices keep their type
    _, out = _codes(model, "always-f16")
    _same_numbers(model, out, {"i": np.array([3, 1], np.int64)}, tol=0)


def test_type_variable() -> None:
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    x4 = helper.make_tensor_value_info("x", F, [1, 1, 2, 3])
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], [x4],
                   [helper.make_tensor_value_info("y", F, [1, 1, 4, 6])], [scales])
    d = _decision(model, "Resize")
    assert d.input_types == {0: H} and d.output_types == {0: H}  # `scales` keeps f32
    _, out = _codes(model, "always-f16")
    assert {t.name: t.data_type for t in out.graph.initializer}["scales"] == F
    feeds = {"x": FEEDS["x"].reshape(1, 1, 2, 3)}
    _same_numbers(model, out, feeds)


def test_the_report_counts_the_nodes_each_rule_decided_in_list_order() -> None:
    model = _model([helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full((2, 3), 2.0, np.float32))),
                    helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "c"], ["a"]),
                    helper.make_node("Softmax", ["a"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                   [X], [Y], [numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")])
    _, report = convert_and_report(model, "auto-mixed", keep_f32_ops=["Softmax"])
    assert report.by_rule == {"source-follows-consumers": 1, "policy-f32": 1, "user-keep": 1}
    assert report.to_json()["by_rule"] == report.by_rule
    assert report.index.decisions == {"0": "f16", "1": "f32", "2": "f16", "3": "f32", "4": "f16"}


def test_every_rule_has_its_example_here() -> None:
    tested = {name[len("test_"):].replace("_", "-") for name in globals() if name.startswith("test_")}
    assert set(REASON_CODES) <= tested and {r.code for r in VARIABLE_RULES} <= tested


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_an_op_typed_by_its_attribute_needs_a_real_kernel(target: str) -> None:
    """HannWindow's output type is its `output_datatype`; onnxruntime has no f16 HannWindow and
    cannot cast around one, so it stays f32 (kernel-table) and its reader gets the Cast. (It
    once went f16 without its attribute: an f32 value declared f16, which the checker and
    onnxruntime refused.)"""
    size = numpy_helper.from_array(np.array(8, np.int32), "n")
    model = _model([helper.make_node("HannWindow", ["n"], ["w"]), helper.make_node("Relu", ["w"], ["y"])], [],
                   [helper.make_tensor_value_info("y", F, [8])], [size])
    codes, out = _codes(model, "always-f16", target=target)
    assert codes == {"HannWindow": "kernel-table"}
    window = next(n for n in out.graph.node if n.op_type == "HannWindow")
    assert "output_datatype" not in {a.name for a in window.attribute}
    _same_numbers(model, out, {}, tol=1e-3)


def test_dequantize_arithmetic() -> None:
    """MatMulInteger's int32 accumulator of uint8 products (about 1.6e5 here) is cast to f32 and
    multiplied by the scale: that Mul and the scale's own Mul stay f32, and so does the node
    whose output DynamicQuantizeLinear quantizes; the dequantized value goes on in f16."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(200, 255, (64, 4), dtype=np.uint8), "w")
    inits = [w, numpy_helper.from_array(np.array(0, np.uint8), "w_zp"), numpy_helper.from_array(np.array(1e-3, np.float32), "w_s")]
    x = helper.make_tensor_value_info("x", F, [2, 64])
    y = helper.make_tensor_value_info("y", F, [2, 4])
    model = _model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("DynamicQuantizeLinear", ["r"], ["q", "q_s", "q_zp"]),
                    helper.make_node("MatMulInteger", ["q", "w", "q_zp", "w_zp"], ["acc"]),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=F),
                    helper.make_node("Mul", ["q_s", "w_s"], ["s"], name="scale"),
                    helper.make_node("Mul", ["acc_f", "s"], ["deq"], name="dequantize"),
                    helper.make_node("Tanh", ["deq"], ["y"])], [x], [y], inits)
    out, report = convert_and_report(model, "always-f16", check_contracts=True)
    kept = {k.node or k.op: k.code for k in report.kept_f32}
    assert kept == {"Relu@0": "dequantize-arithmetic", "scale": "dequantize-arithmetic", "dequantize": "dequantize-arithmetic"}
    assert report.index.decisions["6"] == "f16"  # the Tanh after it
    feeds = {"x": rng.uniform(0, 1, (2, 64)).astype(np.float32)}
    acc = run(model, feeds)[0]
    assert np.isfinite(run(out, feeds)[0]).all() and np.isfinite(acc).all()
    _same_numbers(model, out, feeds)


def test_shape_arithmetic() -> None:
    """A ViT's position-embedding size: Pow(num_positions, 0.5) -> Cast(int64) -> Resize's sizes.
    The Pow stays f32 (its value only computes a size); the Resize itself still lowers."""
    consts = [helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.array(16.0, np.float32))),
              helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32)))]
    x = helper.make_tensor_value_info("x", F, [1, 2, 2, 2])
    y = helper.make_tensor_value_info("y", F, [1, 2, 4, 4])
    lead = numpy_helper.from_array(np.array([1, 2], np.int64), "lead")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    model = _model([*consts,
                    helper.make_node("Pow", ["n", "half"], ["side_f"], name="side"),
                    helper.make_node("Cast", ["side_f"], ["side_i"], to=onnx.TensorProto.INT64),
                    helper.make_node("Unsqueeze", ["side_i", "axes"], ["side_1"]),
                    helper.make_node("Concat", ["lead", "side_1", "side_1"], ["sizes"], axis=0),
                    helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="nearest")],
                   [x], [y], [lead, axes], opset=13)
    out, report = convert_and_report(model, "always-f16", target="cpu", check_contracts=True)
    kept = {k.node: k.code for k in report.kept_f32}
    assert kept.get("side") == "shape-arithmetic"
    assert report.index.decisions["6"] == "f16"  # the Resize of the activations
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)}
    _same_numbers(model, out, feeds)


def test_shape_arithmetic_on_a_graph_deeper_than_pythons_stack() -> None:
    """A value cast to an integer early and read down a 3,000-node chain (a BERT export is such
    a graph): the walk that decides shape-only values must not recurse as deep as the graph
    (it did: RecursionError, exit 70). The chain is not shape arithmetic, so it lowers."""
    depth = 3000
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="head"),
             helper.make_node("Cast", ["r"], ["r_i"], to=onnx.TensorProto.INT64),
             helper.make_node("Shape", ["r_i"], ["n"])]
    value = "r"
    for i in range(depth):
        nodes.append(helper.make_node("Neg", [value], [f"c{i}"]))
        value = f"c{i}"
    nodes.append(helper.make_node("Identity", [value], ["y"]))
    x = helper.make_tensor_value_info("x", F, [2, 3])
    y = helper.make_tensor_value_info("y", F, [2, 3])
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    model = _model(nodes, [x], [y, n], [], opset=13)
    out, report = convert_and_report(model, "always-f16")
    assert "shape-arithmetic" not in {k.code for k in report.kept_f32}
    assert report.index.decisions["0"] == "f16"  # the head Relu: read by the chain, not only by the Cast
    _same_numbers(model, out, {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2})


def test_dequantize_follows_consumer() -> None:
    """Cast(int8 -> f32) -> Sub(zero point) -> Mul(scale) -> MatMul: under auto-mixed the MatMul
    stays f32, and so do the Sub and the Mul with it, so no Cast enters the dequantization; the
    Relu after the MatMul still runs f16. Under always-f16 the chain lowers with its MatMul."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.integers(-127, 127, (8, 4), dtype=np.int8), "wq"),
             numpy_helper.from_array(np.array(3.0, np.float32), "zp"),
             numpy_helper.from_array(np.array(0.01, np.float32), "s")]
    x = helper.make_tensor_value_info("x", F, [2, 8])
    y = helper.make_tensor_value_info("y", F, [2, 4])
    model = _model([helper.make_node("Cast", ["wq"], ["wf"], to=F, name="cast"),
                    helper.make_node("Sub", ["wf", "zp"], ["wc"], name="center"),
                    helper.make_node("Mul", ["wc", "s"], ["w"], name="scale"),
                    helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
                    helper.make_node("Relu", ["m"], ["y"], name="relu")], [x], [y], inits)
    out, report = convert_and_report(model, "auto-mixed", check_contracts=True)
    kept = {k.node: k.code for k in report.kept_f32}
    assert kept == {"center": "dequantize-follows-consumer", "scale": "dequantize-follows-consumer"}
    assert report.index.decisions["4"] == "f16"  # the Relu
    producers = {o: n for n in out.graph.node for o in n.output}
    assert producers[next(n for n in out.graph.node if n.name == "fc").input[1]].name == "scale"  # no Cast
    assert report.casts_inserted == 2  # into and out of the Relu only
    feeds = {"x": rng.uniform(-1, 1, (2, 8)).astype(np.float32)}
    _same_numbers(model, out, feeds)
    low, low_report = convert_and_report(model, "always-f16", check_contracts=True)
    assert "dequantize-follows-consumer" not in low_report.by_rule
    assert low_report.index.decisions["2"] == "f16" and low_report.index.decisions["3"] == "f16"
    _same_numbers(model, low, feeds, tol=5e-2)


def test_dequantize_follows_consumer_down_a_chain_deeper_than_pythons_stack() -> None:
    """Cast(int8 -> f32) -> 2,000 Adds of a scale -> MatMul: the walk that finds what a
    dequantization feeds goes down the whole chain without recursing (3,000 frames would end
    the run), and every step stays f32 with its f32 MatMul under auto-mixed."""
    depth = 2000
    inits = [numpy_helper.from_array(np.arange(-16, 16, dtype=np.int8).reshape(8, 4), "wq"),
             numpy_helper.from_array(np.array(0.001, np.float32), "s")]
    nodes = [helper.make_node("Cast", ["wq"], ["w0"], to=F, name="cast")]
    for i in range(depth):
        nodes.append(helper.make_node("Add", [f"w{i}", "s"], [f"w{i + 1}"], name=f"step{i}"))
    nodes.append(helper.make_node("MatMul", ["x", f"w{depth}"], ["y"], name="fc"))
    x = helper.make_tensor_value_info("x", F, [2, 8])
    y = helper.make_tensor_value_info("y", F, [2, 4])
    model = _model(nodes, [x], [y], inits)
    out, report = convert_and_report(model, "auto-mixed")
    assert report.by_rule.get("dequantize-follows-consumer") == depth and report.casts_inserted == 0
    _same_numbers(model, out, {"x": np.ones((2, 8), np.float32)}, tol=1e-6)


def test_weight_range() -> None:
    """A BatchNormalization's running variance of 1e7 cannot be clamped to 65504 (its output
    would grow 12x): the node stays f32 with its weights; an additive -1e9 mask before a
    Softmax is a sentinel and is clamped as before."""
    c = 3
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
          (("g", np.ones(c)), ("b", np.zeros(c)), ("mean", np.zeros(c)), ("var", np.array([1e7, 2e7, 4e7])))]
    x4 = helper.make_tensor_value_info("x", F, [1, c, 2, 2])
    model = _model([helper.make_node("Mul", ["x", "big"], ["xb"]),
                    helper.make_node("BatchNormalization", ["xb", "g", "b", "mean", "var"], ["n"]),
                    helper.make_node("ReduceMean", ["n"], ["m"], axes=[2, 3], keepdims=0),
                    helper.make_node("Add", ["m", "mask"], ["s"]),
                    helper.make_node("Softmax", ["s"], ["y"])], [x4], [helper.make_tensor_value_info("y", F, [1, 3])],
                   [*bn, numpy_helper.from_array(np.array([[0, 0, -1e9]], np.float32), "mask"),
                    numpy_helper.from_array(np.array(3000.0, np.float32), "big")], opset=17)
    out, report = convert_and_report(model, "always-f16", check_contracts=True)
    assert {k.op: k.code for k in report.kept_f32} == {"BatchNormalization": "weight-range"}
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert types["var"] == F and types["mask"] == H  # the variance kept, the sentinel clamped
    assert report.clamped["mask"]["clamped"] == 1 and "var" not in report.clamped
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (1, c, 2, 2)).astype(np.float32)}
    _same_numbers(model, out, feeds)


def test_range_screen() -> None:
    """The values one reference run saw decide: Exp of x * 16 reaches 8.9e6, past f16; the
    Exp (which makes it) and the ReduceSum and Div (which read it) stay f32, the Mul before
    and after stay f16. Values computed from a clamped mask sentinel are not screened."""
    from rlx_onnx_amp.ranges import ValueRange

    model = _model([helper.make_node("Mul", ["x", "gain"], ["xs"]), helper.make_node("Exp", ["xs"], ["e"]),
                    helper.make_node("ReduceSum", ["e", "axes"], ["z"]), helper.make_node("Div", ["e", "z"], ["p"]),
                    helper.make_node("Mul", ["p", "x"], ["y"])], [X], [Y],
                   [numpy_helper.from_array(np.array(16.0, np.float32), "gain"),
                    numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    feeds = {"x": FEEDS["x"]}
    ranges = {name: ValueRange(8.9e6 if name in ("e", "z") else 16.0, 1e-3) for name in ("xs", "e", "z", "p", "y")}
    out, report = convert_and_report(model, "always-f16", check_contracts=True, value_ranges=ranges)
    assert {k.op: k.code for k in report.kept_f32} == {"Exp": "range-screen", "ReduceSum": "range-screen",
                                                       "Div": "range-screen"}
    assert report.index.decisions["0"] == "f16" and report.index.decisions["4"] == "f16"
    _same_numbers(model, out, feeds)


@pytest.mark.parametrize(("exponent", "kept"), [(2.0, set()), (-0.5, {"Pow", "Relu"})])
def test_range_screen_reads_a_pow_base_as_singular_only_under_a_negative_exponent(exponent: float, kept: set) -> None:
    """x ** 2 of a value that flushes to zero in f16 is 0, nothing singular (an RMSNorm's
    square); x ** -0.5 is Inf: that Pow and the Relu that makes its base stay f32."""
    from rlx_onnx_amp.ranges import ValueRange

    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pow", ["r", "e"], ["p"]),
                    helper.make_node("Neg", ["p"], ["y"])], [X], [Y],
                   [numpy_helper.from_array(np.array(exponent, np.float32), "e")])
    ranges = {"r": ValueRange(1.0, 1e-9), "p": ValueRange(1.0, 1e-3), "y": ValueRange(1.0, 1e-3)}
    _, report = convert_and_report(model, "always-f16", check_contracts=True, value_ranges=ranges)
    assert {k.op for k in report.kept_f32} == kept
    assert all(k.code == "range-screen" for k in report.kept_f32)

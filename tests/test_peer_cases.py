"""Cases found by re-running peers' test suites and real export folders against rlx-amp, each
failing before its fix: a merged decoder's If branch output under the If's own name, a graph
out of topological order, a Loop's outputs with --no-keep-io-types, onnxruntime's own ops in
the default domain (the genai builder's), and `convert()` given a model no rule can make sound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures.make_fixtures import control_flow
from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.errors import InputError
from tests.helpers import feeds_for, rlx

F, H = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "peer", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _merged_decoder() -> onnx.ModelProto:
    """optimum's merged decoder in small: an If whose branches read an outer weight and whose
    outputs carry the If's own output name (`present.0.decoder.key`)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W")
    out = "present.0.decoder.key"

    def branch(name: str, relu: bool) -> onnx.GraphProto:
        nodes = [helper.make_node("MatMul", ["x", "W"], ["t" if relu else out], name=f"{name}_matmul")]
        if relu:
            nodes.append(helper.make_node("Relu", ["t"], [out], name=f"{name}_relu"))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F, [2, 4])])

    node = helper.make_node("If", ["use_cache"], [out], then_branch=branch("with_past", False),
                            else_branch=branch("without_past", True))
    return _model([node], [helper.make_tensor_value_info("use_cache", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", F, [2, 4])],
                  [helper.make_tensor_value_info(out, F, [2, 4])], [w])


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed"])
def test_a_merged_decoder_branch_output_under_the_if_s_name(policy: str) -> None:
    """The branch's low value is renamed and cast back under the shared name: the checker
    passes (it said "Inferred elem type differs" under always-f16), and both branches compute
    what the original does."""
    model = _merged_decoder()
    out, report = convert_and_report(model, policy, check_contracts=True)
    assert report.proof == "onnx.checker"
    x = np.random.default_rng(1).uniform(-1, 1, (2, 4)).astype(np.float32)
    for use_cache in (True, False):
        feeds = {"use_cache": np.array(use_cache), "x": x}
        want, got = _session(model).run(None, feeds)[0], _session(out).run(None, feeds)[0]
        assert got.dtype == np.float32 and np.abs(got - want).max() < 1e-2
    if policy == "always-f16":
        branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
        matmul = next(n for n in branch.node if n.op_type == "MatMul")
        assert matmul.output[0] != "present.0.decoder.key"  # the low value has a name of its own
        assert branch.output[0].name == "present.0.decoder.key"


def test_nodes_out_of_topological_order_are_sorted() -> None:
    """onnxruntime loads a graph whose Conv comes before the Transpose it reads; converting it
    as it stood left the Transpose's f32 output read by an f16 Conv with no Cast, which
    onnxruntime refused ("Type parameter (T) of Optype (Conv) bound to different types")."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 3, 3, 3)).astype(np.float32), "W")
    model = _model([helper.make_node("Conv", ["xt", "W"], ["y"], name="conv"),
                    helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2], name="to_nchw")],
                   [helper.make_tensor_value_info("x", F, [1, 5, 5, 3])], [helper.make_tensor_value_info("y", F, [1, 2, 3, 3])],
                   [w], opset=13)
    out, report = convert_and_report(model, "custom", kind_map={"compute": "f16"})
    assert [n.op_type for n in out.graph.node] == ["Transpose", "Cast", "Conv", "Cast"]
    assert report.changed and report.proof == "onnx.checker"
    x = np.random.default_rng(1).standard_normal((1, 5, 5, 3)).astype(np.float32)
    assert np.abs(_session(out).run(None, {"x": x})[0] - _session(model).run(None, {"x": x})[0]).max() < 1e-2


def test_a_loop_s_outputs_take_the_low_type_without_keep_io_types() -> None:
    """With --no-keep-io-types the Loop's scan output `trace`, computed in f16 inside its body,
    is an f16 graph output like `y` (it stayed f32); its interface stays f32 and one Cast
    after the Loop gives the output."""
    fixture = control_flow()
    out = convert(fixture.model, "always-f16", keep_io_types=False, check_contracts=True)
    assert {o.name: o.type.tensor_type.elem_type for o in out.graph.output} == {"y": H, "trace": H}
    loop = next(n for n in out.graph.node if n.op_type == "Loop")
    cast = next(n for n in out.graph.node if n.op_type == "Cast" and n.output[0] == "trace")
    assert cast.input[0] in loop.output and "trace" not in loop.output
    feeds = feeds_for(fixture, fixture.model)
    low = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    want = _session(fixture.model).run(None, feeds)
    got = _session(out).run(None, low)
    for w, g in zip(want, got):
        assert g.dtype == np.float16 and np.abs(g.astype(np.float32) - w).max() <= 0.05 * max(1.0, float(np.abs(w).max()))


def _genai_style() -> onnx.ModelProto:
    """onnxruntime's SimplifiedLayerNormalization in the default domain, as the genai builder
    writes it: onnxruntime registers and runs it, onnx.checker has no schema for it."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "W")
    return _model([helper.make_node("MatMul", ["x", "W"], ["m"]),
                   helper.make_node("SimplifiedLayerNormalization", ["m", "g"], ["y"], axis=-1, epsilon=1e-5)],
                  [helper.make_tensor_value_info("x", F, [2, 8])], [helper.make_tensor_value_info("y", F, [2, 8])],
                  [numpy_helper.from_array(np.ones(8, np.float32), "g"), w])


def test_onnxruntime_s_own_ops_are_convertible_and_the_report_says_what_proved_it(tmp_path: Path) -> None:
    model = _genai_style()
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model, full_check=True)
    out, report = convert_and_report(model, "always-f16")
    assert report.proof is not None and report.proof.startswith("onnxruntime loads it (the input fails onnx.checker: No Op registered for "
                                   "SimplifiedLayerNormalization")
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    assert np.abs(_session(out).run(None, {"x": x})[0] - _session(model).run(None, {"x": x})[0]).max() < 1e-2
    src, dst, report_path = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    result = rlx(src, "-p", "always-f16", "-o", dst, "--report-json", report_path, "-q")
    assert result.returncode == 0, result.stderr
    written = json.loads(report_path.read_text())
    assert written["proof"].startswith("onnxruntime loads it") and written["verify"]["passed"]


def test_convert_refuses_what_the_cli_refuses() -> None:
    """A graph that fails the checker and that onnxruntime cannot load either (a node reads
    a name nothing defines): convert() raises the CLI's one-line InputError instead of
    returning a model with the same defect."""
    model = _model([helper.make_node("Add", ["x", "nowhere"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                   [helper.make_tensor_value_info("y", F, [2])], [])
    with pytest.raises(InputError, match=r"the input model fails onnx\.checker"):
        convert(model, "always-f16")
    assert convert(model, "always-f16", check=False).graph.node  # asked not to check: the caller's risk

"""rlx_onnx_amp.ir.MixedPrecisionPass (issue 24): the CLI's rewrite as an onnx-ir pass, its
contract (requires/ensures), an honest `modified`, torch's dynamo export, and external data
read and written without every weight in memory."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY, write_external
from tests.helpers import rlx

ir = pytest.importorskip("onnx_ir", reason="onnx-ir is not installed (pip install 'rlx-onnx-amp[ir]')")
import onnx_ir.passes.common  # noqa: E402

import rlx_onnx_amp  # noqa: E402
from rlx_onnx_amp.ir import MixedPrecisionPass  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "models" / "demo_transformer.onnx"


def _typed(model: onnx_ir.Model) -> onnx_ir.Model:
    """Every value's type filled in: the pass's precondition."""
    return onnx_ir.passes.common.ShapeInferencePass()(model).model


def _shape(proto: onnx.ModelProto) -> list[tuple]:
    """Each node's op, inputs, outputs and Cast target; then every value's element type."""
    g = proto.graph
    nodes = [(n.op_type, n.name, list(n.input), list(n.output),
              [a.i for a in n.attribute if n.op_type == "Cast" and a.name == "to"]) for n in g.node]
    types = sorted((v.name, v.type.tensor_type.elem_type) for v in [*g.input, *g.output, *g.value_info])
    inits = sorted((t.name, t.data_type, tuple(t.dims)) for t in g.initializer)
    return [*nodes, *types, *inits]


def _weights(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def _causes(e: BaseException) -> list[type]:
    chain = []
    while e is not None:
        chain.append(type(e))
        e = e.__cause__  # type: ignore[assignment]
    return chain


# ---- the same rewrite as the CLI -----------------------------------------------------------

def test_pass_gives_the_model_convert_and_the_cli_give(tmp_path: Path) -> None:
    model = _typed(ir.load(DEMO))
    src = tmp_path / "typed.onnx"
    ir.save(model, src)
    graph = model.graph
    result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f16")])(model)
    assert result.modified and result.model is model and model.graph is graph
    ours = ir.to_proto(model)
    expected = rlx_onnx_amp.convert(onnx.load(str(src)), "always-f16")
    # Byte for byte, once both have made the same trip through onnx-ir (value_info's order is its own).
    assert ours.SerializeToString() == ir.to_proto(ir.from_proto(expected)).SerializeToString()
    cli_out = tmp_path / "cli.onnx"
    done = rlx(src, "-p", "always-f16", "-o", cli_out, "--no-verify", "-q")
    assert done.returncode == 0, done.stderr
    cli = onnx.load(str(cli_out))
    assert _shape(ours) == _shape(cli)
    assert sum(n.op_type == "Cast" for n in ours.graph.node) > 0
    assert {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in ours.graph.initializer} == \
        {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in cli.graph.initializer}


def test_modified_is_false_when_nothing_changes() -> None:
    model = _typed(ir.load(DEMO))
    before = ir.to_proto(model).SerializeToString()
    result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f32")])(model)
    assert result.modified is False and ir.to_proto(model).SerializeToString() == before
    assert MixedPrecisionPass(policy="always-f16")(model).modified is True
    converted = ir.to_proto(model).SerializeToString()
    again = MixedPrecisionPass(policy="always-f16")
    assert again(model).modified is False and again.result is not None and again.result.conversion is not None and again.result.conversion.changed is False
    assert ir.to_proto(model).SerializeToString() == converted


def test_bad_options_fail_when_the_pass_is_made() -> None:
    with pytest.raises(rlx_onnx_amp.PolicyError):
        MixedPrecisionPass(policy="always-f12")
    with pytest.raises(rlx_onnx_amp.InputError, match="unknown target"):
        MixedPrecisionPass(policy="always-f16", target="tpu")
    with pytest.raises(TypeError, match="not both"):
        MixedPrecisionPass(options=rlx_onnx_amp.make_options(), keep_io_types=False)


def test_keywords_are_converts(tmp_path: Path) -> None:
    """keep_f32_ops and keep_io_types reach the converter as they do through `convert`."""
    model = _typed(ir.load(DEMO))
    proto = ir.to_proto(model)
    kw: dict[str, Any] = {"keep_f32_ops": ["Softmax"], "keep_io_types": False, "target": "cpu"}
    p = MixedPrecisionPass(policy="always-f16", **kw)
    p(model)
    expected = rlx_onnx_amp.convert(proto, "always-f16", **kw)
    assert _shape(ir.to_proto(model)) == _shape(expected)
    assert p.result is not None and p.result.conversion is not None
    assert p.result.conversion.target == "cpu" and p.result.conversion.proof == "onnx.checker"
    assert model.graph.inputs[0].dtype == ir.DataType.FLOAT16  # keep_io_types=False


def test_result_is_the_last_calls_and_matches_converts() -> None:
    """`result` after a call holds that call's conversion record, as `convert_and_report` gives
    it; a second call replaces the first's (its counts are not added to them)."""
    model = _typed(ir.load(DEMO))
    _, expected = rlx_onnx_amp.convert_and_report(ir.to_proto(model), "always-f16")
    p = MixedPrecisionPass(policy="always-f16")
    assert p.result is None
    p(model)
    assert p.result is not None and p.result.conversion is not None
    first = p.result.conversion
    assert first.changed and first.casts_inserted == expected.casts_inserted > 0
    assert first.by_op == expected.by_op and first.nodes == expected.nodes
    p(_typed(ir.load(DEMO)))  # a second model: the result is its alone
    second = p.result.conversion
    assert second is not first and second.nodes == expected.nodes and second.casts_inserted == expected.casts_inserted


# ---- the contract --------------------------------------------------------------------------

def test_requires_every_type_known() -> None:
    model = ir.load(DEMO)  # written without value_info for its intermediate values
    with pytest.raises(ir.passes.PreconditionError, match=r"no known type.*ShapeInferencePass"):
        MixedPrecisionPass(policy="always-f16")(model)
    with pytest.raises(ir.passes.PassError) as caught:
        ir.passes.PassManager([MixedPrecisionPass(policy="always-f16")])(model)
    assert ir.passes.PreconditionError in _causes(caught.value)


def _cast_mislabelled() -> onnx_ir.Model:
    """A Cast (of a float16 input) to FLOAT whose output says FLOAT16: every type known, one
    Cast disagrees; always-f32 leaves it as it is."""
    from onnx import TensorProto as T
    from onnx import helper as h

    graph = h.make_graph([h.make_node("Cast", ["x"], ["c"], to=T.FLOAT, name="cast"),
                          h.make_node("Relu", ["c"], ["y"], name="relu")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT16, [2])], [h.make_tensor_value_info("y", T.FLOAT16, [2])],
                         value_info=[h.make_tensor_value_info("c", T.FLOAT16, [2])])
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def test_ensures_casts_agree_with_their_outputs() -> None:
    with pytest.raises(ir.passes.PostconditionError, match=r"cast \(to=FLOAT, output c: FLOAT16\)"):
        MixedPrecisionPass(policy="always-f32", check=False)(_cast_mislabelled())
    with pytest.raises(ir.passes.PassError) as caught:
        ir.passes.PassManager([MixedPrecisionPass(policy="always-f32", check=False)])(_cast_mislabelled())
    assert ir.passes.PostconditionError in _causes(caught.value)


def test_ensures_types_known() -> None:
    """A postcondition that fails when a value ends without a type (a later pass, say)."""
    model = _typed(ir.load(DEMO))
    MixedPrecisionPass(policy="always-f16")(model)
    next(iter(model.graph)).outputs[0].type = None
    with pytest.raises(ir.passes.PostconditionError, match="no known type after the pass"):
        MixedPrecisionPass(policy="always-f16").ensures(model)


# ---- torch's dynamo exporter -----------------------------------------------------------------

def test_a_dynamo_export() -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install 'rlx-onnx-amp[export]')")
    import torch

    torch.manual_seed(24)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.norm, self.out = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.out(torch.relu(self.norm(self.proj(x)))), dim=-1)

    module, x = Block().eval(), torch.randn(4, 16)
    program = torch.onnx.export(module, (x,), dynamo=True, verbose=False)
    assert program is not None  # dynamo=True returns the program
    model = program.model
    assert isinstance(model, ir.Model)
    before = ir.to_proto(model)
    result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f16")])(model)
    assert result.modified and result.model is model
    ours = ir.to_proto(model)
    assert _shape(ours) == _shape(rlx_onnx_amp.convert(before, "always-f16"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in ours.graph.initializer)
    import onnxruntime as ort

    session = ort.InferenceSession(ours.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, module(x).detach().numpy(), atol=2e-3)


# ---- external data -------------------------------------------------------------------------

def test_external_data_is_read_and_written_a_tensor_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = write_external(HEALTHY["mlp_external"](), src_dir / "mlp.onnx")
    model = _typed(ir.load(src))
    assert any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f16", scratch_dir=scratch)])(model)
    assert result.modified
    # The narrowed weights wait in one scratch file, read back only when asked.
    lazy = {n: v.const_value for n, v in model.graph.initializers.items() if isinstance(v.const_value, ir.LazyTensor)}
    assert {"w1", "w2", "gather_table"} <= set(lazy)
    assert [p.name for d in scratch.iterdir() for p in d.iterdir()] == ["weights.data"]
    # A second run reads them from there as references, not serialized into memory, and changes nothing.
    again = MixedPrecisionPass(policy="always-f16", scratch_dir=scratch)
    with monkeypatch.context() as patched:
        for method in ("tobytes", "numpy"):
            patched.setattr(f"rlx_onnx_amp.ir._ScratchTensor.{method}", lambda self: pytest.fail(f"{self.name} read"))
        assert again(model).modified is False and again.result is not None and again.result.conversion is not None and again.result.conversion.changed is False
    assert all(model.graph.initializers[n].const_value is t for n, t in lazy.items())
    out = tmp_path / "out" / "mlp.f16.onnx"
    out.parent.mkdir()
    ir.save(model, out, external_data="mlp.f16.onnx.data")
    assert (out.parent / "mlp.f16.onnx.data").stat().st_size > 0
    cli = tmp_path / "cli" / "mlp.f16.onnx"
    cli.parent.mkdir()
    typed_src = src_dir / "typed.onnx"
    ir.save(_typed(ir.load(src)), typed_src, external_data="typed.onnx.data")
    done = rlx(typed_src, "-p", "always-f16", "-o", cli, "--no-verify", "-q")
    assert done.returncode == 0, done.stderr
    assert _shape(onnx.load(str(out), load_external_data=False)) == _shape(onnx.load(str(cli), load_external_data=False))
    ours, theirs = _weights(out), _weights(cli)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and ours[k].tobytes() == theirs[k].tobytes() for k in ours)
    onnx.checker.check_model(str(out), full_check=True)
    # The scratch file lives as long as a tensor that reads it.
    del model, result, lazy
    gc.collect()
    assert list(scratch.iterdir()) == []


# ---- verification, opted in ----------------------------------------------------------------

def test_verify_raises_a_postcondition_error_on_drift() -> None:
    from rlx_onnx_amp.verification import VerifyOptions

    model = _typed(ir.from_proto(BROKEN_IN_F16["exp_overflow"]().model))
    before = ir.to_proto(model).SerializeToString()
    # The literal policy (no range screen): f16's exp overflows, and the verdict says so.
    p = MixedPrecisionPass(policy="always-f16", verify=True, verify_options=VerifyOptions(provider="cpu"), screen=False)
    with pytest.raises(ir.passes.PostconditionError, match=r"\by\b"):  # it names the output that drifts
        p(model)
    assert ir.to_proto(model).SerializeToString() == before  # left unchanged
    assert p.result is not None and p.result.verify is not None and p.result.verify.passed is False
    assert [o.name for o in p.result.verify.outputs if not o.passed] == ["y"]


def test_the_pass_screens_as_the_command_does(tmp_path: Path) -> None:
    # One pipeline behind every door: by default the pass runs the reference, screens its
    # ranges and keeps f32 the nodes the command keeps; the verdict then passes.
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    model = _typed(ir.load(src))
    p = MixedPrecisionPass(policy="always-f16", verify=True)
    assert p(model).modified
    assert p.result is not None and p.result.verify is not None and p.result.verify.passed is True
    assert p.result.conversion is not None
    by_pass = sorted((k.node, k.reason) for k in p.result.conversion.kept_f32)
    report = tmp_path / "r.json"
    done = rlx(src, "-p", "always-f16", "-o", tmp_path / "cli.onnx", "-q", "--report-json", report)
    assert done.returncode == 0, done.stderr
    by_cli = sorted((k["node"], k["reason"]) for k in json.loads(report.read_text())["kept_f32"])
    assert by_pass == by_cli and any("range" in reason for _, reason in by_pass), by_pass


def test_verify_passes_a_healthy_model() -> None:
    model = _typed(ir.from_proto(HEALTHY["transformer_block"]().model))
    p = MixedPrecisionPass(policy="always-f16", verify=True)
    assert p(model).modified
    assert p.result is not None and p.result.verify is not None and p.result.verify.passed is True


def test_verify_with_external_weights_runs_the_file_the_checker_read(tmp_path: Path) -> None:
    # The converted model is written once, beside its narrowed weights in the scratch directory,
    # for the checker and onnxruntime alike: not saved again with a copy of every weight.
    from rlx_onnx_amp.verification import VerifyOptions

    src_dir, scratch = tmp_path / "src", tmp_path / "scratch"
    src_dir.mkdir()
    scratch.mkdir()
    src = write_external(HEALTHY["mlp_external"](), src_dir / "mlp.onnx")
    plain, verified = _typed(ir.load(src)), _typed(ir.load(src))
    assert MixedPrecisionPass(policy="always-f16", scratch_dir=scratch)(plain).modified
    p = MixedPrecisionPass(policy="always-f16", verify=True, verify_options=VerifyOptions(provider="cpu"),
                           scratch_dir=scratch)
    assert p(verified).modified
    assert p.result is not None and p.result.verify is not None and p.result.verify.passed is True
    candidate = Path(p.result.verify.candidate)
    assert candidate.name == "converted.onnx" and candidate.parent.parent == scratch
    assert not candidate.exists() and [f.name for f in candidate.parent.iterdir()] == ["weights.data"]
    # The same model as without verify, and its outputs within the f16 tolerance of the input's.
    assert _shape(ir.to_proto(verified)) == _shape(ir.to_proto(plain))
    assert all(o.max_abs is not None and o.max_abs < 0.05 for o in p.result.verify.outputs)


# ---- the extra and the example -------------------------------------------------------------

def test_without_onnx_ir_the_import_says_what_to_install() -> None:
    code = "import sys; sys.modules['onnx_ir'] = None\nimport rlx_onnx_amp.ir"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("ImportError: "), done.stderr
    assert "pip install 'rlx-onnx-amp[ir]'" in done.stderr


def test_the_example_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install 'rlx-onnx-amp[export]')")
    done = subprocess.run([sys.executable, str(REPO / "examples" / "ir_pass.py")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dynamo export: modified=True" in done.stdout
    assert (tmp_path / "mlp.f16.onnx").exists() and (tmp_path / "mlp.f16.onnx.data").exists()


def test_policy_auto_searches_as_the_command_does(tmp_path: Path) -> None:
    """`auto` in the pass: the command line's search, verified; the model takes a passing result."""
    from fixtures.make_fixtures import GAIN_CASES
    from rlx_onnx_amp.errors import InputError
    from rlx_onnx_amp.verification import VerifyOptions

    with pytest.raises(InputError, match="verify=True"):
        MixedPrecisionPass(policy="auto")
    model = _typed(ir.from_proto(GAIN_CASES["overflow_mlp"]().model))
    p = MixedPrecisionPass(policy="auto", verify=True, verify_options=VerifyOptions(provider="cpu"))
    result = p(model)
    assert result.modified and p.result is not None and p.result.verify is not None and p.result.verify.passed
    assert p.result.repair is not None and p.result.conversion is not None
    assert p.result.conversion.cost is not None and p.result.conversion.cost.mac_low_share == 1.0
    kept = {k.node for k in p.result.conversion.kept_f32}
    assert kept == {"scale_up", "scale_down"}
    dtypes = {n.name: n.outputs[0].dtype for n in model.graph if n.name in ("fc1", "fc2", "scale_up")}
    assert dtypes == {"fc1": ir.DataType.FLOAT16, "fc2": ir.DataType.FLOAT16, "scale_up": ir.DataType.FLOAT}

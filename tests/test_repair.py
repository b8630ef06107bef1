"""Auto-repair: each f16 failure mode comes out passing, with most nodes still low, quickly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from rlx_onnx_amp import ModelRunError, make_options
from rlx_onnx_amp.repair import repair_file
from rlx_onnx_amp.reports.record import RepairKeep
from rlx_onnx_amp.verification import VerifyOptions
from tests.helpers import rlx


def _cancellation_model() -> onnx.ModelProto:
    """y = Tanh((x + 1000) - 1000): no value leaves the f16 range, but the f16 sum loses x's
    digits (spacing 0.5 at 1000). No magnitude rule sees it; localization names the Sub, and
    bisection finds the Add."""
    rng = np.random.default_rng(5)
    w = onnx.numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "w")
    big = onnx.numpy_helper.from_array(np.array(1000.0, np.float32), "big")
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["m"], name="proj"), h.make_node("Relu", ["m"], ["r"], name="relu"),
         h.make_node("Add", ["r", "big"], ["shifted"], name="shift"), h.make_node("Sub", ["shifted", "big"], ["back"], name="unshift"),
         h.make_node("Tanh", ["back"], ["t"], name="tanh"), h.make_node("Mul", ["t", "x"], ["y"], name="gate")],
        "cancellation", [h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w, big])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


@pytest.mark.parametrize("name", list(BROKEN_IN_F16))
def test_repair_fixes_each_failure_mode(name: str, tmp_path: Path) -> None:
    src = tmp_path / f"{name}.onnx"
    onnx.save(BROKEN_IN_F16[name]().model, str(src))
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    # Without repair the conversion fails verification...
    assert rlx(str(src), "--policy", "always-f16", "-o", str(out), "--verify", "--no-screen", "-q").returncode == 1
    # ... with it, it passes the default tolerance.
    result = rlx(str(src), "--policy", "always-f16", "-o", str(out), "--repair", "--report-json", str(report))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    rep, ver = data["repair"], data["verify"]
    assert rep["passed"] and ver["passed"]
    first_pass = next(h["evaluation"] for h in rep["history"] if h["passed"])
    assert first_pass <= 3  # found by the screen or localization, then minimized
    assert rep["minimality"] == "checked" and rep["evaluations"] <= 12
    best = min((h for h in rep["history"] if h["passed"]), key=lambda h: (h["kept"], h["score"], h["evaluation"]))
    assert rep["best"]["evaluation"] == best["evaluation"] and [h["written"] for h in rep["history"]].count(True) == 1
    assert len(rep["kept_f32"]) == best["kept"] and all(k["op"] != "?" for k in rep["kept_f32"])
    reasons = {k["reason"] for k in rep["kept_f32"]}
    assert reasons <= {"overflow", "underflow", "drift"} and reasons
    assert {"underflow"} <= reasons if name == "eps_underflow" else "overflow" in reasons
    nodes = data["nodes"]
    assert nodes["by_precision"]["f16"] >= nodes["by_precision"]["f32"] - 1  # most nodes stay low
    assert all(k["reason"].startswith("repair: ") for k in data["kept_f32"] if k["path"] in {r["path"] for r in rep["kept_f32"]})
    onnx.checker.check_model(str(out), full_check=True)


def test_bisection_finds_what_magnitudes_cannot(tmp_path: Path) -> None:
    src = tmp_path / "cancel.onnx"
    onnx.save(_cancellation_model(), str(src))
    _conversion, verified, result = repair_file(src, tmp_path / "out.onnx", "always-f16", verify_options=VerifyOptions(provider="cpu"))
    assert verified.passed and result.passed
    kept = {k.node: k.reason for k in result.kept_f32}
    assert kept.get("shift") == "drift"  # the sum that loses x's digits; minimality gave back the rest
    assert "proj" not in kept and "tanh" not in kept  # the rest stays f16
    assert result.minimality == "checked"
    stages = [h.stage for h in result.history]
    assert stages[0] == "policy" and any(s.startswith("localize") for s in stages) and any(s.startswith("bisect") for s in stages)
    assert result.evaluations <= 12


def test_repair_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "cancel.onnx"
    onnx.save(_cancellation_model(), str(src))
    repair_file(src, tmp_path / "a.onnx", "always-f16")
    repair_file(src, tmp_path / "b.onnx", "always-f16")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_budget_exhausted_writes_best_and_exits_1(tmp_path: Path) -> None:
    src = tmp_path / "cancel.onnx"
    onnx.save(_cancellation_model(), str(src))
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    result = rlx(str(src), "--policy", "always-f16", "-o", str(out), "--repair", "--repair-budget", "2", "--report-json", str(report))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "wrote the best model found" in result.stdout and out.exists()
    data = json.loads(report.read_text())
    assert data["repair"]["evaluations"] <= 2 and not data["repair"]["passed"]


def test_healthy_model_needs_no_repair(tmp_path: Path) -> None:
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    _conversion, _verified, result = repair_file(src, tmp_path / "out.onnx", "auto-mixed")
    assert result.passed and result.evaluations == 1 and result.kept_f32 == ()
    assert result.compute_low_share == 0.0  # auto-mixed keeps Compute in f32 by policy
    assert result.weight_low_share is not None and 0 < result.weight_low_share < 1


def _loop_overflow_model() -> onnx.ModelProto:
    """The overflow sits in a Loop body, where no main-graph tensor shows it:
    Loop 2 times { v = Exp(16·v) / (Exp(16·v) + 1) } ─ Relu."""
    vi = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Mul", ["v_in", "gain"], ["m"], name="body_gain"), h.make_node("Exp", ["m"], ["e"], name="body_exp"),
         h.make_node("Add", ["e", "one"], ["s"], name="body_add"), h.make_node("Div", ["e", "s"], ["v_out"], name="body_div"),
         h.make_node("Identity", ["c_in"], ["c_out"], name="body_cond")],
        "body", [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("v_in", TensorProto.FLOAT, [4, 8])],
        [vi("c_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [4, 8])])
    inits = [onnx.numpy_helper.from_array(np.array(2, np.int64), "trip"), onnx.numpy_helper.from_array(np.array(True), "go"),
             onnx.numpy_helper.from_array(np.array(16.0, np.float32), "gain"), onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    graph = h.make_graph(
        [h.make_node("Loop", ["trip", "go", "x"], ["v"], name="loop", body=body), h.make_node("Relu", ["v"], ["y"], name="relu")],
        "loop_overflow", [vi("x", TensorProto.FLOAT, [4, 8])], [vi("y", TensorProto.FLOAT, [4, 8])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


def test_bisection_searches_loop_bodies(tmp_path: Path) -> None:
    src = tmp_path / "loop.onnx"
    onnx.save(_loop_overflow_model(), str(src))
    _conversion, verified, result = repair_file(src, tmp_path / "out.onnx", "always-f16")
    assert verified.passed and result.passed, result.history
    kept_paths = {k.path for k in result.kept_f32}
    assert kept_paths and all(p.startswith("0/body/") for p in kept_paths)  # only body nodes, found by path
    assert "0/body/0" not in kept_paths  # the gain Mul stays f16
    # The magnitude screen sees inside the body (its values surfaced per iteration): the Exp
    # that overflows is kept by the second evaluation, without bisection.
    assert result.history[1].stage == "magnitude screen" and result.history[1].passed
    assert RepairKeep("0/body/1", "body_exp", "Exp", "overflow") in result.kept_f32
    assert result.evaluations <= 24


def test_repair_keeps_the_target(tmp_path: Path) -> None:
    # Candidates are converted for the user's target: bf16 for the CPU provider keeps MatMul in
    # f32 (no bf16 CPU kernel), and the written model loads there for real.
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    out = tmp_path / "out.onnx"
    conversion, verified, result = repair_file(
        src, out, "auto-mixed-bf16", options=make_options(target="cpu"), verify_options=VerifyOptions(provider="cpu"))
    assert conversion.target == "cpu" and result.passed and verified.passed
    assert conversion.by_op["MatMul"] == {"f32": 8} and conversion.nodes.by_precision["bf16"] > 0
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_repair_emulates_a_candidate_the_provider_cannot_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a provider that runs low precision natively (no emulation by default) but lacks a
    # kernel the candidate needs: bf16 for CUDA on the CPU provider. Repair falls back to
    # emulation, as verify does, instead of stopping with "cannot run".
    import rlx_onnx_amp.verification.compare

    monkeypatch.setattr(rlx_onnx_amp.verification.compare, "emulation_reason", lambda *args: None)
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    out = tmp_path / "out.onnx"
    conversion, _verified, result = repair_file(src, out, "auto-mixed-bf16", verify_options=VerifyOptions(provider="cpu"))
    assert result.passed and result.evaluations == 1 and not result.kept_f32
    assert conversion.target == "cuda" and conversion.by_op["MatMul"] == {"bf16": 8}
    with pytest.raises(ModelRunError):
        repair_file(src, out, "auto-mixed-bf16", verify_options=VerifyOptions(provider="cpu", emulate=False))


@pytest.mark.parametrize("name", ["mask_softmax", "pow_layernorm", "cancellation"])
def test_repair_of_external_weights_searches_as_inline(name: str, tmp_path: Path) -> None:
    # A model with external data is searched with its weights streamed through each candidate's
    # scratch files (never loaded whole): the same evaluations, scores and keeps as inline, the
    # magnitude screen included.
    model = _cancellation_model() if name == "cancellation" else BROKEN_IN_F16[name]().model
    inline, external = tmp_path / "inline.onnx", tmp_path / "ext" / "external.onnx"
    external.parent.mkdir()
    onnx.save(model, str(inline))
    onnx.save(model, str(external), save_as_external_data=True, all_tensors_to_one_file=True,
              location="external.onnx.data", size_threshold=64)  # small shape tensors inline, as onnxruntime reads them
    assert any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(external), load_external_data=False).graph.initializer)
    results = [repair_file(src, tmp_path / f"out_{src.stem}.onnx", "always-f16")[2] for src in (inline, external)]
    steps = [[(s.stage, s.kept, s.passed, s.score) for s in r.history] for r in results]
    assert steps[0] == steps[1] and results[0].kept_f32 == results[1].kept_f32 and results[1].passed
    assert len(steps[1]) > 1  # a search, not the policy's conversion alone
    if name != "cancellation":
        assert any(s[0] == "magnitude screen" for s in steps[1]), steps

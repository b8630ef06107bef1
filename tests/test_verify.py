"""The drift verifier: metrics with known answers, input synthesis, and end-to-end verdicts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx import helper as h

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from rlx_onnx_amp import convert_file
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.reports.record import Worst
from rlx_onnx_amp.verification import InputSpec, Tolerance, VerifyOptions, compare_arrays, verify
from rlx_onnx_amp.verification.inputs import synthesize
from tests.helpers import data_file, rlx

TOL = Tolerance(1e-2, 1e-2, 0.999)


# ---- metrics ------------------------------------------------------------------------------
def test_identical_arrays() -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    d = compare_arrays("y", x, x.copy(), TOL)
    assert d.passed and d.max_abs == 0 and d.cosine == pytest.approx(1.0) and d.mismatch_pct == 0
    assert d.top1_agreement == 1.0 and d.snr_db is None  # no noise: infinite SNR reported as null


def test_known_differences() -> None:
    ref = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    cand = np.array([[1.0, 2.5, 3.0, 4.0]], np.float32)
    d = compare_arrays("y", ref, cand, TOL)
    assert d.max_abs == pytest.approx(0.5) and d.max_rel == pytest.approx(0.25)
    assert d.mean_abs == pytest.approx(0.125)
    assert d.worst == Worst((0, 1), 2.0, 2.5)
    assert d.mismatch_pct == pytest.approx(25.0)
    expected_cos = float(np.dot(ref.ravel(), cand.ravel()) / (np.linalg.norm(ref) * np.linalg.norm(cand)))
    assert d.cosine == pytest.approx(expected_cos)
    assert d.snr_db == pytest.approx(10 * math.log10(30.0 / 0.25))
    assert not d.passed and d.failures and "max_abs 0.5" in d.failures[0]


def test_new_nan_and_inf_fail_but_shared_ones_do_not() -> None:
    ref = np.array([1.0, np.nan, np.inf, 4.0], np.float32)
    same = compare_arrays("y", ref, ref.copy(), TOL)
    assert same.passed and same.nan_ref == same.nan_cand == 1 and same.inf_ref == same.inf_cand == 1
    worse = compare_arrays("y", ref, np.array([np.nan, np.nan, np.inf, 4.0], np.float32), TOL)
    assert not worse.passed and worse.nan_cand == 2 and worse.failures and "1 new NaN" in worse.failures[0]
    inf = compare_arrays("y", ref, np.array([1.0, np.nan, np.inf, -np.inf], np.float32), TOL)
    assert not inf.passed and inf.inf_cand == 2


_RAMP = np.linspace(1.0, 2.0, 1000)
_SMALL = np.random.default_rng(0).standard_normal(100) * 1e-3
#: Each check of `metrics.CHECKS` alone: a reference, a candidate that fails only that check,
#: and the tolerance it is judged by.
_CHECK_CASES: dict[str, tuple[np.ndarray, np.ndarray, Tolerance]] = {
    "finite": (np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, np.nan, 4.0]), TOL),
    "shape": (np.zeros((2, 2)), np.zeros(4), TOL),
    "exact": (np.array([1, 2, 3], np.int64), np.array([1, 2, 4], np.int64), TOL),
    "max-scaled": (_RAMP, np.where(np.arange(1000) == 500, _RAMP + 0.1, _RAMP), TOL),
    # max-scaled passes (rtol_of_max 1) and cosine is not asked; one small element is off by half.
    "element-wise": (_RAMP * 1e-3, np.where(np.arange(1000) == 0, 1.5e-3, _RAMP * 1e-3), Tolerance(0.0, 1.0, 0.0, 1e-2)),
    "cosine": (_SMALL, np.zeros_like(_SMALL), TOL),  # within atol everywhere
}


def test_every_check_has_a_case_here() -> None:
    from rlx_onnx_amp.verification.metrics import CHECKS

    assert set(_CHECK_CASES) == set(CHECKS)


@pytest.mark.parametrize("check", sorted(_CHECK_CASES))
def test_each_check_alone(check: str) -> None:
    """A candidate that fails one check fails on it alone, with its code; the reference passes."""
    ref, cand, tol = _CHECK_CASES[check]
    drift = compare_arrays("y", ref, cand, tol)
    assert not drift.passed and drift.failed_checks == (check,), drift.failures
    assert drift.failures is not None and len(drift.failures) == 1
    assert drift.score is not None and drift.score > 1.0  # how far from passing: what repair minimizes
    same = compare_arrays("y", ref, ref.copy(), tol)
    assert same.passed and same.failed_checks is None and same.score is not None and same.score <= 1.0


def test_empty_output_passes_with_zero_elements() -> None:
    d = compare_arrays("y", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), TOL)
    assert d.passed and d.elements == 0 and d.max_abs == 0


def test_zeros_where_the_reference_is_small_fail_on_cosine() -> None:
    # Absolute tolerance alone passes this candidate; the cosine criterion does not.
    ref = np.random.default_rng(0).standard_normal(100).astype(np.float32) * 1e-3
    d = compare_arrays("y", ref, np.zeros_like(ref), TOL)
    assert d.max_abs is not None and d.max_abs < TOL.atol
    assert not d.passed and d.failures is not None and any("cosine" in f for f in d.failures)


def test_constant_reference_skips_cosine() -> None:
    """A constant reference has no direction to compare: a candidate alternating 2e-3 and 0
    around a reference of 1e-3 everywhere has cosine about 0.71, far under the floor, and
    still passes on max_abs <= atol, saying the reference is constant. (A candidate that is
    constant too would have cosine 1.0 and prove nothing about the skip.)"""
    ref = np.full(10, 1e-3, np.float32)
    cand = np.where(np.arange(10) % 2 == 0, 2e-3, 0.0).astype(np.float32)
    d = compare_arrays("y", ref, cand, TOL)
    assert d.cosine is not None and d.cosine < TOL.min_cosine  # the check that would fail, had it run
    assert d.passed and d.constant_reference == pytest.approx(1e-3)
    varying = compare_arrays("y", ref + np.linspace(0, 1e-4, 10, dtype=np.float32), cand, TOL)
    assert not varying.passed  # the same candidate against a reference that varies: cosine fails it


def _relu_gate(shift: float) -> onnx.ModelProto:
    """x [2, 16] - shift -> Relu -> MatMul: with x uniform in [-1, 1] (the synthesized inputs)
    and shift 10 every output is 0; with shift 0 the outputs move."""
    w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    graph = h.make_graph(
        [h.make_node("Sub", ["x", "shift"], ["s"]), h.make_node("Relu", ["s"], ["r"]),
         h.make_node("MatMul", ["r", "w"], ["y"])], "relu_gate",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(shift, np.float32), "shift")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_outputs_that_never_move_are_no_verdict(tmp_path: Path) -> None:
    """Issue 50: where every output of the reference is one value on every input set, the pass
    compares nothing: NO VERDICT, exit 4 (written), and the line says to give inputs that move
    it; the same model with outputs that move passes with exit 0."""
    for shift, code in ((10.0, 4), (0.0, 0)):
        src = tmp_path / f"gate{int(shift)}.onnx"
        onnx.save(_relu_gate(shift), str(src))
        out = tmp_path / f"gate{int(shift)}_16.onnx"
        result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--report-json", tmp_path / "r.json")
        assert result.returncode == code, result.stdout + result.stderr
        assert out.is_file()
        verify_json = json.loads((tmp_path / "r.json").read_text())["verify"]
        assert verify_json["passed"] is True
        if code == 4:
            assert "NO VERDICT: atol" in result.stdout
            assert f"{out}: written, not verified (exit 4): every output of the reference is constant" in result.stderr
            assert "every output of the reference is constant on these inputs: y (every element 0)" in result.stdout
            assert verify_json["outputs"][0]["constant_reference"] == 0.0
        else:
            assert "PASSED: atol" in result.stdout and "note:" not in result.stdout


def test_integer_outputs_must_match() -> None:
    ref = np.array([1, 2, 3], np.int64)
    assert compare_arrays("ids", ref, ref.copy(), TOL).passed
    d = compare_arrays("ids", ref, np.array([1, 2, 4], np.int64), TOL)
    assert not d.passed and d.mismatch_pct == pytest.approx(100 / 3)


# ---- inputs -------------------------------------------------------------------------------
def _token_model() -> onnx.ModelProto:
    table = onnx.numpy_helper.from_array(np.ones((50, 4), np.float32), "table")
    graph = h.make_graph(
        [h.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
         h.make_node("Gather", ["table", "ids32"], ["emb"]),
         h.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
         h.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
         h.make_node("Mul", ["emb", "m3"], ["y"])],
        "tokens",
        [h.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         h.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [table, onnx.numpy_helper.from_array(np.array([2], np.int64), "axes")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


def test_synthesis_finds_vocab_and_masks() -> None:
    feeds = synthesize(_token_model(), InputSpec(shapes={"input_ids": (2, 64)}, seed=3))
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == (2, 64) and ids.dtype == np.int64 and ids.max() < 50 and ids.max() > 25
    assert mask.shape == (2, 64)  # one size per axis name: the mask's batch and seq are the ids'
    alone = synthesize(_token_model(), InputSpec())["attention_mask"]
    assert alone.shape == (1, 128)  # nothing given: batch 1, a sequence of 128 tokens
    assert set(np.unique(mask)) <= {0, 1}
    again = synthesize(_token_model(), InputSpec(shapes={"input_ids": (2, 64)}, seed=3))
    assert np.array_equal(again["input_ids"], ids)  # seeded


def test_unknown_input_names_are_errors() -> None:
    with pytest.raises(InputError, match="--shape: the model has no input named 'ids'"):
        synthesize(_token_model(), InputSpec(shapes={"ids": (1, 4)}))
    with pytest.raises(InputError, match="--input-range: the model has no input named 'x'"):
        synthesize(_token_model(), InputSpec(ranges={"x": (0, 1)}))


def test_integer_scalar_needs_a_range() -> None:
    graph = h.make_graph([h.make_node("Cast", ["rate"], ["y"], to=TensorProto.FLOAT)], "g",
                         [h.make_tensor_value_info("rate", TensorProto.INT64, [])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    with pytest.raises(InputError, match="integer scalar"):
        synthesize(model, InputSpec())
    feeds = synthesize(model, InputSpec(ranges={"rate": (16000, 16001)}))
    assert int(feeds["rate"]) == 16000


# ---- end to end ---------------------------------------------------------------------------
def _save(name: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save({**HEALTHY, **BROKEN_IN_F16}[name]().model, str(path))
    return path


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed", "auto-mixed-bf16"])
def test_healthy_conversion_passes(policy: str, tmp_path: Path) -> None:
    src = _save("transformer_block", tmp_path)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    result = rlx(str(src), "--policy", policy, "-o", str(out), "--verify", "--report-json", str(report),
                 "--shape", "x:2x8x32", "--shape", "attention_mask:2x8", "--samples", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    v = json.loads(report.read_text())["verify"]
    assert v["passed"] and v["provider"] in ("cpu", "cuda", "coreml") and v["samples"] == 2
    assert v["inputs"] == {"x": [2, 8, 32], "attention_mask": [2, 8]}
    assert v["emulated"] == (v["provider"] == "cpu" or policy == "auto-mixed-bf16")
    assert v["precision"] == ("bf16" if policy == "auto-mixed-bf16" else "f16")
    (out_json,) = v["outputs"]
    assert out_json["name"] == "y" and out_json["max_abs"] > 0 and out_json["cosine"] > 0.999


@pytest.mark.parametrize("name", list(BROKEN_IN_F16))
def test_broken_conversion_fails_and_localize_names_the_node(name: str, tmp_path: Path) -> None:
    src = _save(name, tmp_path)
    out, report, md = tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "r.md"
    result = rlx(str(src), "--policy", "always-f16", "-o", str(out), "--verify", "--no-screen", "--localize",
                 "--report-json", str(report), "--report-md", str(md))
    assert result.returncode == 1, result.stdout + result.stderr
    assert report.exists() and md.exists()  # reports are written on drift too
    v = json.loads(report.read_text())["verify"]
    assert not v["passed"] and not v["outputs"][0]["passed"]
    first = v["localized"][0]
    assert first["op"] == BROKEN_IN_F16[name]().breaks_f16_at, v["localized"]
    assert "FAIL" in md.read_text() and first["node"] in md.read_text()


def test_json_numbers_match_an_independent_computation(tmp_path: Path) -> None:
    src = _save("conv_net", tmp_path)
    out = tmp_path / "out.onnx"
    convert_file(src, out, "always-f16")
    inputs, report = tmp_path / "inputs.npz", tmp_path / "r.json"
    result = rlx("verify", str(src), str(out), "--provider", "cpu", "--no-emulate", "--seed", "7",
                 "--save-inputs", str(inputs), "--report-json", str(report))
    assert result.returncode == 0, result.stderr
    v = json.loads(report.read_text())["verify"]
    assert v["emulated"] is False and v["providers_used"][0] == "CPUExecutionProvider"
    feeds = dict(np.load(inputs))
    # Sessions as the verifier opens them: without prepacked weights (the packed kernels sum in
    # another order, so the drift would differ in its 5th digit).
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_prepacking", "1")
    ref = ort.InferenceSession(str(src), opts).run(None, feeds)[0].astype(np.float64)
    cand = ort.InferenceSession(str(out), opts).run(None, feeds)[0].astype(np.float64)
    got = v["outputs"][0]
    assert got["max_abs"] == pytest.approx(np.max(np.abs(ref - cand)), rel=1e-9)
    assert got["mean_abs"] == pytest.approx(np.mean(np.abs(ref - cand)), rel=1e-9)
    cos = np.dot(ref.ravel(), cand.ravel()) / (np.linalg.norm(ref) * np.linalg.norm(cand))
    assert got["cosine"] == pytest.approx(cos, rel=1e-12)
    # the saved inputs fed back give the same report
    again = rlx("verify", str(src), str(out), "--provider", "cpu", "--no-emulate", "--inputs", str(inputs), "--report-json", str(report))
    assert again.returncode == 0 and json.loads(report.read_text())["verify"]["outputs"][0]["max_abs"] == got["max_abs"]


def test_per_output_tolerance_flips_the_verdict(tmp_path: Path) -> None:
    """Two outputs that drift alike under f16: a strict tolerance named for one fails that one
    alone, and the other keeps the defaults and passes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("a", "b")]
    w = numpy_helper.from_array(np.full((8,), 1.1, np.float32), "w")
    model = helper.make_model(helper.make_graph([helper.make_node("Mul", ["x", "w"], ["a"]),
                                                 helper.make_node("Mul", ["x", "w"], ["m"]),
                                                 helper.make_node("Neg", ["m"], ["b"])], "two", [x], outs, [w]),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    src, out, report = tmp_path / "two.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    convert_file(src, out, "always-f16")
    assert rlx("verify", str(src), str(out)).returncode == 0
    strict = rlx("verify", str(src), str(out), "--atol", "a:1e-9", "--rtol-of-max", "a:0", "--report-json", str(report))
    assert strict.returncode == 1, strict.stdout + strict.stderr
    verdicts = {o["name"]: o["passed"] for o in json.loads(report.read_text())["verify"]["outputs"]}
    assert verdicts == {"a": False, "b": True}


def test_bf16_without_emulation_cannot_run_on_cpu(tmp_path: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA provider present: bf16 may run natively")
    src = _save("transformer_block", tmp_path)
    out = tmp_path / "out.onnx"
    convert_file(src, out, "auto-mixed-bf16")
    # Meant for CUDA, verified on the CPU provider without emulation: it cannot run here.
    result = rlx("verify", str(src), str(out), "--provider", "cpu", "--no-emulate", "--target", "cuda")
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert str(out) in line and "on cpu" in line and "NOT_IMPLEMENTED" in line
    # Given as meant for the provider at hand (the default), the written file must run there:
    # emulated or not, a model that cannot run is never passed.
    for emulate in ("--emulate", "--no-emulate"):
        result = rlx("verify", str(src), str(out), "--provider", "cpu", emulate)
        assert result.returncode == 3, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert str(out) in line and "cannot load it on cpu" in line and "never passed" in line


def test_unavailable_provider_is_an_error(tmp_path: Path) -> None:
    missing = [p for p, full in (("cuda", "CUDAExecutionProvider"), ("coreml", "CoreMLExecutionProvider"))
               if full not in ort.get_available_providers()]
    if not missing:
        pytest.skip("every provider is available here")
    src = _save("conv_net", tmp_path)
    result = rlx("verify", str(src), str(src), "--provider", missing[0])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--provider {missing[0]}" in result.stderr


def test_emulation_of_a_model_with_external_data(tmp_path: Path) -> None:
    from fixtures.make_fixtures import write_external

    src = write_external(HEALTHY["mlp_external"](), tmp_path / "mlp.onnx")
    out = tmp_path / "out.onnx"
    # MatMul weights stay f32 in the reference's data file; the biases are narrowed.
    result = rlx(str(src), "--policy", "always-f16", "--keep-f32-op", "MatMul", "-o", str(out), "--verify", "--localize",
                 "--provider", "cpu", "--report-json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    v = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert v["emulated"] and v["passed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "mlp.onnx.data", "out.onnx", data_file(out).name, "r.json"]


def test_emulation_computes_with_the_candidates_own_weights(tmp_path: Path) -> None:
    """An emulated candidate takes the low weights the candidate holds, not the reference's
    narrowed again: a foreign candidate with one wrong f16 weight fails, with or without
    external data, and rlx-amp's own output gives the same figures either way."""
    from fixtures.make_fixtures import write_external

    for name, src in (("inline", Path(_save("transformer_block", tmp_path))),
                      ("external", write_external(HEALTHY["mlp_external"](), tmp_path / "mlp.onnx"))):
        out = tmp_path / f"{name}16.onnx"
        convert_file(src, out, "always-f16")
        options = VerifyOptions(provider="cpu", spec=InputSpec(samples=2))
        good = verify(src, out, options)
        # The emulation's verdict (the written file's own run is tests/test_written_model_runs.py's:
        # on the second input set, a fully masked row, onnxruntime's f16 Add overflows where the
        # emulation saturates).
        assert good.emulated and all(o.passed for o in good.outputs), name
        cand = onnx.load(str(out))  # its weights read in, inline from here on
        weight = max((t for t in cand.graph.initializer if t.data_type == TensorProto.FLOAT16), key=lambda t: t.raw_data.__len__())
        values = onnx.numpy_helper.to_array(weight)
        weight.CopyFrom(onnx.numpy_helper.from_array((values * np.float16(1.5)).astype(np.float16), weight.name))
        bad_path = tmp_path / f"{name}_bad16.onnx"
        onnx.save(cand, str(bad_path))
        bad = verify(src, bad_path, options)
        assert bad.emulated and not all(o.passed for o in bad.outputs), f"{name}: a wrong {weight.name} passed the emulated check"
        # The model as written, its weights unchanged, re-saved inline: the same figures as before.
        same_path = tmp_path / f"{name}_same16.onnx"
        onnx.save(onnx.load(str(out)), str(same_path))
        same = verify(src, same_path, options)
        assert [o.max_abs for o in same.outputs] == [o.max_abs for o in good.outputs], name


def test_emulation_computes_with_the_candidates_own_constants(tmp_path: Path) -> None:
    """Likewise for Constant values: a candidate whose f16 Constant `w` is wrong fails."""
    src = tmp_path / "c.onnx"
    onnx.save(HEALTHY["constant_weights"]().model, str(src))
    out = tmp_path / "c16.onnx"
    convert_file(src, out, "always-f16")
    options = VerifyOptions(provider="cpu", spec=InputSpec(samples=2))
    assert verify(src, out, options).passed
    cand = onnx.load(str(out))
    node = next(n for n in cand.graph.node if n.op_type == "Constant" and n.output[0] == "w")
    value = node.attribute[0].t
    assert value.data_type == TensorProto.FLOAT16
    wrong = (onnx.numpy_helper.to_array(value) * np.float16(-1)).astype(np.float16)
    value.CopyFrom(onnx.numpy_helper.from_array(wrong, value.name))
    onnx.save(cand, str(tmp_path / "wrong16.onnx"))
    bad = verify(src, tmp_path / "wrong16.onnx", options)
    assert bad.emulated and not bad.passed


def test_inputs_from_a_directory_of_pb_tensors(tmp_path: Path) -> None:
    src = _save("conv_net", tmp_path)
    out = tmp_path / "out.onnx"
    convert_file(src, out, "always-f16")
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    image = np.random.default_rng(1).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    (data / "input_0.pb").write_bytes(onnx.numpy_helper.from_array(image, "image").SerializeToString())
    saved, report = tmp_path / "used.npz", tmp_path / "r.json"
    result = rlx("verify", str(src), str(out), "--inputs", str(data), "--save-inputs", str(saved), "--report-json", str(report))
    assert result.returncode == 0, result.stderr
    assert np.array_equal(np.load(saved)["image"], image)


def test_bad_verify_inputs(tmp_path: Path) -> None:
    src = _save("conv_net", tmp_path)
    np.savez(tmp_path / "wrong.npz", other=np.zeros(3, np.float32))
    result = rlx("verify", str(src), str(src), "--inputs", str(tmp_path / "wrong.npz"))
    assert result.returncode == 2 and "no value for input(s) image" in result.stderr
    result = rlx("verify", str(src), str(tmp_path / "missing.onnx"))
    assert result.returncode == 2 and "missing.onnx: no such file" in result.stderr


def test_batch_form_with_one_summary(tmp_path: Path) -> None:
    good, bad = _save("conv_net", tmp_path), _save("exp_overflow", tmp_path)
    outdir = tmp_path / "out"
    outdir.mkdir()
    md = tmp_path / "summary.md"
    result = rlx(str(good), str(bad), "--policy", "always-f16", "--out-dir", str(outdir), "--verify", "--no-screen", "--report-md", str(md))
    assert result.returncode == 1
    assert "1 of 2 models passed; failed:" in result.stdout and "exp_overflow.onnx" in result.stdout
    text = md.read_text()
    assert "❌ failed" in text and "conv_net.onnx" in text and "exp_overflow.onnx" in text


@pytest.mark.cuda
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="onnxruntime here has no CUDA execution provider")
@pytest.mark.parametrize("name, expect", [("transformer_block", 0), ("residual_sum", 1)])
def test_native_f16_on_cuda(name: str, expect: int, tmp_path: Path) -> None:
    src = _save(name, tmp_path)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    result = rlx(str(src), "--policy", "always-f16", "-o", str(out), "--verify", "--provider", "cuda",
                 "--report-json", str(report))
    assert result.returncode == expect, result.stdout + result.stderr
    v = json.loads(report.read_text())["verify"]
    assert v["emulated"] is False and v["providers_used"][0] == "CUDAExecutionProvider"


def test_emulation_rounds_an_f32_value_a_low_node_reads(tmp_path: Path) -> None:
    """A value held in f32 (its producer kept) but read by an f16 node goes through a Cast to
    f16 in the candidate: past 65504 that node sees Inf. The emulated candidate must show what
    real f16 execution shows, though the value itself is f32 in both."""
    vi = h.make_tensor_value_info
    graph = h.make_graph(
        [h.make_node("Mul", ["x", "gain"], ["big"], name="scale"), h.make_node("Relu", ["big"], ["r"], name="relu"),
         h.make_node("Mul", ["r", "shrink"], ["y"], name="unscale")],
        "read_low", [vi("x", TensorProto.FLOAT, [4, 8])], [vi("y", TensorProto.FLOAT, [4, 8])],
        [onnx.numpy_helper.from_array(np.array(1e5, np.float32), "gain"),
         onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "shrink")])
    src = tmp_path / "m.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), str(src))
    out = tmp_path / "o.onnx"
    report = convert_file(src, out, "always-f16", keep_f32_nodes=["^scale$"], screen=False)
    assert [k.node for k in report.kept_f32] == ["scale"]
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (4, 8)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", allow_pickle=False, **feeds)
    # What f16 arithmetic gives (onnxruntime's CPU provider folds the Cast pair away and
    # computes the Relu in f32, so it cannot show it): Relu(f16(1e5 x)) is Inf where 1e5 x > 65504.
    with np.errstate(over="ignore"):  # the overflow to Inf is the point
        in_f16 = np.maximum((feeds["x"] * np.float32(1e5)).astype(np.float16), np.float16(0))
    expected_inf = int(np.isinf(in_f16).sum())
    assert expected_inf > 0
    result = verify(src, out, VerifyOptions(provider="cpu", inputs=str(tmp_path / "in.npz")))
    assert result.emulated and not result.passed
    assert result.outputs[0].new_inf == expected_inf


def test_a_constant_reference_is_named_and_its_pass_says_it_proves_little(tmp_path: Path) -> None:
    """A reference output that is one value everywhere (here: x * 0 through a Relu) passes on
    max_abs alone; the report names it (constant_reference) and the table, the Markdown
    summary and the HTML page say that only max_abs <= atol was checked there. (Another output,
    `moving`, varies: where every output is constant, there is no verdict, as tested above.)"""
    tol = Tolerance(atol=1e-2, rtol_of_max=1e-2, rtol=None, min_cosine=0.999)
    assert compare_arrays("y", np.zeros((2, 3)), np.full((2, 3), 1e-3), tol).constant_reference == 0.0
    assert compare_arrays("y", np.arange(6.0), np.arange(6.0), tol).constant_reference is None
    assert compare_arrays("y", np.ones(1), np.ones(1), tol).constant_reference is None  # one element: no claim
    zero = onnx.numpy_helper.from_array(np.zeros((2, 3), np.float32), "z")
    graph = h.make_graph([h.make_node("Mul", ["x", "z"], ["m"]), h.make_node("Relu", ["m"], ["y"]),
                          h.make_node("Relu", ["x"], ["moving"])], "zero",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                          h.make_tensor_value_info("moving", TensorProto.FLOAT, [2, 3])], [zero])
    src = tmp_path / "zero.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(src))
    result = rlx(str(src), "--policy", "always-f16", "-o", str(tmp_path / "out.onnx"), "--verify", "--provider", "cpu",
                 "--report-json", str(tmp_path / "r.json"), "--report-md", str(tmp_path / "r.md"),
                 "--report-html", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "note: the reference's output is constant for y (every element 0)" in result.stdout
    assert "only max_abs &lt;= atol was checked there" in (tmp_path / "r.html").read_text()
    assert "only max_abs <= atol was checked there" in (tmp_path / "r.md").read_text()
    output = {o["name"]: o for o in json.loads((tmp_path / "r.json").read_text())["verify"]["outputs"]}["y"]
    assert output["constant_reference"] == 0.0 and output["cosine"] is None and output["passed"]


def test_a_decoder_step_with_a_cache_gets_coherent_inputs() -> None:
    """A generator's decoder step (optimum's, the genai builder's): past_key_values holds P
    positions and input_ids S new ones, so the synthesized attention_mask covers P + S
    positions, all ones, and position_ids count P .. P + S - 1 (random ones pointed past the
    cache: optimum's Llama refused them, 'indices element out of data bounds')."""
    from rlx_onnx_amp.verification.reference import input_sets

    i64 = TensorProto.INT64
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
              helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4])]
    model = helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"])], "step", inputs,
                          [helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4])]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    feeds, longer = input_sets(model, VerifyOptions(spec=InputSpec(shapes={"past_key_values.0.key": (1, 2, 5, 4)})))
    assert feeds["input_ids"].shape == (1, 128) and feeds["past_key_values.0.key"].shape == (1, 2, 5, 4)
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((1, 133), np.int64))
    np.testing.assert_array_equal(feeds["position_ids"], np.arange(5, 133, dtype=np.int64)[None])
    # the second size: twice the new tokens after the same past
    assert longer["input_ids"].shape == (1, 256) and longer["attention_mask"].shape == (1, 261)
    np.testing.assert_array_equal(longer["position_ids"], np.arange(5, 261, dtype=np.int64)[None])
    # What the user says wins: a given mask shape and range are kept.
    spec = InputSpec(shapes={"attention_mask": (1, 3)}, ranges={"position_ids": (0, 2)})
    given = input_sets(model, VerifyOptions(spec=spec))[0]
    assert given["attention_mask"].shape == (1, 3) and given["position_ids"].max() < 2

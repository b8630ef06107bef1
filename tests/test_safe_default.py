"""The plain command is safe by default: the structural rules (dequantize-arithmetic,
weight-range, the clamped copy of a shared sentinel) and the range screen keep what would
break in f16, then the output is verified on the reference run the screen made.

Each pattern of `fixtures.make_fixtures.UNSAFE_BY_DEFAULT` is converted by the plain command
into a model that passes the emulated-f16 verdict, keeping the nodes the rules name; the same
conversion with those rules switched off (the converter before them) fails it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY, UNSAFE_BY_DEFAULT, Fixture
from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.rewrite import decide as decide_module
from rlx_onnx_amp.rewrite.emit import EmitPass
from rlx_onnx_amp.verification import VerifyOptions, verify
from rlx_onnx_amp.verification.inputs import InputSpec
from rlx_onnx_amp.verification.reference import prepare_reference
from tests.helpers import feeds_for, rlx, run

#: fixture -> (policy, {node name: the rule that keeps it f32}); at least these are kept.
EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    "dynamic_quant_transformer": ("auto-mixed", {"ln1": "dequantize-arithmetic", "fc2_quant_scales_mul": "dequantize-arithmetic",
                                                 "fc2_quant_output_scale_mul": "dequantize-arithmetic"}),
    "huge_variance_batchnorm": ("auto-mixed", {"bn": "weight-range"}),
    "reducesum_layernorm": ("auto-mixed", {"sum_squares": "range-screen", "mean_square": "range-screen"}),
    "shared_huge_initializer": ("auto-mixed", {"divide": "weight-range"}),
    "paddle_batch_dim": ("always-f16", {}),
}


def _input_flags(fixture: Fixture) -> list[str]:
    flags = []
    for name, (lo, hi) in fixture.ranges.items():
        flags += ["--input-range", f"{name}:{lo:g},{hi:g}"]
    return flags


def _spec(fixture: Fixture) -> InputSpec:
    return InputSpec(ranges=dict(fixture.ranges))


@pytest.mark.parametrize("name", list(UNSAFE_BY_DEFAULT))
def test_the_plain_command_keeps_each_pattern_safe(name: str, tmp_path: Path) -> None:
    fixture = UNSAFE_BY_DEFAULT[name]()
    policy, expected = EXPECTED[name]
    src, out, report_path = tmp_path / "model.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(fixture.model, str(src))
    result = rlx(src, "--policy", policy, "-o", out, "--report-json", report_path, *_input_flags(fixture))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    kept = {k["node"]: k["code"] for k in report["kept_f32"]}
    assert expected.items() <= kept.items(), kept
    verdict = report["verify"]
    assert verdict["passed"] and verdict["emulated"] and verdict["precision"] == "f16"
    assert all(o["new_nan"] == 0 and o["new_inf"] == 0 for o in verdict["outputs"])
    # Numbers on onnxruntime itself: the written model against the original, on the same feeds.
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted, full_check=True)
    feeds = feeds_for(fixture, fixture.model)
    for want, got in zip(run(fixture.model, feeds), run(converted, feeds)):
        assert np.isfinite(got).all()
        assert np.abs(got - want).max() <= 0.05 * max(float(np.abs(want).max()), 1.0)


def _without_the_new_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The converter as it was before rules dequantize-arithmetic, weight-range and range-screen."""
    kept = tuple(r for r in decide_module.PER_NODE_RULES if r.code == "user-keep")
    monkeypatch.setattr(decide_module, "PER_NODE_RULES", kept)
    monkeypatch.setattr(EmitPass, "_narrowed_copy", lambda self, owner, name, want: None)


@pytest.mark.parametrize("name", [n for n in UNSAFE_BY_DEFAULT if n != "paddle_batch_dim"])
def test_each_pattern_breaks_without_its_rule(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = UNSAFE_BY_DEFAULT[name]()
    policy, _ = EXPECTED[name]
    src, out = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(fixture.model, str(src))
    _without_the_new_rules(monkeypatch)
    onnx.save(convert(fixture.model, policy), str(out))
    result = verify(src, out, VerifyOptions(provider="cpu", spec=_spec(fixture)))
    assert not result.passed


def test_the_paddle_batch_dim_is_symbolic(tmp_path: Path) -> None:
    """`dim_value: -1` reads as a symbolic axis: the default verification runs (batch 1), and
    so does an explicit --shape."""
    fixture = UNSAFE_BY_DEFAULT["paddle_batch_dim"]()
    src, out, report_path = tmp_path / "model.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(fixture.model, str(src))
    result = rlx(src, "-o", out, "--report-json", report_path, "--shape", "x:3x8")
    assert result.returncode == 0, result.stderr
    assert json.loads(report_path.read_text())["verify"]["inputs"] == {"x": [3, 8]}


def test_one_reference_run_gives_the_screen_and_the_verdict(tmp_path: Path) -> None:
    """The screened run's graph outputs are the plain reference's, and every float value of
    the model has its range (Exp(16x) reaching about 8e6)."""
    fixture = BROKEN_IN_F16["exp_overflow"]()
    src = tmp_path / "model.onnx"
    onnx.save(fixture.model, str(src))
    options = VerifyOptions(provider="cpu")
    screened = prepare_reference(src, options, screen=True)
    plain = prepare_reference(src, options)
    assert screened.screened and not plain.screened and not plain.value_ranges
    assert screened.output_names == plain.output_names == ["y"]
    np.testing.assert_array_equal(screened.runs[0]["y"], plain.runs[0]["y"])
    assert set(screened.value_ranges) == {"xs", "e", "z", "p", "y"}
    assert screened.value_ranges["e"].max_abs > 65504 > screened.value_ranges["xs"].max_abs


@pytest.mark.parametrize("name", list(BROKEN_IN_F16))
def test_the_fixtures_built_to_break_pass_the_plain_command(name: str, tmp_path: Path) -> None:
    """Every fixture built to break in f16 (overflowing Exp, Pow and residual sums, two -1e9
    mask planes summed, an epsilon flushed before a Sqrt) passes under always-f16 by default;
    with --no-screen the literal policy is converted, verified and fails (exit 1, written)."""
    src, out, report_path = tmp_path / "model.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(BROKEN_IN_F16[name]().model, str(src))
    result = rlx(src, "--policy", "always-f16", "-o", out, "--report-json", report_path, "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    codes = {k["code"] for k in json.loads(report_path.read_text())["kept_f32"]}
    assert "range-screen" in codes
    literal = rlx(src, "--policy", "always-f16", "-o", out, "--report-json", report_path, "-q", "--no-screen")
    assert literal.returncode == 1, literal.stdout + literal.stderr
    report = json.loads(report_path.read_text())
    assert report["verify"]["passed"] is False and "range-screen" not in {k["code"] for k in report["kept_f32"]}
    assert out.exists()


def _rounding_model() -> onnx.ModelProto:
    """(x + 1000) - 1000: every value in range, but f16 holds 1000 + x to 0.5."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    k = numpy_helper.from_array(np.array(1000.0, np.float32), "k")
    nodes = [helper.make_node("Add", ["x", "k"], ["a"]), helper.make_node("Sub", ["a", "k"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "rounding", [x], [y], [k]),
                             opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_model_it_cannot_make_healthy_exits_1_with_everything_written(tmp_path: Path) -> None:
    src, out, report_path, md = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "r.md"
    onnx.save(_rounding_model(), str(src))
    result = rlx(src, "--policy", "always-f16", "-o", out, "--report-json", report_path, "--report-md", md)
    assert result.returncode == 1, result.stdout + result.stderr
    assert out.exists() and md.exists()
    report = json.loads(report_path.read_text())
    assert report["verify"]["passed"] is False and report["kept_f32"] == []
    assert "FAILED" in result.stdout


def test_no_verify_measures_nothing_and_says_so(tmp_path: Path) -> None:
    src, out, report_path = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    result = rlx(src, "--policy", "always-f16", "-o", out, "--report-json", report_path, "--no-verify")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "--no-verify" in line]
    assert notes == ["rlx-amp: note: --no-verify: nothing was measured; the output's drift is unknown"]
    report = json.loads(report_path.read_text())
    assert "verify" not in report and "range-screen" not in {k["code"] for k in report["kept_f32"]}
    for flags, word in ((["--no-verify", "--atol", "0.1"], "--atol"), (["--no-verify", "--no-screen"], "--screen"),
                        (["--no-verify", "--repair"], "--repair")):
        refused = rlx(src, "-o", tmp_path / "other.onnx", *flags)
        assert refused.returncode == 2 and word in refused.stderr and len(refused.stderr.splitlines()) == 1
        assert not (tmp_path / "other.onnx").exists()


def _wide_conv() -> onnx.ModelProto:
    """A 1x1xT Conv of width 600: every length synthesis tries for a symbolic T (64 down to 8,
    then 256, 512) is too short to run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "U"])
    w = numpy_helper.from_array(np.full((1, 1, 600), 0.1, np.float32), "w")
    return helper.make_model(helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "wide", [x], [y], [w]),
                             opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_reference_that_cannot_run_is_written_unverified_with_exit_4(tmp_path: Path) -> None:
    src, out, report_path = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_wide_conv(), str(src))
    result = rlx(src, "-o", out, "--report-json", report_path, "-q")
    assert result.returncode == 4, result.stdout + result.stderr
    warning, advice = result.stderr.strip().splitlines()
    assert "written, not verified (exit 4)" in warning and "--shape" in warning
    assert advice.startswith("rlx-amp: next: ") and "--shape NAME:1x128" in advice
    assert out.exists()
    report = json.loads(report_path.read_text())
    assert "verify" not in report and "--shape NAME:1x128" in report["unverified"]
    # --verify asks for the proof: the same model is then an input error, and nothing is written.
    strict = rlx(src, "-o", tmp_path / "strict.onnx", "--verify")
    assert strict.returncode == 2 and not (tmp_path / "strict.onnx").exists()
    # Sizes given: it runs, and passes.
    assert rlx(src, "-o", tmp_path / "sized.onnx", "--shape", "x:1x1x640", "-q").returncode == 0


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_batch_mode_verifies_model_by_model(tmp_path: Path, jobs: str) -> None:
    """A batch of a healthy model, one built to break and one whose reference cannot run:
    converted, screened and verified each, the unverified one written with exit 4, and the
    batch's exit code the worst of 0, 0 and 4."""
    models = []
    for name, model in (("good", HEALTHY["transformer_block"]().model), ("exp", BROKEN_IN_F16["exp_overflow"]().model),
                        ("wide", _wide_conv())):
        models.append(tmp_path / f"{name}.onnx")
        onnx.save(model, str(models[-1]))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = rlx(*models, "--out-dir", out_dir, "--jobs", jobs, "--report-json", tmp_path / "r.json", "-q")
    assert result.returncode == 4, result.stdout + result.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["exp.onnx", "good.onnx", "wide.onnx"]
    batch = json.loads((tmp_path / "r.json").read_text())
    assert batch["exit_code"] == 4 and not batch["passed"]
    by_model = {Path(r["model"]).stem: r for r in batch["models"]}
    assert by_model["good"]["verify"]["passed"] and by_model["exp"]["verify"]["passed"]
    assert "unverified" in by_model["wide"] and "verify" not in by_model["wide"]


def test_inspect_shows_what_the_rules_and_the_screen_keep(tmp_path: Path) -> None:
    bn, exp = tmp_path / "bn.onnx", tmp_path / "exp.onnx"
    onnx.save(UNSAFE_BY_DEFAULT["huge_variance_batchnorm"]().model, str(bn))
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(exp))
    shown = json.loads(rlx("inspect", bn, "--json").stdout)
    assert shown["by_rule"]["weight-range"] == 1
    plain = json.loads(rlx("inspect", exp, "--json", "-p", "always-f16").stdout)
    screened = json.loads(rlx("inspect", exp, "--json", "-p", "always-f16", "--screen").stdout)
    assert "range-screen" not in plain["by_rule"] and screened["by_rule"]["range-screen"] == 3


def test_reports_name_the_kept_nodes_and_their_rules(tmp_path: Path) -> None:
    """The terminal table and the Markdown summary carry each kept node's reason."""
    src, out, md = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.md"
    onnx.save(UNSAFE_BY_DEFAULT["huge_variance_batchnorm"]().model, str(src))
    result = rlx(src, "-o", out, "-v", "--report-md", md)
    assert result.returncode == 0, result.stderr
    assert "weight: 'var' holds 1e+08" in result.stderr  # -v lists each kept node with its reason
    _, report = convert_and_report(UNSAFE_BY_DEFAULT["huge_variance_batchnorm"]().model, "auto-mixed")
    assert [k.code for k in report.kept_f32] == ["weight-range"]

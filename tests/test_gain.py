"""What a conversion buys (issue 38): `--policy auto` keeps the most compute low that passes,
chosen on some input sets and confirmed on the others; `--min-low-share` gates it; every
report says what the conversion bought (files, weights, MACs by class, Casts, latency)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import GAIN_CASES, HEALTHY
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_LOW_GAIN, EXIT_OK
from tests.helpers import feeds_for, rlx, run


def _save(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(GAIN_CASES[name]().model, str(path))
    return path


def test_auto_passes_where_always_f16_fails_and_keeps_every_mac_low(tmp_path: Path) -> None:
    src = _save(tmp_path, "overflow_mlp")
    plain = rlx(src, "-p", "always-f16", "--no-screen", "-o", tmp_path / "f16.onnx", "-q", "--provider", "cpu")
    assert plain.returncode == EXIT_DRIFT  # the literal policy makes Inf
    out, report = tmp_path / "auto.onnx", tmp_path / "auto.json"
    result = rlx(src, "-p", "auto", "-o", out, "--provider", "cpu", "--report-json", report)
    assert result.returncode == EXIT_OK, result.stderr
    data = json.loads(report.read_text())
    assert data["policy"]["name"] == "auto" and data["verify"]["passed"]
    # Structure: the scaled copy stays f32, each with its code (the range screen of the reference
    # run the search starts from); both MatMuls, every MAC, run f16, found in one evaluation.
    kept = {(k["node"], k["code"]) for k in data["kept_f32"]}
    assert kept == {("scale_up", "range-screen"), ("scale_down", "range-screen")}
    assert data["repair"]["evaluations"] == 1
    assert data["cost"]["mac_low_share"] == 1.0 and data["cost"]["macs_by_precision"]["f16"] == data["cost"]["macs"]
    assert data["by_kind"]["compute"] == {"f16": 2}
    converted = onnx.load(str(out))
    assert {n.name: n.op_type for n in converted.graph.node if n.op_type == "Cast"}  # Casts around the kept pair
    # Numbers: onnxruntime's output of the written model against the original's, on fresh inputs.
    model = onnx.load(str(src))
    feeds = feeds_for(None, model, seed=7)
    np.testing.assert_allclose(run(converted, feeds)[0], run(model, feeds)[0], rtol=2e-2, atol=5e-2)


def test_the_held_out_sets_decide_when_the_choosing_sets_passed(tmp_path: Path) -> None:
    src = _save(tmp_path, "scaled_identity")
    rng = np.random.default_rng(0)
    sets = {f"x#{k}": rng.uniform(-1, 1, (2, 8)).astype(np.float32) for k in range(2)}
    sets |= {f"x#{k}": rng.uniform(3, 4, (2, 8)).astype(np.float32) for k in range(2, 4)}  # past f16 once x 3e4
    np.savez(tmp_path / "sets.npz", **sets)  # type: ignore[arg-type]
    report = tmp_path / "r.json"
    result = rlx(src, "-p", "auto", "-o", tmp_path / "o.onnx", "--inputs", tmp_path / "sets.npz", "--provider", "cpu",
                 "--report-json", report, "-q")
    data = json.loads(report.read_text())
    assert data["repair"]["held_out"] == {"chosen_on": 2, "confirmed_on": 2, "choosing_passed": True}
    assert data["verify"]["samples"] == 2 and not data["verify"]["passed"]
    assert result.returncode == EXIT_DRIFT  # the exit code follows the held-out verdict


def test_min_low_share_fails_a_repair_that_undid_the_conversion(tmp_path: Path) -> None:
    src = _save(tmp_path, "overflow_mlp")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    exact = ("--atol", "0", "--rtol-of-max", "0", "--min-cosine", "1")  # only f32 meets it
    result = rlx(src, "-p", "always-f16", "--repair", *exact, "--min-low-share", "0.5", "-o", out, "--provider", "cpu",
                 "--report-json", report)
    data = json.loads(report.read_text())
    assert data["verify"]["passed"] and data["repair"]["passed"]  # green by keeping everything f32...
    assert data["cost"]["mac_low_share"] == 0.0
    assert data["gate"] == {"min_low_share": 0.5, "low_share": 0.0, "passed": False}
    assert result.returncode == EXIT_LOW_GAIN and out.exists()  # ...which the gate refuses, everything written
    ok = rlx(src, "-p", "auto", "--min-low-share", "0.9", "-o", tmp_path / "a.onnx", "--provider", "cpu", "-q")
    assert ok.returncode == EXIT_OK


@pytest.mark.parametrize("bad", ["1.5", "-0.1"])
def test_min_low_share_is_a_share(tmp_path: Path, bad: str) -> None:
    src = _save(tmp_path, "overflow_mlp")
    result = rlx(src, "--min-low-share", bad, "-o", tmp_path / "o.onnx")
    assert result.returncode == 2 and "--min-low-share" in result.stderr and not (tmp_path / "o.onnx").exists()


def test_auto_needs_its_verification(tmp_path: Path) -> None:
    src = _save(tmp_path, "overflow_mlp")
    result = rlx(src, "-p", "auto", "--no-verify", "-o", tmp_path / "o.onnx")
    assert result.returncode == 2 and "--no-verify" in result.stderr and not (tmp_path / "o.onnx").exists()


def test_what_it_buys_is_in_every_report_and_in_merge_reports(tmp_path: Path) -> None:
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    paths = {kind: tmp_path / f"r.{kind}" for kind in ("json", "md", "html")}
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "o.onnx", "--provider", "cpu", "--target", "cpu",
                 "--report-json", paths["json"], "--report-md", paths["md"], "--report-html", paths["html"])
    assert result.returncode == EXIT_OK, result.stderr
    data = json.loads(paths["json"].read_text())
    files, weights = data["file_bytes"], data["initializer_bytes"]
    assert files["after"] < files["before"] and weights["after"] < weights["before"]
    assert data["cost"]["mac_low_share"] > 0.9 and data["cost"]["weight_bytes"]["f16"] > 0
    latency = data["verify"]["latency"]
    assert latency["provider"] == "cpu" and latency["runs"] == 5
    assert latency["reference_ms"] > 0 and latency["candidate_ms"] > 0
    # The terminal, the Markdown and the HTML page carry the same facts.
    assert "buys: file" in result.stdout and "latency on cpu:" in result.stdout
    md, html = paths["md"].read_text(), paths["html"].read_text()
    assert "Buys: file" in md and "Latency on cpu:" in md and "| speed-up |" in md
    assert "Buys: file" in html and "Latency on cpu:" in html and "<th>speed-up</th>" in html
    merged = tmp_path / "merged.md"
    assert rlx("merge-reports", paths["json"], "--report-md", merged, "-q").returncode == EXIT_OK
    row = next(line for line in merged.read_text().splitlines() if "o.onnx" in line)
    assert row.rstrip(" |").split(" | ")[-2].endswith("x")  # size: the written files over the input's


def test_a_cpu_stand_in_draws_no_speed_conclusion(tmp_path: Path) -> None:
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "o.onnx", "--provider", "cpu")  # target cuda
    line = next(line for line in result.stdout.splitlines() if line.startswith("latency on cpu"))
    assert "stands in for the cuda target: no speed conclusion" in line
    quiet = rlx(src, "-p", "always-f16", "-o", tmp_path / "o2.onnx", "--provider", "cpu", "--latency-runs", "0",
                "--report-json", tmp_path / "r.json")
    assert "latency" not in quiet.stdout and "latency" not in json.loads((tmp_path / "r.json").read_text())["verify"]


def test_a_written_model_slower_on_its_target_says_so_in_one_line(tmp_path: Path) -> None:
    """--target cpu and a candidate measured slower there: the latency line says so; the same
    figures on a stand-in provider draw no conclusion. (The times are set, not raced.)"""
    import dataclasses

    from rlx_onnx_amp.reports.record import Latency
    from rlx_onnx_amp.reports.text import latency_line
    from rlx_onnx_amp.verification import VerifyOptions, verify

    src, out = tmp_path / "block.onnx", tmp_path / "o.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    assert rlx(src, "-p", "always-f16", "-o", out, "--no-verify", "-q").returncode == EXIT_OK
    measured = verify(src, out, VerifyOptions(provider="cpu", latency_runs=0))
    slower = dataclasses.replace(measured, latency=Latency("cpu", 5, 1.0, 2.5, None))
    line = latency_line(slower, "cpu")
    assert line is not None and "0.40x, slower" in line and line.endswith("slower than the original on cpu, its target")
    assert "no speed conclusion" in (latency_line(slower, "cuda") or "")
    faster = dataclasses.replace(measured, latency=Latency("cpu", 5, 2.5, 1.0, None))
    assert "2.50x, faster" in (latency_line(faster, "cpu") or "") and "slower" not in (latency_line(faster, "cpu") or "")

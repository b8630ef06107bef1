"""bench/gpu_check.py in its CPU mode: it runs end to end on the demo model and writes a row per
policy and batch; a model that fails becomes rows with errors, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from fixtures.make_fixtures import HEALTHY

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"
POLICIES = {"always-f16", "auto-mixed-conservative", "auto-mixed", "auto-mixed-bf16"}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _table(stdout: str) -> list[dict[str, str]]:
    """The printed table's rows, as {column: cell}."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    header, *body = ([c.strip() for c in line.split("|")[1:-1]] for line in lines)
    assert header[:4] == ["model", "policy", "batch", "loads"] and header[-1] == "agree"
    return [dict(zip(header, cells)) for cells in body]


def test_cpu_mode_runs_end_to_end_on_the_demo(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--provider", "cpu", "--quick", "--skip-pytest", "--repeats", "2",
         "--warmup", "1", "--models", "demo", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    data = json.loads(out.read_text())
    assert data["exit_code"] == 0 and data["pytest"] is None
    assert data["args"]["model_names"] == ["demo"]
    env = data["environment"]
    assert env["provider"] == "cpu" and env["onnxruntime"] and "CPUExecutionProvider" in env["onnxruntime_providers"]
    assert set(data["policies"]) == POLICIES

    rows = data["rows"]
    # The demo's batch axis is symbolic: every policy at batch 1 and 16.
    assert {(r["policy"], r["batch"]) for r in rows} == {(p, b) for p in POLICIES for b in (1, 16)}
    assert len(rows) == 8
    for r in rows:
        where = f"{r['policy']} batch {r['batch']}"
        assert r["model"] == "demo" and r["errors"] == [], where
        assert isinstance(r["loaded"], bool) and r["loaded"] and r["ran"] and r["converted"], where
        for key in ("ms_f32", "ms_converted", "speedup"):
            assert isinstance(r[key], float) and r[key] > 0, (where, key, r[key])
        assert "agree" in r and r["ok"] is True, where
        assert r["real"]["emulated"] is False and r["emulated"]["emulated"] is True, where
        assert [o["name"] for o in r["outputs_agree"]] == ["y"], where
        assert r["shapes"]["x"] == [r["batch"], 16, 64], where
        if r["batch"] == 1:  # placement: one profiled run each, at the first batch size
            assert r["placement"]["f32"]["CPUExecutionProvider"]["MatMul"] > 0, where
            assert sum(r["placement"]["converted"]["CPUExecutionProvider"].values()) > 0, where

    for r in (r for r in rows if r["policy"] == "always-f16"):
        assert r["agree"] is True and r["real"]["passed"] and r["emulated"]["passed"]
        assert r["real"]["precision"] == "f16"
        real, emulated = r["real"]["outputs"][0], r["emulated"]["outputs"][0]
        assert 0 < real["max_abs"] <= real["bound"] and 0 < emulated["max_abs"] <= emulated["bound"]
    # The table lists every row, with the verdicts and the agreement.
    printed = _table(result.stdout)
    assert len(printed) == 8
    assert all(t["loads"] == "yes" and t["real"] == t["emulated"] == "pass" and t["agree"] == "yes" for t in printed)


def test_a_model_the_provider_cannot_load_is_a_row_and_exit_1(tmp_path: Path) -> None:
    # Converted for CUDA, auto-mixed-bf16 puts bf16 nodes where the CPU provider has no kernel.
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--provider", "cpu", "--target", "cuda", "--repeats", "1", "--warmup", "0",
         "--models", "conv_net", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    data = json.loads(out.read_text())
    assert data["exit_code"] == 1
    rows = {r["policy"]: r for r in data["rows"]}
    assert set(rows) == POLICIES and all(r["batch"] == 1 for r in rows.values())
    assert all("batch axis fixed at 1: batch 16 skipped" in r["notes"] for r in rows.values())
    bf16 = rows["auto-mixed-bf16"]
    assert bf16["converted"] and bf16["conversion"]["target"] == "cuda"
    assert bf16["loaded"] is False and bf16["ok"] is False and bf16["ms_converted"] is None
    assert bf16["ms_f32"] > 0 and bf16["real"] is None and bf16["emulated"]["passed"] is True
    assert any("NOT_IMPLEMENTED" in e for e in bf16["errors"])
    assert all(rows[p]["ok"] for p in POLICIES - {"auto-mixed-bf16"})
    printed = {t["policy"]: t for t in _table(result.stdout)}
    assert printed["auto-mixed-bf16"]["loads"] == "NO" and printed["auto-mixed-bf16"]["ms converted"] == "-"
    assert printed["auto-mixed-bf16"]["real"] == "error" and printed["auto-mixed-bf16"]["agree"] == "-"
    assert printed["always-f16"]["loads"] == "yes" and printed["always-f16"]["agree"] == "yes"


def test_a_failing_model_becomes_error_rows(tmp_path: Path) -> None:
    gpu_check = _load_script()
    broken = gpu_check.Model("bert", "export", error="torch/transformers do not import")
    settings = gpu_check.Settings("cpu", "cpu", 0, 1, tmp_path)
    rows = gpu_check.check_model(broken, settings)
    assert {r["policy"] for r in rows} == POLICIES
    assert all(not r["ok"] and not r["loaded"] and r["errors"] == ["torch/transformers do not import"] for r in rows)
    assert "no conv" in gpu_check.table(rows)

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    rows = gpu_check.check_model(gpu_check.Model("garbage", "fixture", garbage), settings)
    assert len(rows) == 4 and all(not r["ok"] and r["errors"][0].startswith("inputs: ") for r in rows)


def test_fixed_batch_axis_runs_once_and_says_so() -> None:
    gpu_check = _load_script()
    conv = HEALTHY["conv_net"]().model
    assert gpu_check.batch_plan(conv) == ([1], "batch axis fixed at 1: batch 16 skipped")
    block = HEALTHY["transformer_block"]().model
    assert gpu_check.batch_plan(block) == ([1, 16], None)
    assert gpu_check.input_shapes(block, 16) == {"x": (16, 8, 32), "attention_mask": (16, 8)}

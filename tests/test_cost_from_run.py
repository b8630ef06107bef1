"""The cost model at the shapes the reference run produced (issue 51): a `.[cpu]` install has
no sympy, so onnxruntime's symbolic shape inference is not there; where the model ran, every
Compute node's MACs still come from what onnxruntime computed, and inference is left only for
what did not run (`--no-verify`), its gaps counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from fixtures.quantized import WIDTH, contrib_gelu_mlp, write_symbolic_q4
from rlx_onnx_amp.cost import estimate_cost, run_values
from rlx_onnx_amp.exits import EXIT_LOW_GAIN

ROOT = Path(__file__).resolve().parents[1]
BATCH = 4


#: name -> (writer, policy, MACs at batch 4, the class they run in, Compute nodes).
CASES = {
    "q4_mlp": (write_symbolic_q4, "auto-mixed", BATCH * WIDTH * WIDTH * 3, "int4", 3),
    "gelu_mlp": (lambda p: onnx.save(contrib_gelu_mlp(), str(p)), "always-f16", BATCH * (512 * 256 + 256 * 128), "f16", 2),
}


def _without_sympy(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m rlx_onnx_amp ARGS` where `import sympy` fails, as in a fresh `.[cpu]` venv."""
    hide = tmp_path / "hide_sympy"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['sympy'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run([sys.executable, "-c", "import sympy"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "sympy" in probe.stderr  # the environment really lacks it
    return subprocess.run([sys.executable, "-m", "rlx_onnx_amp", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("name", sorted(CASES))
def test_macs_come_from_the_run_without_sympy(tmp_path: Path, name: str) -> None:
    """Before: 0 MACs, every Compute node of unknown shape, exit 5 under --min-low-share."""
    write, policy, macs, cls, nodes = CASES[name]
    src = tmp_path / f"{name}.onnx"
    write(src)
    result = _without_sympy(
        tmp_path, "convert", src, "-o", tmp_path / "out.onnx", "--policy", policy, "--shape", f"x:{BATCH}x"
        + ("64" if name == "q4_mlp" else "512"), "--min-low-share", "0.9", "--report-json", tmp_path / "r.json",
    )
    assert result.returncode == 0, result.stderr
    cost = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert (cost["macs"], cost["unknown_macs_nodes"], cost["run_shaped_nodes"]) == (macs, 0, nodes)
    assert cost["macs_by_precision"][cls] == macs and cost["mac_low_share"] == 1.0
    assert f"cost: {macs / 1e3:.3g} k MACs, 100% low" in result.stdout


def test_without_a_run_the_gaps_are_counted_and_gate_the_exit(tmp_path: Path) -> None:
    """--no-verify: nothing ran, onnx's inference stops at MatMulNBits, and without sympy the
    MACs stay unknown, said so, and --min-low-share exits 5 on "an unknown share"."""
    src = write_symbolic_q4(tmp_path / "q4.onnx")
    result = _without_sympy(tmp_path, "convert", src, "-o", tmp_path / "out.onnx", "--no-verify",
                            "--min-low-share", "0.9", "--report-json", tmp_path / "r.json")
    assert result.returncode == EXIT_LOW_GAIN, result.stderr
    cost = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert (cost["macs"], cost["unknown_macs_nodes"], cost["run_shaped_nodes"]) == (0, 3, 0)
    assert "3 Compute nodes of unknown shape" in result.stdout and "an unknown share" in result.stderr


def test_the_run_shapes_are_used_only_at_the_input_shapes_they_were_seen_at() -> None:
    """Shapes seen at another batch than the one counted at would mix two sizes: unused."""
    model = contrib_gelu_mlp()
    seen = {"x": (2, 512), "g": (2, 512), "h": (2, 256), "r": (2, 256), "y": (2, 128)}
    assert set(run_values(model)) == {"g", "h", "r", "y"}
    at_run = estimate_cost(model, {"x": [2, 512]}, seen)
    assert (at_run.macs, at_run.run_shaped_nodes, at_run.unknown_macs_nodes) == (2 * (512 * 256 + 256 * 128), 2, 0)
    other = estimate_cost(model, {"x": [8, 512]}, seen)
    assert other.run_shaped_nodes == 0
    assert other.macs in (0, 8 * (512 * 256 + 256 * 128))  # inference's (symbolic inference where sympy is)

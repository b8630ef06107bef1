"""CI's check of the user's install (issue 51): in a fresh venv with `pip install -e ".[cpu]"`
only (no test extra, so no sympy unless onnxruntime itself brings it), README's first command
and a conversion of a symbolic-axis model with a contrib op (`fixtures.quantized.contrib_gelu_mlp`)
under `--min-low-share 0.5`, each with a JSON report; exits 1 when either counts no MACs or
leaves a Compute node's MACs unknown. Run from the checkout: `python -m tools.cpu_install_check OUT`
with that venv's python and its `rlx-amp` on PATH."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import onnx

from fixtures.quantized import contrib_gelu_mlp

#: README's quick start, as its first code block gives it after the install.
README_COMMAND = ["rlx-amp", "fixtures/models/demo_transformer.onnx", "--policy", "auto-mixed", "-o"]


def _run(argv: list[str], report: Path) -> list[str]:
    """Run `argv` with a JSON report; the problems with its cost (none: an empty list)."""
    result = subprocess.run([*argv, "--report-json", str(report)], capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        return [f"{' '.join(argv)}: exit {result.returncode}"]
    cost = json.loads(report.read_text())["cost"]
    if not cost["macs"] or cost["unknown_macs_nodes"]:
        return [f"{' '.join(argv)}: {cost['macs']} MACs, {cost['unknown_macs_nodes']} Compute nodes of unknown shape"]
    return []


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    sympy = importlib.util.find_spec("sympy") is not None
    print(f"cpu install check: sympy {'present' if sympy else 'absent'} in this environment")
    problems = _run([*README_COMMAND, str(out / "demo_auto_mixed.onnx")], out / "demo.json")
    model = out / "gelu_mlp.onnx"
    onnx.save(contrib_gelu_mlp(), str(model))
    problems += _run(["rlx-amp", str(model), "--policy", "always-f16", "-o", str(out / "gelu_f16.onnx"),
                      "--min-low-share", "0.5"], out / "gelu.json")
    for problem in problems:
        print(f"cpu install check: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("cpu-install-check")))

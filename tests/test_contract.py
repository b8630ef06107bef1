"""Every promise holds (issue 12): the command line's contract, the reports' one row model, the
Python API, and the rules the code cites (the docs' own checks: tests/test_docs.py)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from tests.helpers import rlx

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "models" / "demo_transformer.onnx"


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# ---- the command line ----------------------------------------------------------------------

def test_batch_converts_every_model_it_can(tmp_path: Path) -> None:
    good = tmp_path / "good.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(good))
    drifting = tmp_path / "drifting.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(drifting))
    broken = tmp_path / "broken.onnx"
    broken.write_text("not a model")
    out = tmp_path / "out"
    out.mkdir()
    result = rlx(good, broken, drifting, "--policy", "always-f16", "--out-dir", out, "--verify", "--no-screen", "--provider", "cpu",
                 "--report-json", tmp_path / "r.json", "--report-md", tmp_path / "r.md")
    assert result.returncode == 2, result.stdout + result.stderr  # the worst of 0, 2 and 1
    assert f"rlx-amp: error: {broken}: not a valid ONNX model" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["drifting.onnx", "good.onnx"]
    assert "1 of 3 models passed; failed: " in result.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert [m["model"] for m in data["models"]] == [str(good), str(drifting)]
    error = next(line for line in result.stderr.splitlines() if line.startswith("rlx-amp: error: "))
    assert data["failed"] == [{"model": str(broken), "error": error.removeprefix("rlx-amp: error: "), "exit_code": 2}]
    assert data["passed"] is False and data["exit_code"] == 2
    md = (tmp_path / "r.md").read_text()
    assert "**ERROR**" in md and "broken.onnx" in md and "**FAIL**" in md


def test_a_mistyped_subcommand_says_so(tmp_path: Path) -> None:
    result = rlx("inpsect", DEMO)
    assert result.returncode == 2
    assert _one_line(result) == "rlx-amp: error: no command 'inpsect'; did you mean 'inspect'? (a model file 'inpsect' does not exist)"


@pytest.mark.parametrize(("args", "expect"), [
    (["--no-verify", "--atol", "0.1"], "--atol does nothing with --no-verify"),
    (["--no-verify", "--localize"], "--localize does nothing with --no-verify"),
    (["--verify", "--repair-budget", "3"], "--repair-budget needs --repair"),
    (["--policy", "custom", "--map", "boundary=f16"], "boundary=f16 would do nothing"),
    (["--verify", "--atol", "nosuch:0.1"], "has no output 'nosuch'"),
    (["--verify", "--min-cosine", "1.5"], "--min-cosine: expected a finite number in [-1, 1]"),
    (["--verify", "--rtol", "-0.1"], "--rtol: expected a finite number at least 0"),
    (["--verify", "--shape", "x:1x2x3x4x5"], "synthesized inputs (--shape): input 'x': got rank 5"),
])
def test_options_that_would_do_nothing_are_errors(tmp_path: Path, args: list[str], expect: str) -> None:
    result = rlx(DEMO, "-o", tmp_path / "o.onnx", *args)
    assert result.returncode == 2, result.stderr
    assert expect in _one_line(result)
    assert not (tmp_path / "o.onnx").exists()


def test_options_that_match_nothing_in_a_model_warn(tmp_path: Path) -> None:
    result = rlx(DEMO, "-o", tmp_path / "o.onnx", "--keep-f32-op", "Softmx", "--data-name", "w.bin", "-q")
    assert result.returncode == 0
    assert "rlx-amp: warning: --keep-f32-op Softmx: " in result.stderr and "(close: Softmax)" in result.stderr
    assert "rlx-amp: warning: --data-name w.bin: " in result.stderr and "without external data" in result.stderr


def test_quiet_still_prints_a_failing_verdict(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    failing = rlx(src, "--policy", "always-f16", "-o", tmp_path / "o.onnx", "--verify", "--no-screen", "-q")
    assert failing.returncode == 1
    assert failing.stdout.strip() == f"FAILED {tmp_path / 'o.onnx'}: y (finite, max-scaled, cosine)", failing.stdout
    passing = rlx(DEMO, "-o", tmp_path / "p.onnx", "--verify", "-q")
    assert passing.returncode == 0 and passing.stdout == "" and passing.stderr == ""


def test_verbose_logs_kept_nodes_and_casts(tmp_path: Path) -> None:
    result = rlx(DEMO, "--policy", "always-f16", "-o", tmp_path / "o.onnx", "--keep-f32-op", "Softmax", "-v")
    assert result.returncode == 0
    assert re.search(r"kept f32: \S+ \(Softmax, path \d+\): user: --keep-f32-op Softmax", result.stderr), result.stderr
    assert re.search(r"\d+ Casts inserted, 1 nodes kept f32", result.stderr)


def test_save_inputs_round_trips_every_sample(tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    assert rlx(DEMO, "--policy", "always-f16", "-o", out, "-q").returncode == 0
    first = rlx("verify", DEMO, out, "--samples", "3", "--seed", "7", "--save-inputs", tmp_path / "in.npz",
                "--report-json", tmp_path / "a.json")
    assert first.returncode == 0, first.stderr
    with np.load(tmp_path / "in.npz") as saved:
        assert sorted(saved.files) == ["attention_mask", "attention_mask#1", "attention_mask#2", "x", "x#1", "x#2"]
    again = rlx("verify", DEMO, out, "--inputs", tmp_path / "in.npz", "--report-json", tmp_path / "b.json")
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((tmp_path / n).read_text())["verify"] for n in ("a.json", "b.json"))
    assert b["samples"] == 3
    assert a["outputs"] == b["outputs"]  # the same three input sets, replayed


def test_inputs_from_a_polygraphy_json_file(tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    assert rlx(DEMO, "--policy", "always-f16", "-o", out, "-q").returncode == 0
    assert rlx("verify", DEMO, out, "--samples", "2", "--save-inputs", tmp_path / "in.npz", "--report-json",
               tmp_path / "a.json").returncode == 0
    with np.load(tmp_path / "in.npz") as saved:
        names = ("x", "attention_mask")
        sets = [{n: saved[n] for n in names}, {n: saved[f"{n}#1"] for n in names}]

    def encode(array: np.ndarray) -> dict[str, str]:  # as Polygraphy's JSON encoder writes arrays
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}

    (tmp_path / "inputs.json").write_text(json.dumps([{n: encode(v) for n, v in s.items()} for s in sets]))
    result = rlx("verify", DEMO, out, "--inputs", tmp_path / "inputs.json", "--report-json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    a, b = (json.loads((tmp_path / n).read_text())["verify"] for n in ("a.json", "b.json"))
    assert a["outputs"] == b["outputs"] and b["samples"] == 2


def test_rtol_means_what_peers_mean(tmp_path: Path) -> None:
    """`--rtol` is element-wise, as in Polygraphy and np.allclose: with --atol 1e-2 --rtol 1e-2
    the demo's always-f16 output fails (as it does in Polygraphy), while the default max-scaled
    check passes it; the report says which check decided and what would have passed."""
    out = tmp_path / "o.onnx"
    assert rlx(DEMO, "--policy", "always-f16", "-o", out, "-q").returncode == 0
    default = rlx("verify", DEMO, out, "--report-json", tmp_path / "d.json")
    assert default.returncode == 0
    strict = rlx("verify", DEMO, out, "--atol", "1e-2", "--rtol", "1e-2", "--report-json", tmp_path / "s.json")
    assert strict.returncode == 1, strict.stdout
    report = json.loads((tmp_path / "s.json").read_text())["verify"]
    (output,) = report["outputs"]
    assert output["failed_checks"] == ["element-wise"] and "element-wise" in report["criterion"]
    assert output["rtol"] == 1e-2 and output["rtol_of_max"] == 1e-2
    # The element-wise check by hand, as np.allclose would judge it.
    assert output["required"]["atol"] == pytest.approx(output["max_abs"])
    assert "minimum tolerances:" in strict.stdout and "--rtol y:" in strict.stdout
    assert "bound" in strict.stdout.splitlines()[1]


# ---- reports: one row model ----------------------------------------------------------------

def test_text_markdown_and_json_share_the_drift_columns(tmp_path: Path) -> None:
    from rlx_onnx_amp.reports.text import DRIFT_COLUMNS

    out = tmp_path / "o.onnx"
    result = rlx(DEMO, "--policy", "always-f16", "-o", out, "--verify", "-v", "--report-json", tmp_path / "r.json",
                 "--report-md", tmp_path / "r.md")
    assert result.returncode == 0, result.stderr
    headers = [c.header for c in DRIFT_COLUMNS]
    text_header = next(line for line in result.stdout.splitlines() if line.startswith("output "))
    assert text_header.split() == " ".join(headers).split()
    md = (tmp_path / "r.md").read_text()
    assert "| " + " | ".join(headers) + " |" in md
    for c in DRIFT_COLUMNS:  # every column is explained, and every value is in the JSON report
        assert f"**{c.header}**: {c.legend}" in md and f"{c.header}: {c.legend}" in result.stdout
    (output,) = json.loads((tmp_path / "r.json").read_text())["verify"]["outputs"]
    assert {c.json_key for c in DRIFT_COLUMNS} <= set(output)
    assert "### Conversion" in md and "Casts inserted" in md


def test_markdown_carries_why_and_the_repair(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    assert rlx(src, "--policy", "always-f16", "-o", tmp_path / "v.onnx", "--verify", "--no-screen", "--report-md", tmp_path / "v.md").returncode == 1
    assert "new NaN" in (tmp_path / "v.md").read_text()  # the why column
    assert rlx(src, "--policy", "always-f16", "-o", tmp_path / "r.onnx", "--repair", "--report-md", tmp_path / "r.md").returncode == 0
    md = (tmp_path / "r.md").read_text()
    assert "### Repair" in md and "magnitude screen" in md and "minimality checked" in md


def test_cosine_prints_enough_digits() -> None:
    from rlx_onnx_amp.reports.record import OutputResult
    from rlx_onnx_amp.reports.text import DRIFT_COLUMNS
    from rlx_onnx_amp.verification import Tolerance, compare_arrays

    def output(cosine: float) -> OutputResult:
        measured = compare_arrays("y", np.array([1.0, 0.0]), np.array([1.0, 0.0]), Tolerance(1e-2, 1e-2, 0.999))
        return dataclasses.replace(measured, cosine=cosine)

    column = next(c for c in DRIFT_COLUMNS if c.header == "cosine")
    assert column.cell(output(0.9999997)) == "0.9999997"
    assert column.cell(output(1.0)) == "1"


def test_max_rel_is_not_blown_up_by_near_zero_references() -> None:
    from rlx_onnx_amp.verification.metrics import compare_arrays
    from rlx_onnx_amp.verification.tolerance import Tolerance

    ref = np.array([1e-9, 1.0, -2.0], np.float32)
    cand = np.array([2e-4, 1.001, -2.002], np.float32)
    drift = compare_arrays("y", ref, cand, Tolerance(1e-2, 1e-2, 0.999))
    assert drift.max_rel == pytest.approx(0.02, rel=1e-3)  # 2e-4 / max(1e-9, atol 1e-2), not 2e5
    assert drift.passed


# ---- the Python API ------------------------------------------------------------------------

def test_api_takes_the_same_options_everywhere(tmp_path: Path) -> None:
    import rlx_onnx_amp as amp

    report = amp.convert_file(DEMO, tmp_path / "o.onnx", "custom", kind_map={"compute": "f16"}, keep_f32_ops=["Softmax"],
                              target="cpu")
    assert report.by_op["Softmax"] == {"f32": 1} and report.by_kind["compute"] == {"f16": 8}
    with pytest.raises(amp.PolicyError, match="kind_map: unknown kind 'matmul'"):
        amp.convert(DEMO, "custom", kind_map={"matmul": "f16"})
    with pytest.raises(amp.PolicyError, match="unknown precision 'fp8'"):
        amp.convert_file(DEMO, tmp_path / "p.onnx", "custom", kind_map={"compute": "fp8"})
    assert not (tmp_path / "p.onnx").exists()


# ---- docs ----------------------------------------------------------------------------------
# (README's and the docs pages' own checks are in tests/test_docs.py.)

def test_design_rules_cited_in_code_exist() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    cited = set()
    for path in (REPO / "rlx_onnx_amp").rglob("*.py"):
        cited |= set(re.findall(r"\brule ([a-z][a-z-]+[a-z])", path.read_text()))
    assert cited, "no rule citations found"
    # A rule is a bullet (**name**) or a row of the keep-rule and variable-rule tables.
    missing = sorted(name for name in cited if f"**{name}**" not in design and f"| `{name}` |" not in design)
    assert not missing, f"comments cite rules docs/design.md does not name: {missing}"


def test_no_module_shares_a_public_function_name() -> None:
    """`rlx_onnx_amp.convert` is the function, not a module that importing shadows it with."""
    import importlib
    import pkgutil

    import rlx_onnx_amp

    modules = {m.name for m in pkgutil.iter_modules(rlx_onnx_amp.__path__)}
    clashes = sorted(name for name in rlx_onnx_amp.__all__ if name in modules)
    assert not clashes, clashes
    importlib.import_module("rlx_onnx_amp.verification.compare")  # importing submodules changes nothing
    importlib.import_module("rlx_onnx_amp.rewrite")
    assert callable(rlx_onnx_amp.convert) and callable(rlx_onnx_amp.verify)


def test_one_onnxruntime_per_install() -> None:
    """onnxruntime comes from the [cpu] or [gpu] extra, never from the base dependencies, so a
    CUDA user gets onnxruntime-gpu alone (the two wheels install the same module)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def runtimes(requirements: list[str]) -> set[str]:
        return {r.name for r in map(Requirement, requirements) if r.name.startswith("onnxruntime") and r.name != "onnxruntime-genai"}

    extras = project["optional-dependencies"]
    assert runtimes(project["dependencies"]) == set()
    assert runtimes(extras["cpu"]) == {"onnxruntime"} and runtimes(extras["gpu"]) == {"onnxruntime-gpu"}


def test_without_onnxruntime_the_command_says_which_extra(tmp_path: Path) -> None:
    hide = (
        "import builtins, sys\n"
        "real = builtins.__import__\n"
        "def hidden(name, *a, **k):\n"
        "    if name.split('.')[0] == 'onnxruntime':\n"
        "        raise ModuleNotFoundError(\"No module named 'onnxruntime'\", name='onnxruntime')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = hidden\n"
        "from rlx_onnx_amp.__main__ import main\n"
        "main(['demo', 'demo.onnx'])\n"
    )
    result = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "rlx-amp: error: onnxruntime is not installed: pip install 'rlx-onnx-amp[cpu]' "
        "(or 'rlx-onnx-amp[gpu]' for onnxruntime-gpu and its CUDA provider)"
    )
    assert not (tmp_path / "demo.onnx").exists()


def _run_command(tmp_path: Path, before: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`rlx_onnx_amp.__main__.run` (what the `rlx-amp` script calls) on ARGV in a fresh
    interpreter, after the Python lines `before`."""
    code = f"import sys\n{before}\nsys.argv = ['rlx-amp', *{list(argv)!r}]\nfrom rlx_onnx_amp.__main__ import run\nrun()\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as a user has it
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_the_command_ends_after_atexit_handlers_and_flushed_streams(tmp_path: Path) -> None:
    # What an exit must do happens once the run is over (atexit handlers, logging's and the
    # streams' flush), and the run's exit code is kept.
    before = "import atexit\natexit.register(lambda: open('atexit-ran', 'w').write('yes') and print('atexit printed'))"
    made = _run_command(tmp_path, before, "demo", "demo.onnx")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "atexit-ran").read_text() == "yes" and made.stdout.endswith("atexit printed\n")
    assert onnx.load(str(tmp_path / "demo.onnx")).graph.node
    before = "print('before the run', flush=False)"  # stdout is a pipe: block-buffered
    inspected = _run_command(tmp_path, before, "inspect", "demo.onnx")
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout.startswith("before the run\n") and "demo.onnx" in inspected.stdout
    logged = _run_command(tmp_path, "", "demo.onnx", "-o", "out.onnx", "--no-verify", "-v")
    assert logged.returncode == 0, logged.stderr
    assert "Casts inserted" in logged.stderr and onnx.load(str(tmp_path / "out.onnx")).graph.node
    failed = _run_command(tmp_path, "", "inspect", "missing.onnx")
    assert failed.returncode == 2 and failed.stderr.strip() == "rlx-amp: error: missing.onnx: no such file"

"""No onnxruntime crash takes rlx-amp down (issue 49): each model runs under a supervisor
(`supervise.run_contained`), so a crash anywhere in its run (the reference, the screen, the proof's
load, the conversion, the verification, a search's candidates) is that model's exit 3 with one
line naming what crashed, and nothing of it is left beside the outputs or in TMPDIR.

Two ways in: the real crash (a two-node model onnxruntime 1.32's CPU provider dies on while it
makes the session), and, so that containment stays proven whatever onnxruntime does, a run whose
child kills itself with SIGSEGV at a chosen stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp import contain
from rlx_onnx_amp.errors import ModelRunError
from rlx_onnx_amp.files import OutputSet
from rlx_onnx_amp.supervise import run_contained
from tests.helpers import rlx

DEMO = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "demo_transformer.onnx"


def _transpose_matmul(path: Path) -> Path:
    """Transpose(perm 1,0,2) -> MatMul with a 256x59 weight, input 8x1x256, its output declared
    without a shape (as some exporters write it): it fails onnx.checker, and onnxruntime 1.32's
    CPU provider dies of SIGSEGV creating its session."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 59)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1, 256])
    y = onnx.ValueInfoProto()
    y.name = "y"
    y.type.tensor_type.elem_type = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]), helper.make_node("MatMul", ["t", "w"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "tm", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _onnxruntime_crashes_on(path: Path) -> bool:
    """Whether onnxruntime's CPU provider dies making a session on the model's always-f16
    conversion (onnxruntime 1.32.0 does; the input itself loads)."""
    code = (
        "import sys, onnx, onnxruntime as ort, rlx_onnx_amp\n"
        f"m = rlx_onnx_amp.convert(onnx.load({str(path)!r}), 'always-f16', check=False)\n"
        "ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode < 0


def _leftovers(*dirs: Path) -> list[str]:
    """Every entry in `dirs` (hidden ones too) that a run of rlx-amp made: staging, scratch."""
    return sorted(str(p) for d in dirs for p in d.iterdir() if p.name.startswith((".rlx-amp", "rlx-amp", "pymp-")))


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR of the test's own, to see what a run leaves there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


@pytest.mark.parametrize("extra", [["--target", "cpu"], [], ["--no-verify"]], ids=["target-cpu", "default", "no-verify"])
def test_the_two_node_crash_is_exit_3_with_one_line_and_nothing_left(tmp_path: Path, tmpdir_env: Path,
                                                                      extra: list[str]) -> None:
    model = _transpose_matmul(tmp_path / "tm.onnx")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "rlx_onnx_amp", str(model), "--policy", "always-f16", *extra,
                           "-o", str(out / "tm16.onnx")], capture_output=True, text=True, timeout=300)
    assert done.returncode >= 0, f"rlx-amp died of signal {-done.returncode}"  # never the tool's own death
    if _onnxruntime_crashes_on(model):
        assert done.returncode == 3, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("rlx-amp: error:")]
        assert len(errors) == 1 and "tm.onnx" in errors[0] and "SIGSEGV" in errors[0], done.stderr
        assert "onnxruntime crashed" in errors[0] and "Traceback" not in done.stderr
    else:  # a later onnxruntime that runs it: the run ends as any other (containment: the tests below)
        assert done.returncode in (0, 1, 2, 4), done.stderr
    if done.returncode != 0:
        assert list(out.iterdir()) == []  # nothing written, no hidden staging
    assert _leftovers(tmpdir_env) == []


def _crashing_at(monkeypatch: pytest.MonkeyPatch, target: str, note: str, only: str | None = None) -> None:
    """Make the function `target` (module:attribute) kill its process with SIGSEGV, as
    onnxruntime's C++ can, after its work and after a `contain.note` (for `only`: on that model)."""
    module_name, _, attribute = target.partition(":")
    module = sys.modules[module_name]
    real: Callable[..., Any] = getattr(module, attribute)

    def crashing(*args: Any, **kwargs: Any) -> Any:
        value = real(*args, **kwargs)
        if only is None or only in str(args[0]):
            contain.note(note)
            os.kill(os.getpid(), signal.SIGSEGV)
        return value

    monkeypatch.setattr(module, attribute, crashing)


@pytest.mark.parametrize(
    "target, note",
    [
        ("rlx_onnx_amp.verification.reference:prepare_reference", "running the input on CPUExecutionProvider"),
        ("rlx_onnx_amp.pipeline:stage_conversion", "loading the converted model on CPUExecutionProvider"),
        ("rlx_onnx_amp.verification.core:verify", "running a candidate on CPUExecutionProvider"),
    ],
    ids=["reference", "staged-output", "verification"],
)
def test_a_crash_at_any_stage_is_exit_3_and_leaves_nothing(tmp_path: Path, tmpdir_env: Path,
                                                           monkeypatch: pytest.MonkeyPatch, target: str,
                                                           note: str) -> None:
    import rlx_onnx_amp.pipeline
    import rlx_onnx_amp.verification.core
    import rlx_onnx_amp.verification.reference  # noqa: F401

    _crashing_at(monkeypatch, target, note)
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "r.json"
    done = rlx(DEMO, "-o", out / "d16.onnx", "--report-json", report)
    assert done.returncode == 3, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlx-amp: error:")]
    assert errors == [f"rlx-amp: error: {DEMO}: onnxruntime crashed (signal 11 (SIGSEGV)) {note}; nothing written"]
    assert list(out.iterdir()) == [] and not report.exists()
    assert _leftovers(tmpdir_env, tmp_path) == []


def test_a_batch_goes_on_past_a_model_that_crashes(tmp_path: Path, tmpdir_env: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_onnx_amp.verification.reference  # noqa: F401

    crashes, runs = tmp_path / "crashes.onnx", tmp_path / "runs.onnx"
    crashes.write_bytes(DEMO.read_bytes())
    runs.write_bytes(DEMO.read_bytes())
    _crashing_at(monkeypatch, "rlx_onnx_amp.verification.reference:prepare_reference", "running the input",
                 only="crashes.onnx")
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "r.json"
    done = rlx(crashes, runs, "--out-dir", out, "--report-json", report)
    assert done.returncode == 3, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["runs.onnx"]  # the other model is written
    data = json.loads(report.read_text())
    assert [f["exit_code"] for f in data["failed"]] == [3] and "onnxruntime crashed" in data["failed"][0]["error"]
    assert [m["model"] for m in data["models"]] == [str(runs)] and data["models"][0]["verify"]["passed"]
    assert _leftovers(tmpdir_env, tmp_path) == []


def test_a_jobs_pool_goes_on_past_the_real_crash(tmp_path: Path, tmpdir_env: Path) -> None:
    model = _transpose_matmul(tmp_path / "tm.onnx")
    demo = tmp_path / "demo.onnx"
    demo.write_bytes(DEMO.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "rlx_onnx_amp", str(model), str(demo), "--jobs", "2",
                           "--policy", "always-f16", "--target", "cpu", "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode >= 0 and "demo.onnx" in {p.name for p in out.iterdir()}, done.stderr
    if _onnxruntime_crashes_on(model):
        assert done.returncode == 3 and "onnxruntime crashed" in done.stderr, done.stderr
    assert _leftovers(tmpdir_env, out) == []


def _segfault_after_staging(outputs: OutputSet, final: Path) -> None:
    outputs.write_text(final, "half")
    contain.note("running the written file on CPUExecutionProvider")
    os.kill(os.getpid(), signal.SIGSEGV)


def _stage(outputs: OutputSet, final: Path) -> str:
    outputs.write_text(final, "whole")
    return "done"


def test_the_supervisor_adopts_what_a_child_staged_and_removes_what_a_crash_left(tmp_path: Path) -> None:
    final = tmp_path / "out.txt"
    with OutputSet() as outputs:
        with pytest.raises(ModelRunError, match=r"^m\.onnx: onnxruntime crashed \(signal 11 \(SIGSEGV\)\) running the "
                                                r"written file on CPUExecutionProvider; nothing written$"):
            run_contained(_segfault_after_staging, (outputs, final), outputs, label="m.onnx")
        assert _leftovers(tmp_path) == []  # the child's staging directory is gone
        assert run_contained(_stage, (outputs, final), outputs, label="m.onnx") == "done"
        outputs.commit()
    assert final.read_text() == "whole" and _leftovers(tmp_path) == []


def test_the_verify_command_is_contained_too(tmp_path: Path) -> None:
    import rlx_onnx_amp

    model = _transpose_matmul(tmp_path / "tm.onnx")
    f16 = tmp_path / "tm16.onnx"
    onnx.save(rlx_onnx_amp.convert(onnx.load(str(model)), "always-f16", check=False), str(f16))
    done = subprocess.run([sys.executable, "-m", "rlx_onnx_amp", "verify", str(model), str(f16), "--no-emulate"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode >= 0, done.stderr
    if _onnxruntime_crashes_on(model):
        assert done.returncode == 3 and "onnxruntime crashed" in done.stderr, done.stderr

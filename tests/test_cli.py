"""The command line: conversions, reports, and one clear line for every kind of bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import HEALTHY, write_external
from tests.helpers import rlx

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "models" / "demo_transformer.onnx"
#: A hang guard, not a budget: a loaded machine must never trip it.
HANG_S = 600


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(path))
    return path


def test_demo_model_is_what_the_fixture_script_writes(tmp_path: Path) -> None:
    from fixtures.make_fixtures import write_all

    written = {p.name: p for p in write_all(tmp_path)}
    assert _digest(written["demo_transformer.onnx"]) == _digest(DEMO)


def test_convert_writes_model_and_report(model: Path, tmp_path: Path) -> None:
    before = _digest(model)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    result = rlx(str(model), "--policy", "auto-mixed", "-o", str(out), "--report-json", str(report))
    assert result.returncode == 0, result.stderr
    assert "casts inserted" in result.stdout and "elementwise" in result.stdout
    onnx.checker.check_model(str(out), full_check=True)
    data = json.loads(report.read_text())
    assert data["policy"]["name"] == "auto-mixed" and data["output"] == str(out)
    assert data["nodes"]["total"] == 37 and data["nodes"]["by_precision"]["f16"] > 0
    assert data["by_kind"]["compute"] == {"f32": 8}
    assert _digest(model) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_custom_policy_map_and_map_file(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    result = rlx(str(model), "--policy", "custom", "--map", "compute=f16", "-o", str(out), "--report-json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    by_kind = json.loads((tmp_path / "r.json").read_text())["by_kind"]
    assert by_kind["compute"] == {"f16": 8} and "f16" not in by_kind["reduction"]
    (tmp_path / "map.toml").write_text('reduction = "f16"\n')
    result = rlx(str(model), "--policy", "custom", "--map-file", str(tmp_path / "map.toml"), "-o", str(out), "--report-json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["by_kind"]["reduction"] == {"f16": 3}


def test_external_data_output(tmp_path: Path) -> None:
    src = write_external(HEALTHY["mlp_external"](), tmp_path / "mlp.onnx")
    out = tmp_path / "out" / "mlp16.onnx"
    out.parent.mkdir()
    result = rlx(str(src), "--policy", "always-f16", "-o", str(out), "--data-name", "weights.bin", "-q")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert (out.parent / "weights.bin").stat().st_size > 200_000
    onnx.checker.check_model(str(out), full_check=True)


def test_batch_out_dir(model: Path, tmp_path: Path) -> None:
    second = tmp_path / "conv.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(second))
    outdir = tmp_path / "converted"
    outdir.mkdir()
    result = rlx(str(model), str(second), "--policy", "always-f16", "--out-dir", str(outdir), "--report-json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in outdir.iterdir()) == ["conv.onnx", "model.onnx"]
    assert len(json.loads((tmp_path / "r.json").read_text())["models"]) == 2


def test_target_decides_bf16_kernels(model: Path, tmp_path: Path) -> None:
    reports = {}
    for target in ("cuda", "cpu"):
        out, report = tmp_path / f"{target}.onnx", tmp_path / f"{target}.json"
        result = rlx(str(model), "--policy", "auto-mixed-bf16", "--target", target, "-o", str(out), "--report-json", str(report))
        assert result.returncode == 0, result.stderr
        assert f"target {target}" in result.stdout
        reports[target] = json.loads(report.read_text())
        assert reports[target]["target"] == target
    # CUDA has bf16 MatMul kernels, onnxruntime's CPU provider has none.
    assert reports["cuda"]["by_op"]["MatMul"] == {"bf16": 8}
    assert reports["cpu"]["by_op"]["MatMul"] == {"f32": 8}
    # The rule's code, stable whatever the wording of its reason (which names the provider).
    kept = [k for k in reports["cpu"]["kept_f32"] if k["op"] == "MatMul"]
    assert len(kept) == 8 and {k["code"] for k in kept} == {"kernel-table"}, kept
    assert all("CPUExecutionProvider" in k["reason"] for k in kept), kept
    import onnxruntime as ort

    ort.InferenceSession(str(tmp_path / "cpu.onnx"), providers=["CPUExecutionProvider"])  # loads for real
    # inspect answers for the same target without writing anything
    shown = json.loads(rlx("inspect", str(model), "--policy", "auto-mixed-bf16", "--target", "cpu", "--json").stdout)
    assert shown["target"] == "cpu" and shown["by_op"]["MatMul"] == {"f32": 8}


def test_inspect(model: Path, tmp_path: Path) -> None:
    result = rlx("inspect", str(model), "--policy", "auto-mixed", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["by_op"]["MatMul"] == {"f32": 8} and data["by_op"]["Softmax"] == {"f16": 1}
    assert data["nodes"]["total"] == 37
    # 18 nodes stay f32: the Cast keeps its `to`, the policy runs the other 17's kinds at f32
    assert data["by_rule"] == {"source-follows-consumers": 1, "cast-keeps-to": 1, "policy-f32": 17}
    text = rlx("inspect", str(model))
    assert text.returncode == 0 and "LayerNormalization" in text.stdout
    # The by-rule table's row: the code, its count and what it means (whatever the padding).
    rows = [line.split(None, 2) for line in text.stdout.splitlines() if line.strip().startswith("policy-f32 ")]
    assert rows == [["policy-f32", "17", "the policy runs its kind at f32"]], text.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]  # nothing written


def _bad(tmp_path: Path, *args: str, expect: str | tuple[str, ...], code: int = 2) -> None:
    """Exit CODE, one line on stderr holding every key phrase of EXPECT, nothing written."""
    before = sorted(p.name for p in tmp_path.iterdir())
    result = rlx(*args)
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for phrase in (expect,) if isinstance(expect, str) else expect:
        assert phrase in lines[0], (phrase, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a partial output was left"


def test_bad_inputs(model: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "out.onnx")
    _bad(tmp_path, str(tmp_path / "missing.onnx"), "-o", out, expect="missing.onnx: no such file")
    (tmp_path / "text.onnx").write_text("this is not a model")
    _bad(tmp_path, str(tmp_path / "text.onnx"), "-o", out, expect="text.onnx: not a valid ONNX model")
    data = model.read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 2])
    _bad(tmp_path, str(tmp_path / "truncated.onnx"), "-o", out, expect="truncated.onnx: not a valid ONNX model")
    _bad(tmp_path, str(model), "--policy", "fastest", "-o", out, expect="unknown policy 'fastest'")
    _bad(tmp_path, str(model), "--policy", "custom", "--map", "matmul=f16", "-o", out, expect="unknown kind 'matmul'")
    _bad(tmp_path, str(model), "--target", "tpu", "-o", out, expect="unknown target 'tpu' (known: cpu, cuda)")
    _bad(tmp_path, str(model), "-o", str(tmp_path / "no" / "such" / "dir.onnx"), expect="does not exist")
    _bad(tmp_path, str(model), "-o", str(model), expect=(f"{model}:", "would overwrite the input"))
    _bad(tmp_path, str(model), expect="missing -o/--output")
    assert _digest(model) == hashlib.sha256(data).hexdigest()


# An unwritable output directory (a read-only mount, so it holds for root too) is in
# tests/test_files.py::test_read_only_model_directory.


def test_output_path_that_is_a_file_in_a_file(model: Path, tmp_path: Path) -> None:
    # A parent "directory" that is a file cannot be written, even by root.
    _bad(tmp_path, str(model), "-o", str(model / "out.onnx"), expect="does not exist")


def test_missing_and_short_external_data(tmp_path: Path) -> None:
    src = write_external(HEALTHY["mlp_external"](), tmp_path / "mlp.onnx")
    data = tmp_path / "mlp.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[: len(content) // 3])
    _bad(tmp_path, str(src), "-o", str(tmp_path / "out.onnx"), expect="is too short for the tensor")
    data.unlink()
    _bad(tmp_path, str(src), "-o", str(tmp_path / "out.onnx"), expect=("'mlp.onnx.data'", "no such file"))


def _rlx_on_terminal(*args: str) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout piped): (exit code, stdout, terminal text)."""
    import pty
    import select

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rlx_onnx_amp", *args], stdout=subprocess.PIPE,
                            stderr=follower, stdin=subprocess.DEVNULL, text=True)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], HANG_S)
        if not ready:
            proc.kill()
            raise AssertionError(f"the CLI wrote nothing to its terminal for {HANG_S} s (a hang?)")
        try:
            data = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    stdout, _ = proc.communicate(timeout=HANG_S)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """Issue 4: a progress bar on long work (converting, verifying) when stderr is a terminal;
    none under --quiet or when stderr is piped. The conversion bar starts at 64 MiB of weights,
    so the model has 68 MiB."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((4352, 4096)).astype(np.float32)  # 68 MiB
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4352, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4352, 4096])],
                              [numpy_helper.from_array(weight, "w")])
    src = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src),
              save_as_external_data=True, location="big.onnx.data")
    # The conversion's bar (--no-verify: verifying 68 MiB of Add proves nothing here; the
    # verification's bars are checked on the demo below).
    code, _, terminal = _rlx_on_terminal(str(src), "--policy", "always-f16", "-o", str(tmp_path / "out.onnx"), "--no-verify")
    assert code == 0 and "converting big.onnx" in terminal and "100%" in terminal, terminal
    code, _, terminal = _rlx_on_terminal(str(src), "--policy", "always-f16", "-o", str(tmp_path / "quiet.onnx"), "-q",
                                         "--no-verify")
    assert code == 0 and terminal == ""
    piped = rlx(str(src), "--policy", "always-f16", "-o", str(tmp_path / "piped.onnx"), "--no-verify")
    assert piped.returncode == 0 and "%" not in piped.stderr and "\r" not in piped.stderr  # no bar: a line per stage
    assert re.search(r"^rlx-amp: .*big\.onnx: converting: \d+\.\d s$", piped.stderr, re.M), piped.stderr
    # Verifying: a bar per stage long enough to watch (here 4 input sets run through both models).
    small = tmp_path / "demo16.onnx"
    assert rlx(str(DEMO), "--policy", "always-f16", "-o", str(small), "-q").returncode == 0
    code, stdout, terminal = _rlx_on_terminal("verify", str(DEMO), str(small), "--samples", "4")
    assert code == 0 and "PASS" in stdout and "verifying" in terminal and "running" in terminal and "100%" in terminal, terminal
    code, _, terminal = _rlx_on_terminal("verify", str(DEMO), str(small), "--samples", "4", "-q")
    assert code == 0 and terminal == ""


def _wide_conv(path: Path) -> Path:
    """x (1x1xT, T symbolic) -> Conv with a kernel of 600 -> y: wider than any size synthesis
    tries for T (64, 32, 16, 8, 256, 512)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (1, 1, 600)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "wide_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, None])], [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_a_reference_that_cannot_run_on_guessed_axes_says_to_give_their_sizes(tmp_path: Path, command: str) -> None:
    """The reference is fine; the synthesized input (T = 64, then 32, 16, 8, 256, 512) is shorter than its
    kernel. That is an input error naming the guessed shapes and --shape, in one line (no
    onnxruntime log line), with nothing written; the sizes given, the same run passes."""
    src = _wide_conv(tmp_path / "conv.onnx")
    flags = ("--verify",) if command == "verify" else ("--repair", "--verify")  # --verify: the proof or an error
    args = (str(src), "--policy", "always-f16", "-o", str(tmp_path / "out.onnx"), *flags, "--provider", "cpu", "-q")
    _bad(tmp_path, *args, expect=("axes were guessed", "(x 1x1x64; x also tried at 1x1x32, 1x1x16, 1x1x8, 1x1x256, 1x1x512)",
                                      "--shape"))
    result = rlx(*args, "--shape", "x:1x1x640")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.onnx").is_file()

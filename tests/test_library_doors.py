"""One pipeline behind every door (issue 49): the library's `convert`, `convert_file` and `run`
keep f32 the nodes the command keeps (the range screen, on by default), `screen=False` is the
rewrite alone, and `run` answers what the command answers for one model."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import onnx
import pytest

import rlx_onnx_amp as amp
from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from tests.helpers import rlx


def _kept_by_command(src: Path, tmp_path: Path) -> list[tuple[str, str]]:
    report = tmp_path / "r.json"
    done = rlx(src, "-p", "always-f16", "-o", tmp_path / "cli.onnx", "-q", "--report-json", report)
    assert done.returncode == 0, done.stderr
    return sorted((k["node"], k["reason"]) for k in json.loads(report.read_text())["kept_f32"])


def test_convert_and_convert_file_screen_as_the_command_does(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    model = BROKEN_IN_F16["exp_overflow"]().model
    onnx.save(model, str(src))
    by_cli = _kept_by_command(src, tmp_path)
    assert any("range" in reason for _, reason in by_cli), by_cli
    _, in_memory = amp.convert_and_report(model, "always-f16")  # a ModelProto: screened from a saved copy
    from_path = amp.convert_file(src, tmp_path / "lib.onnx", "always-f16")
    for conversion in (in_memory, from_path):
        assert sorted((k.node, k.reason) for k in conversion.kept_f32) == by_cli
    literal = amp.convert_file(src, tmp_path / "literal.onnx", "always-f16", screen=False)
    assert literal.kept_f32 == ()  # the rewrite alone keeps nothing f32 on this model
    # Numbers: `run` below passes the screened conversion and fails the literal one (emulated f16).


def test_a_model_that_cannot_run_is_converted_unscreened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An input whose size no rule can guess (a symbolic axis of a 2-D float input that a
    # Reshape fixes to 12 elements): the screen cannot run, the rewrite goes on and says so.
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[n, m] x) => (float[3, 4] y) {
            s = Constant <value = int64[2] {3, 4}> ()
            y = Reshape (x, s)
        }
    """)
    with caplog.at_level(logging.WARNING, logger="rlx_onnx_amp"):
        out, conversion = amp.convert_and_report(model, "always-f16")
    assert conversion.changed and "not range-screened" in caplog.text
    assert out.graph.node[-1].op_type in {"Reshape", "Cast"}
    # A string input the command draws no value for: the same, not an error.
    tagged = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3] x, string[1] tag) => (float[2, 3] y, string[1] t) {
            y = Relu (x)
            t = Identity (tag)
        }
    """)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlx_onnx_amp"):
        _, conversion = amp.convert_and_report(tagged, "always-f16")
    assert conversion.changed and "g: not range-screened: synthesized inputs" in caplog.text


def test_run_answers_what_the_command_answers(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    result = amp.run(src, tmp_path / "run.onnx", "always-f16")
    assert result.exit_code == 0 and result.verify is not None and result.verify.passed
    assert result.conversion is not None
    assert sorted((k.node, k.reason) for k in result.conversion.kept_f32) == _kept_by_command(src, tmp_path)
    assert (tmp_path / "run.onnx").is_file()
    with pytest.raises(amp.InputError, match="verify=False"):
        amp.run(src, tmp_path / "auto.onnx", "auto", verify=False)
    assert not (tmp_path / "auto.onnx").exists()


def test_run_writes_a_failed_verdict_as_the_command_does(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    result = amp.run(src, tmp_path / "unscreened.onnx", "always-f16", screen=False)
    assert result.exit_code == 1 and result.verify is not None and not result.verify.passed
    assert (tmp_path / "unscreened.onnx").is_file()
    healthy = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(healthy))
    assert amp.run(healthy, tmp_path / "block16.onnx", "auto-mixed", min_low_share=0.5).exit_code == 5


def test_run_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    """The written file runs in a child process, which imports no __main__ script: a plain
    script calling `run` (no `if __name__ == "__main__"`) ran again in it, and the child died
    with exit code 1 (the verdict then exit 4)."""
    import subprocess
    import sys

    script = tmp_path / "convert.py"
    script.write_text(
        "import rlx_onnx_amp as amp\n"
        "from rlx_onnx_amp.verification import VerifyOptions\n"
        "amp.write_demo('model.onnx')\n"
        "r = amp.run('model.onnx', 'model16.onnx', 'always-f16', verify_options=VerifyOptions(provider='cpu'))\n"
        "print('exit', r.exit_code, 'written ran', r.verify.written.ran)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "exit 0 written ran True", done.stdout + done.stderr

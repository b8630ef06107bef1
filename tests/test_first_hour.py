"""The first hour (issue 41): a run that did not pass ends with the next step in one line (and
the reports head with it), the JSON carries where and how it was made (`run`), merge-reports
reads a shard once, and every --help lists its exit codes and an example."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from tests.helpers import rlx, save_integer_scalar_model


def test_drift_ends_with_the_next_step_and_the_reports_head_with_it(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    result = rlx(src, "-p", "always-f16", "--no-screen", "-o", tmp_path / "o.onnx", "--provider", "cpu", "-q",
                 "--localize", "--report-md", tmp_path / "r.md", "--report-html", tmp_path / "r.html")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rlx-amp: next: ") and "--repair" in last and "--keep-f32-node" in last
    assert len(last) <= 160
    assert "> **Next:**" in (tmp_path / "r.md").read_text()
    assert "<strong>Next:</strong>" in (tmp_path / "r.html").read_text()
    passing = rlx(src, "-p", "always-f16", "-o", tmp_path / "ok.onnx", "--provider", "cpu", "-q")
    assert passing.returncode == 0 and "next:" not in passing.stderr


def test_an_unverified_model_ends_with_the_option_that_gives_its_inputs(tmp_path: Path) -> None:
    src = save_integer_scalar_model(tmp_path / "n.onnx")
    result = rlx(src, "-o", tmp_path / "o.onnx", "--provider", "cpu", "-q")
    assert result.returncode == 4
    assert result.stderr.strip().splitlines()[-1].startswith("rlx-amp: next: ")
    assert "--input-range n:LO,HI" in result.stderr.strip().splitlines()[-1]


def test_the_json_says_where_and_how_it_was_made(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(src))
    assert rlx(src, "-o", tmp_path / "o.onnx", "--provider", "cpu", "-q", "--report-json", tmp_path / "r.json").returncode == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert list(data)[:2] == ["schema_version", "run"]
    run = data["run"]
    assert run["provider"] == "cpu" and run["target"] == "cuda" and run["seconds"] > 0
    assert run["rlx_amp"] and run["onnx"] and run["onnxruntime"] and run["numpy"]
    assert run["command"][0] == "rlx-amp" and str(tmp_path / "r.json") in run["command"]
    assert run["started"].endswith("+00:00")


def test_merge_reports_reads_a_shard_once(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(src))
    assert rlx(src, "-o", tmp_path / "o.onnx", "--provider", "cpu", "-q", "--report-json", tmp_path / "a.json").returncode == 0
    shutil.copy(tmp_path / "a.json", tmp_path / "copy.json")
    for again in (tmp_path / "a.json", tmp_path / "copy.json"):
        result = rlx("merge-reports", tmp_path / "a.json", again, "-q")
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert str(again) in line and str(tmp_path / "a.json") in line and "once" in line


@pytest.mark.parametrize("command", ["convert", "verify", "inspect", "merge-reports"])
def test_every_help_lists_its_exit_codes_and_an_example(command: str) -> None:
    result = rlx(command, "--help")
    assert result.returncode == 0
    assert "Exit code" in result.stdout and "rlx-amp " in result.stdout.split("Example")[1]
    if command == "convert":
        assert "export directory" in result.stdout and " 5 " in result.stdout


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["convert", "--help"], ["verify", "--help"]])
def test_version_and_help_import_no_onnx(argv: list[str]) -> None:
    """`--version` and every `--help` answer without onnx or onnxruntime (an import check, not a timer)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlx_onnx_amp", *argv],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("rlx-amp, version " if argv == ["--version"] else "Usage: rlx-amp")
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not {"onnx", "onnxruntime", "numpy"} & imported
    assert ("click" in imported) == (argv != ["--version"])


def test_the_names_the_help_spells_are_the_librarys() -> None:
    """cli spells the policy and task names and the repair budget, so that --help imports no onnx."""
    from rlx_onnx_amp import cli
    from rlx_onnx_amp.policy import POLICY_NAMES
    from rlx_onnx_amp.verification.options import DEFAULT_BUDGET, DEFAULT_GENERATE_STEPS
    from rlx_onnx_amp.verification.task import TASKS

    assert (cli.POLICY_NAMES, cli.TASKS, cli.DEFAULT_BUDGET, cli.DEFAULT_GENERATE_STEPS) == (
        POLICY_NAMES, TASKS, DEFAULT_BUDGET, DEFAULT_GENERATE_STEPS)


def test_repair_counts_its_evaluations_and_the_summary_defines_its_words(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    result = rlx(src, "-p", "always-f16", "--repair", "-o", tmp_path / "o.onnx", "--provider", "cpu",
                 "--report-md", tmp_path / "r.md")
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stderr.splitlines() if line.startswith("repair: ")]
    assert steps and steps[0].startswith("repair: 1/24 policy:")  # k/N: evaluations into the budget
    assert "*worst score*: the worst output's distance from passing" in (tmp_path / "r.md").read_text()


#: A piped run's stage line (`batch.StageLines`): the model, `[k/N]` in a batch, the stage, its seconds.
STAGE_LINE = re.compile(r"rlx-amp: (\[\d+/\d+\] )?(\S+): ([a-z ]+): (\d+\.\d) s")


def test_a_piped_run_prints_a_plain_line_per_stage_and_a_batch_ends_with_a_table(tmp_path: Path) -> None:
    # The tests' stderr is no terminal, as in a CI log: a plain line per stage, no bar, no \r.
    demo = tmp_path / "demo.onnx"
    assert rlx("demo", demo).returncode == 0
    one = rlx(demo, "-o", tmp_path / "one.onnx", "--provider", "cpu")
    assert one.returncode == 0 and "\r" not in one.stderr + one.stdout, one.stderr
    stages = [m.group(3) for m in map(STAGE_LINE.fullmatch, one.stderr.splitlines()) if m]
    assert stages[:2] == ["running the reference", "converting"] and "running the candidate" in stages
    assert re.search(r"^rlx-amp: \S*demo\.onnx: exit 0 after \d+\.\d s$", one.stderr, re.M), one.stderr
    assert all(len(line) <= 160 for line in one.stderr.splitlines() if "demo.onnx" in line)
    # A batch of three, one of which drifts: [k/N] on each model's lines, then the table.
    models = []
    for name in ("a", "b"):
        shutil.copy(demo, tmp_path / f"{name}.onnx")
        models.append(tmp_path / f"{name}.onnx")
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(tmp_path / "exp.onnx"))
    models.append(tmp_path / "exp.onnx")
    (tmp_path / "out").mkdir()
    batch = rlx(*models, "-p", "always-f16", "--no-screen", "--out-dir", tmp_path / "out", "--provider", "cpu")
    assert batch.returncode == 1, batch.stderr
    positions = {m.group(1) for m in map(STAGE_LINE.fullmatch, batch.stderr.splitlines()) if m}
    assert positions == {"[1/3] ", "[2/3] ", "[3/3] "}, batch.stderr
    lines = batch.stdout.splitlines()
    head = next(k for k, line in enumerate(lines) if line.split()[:2] == ["model", "exit"])
    assert lines[head].split() == ["model", "exit", "MACs", "low", "worst", "score", "seconds"]
    rows = [line.split() for line in lines[head + 2 : head + 5]]
    assert [(Path(r[0]).name, r[1]) for r in rows] == [("a.onnx", "0"), ("b.onnx", "0"), ("exp.onnx", "1")]
    assert all(re.fullmatch(r"\d+\.\d", r[-1]) for r in rows)
    assert lines[head + 5].startswith("worst score: ")
    # -q: today's silence, no stage line and no table.
    (tmp_path / "quiet").mkdir()
    quiet = rlx(*models, "-p", "always-f16", "--no-screen", "--out-dir", tmp_path / "quiet", "--provider", "cpu", "-q")
    assert quiet.returncode == 1
    assert not any(map(STAGE_LINE.fullmatch, quiet.stderr.splitlines())) and "exit " not in quiet.stderr
    assert "seconds" not in quiet.stdout and "worst score" not in quiet.stdout


def _refused_by_onnxruntime(path: Path) -> Path:
    """A valid model whose op no runtime registers: onnxruntime refuses it in a long message."""
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y"))
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SomeCustomOperatorNobodyRegistered", ["r"], ["y"], domain="com.example.custom")]
    model = helper.make_model(helper.make_graph(nodes, "refused", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.custom", 1)])
    onnx.save(model, str(path))
    return path


def test_a_long_onnxruntime_message_is_summarized_whole_with_v_and_in_the_json(tmp_path: Path) -> None:
    src = _refused_by_onnxruntime(tmp_path / "custom.onnx")
    whole = "SomeCustomOperatorNobodyRegistered(-1) is not a registered function/op"
    result = rlx(src.name, "-o", "o.onnx", "--report-json", "r.json", cwd=tmp_path)  # paths as short as a user's
    assert result.returncode == 4, result.stderr
    [warning] = [line for line in result.stderr.splitlines() if "not verified (exit 4)" in line]
    assert len(warning) <= 160 and " ... " in warning and whole not in warning, warning
    assert "onnxruntime cannot load it" in warning and "[ONNXRuntimeError] : 1 : FAIL : " not in warning
    assert all(len(line) <= 160 for line in (result.stdout + result.stderr).splitlines() if "onnxruntime" in line)
    assert whole in json.loads((tmp_path / "r.json").read_text())["unverified"]
    verbose = rlx(src.name, "-o", "v.onnx", "-v", cwd=tmp_path)
    assert verbose.returncode == 4 and whole in verbose.stderr


def test_an_emulated_verify_leaves_onnxruntimes_refusal_to_v(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA provider present: bf16 may run natively, nothing is emulated")
    demo, bf16 = tmp_path / "demo.onnx", tmp_path / "bf16.onnx"
    assert rlx("demo", demo).returncode == 0
    assert rlx(demo, "-p", "auto-mixed-bf16", "-o", bf16, "--no-verify", "-q").returncode == 0
    plain = rlx("verify", demo.name, bf16.name, "--provider", "cpu", "--target", "cuda", cwd=tmp_path)
    assert plain.returncode == 0 and "NOT_IMPLEMENTED" not in plain.stdout, plain.stdout
    assert max(len(line) for line in plain.stdout.splitlines()) <= 160
    verbose = rlx("verify", demo.name, bf16.name, "--provider", "cpu", "--target", "cuda", "-v", cwd=tmp_path)
    assert verbose.returncode == 0 and "NOT_IMPLEMENTED" in verbose.stdout

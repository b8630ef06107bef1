"""The Olive pass (`rlx_onnx_amp.olive.RlxAmp`, docs/olive.md): docs/olive.md's command sequence
run as written on examples/olive/workflow.json, its model byte for byte the CLI's, drift failing
`olive run`, repair passing it; and the pass in this process through `olive.workflows.run`.

The tests that need Olive skip, saying so, where olive-ai is not installed
(`pip install 'rlx-onnx-amp[olive]'`); one that is installed but cannot be imported fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, mlp_external, write_external
from tests.helpers import rlx

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "olive" / "workflow.json"
DOCS = ROOT / "docs" / "olive.md"
#: The recipe docs/olive.md gives, from the repository root.
COMMAND = (
    "rlx-amp demo demo.onnx && rlx-amp olive-config > olive_pkg.json && "
    "olive run --config examples/olive/workflow.json --package-config olive_pkg.json"
)

_MISSING = None if importlib.util.find_spec("olive") else "olive-ai is not installed (pip install 'rlx-onnx-amp[olive]')"
needs_olive = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


#: No telemetry. olive-ai 0.13.0 logs its heartbeat before it reads OLIVE_DISABLE_TELEMETRY (or
#: --disable_telemetry), and offline its exporter then retries for about 10 s as `olive run`
#: exits; with CI set (the first thing it checks) it logs nothing.
_NO_TELEMETRY = {"OLIVE_DISABLE_TELEMETRY": "1", "CI": "1"}


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _NO_TELEMETRY.items():  # olive.workflows.run in this process too
        monkeypatch.setenv(name, value)


def _env() -> dict[str, str]:
    """The scripts of this interpreter first, this checkout importable, no telemetry."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(_NO_TELEMETRY)
    return env


def _shell(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _workspace(tmp_path: Path) -> Path:
    """A directory laid out as the repository root for the recipe: examples/olive/workflow.json."""
    (tmp_path / "examples" / "olive").mkdir(parents=True)
    shutil.copy(WORKFLOW, tmp_path / "examples" / "olive" / "workflow.json")
    return tmp_path


def _variant(tmp_path: Path, name: str, model: str, **options: Any) -> Path:
    """examples/olive/workflow.json with another model, output directory and pass options."""
    config = json.loads(WORKFLOW.read_text())
    config["input_model"]["model_path"] = model
    config["output_dir"] = f"out-{name}"
    config["passes"]["amp"].update(options)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report without the paths it names (the pass's are in Olive's cache)."""
    report = json.loads(json.dumps(report))
    report.pop("model"), report.pop("output"), report.pop("run", None)  # run: the CLI's own command line
    for key in ("reference", "candidate", "latency"):  # latency: timings differ from run to run
        (report.get("verify") or {}).pop(key, None)
    return report


def test_docs_give_the_tested_recipe() -> None:
    assert COMMAND in DOCS.read_text()
    assert json.loads(WORKFLOW.read_text())["passes"]["amp"]["type"] == "RlxAmp"


def test_olive_config_without_olive_is_one_error_line(tmp_path: Path) -> None:
    code = "import sys; sys.modules['olive'] = None; from rlx_onnx_amp.__main__ import main; main(['olive-config'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=_env(),
                            timeout=600)  # a hang guard
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlx-amp: error: olive-config:"), result.stderr
    assert "pip install 'rlx-onnx-amp[olive]'" in lines[0]


@needs_olive
def test_olive_config_is_olives_default_plus_rlxamp() -> None:
    from olive.package_config import OlivePackageConfig

    result = rlx("olive-config")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    default = json.loads(Path(OlivePackageConfig.get_default_config_path()).read_text())
    entry = printed["passes"].pop("RlxAmp")
    assert printed == default
    assert entry["module_path"] == "rlx_onnx_amp.olive.RlxAmp"
    assert entry["supported_providers"] == ["*"] and entry["supported_accelerators"] == ["*"]
    assert entry["supported_precisions"] == ["fp16", "bf16"]


@needs_olive
@pytest.mark.slow
def test_recipe_writes_the_clis_model_and_report(tmp_path: Path) -> None:
    work = _workspace(tmp_path)
    result = _shell(COMMAND, work)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = work / "olive-out"
    (work / "cli").mkdir()
    cli = rlx("demo.onnx", "-o", "cli/demo.onnx", "--report-json", "cli/report.json", "-q", cwd=work)
    assert cli.returncode == 0, cli.stderr
    assert (out / "model.onnx").read_bytes() == (work / "cli" / "demo.onnx").read_bytes()
    report = json.loads((out / "rlx_amp_report.json").read_text())
    assert report["verify"]["passed"] is True
    assert _comparable(report) == _comparable(json.loads((work / "cli" / "report.json").read_text()))
    attributes = json.loads((out / "model_config.json").read_text())["config"]["model_attributes"]
    assert attributes["additional_files"] == [str(out / "rlx_amp_report.json")]
    assert attributes["rlx_amp"]["passed"] is True and attributes["rlx_amp"]["report"] == "rlx_amp_report.json"


@needs_olive
@pytest.mark.slow
def test_drift_fails_olive_run_and_repair_passes_it(tmp_path: Path) -> None:
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(tmp_path / "exp.onnx"))
    pkg = rlx("olive-config")
    (tmp_path / "pkg.json").write_text(pkg.stdout)
    # the plain command's verdict on these options: drift (exit 1)
    cli = rlx("exp.onnx", "--policy", "always-f16", "--no-screen", "-o", "cli.onnx", "-q", cwd=tmp_path)
    assert cli.returncode == 1, cli.stderr
    drift = _variant(tmp_path, "drift", "exp.onnx", policy="always-f16", screen=False)
    result = _shell(f"olive run --config {drift.name} --package-config pkg.json", tmp_path)
    assert result.returncode != 0
    assert "RlxAmpVerificationFailed" in result.stdout + result.stderr
    assert not (tmp_path / "out-drift" / "model.onnx").exists()

    repaired = _variant(tmp_path, "repair", "exp.onnx", policy="always-f16", repair=True)
    result = _shell(f"olive run --config {repaired.name} --package-config pkg.json", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (tmp_path / "cli").mkdir()
    cli = rlx("exp.onnx", "--policy", "always-f16", "--repair", "-o", "cli/exp.onnx", "-q", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    out = tmp_path / "out-repair"
    assert (out / "model.onnx").read_bytes() == (tmp_path / "cli" / "exp.onnx").read_bytes()
    report = json.loads((out / "rlx_amp_report.json").read_text())
    assert report["verify"]["passed"] is True and report["repair"]


def _workflow(tmp_path: Path, model: Path, **options: Any) -> dict[str, Any]:
    config = json.loads(WORKFLOW.read_text())
    config["input_model"]["model_path"] = str(model)
    config["passes"]["amp"].update(options)
    config["cache_dir"], config["output_dir"] = str(tmp_path / "cache"), str(tmp_path / "out")
    return config


@needs_olive
def test_pass_in_process_external_data_is_a_folder_model(tmp_path: Path) -> None:
    from olive.workflows import run

    from rlx_onnx_amp.olive import package_config

    (tmp_path / "src").mkdir()
    src = write_external(mlp_external(), tmp_path / "src" / "mlp.onnx")
    output = run(_workflow(tmp_path, src, policy="always-f16"), package_config=package_config())
    assert output.has_output_model()
    out = tmp_path / "out"
    (tmp_path / "cli").mkdir()
    cli = rlx(src, "--policy", "always-f16", "-o", tmp_path / "cli" / "mlp.onnx", "-q")
    assert cli.returncode == 0, cli.stderr
    report = json.loads((out / "rlx_amp_report.json").read_text())
    [data] = report["data_files"]
    assert (out / "model.onnx").read_bytes() == (tmp_path / "cli" / "mlp.onnx").read_bytes()
    assert (out / data).read_bytes() == (tmp_path / "cli" / data).read_bytes()
    assert json.loads((out / "model_config.json").read_text())["config"]["onnx_file_name"] == "model.onnx"


@needs_olive
def test_pass_takes_policy_auto_as_the_command_does(tmp_path: Path) -> None:
    from olive.workflows import run

    from fixtures.make_fixtures import GAIN_CASES
    from rlx_onnx_amp.olive import package_config

    src = tmp_path / "mlp.onnx"
    onnx.save(GAIN_CASES["overflow_mlp"]().model, str(src))
    output = run(_workflow(tmp_path, src, policy="auto"), package_config=package_config())
    assert output.has_output_model()
    report = json.loads((tmp_path / "out" / "rlx_amp_report.json").read_text())
    assert report["policy"]["name"] == "auto" and report["repair"]["passed"] and report["verify"]["passed"]
    assert report["cost"]["mac_low_share"] == 1.0
    attributes = json.loads((tmp_path / "out" / "model_config.json").read_text())["config"]["model_attributes"]
    assert attributes["rlx_amp"]["repaired"] is True and attributes["rlx_amp"]["policy"] == "auto"


@needs_olive
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"all_tensors_to_one_file": False}, "all_tensors_to_one_file=False has no twin"),
        ({"save_as_external_data": True}, "save_as_external_data"),
        ({"verify": False, "repair": True}, "repair verifies every candidate"),
        ({"verify": False, "policy": "auto"}, "policy='auto' searches by verifying its candidates: it cannot run with verify=False"),
        ({"verify": False, "atol": 0.5}, "atol does nothing with verify=False"),
        ({"policy": "always-f17"}, "always-f17"),
        # The verify options' checks, shared with the CLI (VerifyOptions.check), in the config's names:
        ({"samples": 0}, "RlxAmp: samples must be at least 1"),
        ({"provider": "tpu"}, "RlxAmp: provider: unknown provider 'tpu'"),
        ({"inputs": "/nonexistent/in.npz"}, "RlxAmp: inputs: /nonexistent/in.npz: no such file"),
    ],
)
def test_pass_refuses_what_it_cannot_do(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    from olive.workflows import run

    from rlx_onnx_amp.olive import RlxAmpError, package_config

    assert rlx("demo", tmp_path / "demo.onnx").returncode == 0
    with pytest.raises(RlxAmpError, match=message.replace("[", r"\[")):
        run(_workflow(tmp_path, tmp_path / "demo.onnx", **options), package_config=package_config())
    assert not (tmp_path / "out" / "model.onnx").exists()


def _unrunnable_reference() -> onnx.ModelProto:
    """A Conv of width 600 on a symbolic length: every length synthesis tries (64 down to 8, 256, 512) is
    too short to run."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "U"])
    w = numpy_helper.from_array(np.full((1, 1, 600), 0.1, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "wide", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@needs_olive
def test_pass_writes_an_unverifiable_model_as_the_plain_command_does(tmp_path: Path) -> None:
    from olive.workflows import run

    from rlx_onnx_amp.olive import RlxAmpError, package_config

    src = tmp_path / "wide.onnx"
    onnx.save(_unrunnable_reference(), str(src))
    assert run(_workflow(tmp_path, src), package_config=package_config()).has_output_model()
    attributes = json.loads((tmp_path / "out" / "model_config.json").read_text())["config"]["model_attributes"]
    verdict = attributes["rlx_amp"]
    assert verdict["exit_code"] == 4 and verdict["verified"] is False and "--shape" in verdict["unverified"]
    report = json.loads((tmp_path / "out" / "rlx_amp_report.json").read_text())
    assert "verify" not in report and report["unverified"] == verdict["unverified"]
    shutil.rmtree(tmp_path / "out")
    with pytest.raises(RlxAmpError):
        run(_workflow(tmp_path, src, verify_required=True), package_config=package_config())
    assert not (tmp_path / "out" / "model.onnx").exists()
    sized = run(_workflow(tmp_path, src, shapes={"x": [1, 1, 640]}), package_config=package_config())
    assert sized.has_output_model()
    assert json.loads((tmp_path / "out" / "rlx_amp_report.json").read_text())["verify"]["passed"] is True

"""The package is real (issue 12): the wheel runs README's quick start away from the checkout,
the sdist carries what its tests need and they pass from it, and the build warns of nothing.

The wheel is installed with `pip --target` into a directory of its own and run with `python -S`
(no site processing), so the checkout's editable install cannot stand in for it; the
dependencies come from this interpreter's site-packages, as a fresh environment would install them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import onnx
import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = sysconfig.get_paths()["purelib"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    text = built.stdout + built.stderr
    assert "Deprecat" not in text and "deprecat" not in text, [line for line in text.splitlines() if "eprecat" in line]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "out": out}


def _run_isolated(args: list[str], pythonpath: list[Path | str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_wheel_runs_the_quick_start_away_from_the_checkout(dist: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(target),
                                str(dist["wheel"])], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    assert (target / "rlx_onnx_amp" / "py.typed").is_file()
    work = tmp_path / "work"
    work.mkdir()
    path: list[Path | str] = [target, SITE]
    where = _run_isolated(["-c", "import rlx_onnx_amp, sys; print(rlx_onnx_amp.__file__)"], path, work)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    demo = _run_isolated(["-m", "rlx_onnx_amp", "demo", "demo.onnx"], path, work)
    assert demo.returncode == 0, demo.stderr
    convert = _run_isolated(["-m", "rlx_onnx_amp", "demo.onnx", "--policy", "auto-mixed", "-o", "demo_auto_mixed.onnx",
                             "--verify"], path, work)
    assert convert.returncode == 0, convert.stdout + convert.stderr
    assert "PASSED" in convert.stdout
    onnx.checker.check_model(str(work / "demo_auto_mixed.onnx"), full_check=True)
    assert (work / "demo.onnx").read_bytes() == (REPO / "fixtures" / "models" / "demo_transformer.onnx").read_bytes()


def test_sdist_carries_its_tests_and_they_pass_from_it(dist: dict[str, Path], tmp_path: Path) -> None:
    with tarfile.open(dist["sdist"]) as tar:
        tar.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    for needed in ("tests/test_cli.py", "tests/helpers.py", "fixtures/make_fixtures.py", "fixtures/models/demo_transformer.onnx",
                   "Makefile", "README.md", "LICENSE-MIT", "LICENSE-APACHE", "rlx_onnx_amp/data/demo_transformer.onnx",
                   "rlx_onnx_amp/py.typed"):
        assert (root / needed).is_file(), needed
    # The unpacked sdist's own package runs its own tests (its root comes first on the path): the
    # CLI's and the docs', which need the fixtures, the demo and the docs it ships. The whole
    # suite is the checkout's; running it a second time from here proved nothing more.
    result = _run_isolated(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                            "tests/test_cli.py", "tests/test_contract.py"], [root, SITE], root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_metadata(dist: dict[str, Path]) -> None:
    import zipfile

    with zipfile.ZipFile(dist["wheel"]) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        names = z.namelist()
    assert "License-Expression: MIT OR Apache-2.0" in text
    assert "Classifier: Typing :: Typed" in text
    assert any(n.endswith("licenses/LICENSE-MIT") for n in names) and any(n.endswith("licenses/LICENSE-APACHE") for n in names)
    assert "rlx_onnx_amp/data/demo_transformer.onnx" in names

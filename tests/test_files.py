"""Files are sacred (issue 10): a catalogue of bad paths, hostile external data, late failures,
races, full disks, signals and read-only directories against convert, verify, repair and batch.

Every case asserts the exit code, the one-line message, that every input file is byte-identical,
that nothing appeared outside the output directory (scratch included: TMPDIR is a directory of
the test's own), and what exists afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from fixtures.make_fixtures import HEALTHY, mlp_external, write_external
from tests.helpers import data_file, feeds_for

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def line(self) -> str:
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in self.stderr, self.stderr
        return lines[0]


@dataclass
class Layout:
    """in/ holds the inputs, out/ the outputs, elsewhere/ files the run must not touch, tmp/
    is TMPDIR."""

    root: Path

    @property
    def inp(self) -> Path:
        return self.root / "in"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def elsewhere(self) -> Path:
        return self.root / "elsewhere"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def snapshot(self, *dirs: Path) -> dict[str, str]:
        return {str(p.relative_to(self.root)): _digest(p) for d in dirs for p in sorted(d.rglob("*")) if p.is_file() or p.is_symlink()}


#: onnxruntime's bundled telemetry SDK writes a 51-byte session file, `$TMPDIR/.ses`, when the
#: module is imported (reused by later imports); it is not rlx-amp's scratch.
ORT_SESSION_FILE = ".ses"


def scratch_left(tmp: Path) -> list[Path]:
    return [p for p in tmp.iterdir() if p.name != ORT_SESSION_FILE]


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def lay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    layout = Layout(tmp_path)
    for d in (layout.inp, layout.out, layout.elsewhere, layout.tmp):
        d.mkdir()
    (layout.elsewhere / "secret.data").write_bytes(np.arange(1 << 16, dtype=np.float32).tobytes())
    monkeypatch.setenv("TMPDIR", str(layout.tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    onnx.save(HEALTHY["transformer_block"]().model, str(layout.inp / "model.onnx"))
    write_external(mlp_external(), layout.inp / "mlp.onnx")
    return layout


def cli(*args: str | Path) -> Result:
    """The CLI in this process (fast); signals are tested in subprocesses below."""
    from rlx_onnx_amp.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main.main(args=[str(a) for a in args], prog_name="rlx-amp", standalone_mode=True)
        except SystemExit as e:
            code = e.code
    return Result(code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


def refused(lay: Layout, *args: str | Path, expect: str, code: int = 2, out_after: list[str] | None = None) -> Result:
    """Run a command that must fail: exit code, one line containing `expect`, inputs and
    elsewhere unchanged, out/ as before (or `out_after`), no scratch left."""
    before = lay.snapshot(lay.inp, lay.elsewhere)
    out_before = sorted(p.name for p in lay.out.iterdir())
    result = cli(*args)
    assert result.code == code, (result.code, result.stderr)
    assert expect in result.line, result.line
    assert result.line.startswith("rlx-amp: error: ")
    assert lay.snapshot(lay.inp, lay.elsewhere) == before, "an input or an outside file changed"
    assert sorted(p.name for p in lay.out.iterdir()) == (out_before if out_after is None else out_after)
    assert not scratch_left(lay.tmp), f"scratch left: {scratch_left(lay.tmp)}"
    return result


def loads_and_runs(model: Path, reference: Path, atol: float = 5e-2) -> None:
    """The written model passes the checker, loads, and computes what `reference` computes."""
    onnx.checker.check_model(str(model), full_check=True)
    ref = onnx.load(str(reference), load_external_data=False)
    feeds = feeds_for(None, ref)
    got = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), atol=atol, rtol=atol)


# ---- 1. paths that alias inputs or each other ----------------------------------------------

def test_reports_and_outputs_never_overwrite_an_input(lay: Layout) -> None:
    model, mlp, out = lay.inp / "model.onnx", lay.inp / "mlp.onnx", lay.out / "o.onnx"
    for option in ("--report-json", "--report-md"):
        refused(lay, model, "-o", out, option, model, expect=f"the {option} file would overwrite the input model")
        refused(lay, mlp, "-o", out, option, lay.inp / "mlp.onnx.data",
                expect=f"the {option} file would overwrite the input model's external data")
        refused(lay, model, "-o", out, option, out, expect=f"the {option} file and the output model")
    refused(lay, model, "-o", out, "--report-json", lay.out / "r", "--report-md", lay.out / "r", expect="are the same file")
    refused(lay, mlp, "-o", lay.inp / "mlp.onnx.data", expect="the output model would overwrite the input model's external data")
    refused(lay, mlp, "-o", lay.inp / "copy.onnx", "--data-name", "mlp.onnx", expect="would overwrite the input model")
    refused(lay, mlp, "-o", lay.inp / "copy.onnx", "--data-name", "mlp.onnx.data", expect="would overwrite the input model's external data")
    refused(lay, model, "-o", out, "--verify", "--save-inputs", model, expect="the --save-inputs file would overwrite the input model")
    (lay.inp / "maps.json").write_text('{"compute": "f16"}')
    refused(lay, model, "--policy", "custom", "--map-file", lay.inp / "maps.json", "-o", lay.inp / "maps.json",
            expect="would overwrite the --map-file")


def test_links_to_an_input_are_the_input(lay: Layout) -> None:
    model = lay.inp / "model.onnx"
    (lay.out / "sym.onnx").symlink_to(model)
    os.link(model, lay.out / "hard.onnx")
    out_files = ["hard.onnx", "sym.onnx"]
    refused(lay, model, "-o", lay.out / "sym.onnx", expect="the output model would overwrite the input model", out_after=out_files)
    refused(lay, model, "-o", lay.out / "hard.onnx", expect="the output model would overwrite the input model", out_after=out_files)
    refused(lay, model, "-o", lay.out / "x.onnx", "--report-json", lay.out / "hard.onnx",
            expect="the --report-json file would overwrite the input model", out_after=out_files)


def test_verify_reports_never_overwrite_the_models(lay: Layout) -> None:
    mlp = lay.inp / "mlp.onnx"
    assert cli(mlp, "-o", lay.out / "c.onnx", "-q").code == 0
    cand = lay.out / "c.onnx"
    before = lay.snapshot(lay.out)
    for target, role in ((mlp, "reference model"), (cand, "candidate model"), (data_file(cand), "candidate model's external data"),
                         (lay.inp / "mlp.onnx.data", "reference model's external data")):
        for option in ("--report-json", "--report-md", "--save-inputs"):
            result = cli("verify", mlp, cand, "--provider", "cpu", option, target)
            assert result.code == 2 and f"would overwrite the {role}" in result.line, result.stderr
    assert lay.snapshot(lay.out) == before


def test_batch_into_the_input_directory_is_refused(lay: Layout) -> None:
    refused(lay, lay.inp / "model.onnx", lay.inp / "mlp.onnx", "--out-dir", lay.inp, expect="would overwrite the input model")


def test_data_name_must_be_a_plain_file_name(lay: Layout) -> None:
    mlp = lay.inp / "mlp.onnx"
    for bad in ("../elsewhere/secret.data", "sub/w.data", "..", "", "/abs.data"):
        refused(lay, mlp, "-o", lay.out / "o.onnx", "--data-name", bad, expect="must be a plain file name")
    refused(lay, mlp, "-o", lay.out / "o.onnx", "--data-name", "x" * 300, expect="file name too long")


def test_output_paths_that_cannot_be_files(lay: Layout) -> None:
    model = lay.inp / "model.onnx"
    os.mkfifo(lay.out / "fifo.onnx")
    refused(lay, model, "-o", lay.out / "fifo.onnx", expect="exists and is not a regular file", out_after=["fifo.onnx"])
    (lay.out / "fifo.onnx").unlink()
    refused(lay, model, "-o", lay.out, expect="is a directory")
    refused(lay, model, "-o", lay.out / ("n" * 300 + ".onnx"), expect="file name too long")
    refused(lay, model, "-o", lay.out / "o.onnx", "--report-json", lay.out / "no" / "r.json",
            expect="directory " + str(lay.out / "no") + " of the --report-json file does not exist")
    refused(lay, lay.inp / ("m" * 300 + ".onnx"), "-o", lay.out / "o.onnx", expect="file name too long")


# ---- 2. external data: only from inside the model's directory, checked before reading ------

def _with_external(lay: Layout, edit: dict[str, str | None] | None = None, clear: bool = False) -> Path:
    """mlp.onnx rewritten with tensor w1's external_data entries edited (None removes a key)."""
    model = onnx.load(str(lay.inp / "mlp.onnx"), load_external_data=False)
    (w1,) = [t for t in model.graph.initializer if t.name == "w1"]
    entries = {e.key: e.value for e in w1.external_data}
    for key, value in (edit or {}).items():
        if value is None:
            entries.pop(key, None)
        else:
            entries[key] = value
    del w1.external_data[:]
    if not clear:
        for key, value in entries.items():
            w1.external_data.add(key=key, value=value)
    path = lay.inp / "bad.onnx"
    onnx.save(model, str(path))
    return path


def test_external_data_outside_the_model_directory_is_refused(lay: Layout) -> None:
    secret = lay.elsewhere / "secret.data"
    (lay.inp / "link.data").symlink_to(secret)
    cases: list[tuple[dict[str, str | None], str]] = [
        ({"location": "../elsewhere/secret.data"}, "'../elsewhere/secret.data' leads out of the model's directory"),
        ({"location": str(secret)}, "is an absolute path"),
        ({"location": "link.data"}, "'link.data' is a symbolic link"),
        ({"location": None}, "tensor 'w1': external data has no location"),
        ({"offset": str(10**9)}, "is too short for the tensor"),
        ({"length": "12"}, "length 12 does not match the tensor's dims [256, 256]"),
        ({"offset": "ten"}, "offset and length must be integers"),
        ({"offset": "-4"}, "negative offset or length"),
    ]
    for edit, expect in cases:
        bad = _with_external(lay, edit)
        refused(lay, bad, "-o", lay.out / "o.onnx", expect=expect)
        refused(lay, bad, "-o", lay.out / "o.onnx", "--repair", "--provider", "cpu", expect=expect)
        refused(lay, "verify", lay.inp / "mlp.onnx", bad, "--provider", "cpu", expect=expect)
        refused(lay, "inspect", bad, expect=expect)
    refused(lay, _with_external(lay, clear=True), "-o", lay.out / "o.onnx", expect="external data has no location")


def test_inline_data_that_does_not_match_its_dims(lay: Layout) -> None:
    model = onnx.load(str(lay.inp / "model.onnx"))
    big = next(t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.raw_data) > 64)
    name = big.name
    big.raw_data = big.raw_data[:-4]
    onnx.save(model, str(lay.inp / "short.onnx"))
    refused(lay, lay.inp / "short.onnx", "-o", lay.out / "o.onnx", expect=f"tensor {name!r} holds")
    model = onnx.load(str(lay.inp / "model.onnx"))
    big = next(t for t in model.graph.initializer if t.name == name)
    big.dims[0] = 10**12
    onnx.save(model, str(lay.inp / "huge.onnx"))
    refused(lay, lay.inp / "huge.onnx", "-o", lay.out / "o.onnx", expect="need")


# ---- 3. late failures leave an earlier output whole ----------------------------------------

def test_a_late_failure_keeps_the_previous_output(lay: Layout) -> None:
    mlp, out = lay.inp / "mlp.onnx", lay.out / "o.onnx"
    assert cli(mlp, "--policy", "always-f16", "-o", out, "-q").code == 0
    before = lay.snapshot(lay.out)
    # Each fails after the conversion ran (during verification), or at commit time.
    np.savez(lay.inp / "wrong.npz", x=np.zeros(3, np.float32), idx=np.zeros(3, np.int64))
    np.savez(lay.inp / "ints.npz", x=np.zeros((2, 256), np.int64), idx=np.zeros(3, np.int64))
    late: list[tuple[tuple[str | Path, ...], str]] = [
        (("--verify", "--inputs", lay.inp / "wrong.npz"), f"--inputs {lay.inp / 'wrong.npz'}: input 'x': got rank 1 [3]"),
        (("--verify", "--inputs", lay.inp / "ints.npz"), "input 'x': got int64 values, the model takes float32"),
        (("--verify", "--shape", "x:2x256x1"), "synthesized inputs (--shape): input 'x': got rank 3"),
        (("--verify", "--shape", "x:3x256"), "dimension 0 is 3, the model fixes it to 2"),
        (("--verify", "--input-range", "nosuch:0,1"), "--input-range: the model has no input named 'nosuch'"),
        (("--verify", "--atol", "y:nan"), "--atol: expected a finite number"),
        (("--verify", "--seed", "-1"), "--seed: expected a number from 0"),
        (("--verify", "--input-range", "x:-inf,inf"), "--input-range: bounds must be finite"),
    ]
    for extra, expect in late:
        refused(lay, mlp, "--policy", "auto-mixed", "-o", out, *extra, expect=expect, out_after=sorted(before_names(before)))
        assert lay.snapshot(lay.out) == before
    loads_and_runs(out, mlp)


def before_names(snapshot: dict[str, str]) -> list[str]:
    return [Path(k).name for k in snapshot]


def test_exit_2_writes_nothing(lay: Layout) -> None:
    model, out = lay.inp / "model.onnx", lay.out / "o.onnx"
    missing = [p for p in ("cuda", "coreml") if {"cuda": "CUDAExecutionProvider", "coreml": "CoreMLExecutionProvider"}[p]
               not in ort.get_available_providers()]
    if missing:
        refused(lay, model, "-o", out, "--verify", "--provider", missing[0], expect=f"--provider {missing[0]}")
    refused(lay, model, "-o", out, "--verify", "--inputs", lay.inp / "none.npz", expect="--inputs")
    (lay.inp / "junk.npz").write_bytes(b"not a zip file")
    refused(lay, model, "-o", out, "--verify", "--inputs", lay.inp / "junk.npz", expect="not a readable .npz file")
    refused(lay, model, "-o", out, "--verify", "--shape", "x:oops", expect="--shape: expected NAME:1x128")
    refused(lay, model, "-o", out, "--verify", "--report-md", lay.out / "missing" / "r.md", expect="does not exist")
    (lay.inp / "binary.toml").write_bytes(bytes(range(256)))
    refused(lay, model, "--policy", "custom", "--map-file", lay.inp / "binary.toml", "-o", out, expect="not UTF-8 text")
    for bad in ("nan", "inf", "-1"):
        refused(lay, model, "-o", out, "--verify", "--atol", bad, expect="--atol: expected a finite number at least 0")
    refused(lay, model, "-o", out, "--verify", "--min-cosine", "2", expect="--min-cosine: expected a finite number in [-1, 1]")
    refused(lay, model, "-o", out, "--repair", "--seed", "-3", expect="--seed")


def test_exit_1_writes_the_model_and_reports(lay: Layout) -> None:
    model, out = lay.inp / "model.onnx", lay.out / "o.onnx"
    result = cli(model, "--policy", "always-f16", "-o", out, "--verify", "--provider", "cpu", "--atol", "0", "--rtol", "0",
                 "--min-cosine", "1", "--report-json", lay.out / "r.json", "-q")
    assert result.code == 1, result.stderr
    assert sorted(p.name for p in lay.out.iterdir()) == ["o.onnx", "r.json"]
    assert json.loads((lay.out / "r.json").read_text())["verify"]["passed"] is False


# ---- 4. concurrent conversions into one output ---------------------------------------------

def test_concurrent_conversions_into_one_output(lay: Layout) -> None:
    """Two different models converted to the same -o at once: both finish, and what is left is
    one of them, whole, with its own weights (never a mix)."""
    a, b = lay.inp / "a.onnx", lay.inp / "b.onnx"
    write_external(mlp_external(salt=1, width=512), a)
    write_external(mlp_external(salt=2, width=512), b)
    out = lay.out / "o.onnx"
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "rlx_onnx_amp", str(src), "--policy", "always-f16", "-o", str(out), "-q"],
                                  stderr=subprocess.PIPE, text=True) for src in (a, b)]
        codes = [p.wait(timeout=120) for p in procs]
        assert codes == [0, 0], [p.stderr.read() for p in procs if p.stderr]
        data_file(out)  # exactly one data file, named after its content
        matches = []
        for src in (a, b):
            try:
                loads_and_runs(out, src, atol=1e-2)
                matches.append(src.name)
            except AssertionError:
                pass
        assert len(matches) == 1, matches
        assert sorted(p.name for p in lay.out.iterdir()) == sorted(["o.onnx", data_file(out).name])


def test_a_new_output_retires_the_old_data_file(lay: Layout) -> None:
    mlp, out = lay.inp / "mlp.onnx", lay.out / "o.onnx"
    assert cli(mlp, "--policy", "always-f16", "-o", out, "-q").code == 0
    first = data_file(out).name
    assert cli(mlp, "--policy", "auto-mixed-bf16", "-o", out, "-q").code == 0
    second = data_file(out).name
    assert first != second
    assert sorted(p.name for p in lay.out.iterdir()) == sorted(["o.onnx", second])
    assert cli(mlp, "--policy", "auto-mixed-bf16", "-o", out, "-q").code == 0  # same content, same name
    assert data_file(out).name == second
    assert cli(mlp, "--policy", "always-f16", "-o", out, "--data-name", "w.bin", "-q").code == 0
    assert sorted(p.name for p in lay.out.iterdir()) == ["o.onnx", "w.bin"]
    loads_and_runs(out, mlp)


# ---- 5. full disk --------------------------------------------------------------------------

@contextlib.contextmanager
def _tmpfs(path: Path, size: str, read_only: bool = False):
    path.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_leaves_nothing_and_keeps_the_old_output(lay: Layout) -> None:
    big = lay.inp / "big.onnx"
    write_external(mlp_external(width=1024), big)  # 8 MiB of weights, 4 MiB in f16
    with _tmpfs(lay.root / "small", "3m") as small:
        result = cli(big, "--policy", "always-f16", "-o", small / "o.onnx", "-q")
        assert result.code == 2 and "No space left on device" in result.line, result.stderr
        assert not list(small.iterdir())
        # An earlier output that fits stays whole when the next one does not fit.
        assert cli(lay.inp / "model.onnx", "-o", small / "o.onnx", "-q").code == 0
        before = {p.name: _digest(p) for p in small.iterdir()}
        result = cli(big, "--policy", "always-f16", "-o", small / "o.onnx", "--report-json", small / "r.json", "-q")
        assert result.code == 2 and "No space left on device" in result.line, result.stderr
        assert {p.name: _digest(p) for p in small.iterdir()} == before
        loads_and_runs(small / "o.onnx", lay.inp / "model.onnx")
    assert not scratch_left(lay.tmp)


# ---- 6. signals: no partial output, no scratch, the next run works ------------------------

def _spawn(lay: Layout, *args: str | Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(lay.tmp)}
    return subprocess.Popen([sys.executable, "-m", "rlx_onnx_amp", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLP with 2 x 64 MiB of external weights: converting or verifying takes a while."""
    path = tmp_path_factory.mktemp("long") / "long.onnx"
    write_external(mlp_external(width=4096), path)
    return path


def _until(proc: subprocess.Popen[str], state: Callable[[], bool]) -> bool:
    """Poll until `state()` holds (True) or the run has ended (False): a state, never a delay."""
    while not state():
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("command", ["convert", "verify"])
def test_signals_leave_no_partial_output_and_no_scratch(lay: Layout, long_model: Path, signum: int, command: str) -> None:
    out = lay.out / "o.onnx"
    model = lay.inp / "model.onnx"
    assert cli(model, "-o", out, "-q").code == 0  # an earlier output, which must survive
    inputs = {p.name: _digest(p) for p in long_model.parent.iterdir()}
    if command == "convert":
        args: tuple[str | Path, ...] = (long_model, "--policy", "always-f16", "-o", out, "--report-json", lay.out / "r.json")
    else:
        assert cli(long_model, "--policy", "always-f16", "-o", lay.out / "c.onnx", "-q").code == 0
        args = ("verify", long_model, lay.out / "c.onnx", "--provider", "cpu", "--localize", "--report-json", lay.out / "r.json")
    earlier = lay.snapshot(lay.out)
    # What this test's own process keeps in TMPDIR (the fork server's socket directory, where the
    # in-process runs above started it) is not the spawned run's.
    own = set(scratch_left(lay.tmp))
    left = lambda: sorted(set(scratch_left(lay.tmp)) - own)  # noqa: E731
    # The signal lands in a state the run is seen in: the output staged beside its final path
    # (converting, verifying, committing), or the verification's scratch in TMPDIR.
    staged = lambda: any(p.name.startswith(".rlx-amp-stage-") for p in lay.out.iterdir())  # noqa: E731
    states = {"staged": staged, "scratch": lambda: bool(left())}
    if command == "verify":
        del states["staged"]
    expected = 143 if signum == signal.SIGTERM else 130
    outcomes = []
    for name, state in states.items():
        proc = _spawn(lay, *args)
        seen = _until(proc, state)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=600)  # a hang guard, not a measure
        assert seen, f"the run ended before the state {name} was seen: {proc.returncode} {stderr}"
        assert proc.returncode in (0, expected), (proc.returncode, stderr)
        assert "Traceback" not in stderr, stderr
        outcomes.append(proc.returncode)
        assert not left(), f"scratch left in TMPDIR: {left()}"
        assert not [p for p in lay.out.iterdir() if p.name.startswith(".")], "staging left in the output directory"
        assert {p.name: _digest(p) for p in long_model.parent.iterdir()} == inputs
        finished = proc.returncode == 0 or "they are complete and written" in stderr  # the signal came during the commit
        if proc.returncode == expected:
            assert stderr.strip().splitlines()[-1].startswith("rlx-amp: error: "), stderr
            assert ("nothing written" in stderr) != finished, stderr
        if not finished:
            assert lay.snapshot(lay.out) == earlier  # the earlier output untouched, nothing new
        else:  # the signal waited for the commit: the new output is whole
            assert "r.json" in sorted(p.name for p in lay.out.iterdir())
            if command == "convert":
                loads_and_runs(out, long_model)
                assert cli(model, "-o", out, "-q").code == 0  # the earlier output again, for the next state
            (lay.out / "r.json").unlink()
            earlier = lay.snapshot(lay.out)
    assert expected in outcomes, f"no run was interrupted while rlx-amp worked ({outcomes})"
    assert cli(*args[:-2], "-q").code == 0  # the next run works


#: The CLI's run (`cli._run_guarded`, with its stop handlers) inside what stands for a long C
#: call (onnxruntime opening a large float16 model): the stop signals blocked, so no handler runs,
#: and a read of stdin, until the test writes a line. Its scratch directory is made first.
_STUCK_RUN = """
import signal, sys
from rlx_onnx_amp import cli, files

def stuck():
    scratch = files.private_dir("rlx-amp-stuck-")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print(scratch, flush=True)
    sys.stdin.readline()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    print("the run went on", flush=True)
    return 0

cli._run_guarded(stuck)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_a_long_c_call_ends_the_run_once_it_returns(lay: Layout, signum: int) -> None:
    # A Python handler runs only after a C call returns: the run then ends with the line and
    # exit code of the signal, nothing written and its scratch removed, whatever the call did.
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_RUN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(lay.tmp)})
    assert proc.stdin is not None and proc.stdout is not None
    scratch = Path(proc.stdout.readline().strip())  # a state: the scratch exists, the call begins
    assert scratch.is_dir() and scratch.parent == lay.tmp
    proc.send_signal(signum)
    proc.stdin.write("return\n")
    proc.stdin.flush()
    stdout, stderr = proc.communicate(timeout=600)  # a hang guard, not a measure
    word, code = ("terminated", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    assert (proc.returncode, stderr.strip().splitlines()) == (code, [f"rlx-amp: error: {word}; nothing written"])
    assert stdout == ""  # the handler ran once the call returned, and the run went no further
    assert not scratch_left(lay.tmp), scratch_left(lay.tmp)


def test_a_run_removes_the_directories_a_signal_left_without_an_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A signal between a scratch directory's creation and the `with` block that would remove
    # it (or inside its removal) leaves it to no one: the run removes it as it ends, and only
    # the directories it made (one that was there before it is left alone).
    from rlx_onnx_amp import cli, files

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    kept = files.private_dir("rlx-amp-kept-")

    def run() -> int:
        files.private_dir("rlx-amp-orphan-")  # its owner never got it
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        cli._run_guarded(run)
    assert ended.value.code == 130
    assert capsys.readouterr().err == "rlx-amp: error: interrupted; nothing written\n"
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]
    files.remove_private_dir(kept)
    assert not list(tmp_path.iterdir()) and kept not in files.live_dirs()


_SIGNAL_IN_LOGGING_SETUP = """
import logging, os, signal, sys
from rlx_onnx_amp.__main__ import run
create_lock = logging.Handler.createLock
signum = getattr(signal, sys.argv[1])

def signalled_create_lock(self):
    # Inside StreamHandler.__init__: the handler is registered with logging, its stream not set.
    create_lock(self)
    if type(self) is logging.StreamHandler:
        logging.Handler.createLock = create_lock
        os.kill(os.getpid(), signum)

logging.Handler.createLock = signalled_create_lock
sys.argv[1:] = sys.argv[2:]
run()  # as the rlx-amp script does: the atexit handlers run as the interpreter exits
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["convert", "verify"])
def test_a_signal_while_logging_is_set_up_ends_the_run_cleanly(lay: Layout, signame: str, command: str) -> None:
    # Found by CI: SIGTERM landing inside logging.basicConfig's handler constructor left a
    # handler without a stream, and logging's atexit flush printed a traceback after the line.
    model = lay.inp / "model.onnx"
    out = lay.out / "o.onnx"
    args = [model, "-o", out] if command == "convert" else ["verify", model, model, "--provider", "cpu"]
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_IN_LOGGING_SETUP, signame, *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    word, code = ("terminated", 143) if signame == "SIGTERM" else ("interrupted", 130)
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (code, [f"rlx-amp: error: {word}; nothing written"])
    assert not out.exists()


# ---- 7. read-only model directory ----------------------------------------------------------

def test_read_only_model_directory(lay: Layout) -> None:
    """Converting, verifying (emulated, with external data) and repairing read a model in a
    read-only directory and write nothing there."""
    with _tmpfs(lay.root / "ro", "64m") as ro:
        write_external(mlp_external(), ro / "mlp.onnx")
        remount = subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.decode().strip()}")
        before = {p.name: _digest(p) for p in ro.iterdir()}
        out = lay.out / "o.onnx"
        result = cli(ro / "mlp.onnx", "--policy", "always-f16", "-o", out, "--verify", "--localize", "--provider", "cpu", "-q")
        assert result.code == 0, result.stderr
        result = cli("verify", ro / "mlp.onnx", out, "--provider", "cpu", "--emulate", "-q")
        assert result.code == 0, result.stderr
        result = cli(ro / "mlp.onnx", "--policy", "always-f16", "-o", lay.out / "r.onnx", "--repair", "--provider", "cpu", "-q")
        assert result.code == 0, result.stderr
        assert {p.name: _digest(p) for p in ro.iterdir()} == before
        refused(lay, ro / "mlp.onnx", "-o", ro / "o.onnx", expect="is not writable", out_after=sorted(p.name for p in lay.out.iterdir()))
    assert not scratch_left(lay.tmp)


# ---- 8. modes and the internal-error code --------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_umask_mode(lay: Layout, umask: int) -> None:
    old = os.umask(umask)
    try:
        result = cli(lay.inp / "mlp.onnx", "--policy", "always-f16", "-o", lay.out / "o.onnx", "--verify", "--provider", "cpu",
                     "--report-json", lay.out / "r.json", "--report-md", lay.out / "r.md", "--save-inputs", lay.out / "in.npz", "-q")
    finally:
        os.umask(old)
    assert result.code == 0, result.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in lay.out.iterdir()}
    assert len(modes) == 5 and set(modes.values()) == {0o666 & ~umask}, modes


def test_an_internal_error_keeps_its_traceback_and_exit_70(lay: Layout) -> None:
    code = ("import rlx_onnx_amp.api as api, sys\n"
            "def broken(*a, **k): raise RuntimeError('simulated bug')\n"
            "api.rewrite_model = broken\n"
            "from rlx_onnx_amp.cli import main\n"
            "sys.argv = ['rlx-amp', sys.argv[1], '-o', sys.argv[2]]\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code, str(lay.inp / "model.onnx"), str(lay.out / "o.onnx")],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(lay.tmp)})
    assert result.returncode == 70, result.stderr
    assert "Traceback" in result.stderr and "simulated bug" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("rlx-amp: error: internal error (RuntimeError: simulated bug)")
    assert not list(lay.out.iterdir()) and not scratch_left(lay.tmp)


def test_an_internal_error_in_one_model_of_a_batch_keeps_its_traceback_and_exit_70(lay: Layout) -> None:
    # The batch says what the single command says (batch.unexpected_failure), for that model
    # alone: the other model is written, the run's exit code is the bug's.
    shutil.copy(lay.inp / "model.onnx", lay.inp / "other.onnx")
    code = ("import rlx_onnx_amp.api as api, sys\n"
            "real = api.rewrite_model\n"
            "def broken(*a, **k):\n"
            "    if k['label'].endswith('other.onnx'): raise RuntimeError('simulated bug')\n"
            "    return real(*a, **k)\n"
            "api.rewrite_model = broken\n"
            "from rlx_onnx_amp.cli import main\n"
            "sys.argv = ['rlx-amp', *sys.argv[1:3], '--out-dir', sys.argv[3], '--jobs', '1', '--no-verify', '-q']\n"
            "main()\n")
    argv = [sys.executable, "-c", code, str(lay.inp / "model.onnx"), str(lay.inp / "other.onnx"), str(lay.out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(lay.tmp)})
    assert result.returncode == 70, result.stderr
    assert "Traceback" in result.stderr and "simulated bug" in result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("rlx-amp: error:")]
    assert said == [
        "rlx-amp: error: internal error (RuntimeError: simulated bug); this is a bug in rlx-amp, please report it "
        "with the model"
    ], result.stderr
    assert sorted(p.name for p in lay.out.iterdir()) == ["model.onnx"] and not scratch_left(lay.tmp)


def test_the_command_leaves_nothing_in_tmpdir_refused_or_done(lay: Layout) -> None:
    """The rlx-amp process starts its verification's fork server at once (`cli.WARM_UP_CHILDREN`),
    before the input is checked: its socket directory in TMPDIR goes with the process, whether
    the run is refused (exit 2) or verified and written."""
    model = lay.inp / "model.onnx"
    refused_run = _spawn(lay, model, "-o", model)
    _, stderr = refused_run.communicate(timeout=600)  # a hang guard, not a measure
    assert refused_run.returncode == 2 and "would overwrite the input model" in stderr, stderr
    assert not scratch_left(lay.tmp), scratch_left(lay.tmp)
    done = _spawn(lay, model, "-o", lay.out / "o.onnx")
    _, stderr = done.communicate(timeout=600)
    assert done.returncode == 0, stderr
    assert not scratch_left(lay.tmp), scratch_left(lay.tmp)

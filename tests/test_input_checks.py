"""Verification inputs the CLI must refuse in one line (exit 2), or accept: declared dims of -1
and 0, shapes too large to synthesize, --input-range bounds past a type's range; and a closed
stdout, which ends any command quietly (exit 141)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto
from onnx import helper as h

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.verification import InputSpec, inputs
from rlx_onnx_amp.verification.inputs import synthesize
from tests.helpers import rlx

EXIT_SIGPIPE = 141


def _model(path: Path, dims: Sequence[int | str], elem: int = TensorProto.FLOAT, op: str = "Relu") -> Path:
    """x (dims, elem) -> op -> y: one node, deterministic."""
    x = h.make_tensor_value_info("x", elem, list(dims))
    y = h.make_tensor_value_info("y", elem, list(dims))
    graph = h.make_graph([h.make_node(op, ["x"], ["y"])], "g", [x], [y])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2 and one line `rlx-amp: error: ...` holding every word."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlx-amp: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---- declared dims of -1 and 0 -------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [(), ("--shape", "x:3x4"), ("--inputs", "batch3.npz"), ("--samples", "2")],
    ids=["synthesized", "shape", "inputs", "samples"],
)
def test_a_negative_dim_is_symbolic(tmp_path: Path, extra: tuple[str, ...]) -> None:
    # Paddle writes dim_value -1 for a dynamic axis; onnxruntime reads it as symbolic too.
    model = _model(tmp_path / "m.onnx", [-1, 4])
    np.savez(tmp_path / "batch3.npz", x=np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    result = rlx("verify", model, model, *extra, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "PASSED" in result.stdout


def test_a_negative_dim_is_symbolic_in_convert_verify(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", [-1, 4])
    result = rlx(model, "-o", tmp_path / "out.onnx", "--verify", "--shape", "x:3x4", "--save-inputs", "in.npz",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.onnx").exists()
    with np.load(tmp_path / "in.npz") as saved:
        assert saved["x"].shape == (3, 4)


def test_a_zero_dim_is_an_empty_axis(tmp_path: Path) -> None:
    # onnxruntime fixes dim_value 0 to 0 (it refuses a batch of 1 or 3 there): the input error
    # says so up front instead of onnxruntime failing later.
    model = _model(tmp_path / "m.onnx", [0, 4])
    line = _refused(rlx("verify", model, model, cwd=tmp_path), "input 'x'", "fixes it to 0", "dim_param")
    assert line.startswith("rlx-amp: error: synthesized inputs")
    np.savez(tmp_path / "batch3.npz", x=np.ones((3, 4), np.float32))
    _refused(rlx("verify", model, model, "--inputs", "batch3.npz", cwd=tmp_path), "batch3.npz", "fixes it to 0")
    np.savez(tmp_path / "empty.npz", x=np.ones((0, 4), np.float32))
    assert rlx("verify", model, model, "--inputs", "empty.npz", cwd=tmp_path).returncode == 0


# ---- shapes too large to synthesize --------------------------------------------------------
def test_a_huge_shape_option_is_refused_before_allocating(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", ["N", "T"])
    _refused(rlx("verify", model, model, "--shape", "x:1x99999999999", cwd=tmp_path),
             "input 'x'", "1x99999999999", "2 GiB limit")
    out = tmp_path / "out.onnx"
    _refused(rlx(model, "-o", out, "--verify", "--shape", "x:1x99999999999", cwd=tmp_path), "input 'x'", "1x99999999999")
    assert not out.exists()


def test_a_huge_declared_shape_is_refused(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", [100000, 100000, 1000])
    _refused(rlx("verify", model, model, cwd=tmp_path), "input 'x'", "100000x100000x1000", "TiB")


def test_a_shape_size_past_int64_is_refused(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", ["N", "T"])
    _refused(rlx("inspect", model, "--shape", "x:1x9999999999999999999", cwd=tmp_path), "--shape", "9999999999999999999")
    _refused(rlx("inspect", model, "--shape", "x:1x" + "9" * 5000, cwd=tmp_path), "--shape")


def test_the_synthesis_limit_is_in_bytes_of_the_input_type(monkeypatch: pytest.MonkeyPatch) -> None:
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    model = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [x]))
    monkeypatch.setattr(inputs, "MAX_SYNTHESIZED_BYTES", 16)
    assert synthesize(model, InputSpec({"x": (1, 4)}))["x"].nbytes == 16  # at the limit: allowed
    with pytest.raises(InputError) as refused:
        synthesize(model, InputSpec({"x": (2, 4)}))
    for fact in ("input 'x'", "2x4 float32", "32 B", "16 B"):  # the input, its shape and type, its size, the limit
        assert fact in str(refused.value), (fact, str(refused.value))


# ---- --input-range bounds ------------------------------------------------------------------
@pytest.mark.parametrize("bounds", ["0,1e39", "-1e39,0", "-inf,0", "0,nan"])
def test_a_range_past_float32_is_refused(tmp_path: Path, bounds: str) -> None:
    model = _model(tmp_path / "m.onnx", [1, 4])
    _refused(rlx("verify", model, model, "--input-range", f"x:{bounds}", cwd=tmp_path), "--input-range", f"x:{bounds}")


def test_a_range_at_float32_max_is_accepted(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", [1, 4])
    result = rlx("verify", model, model, "--input-range", "x:-3.4028234e38,3.4028234e38", cwd=tmp_path)
    assert result.returncode == 0 and "RuntimeWarning" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("elem", "bounds"),
    [(TensorProto.INT64, "0,1e30"), (TensorProto.INT32, "0,1e10"), (TensorProto.UINT8, "-5,3"),
     (TensorProto.FLOAT16, "0,1e5")],
    ids=["int64", "int32", "uint8", "float16"],
)
def test_a_range_past_the_input_type_is_refused(tmp_path: Path, elem: int, bounds: str) -> None:
    model = _model(tmp_path / "m.onnx", [1, 4], elem, op="Identity")
    _refused(rlx("verify", model, model, "--input-range", f"x:{bounds}", cwd=tmp_path), "--input-range x:", "input's")


# ---- the verify options, checked before any work ------------------------------------------
@pytest.mark.parametrize(
    ("command", "args", "words"),
    [
        ("convert", ("--samples", "0"), ("--samples must be at least 1",)),
        pytest.param(
            "convert",
            ("--provider", "coreml"),
            ("--provider coreml:", "no CoreML"),
            marks=pytest.mark.skipif(
                "CoreMLExecutionProvider" in onnxruntime.get_available_providers(), reason="onnxruntime has CoreML"
            ),
        ),
        ("convert", ("--inputs", "missing.npz"), ("--inputs: missing.npz:", "no such file")),
        ("verify", ("--samples", "0"), ("--samples must be at least 1",)),
        ("verify", ("--inputs", "missing.npz"), ("--inputs: missing.npz",)),
        ("inspect", ("--screen", "--inputs", "missing.npz"), ("--inputs: missing.npz:", "no such file")),
    ],
)
def test_unusable_verify_options_are_one_line_before_any_work(
    tmp_path: Path, command: str, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    # One check (VerifyOptions.check) for the convert and verify commands, inspect --screen and
    # the Olive pass (tests/test_olive.py): no output, no scratch left.
    model = _model(tmp_path / "m.onnx", [2, 4])
    argv: dict[str, tuple[str | Path, ...]] = {
        "convert": (model, "-o", tmp_path / "out.onnx", *args),
        "verify": ("verify", model, model, *args),
        "inspect": ("inspect", model, *args),
    }
    _refused(rlx(*argv[command], cwd=tmp_path), *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_verify_options_check_spells_options_as_told(tmp_path: Path) -> None:
    from rlx_onnx_amp.verification import VerifyOptions

    with pytest.raises(InputError, match=r"^samples must be at least 1$"):
        VerifyOptions(spec=InputSpec(samples=0)).check(str)
    with pytest.raises(InputError, match=r"^inputs: x\.npz: no such file"):
        VerifyOptions(inputs="x.npz").check(str)
    VerifyOptions(provider="cpu", inputs=str(_model(tmp_path / "m.onnx", [2]))).check()  # usable: no error


# ---- a closed stdout -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [("inspect", "m.onnx"), ("inspect", "m.onnx", "--json"), ("verify", "m.onnx", "m.onnx"),
     ("m.onnx", "-o", "out.onnx"), ("--help",), ("verify", "--help")],
    ids=["inspect", "inspect-json", "verify", "convert", "help", "verify-help"],
)
def test_a_closed_stdout_ends_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    _model(tmp_path / "m.onnx", ["N", 4])
    read, write = os.pipe()
    os.close(read)  # `| head -0`: the reader is gone before the command writes
    try:
        result = subprocess.run([sys.executable, "-m", "rlx_onnx_amp", *args], stdout=write, stderr=subprocess.PIPE,
                                text=True, cwd=tmp_path, timeout=600)
    finally:
        os.close(write)
    assert result.returncode == EXIT_SIGPIPE, result.stderr
    # Quietly: nothing on stderr but a piped run's stage lines (`batch.StageLines`), written before stdout.
    stage = re.compile(r"rlx-amp: m\.onnx: [a-z ]+: \d+\.\d s")
    assert [line for line in result.stderr.splitlines() if not stage.fullmatch(line)] == []
    assert not (tmp_path / "out.onnx").exists()  # convert prints before it commits: nothing written

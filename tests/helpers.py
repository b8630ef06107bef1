"""Shared test helpers: seeded feeds, onnxruntime runs, structural invariants."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
import wave
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from fixtures.make_fixtures import Fixture
from rlx_onnx_amp.types import all_graphs

POLICIES = ("always-f32", "always-f16", "auto-mixed-conservative", "auto-mixed", "auto-mixed-bf16")
LOW = {TensorProto.FLOAT16, TensorProto.BFLOAT16}

_NP = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.BOOL: np.bool_,
       TensorProto.FLOAT16: np.float16}


def rlx(
    *args: str | Path, cwd: Path | None = None, timeout: float = 600, subprocess_only: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the command line on ARGS and capture its exit code, stdout and stderr.

    In this process (`rlx_onnx_amp.__main__.main`, what `rlx-amp` runs), which saves each
    call the interpreter's start and the imports (about a second): the CLI's signal handlers,
    logging and working directory are put back afterwards. In a subprocess
    (`python -m rlx_onnx_amp ARGS`) where the process is the point: `subprocess_only`, a
    `--jobs` pool, or RLX_AMP_TEST_SUBPROCESS=1 in the environment (the whole suite then runs
    every command as a user would)."""
    argv = [str(a) for a in args]
    if subprocess_only or os.environ.get("RLX_AMP_TEST_SUBPROCESS") == "1" or any(a.startswith("--jobs") for a in argv):
        return subprocess.run([sys.executable, "-m", "rlx_onnx_amp", *argv], capture_output=True, text=True,
                              cwd=cwd, timeout=timeout)
    return _rlx_in_process(argv, cwd)


def _rlx_in_process(argv: list[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
    from rlx_onnx_amp.__main__ import main

    stdout, stderr = io.StringIO(), io.StringIO()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_handlers, root_level = root.handlers[:], root.level
    root.handlers = []  # the CLI's logging.basicConfig adds its own, on the captured stderr
    here = os.getcwd()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(argv)
            except SystemExit as e:
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # what the interpreter would print before exiting 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
        root.handlers, root.level = root_handlers, root_level
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return subprocess.CompletedProcess(["rlx-amp", *argv], code, stdout.getvalue(), stderr.getvalue())


def feeds_for(fixture: Fixture | None, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = (fixture.shapes.get(vi.name) if fixture else None) or tuple(d.dim_value or 1 for d in tt.shape.dim)
        lo, hi = (fixture.ranges.get(vi.name) if fixture else None) or ((-1.0, 1.0) if tt.elem_type in (1, 10) else (0, 2))
        dtype = _NP[tt.elem_type]
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.uniform(lo, hi, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(int(lo), int(hi), shape).astype(dtype)
    return feeds


def run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_close(expected: list[np.ndarray], actual: list[np.ndarray], atol: float, rtol: float, min_cosine: float = 0.999) -> None:
    assert len(expected) == len(actual)
    for k, (e, a) in enumerate(zip(expected, actual)):
        assert e.dtype == a.dtype and e.shape == a.shape, f"output {k}: {a.dtype}{a.shape} vs {e.dtype}{e.shape}"
        if e.dtype.kind != "f":
            np.testing.assert_array_equal(a, e, err_msg=f"output {k}")
            continue
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        assert not np.any(np.isnan(a64) & ~np.isnan(e64)), f"output {k}: new NaN"
        assert not np.any(np.isinf(a64) & ~np.isinf(e64)), f"output {k}: new Inf"
        err = float(np.max(np.abs(e64 - a64))) if e.size else 0.0
        assert err <= atol + rtol * float(np.max(np.abs(e64))), f"output {k}: max_abs {err}"
        if e.size > 1 and np.ptp(e64) > 0:
            cos = float(np.dot(e64.ravel(), a64.ravel()) / (np.linalg.norm(e64) * np.linalg.norm(a64)))
            assert cos >= min_cosine, f"output {k}: cosine {cos}"


def all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in all_graphs(model.graph) for n in g.node]


def value_names(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for g in all_graphs(model.graph):
        names.update(i.name for i in g.input)
        names.update(t.name for t in g.initializer)
        for n in g.node:
            names.update(o for o in n.output if o)
    return names


def cast_duplicates(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """(source, to) pairs served by more than one Cast in the same graph."""
    dups = []
    for g in all_graphs(model.graph):
        count = collections.Counter((n.input[0], next(a.i for a in n.attribute if a.name == "to")) for n in g.node if n.op_type == "Cast")
        dups += [k for k, v in count.items() if v > 1]
    return dups


def integer_digest(model: onnx.ModelProto) -> dict[str, str]:
    """Hash of every non-float initializer and Constant tensor, by name."""
    out = {}
    for g in all_graphs(model.graph):
        tensors = list(g.initializer) + [a.t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
        for t in tensors:
            if t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
                out[t.name] = hashlib.sha256(onnx.numpy_helper.to_array(t).tobytes()).hexdigest()
    return out


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {}
    for g in all_graphs(model.graph):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
    return types


def data_file(model_path) -> Path:
    """The one external data file a written model reads: `OUT.<sha256 prefix>.data` beside it,
    named after its content (rlx_onnx_amp.files)."""
    import re
    from pathlib import Path

    model_path = Path(model_path)
    meta = onnx.load(str(model_path), load_external_data=False)
    locations = {e.value for g in all_graphs(meta.graph) for t in g.initializer if t.data_location == TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    assert len(locations) == 1, locations
    (location,) = locations
    assert re.fullmatch(re.escape(model_path.name) + r"\.[0-9a-f]{16}\.data", location), location
    path = model_path.parent / location
    assert path.is_file(), path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert location.endswith(f".{digest[:16]}.data"), (location, digest)
    return path


#: A piped run's progress lines (`batch.StageLines`): a stage's seconds, or the model's exit and seconds.
PROGRESS_LINE = re.compile(r"rlx-amp: (\[\d+/\d+\] )?\S+: ([a-z ]+: \d+\.\d s|exit \d+ after \d+\.\d s)")


def without_progress(stderr: str) -> list[str]:
    """The lines of `stderr` but a piped run's progress lines."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS_LINE.fullmatch(line)]


def save_integer_scalar_model(path: Path) -> Path:
    """y = Cast(n) to float, n an int64 scalar input nothing in the graph bounds: a value
    rlx-amp cannot synthesize without `--input-range n:LO,HI` (exit 4)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)], "g",
        [onnx.helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, str(path))
    return path


def write_wav(path: Path, rate: int, channels: int, samples: np.ndarray) -> Path:
    """16-bit PCM `samples` (interleaved where `channels` > 1) as a wav file at `path`."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples).astype("<i2").tobytes())
    return path

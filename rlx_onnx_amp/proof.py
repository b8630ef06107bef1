"""The proof that a converted model is sound: onnx's full checker passes on it, or (for an input
the checker refuses) onnxruntime loads the input and the output alike.

The checker is the longest single step of a plain conversion of a large graph without
verification (about a quarter of it at 200,000 nodes) and holds the GIL, so a thread cannot run
beside it. `CheckerRun` runs its strict shape inference (most of it) in a process of its own,
started while the model is converted (its imports take a quarter of a second) and given the
written file, while this process fills the conversion's report and runs the checks before the
inference. Its verdict is `checker_failure`'s, word for word.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import ModelProto

from rlx_onnx_amp.errors import AmpError, InputError, first_line, message_first_line
from rlx_onnx_amp.exits import add_last_resort
from rlx_onnx_amp.reports.conversion import ConversionReport

__all__ = ["SEPARATE_CHECK_NODES", "CheckerRun", "checker_failure", "onnxruntime_failure", "prove"]

logger = logging.getLogger(__name__)

#: From this many nodes in the main graph the checker runs in a process of its own: below it the
#: check takes less than that process's start-up.
SEPARATE_CHECK_NODES = 20_000

_LIMIT = 1000  # characters of the checker's first line

#: A model in memory (a protobuf at most 2 GiB) or a model file.
_Checkable = ModelProto | str | os.PathLike[str]

# The checker's process: it reads a model path on stdin (to its end), runs the full checker's
# strict shape inference on it and writes "P", or "F" with the exception's type name, a NUL and
# its text, then closes stdout and ends; the checks before it run in this process meanwhile
# (`CheckerRun.result`). It ignores
# SIGINT (a terminal's ^C reaches the whole process group; this process stops it). `-P`: the
# working directory is not put on its sys.path.
_INFERENCE_PROCESS = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
import onnx.shape_inference
path = os.fsdecode(sys.stdin.buffer.read())
if path:
    try:
        onnx.shape_inference.infer_shapes_path(path, os.devnull, check_type=True, strict_mode=True)
        said = "P"
    except Exception as e:
        said = "F" + type(e).__name__ + "\\0" + str(e)
    sys.stdout.buffer.write(said.encode("utf-8", "replace"))
    sys.stdout.buffer.flush()
    os.close(1)  # its reader sees the end now, not once this process's memory is unmapped
    os._exit(0)  # the verdict is out: no interpreter teardown to wait for
"""


def checker_failure(model: _Checkable, limit: int = _LIMIT) -> str | None:
    """The first line of what `onnx.checker.check_model(full_check=True)` says against a model
    file (or a model in memory), or None when it passes: how a failure is told to be the
    input's or ours."""
    try:
        onnx.checker.check_model(model if isinstance(model, ModelProto) else str(model), full_check=True)
    except Exception as e:
        return first_line(e, limit)
    return None


#: The checkers' processes that run now: what a watchdog that ends the process kills first.
_RUNNING: set[subprocess.Popen[bytes]] = set()


def _kill_running() -> None:
    for process in list(_RUNNING):
        with contextlib.suppress(OSError):
            process.kill()


add_last_resort(_kill_running)
if hasattr(os, "register_at_fork"):  # POSIX; a forked worker's are its own
    os.register_at_fork(after_in_child=_RUNNING.clear)


class CheckerRun:
    """`checker_failure` of a model file, in a process of its own when `separate`: started now,
    given the file with `check`, read with `result`. Without `separate`, or when that process
    cannot start or ends without a verdict, `result` runs the checker in this process. `close`
    (or leaving the `with` block) stops the process, whatever stopped the caller."""

    def __init__(self, separate: bool) -> None:
        self._path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ending = False
        if separate:
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-P", "-c", _INFERENCE_PROCESS],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                )
            except OSError as e:
                logger.debug("cannot start the checker's process (%s): it runs in this process", e)
            else:
                _RUNNING.add(self._process)

    @property
    def separate(self) -> bool:
        """Whether the checker runs in a process of its own."""
        return self._process is not None

    def check(self, path: str | os.PathLike[str]) -> None:
        """Start the checker on `path` (once)."""
        self._path = Path(path)
        if self._process is not None and self._process.stdin is not None:
            try:
                self._process.stdin.write(os.fsencode(self._path))
                self._process.stdin.close()
            except OSError:
                self.close()

    def result(self) -> str | None:
        """What `checker_failure(path)` says: the checker's first line, or None when it passes.

        onnx's full check is its checks, then strict shape inference (`check_model` with
        `full_check=True`): with a process of its own the inference runs there while the
        checks run here, and the checks' failure comes first, as in the full check."""
        assert self._path is not None, "check(path) first"
        if self._process is None or self._process.stdout is None:
            return checker_failure(self._path)
        try:
            onnx.checker.check_model(str(self._path), full_check=False)
        except Exception as e:
            self.close()
            return first_line(e, _LIMIT)
        _release_memory()  # while the inference runs there
        said = self._process.stdout.read()
        self._ending = said[:1] in (b"P", b"F")  # its verdict is out: it ends by itself
        self.close()
        if said[:1] == b"P":
            return None
        if said[:1] == b"F":
            type_name, _, text = said[1:].decode("utf-8", "replace").partition("\0")
            return message_first_line(type_name, text, _LIMIT)
        logger.debug("the checker's process ended without a verdict: checking in this process")
        return checker_failure(self._path)

    def close(self) -> None:
        """Stop the checker's process if it still runs, and reap it: at once, or (a process
        that gave its verdict and is ending on its own) in a thread beside the run, since its
        end waits for its memory to be unmapped (30 ms after a 200,000-node graph)."""
        process, self._process = self._process, None
        if process is None:
            return
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        if self._ending and process.poll() is None:
            threading.Thread(target=_reap, args=(process,), name="rlx-amp-checker-reaper", daemon=True).start()
            return
        if process.poll() is None:
            process.kill()
        _reap(process)

    def __enter__(self) -> CheckerRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reap(process: subprocess.Popen[bytes]) -> None:
    process.wait()
    _RUNNING.discard(process)


def _release_memory() -> None:
    """Work that frees memory, done now rather than later in the run: a collection of what the
    collector has not walked yet (the rewrite runs with it paused, `rewrite.convert.gc_paused`;
    the first allocation after the pause would walk it all, 20 ms after a 200,000-node graph),
    and glibc's free pages handed back to the system (the checks' parse of the output, a third
    of the process's memory, which its exit would otherwise unmap)."""
    gc.collect(1)
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim() if sys.platform.startswith("linux") else None


def onnxruntime_failure(model: _Checkable, limit: int = 400, provider: str = "CPUExecutionProvider") -> str | None:
    """Why onnxruntime's `provider` (with the CPU provider behind it) cannot load a model, or
    None when it loads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.add_session_config_entry("session.disable_prepacking", "1")
    try:
        source = model.SerializeToString() if isinstance(model, ModelProto) else str(model)
        providers = list(dict.fromkeys([provider, "CPUExecutionProvider"]))
        ort.InferenceSession(source, opts, providers=providers)
    except Exception as e:
        return first_line(e, limit)
    return None


def prove(
    output: _Checkable,
    source: _Checkable | Callable[[], _Checkable],
    report: ConversionReport,
    source_label: str,
    label: str,
    checked: CheckerRun | None = None,
) -> None:
    """The proof that a converted model is sound, in `report.proof`: onnx's full checker
    passes on it; or, for an input the checker refuses (onnxruntime's own ops in the default
    domain, as onnxruntime-genai's builder writes them), onnxruntime loads the input and the
    output alike. Anything else is bad input (InputError) or a bug of ours (AmpError).
    `source` may be a function that makes it, called only when the output fails the checker;
    `checked`: the checker already given `output`'s file."""
    found = checked.result() if checked is not None else checker_failure(output)
    if found is None:
        report.proof = "onnx.checker"
        return
    if callable(source):
        source = source()
    first = checker_failure(source)
    if first is None:  # the input was valid, so this is our bug: say so, with the checker's words
        raise AmpError(f"{label}: the converted model fails onnx.checker; nothing written ({found})")
    if onnxruntime_failure(source) is not None:
        raise InputError(f"{source_label}: the input model fails onnx.checker ({first}); nothing written")
    import onnxruntime as ort

    # The output is meant for its target: a bf16 model for CUDA need not load on the CPU provider.
    wanted = "CUDAExecutionProvider" if report.target == "cuda" else "CPUExecutionProvider"
    provider = wanted if wanted in ort.get_available_providers() else "CPUExecutionProvider"
    output_not_loaded = onnxruntime_failure(output, provider=provider)
    if output_not_loaded is not None and provider != wanted:
        raise InputError(
            f"{source_label}: the input model fails onnx.checker ({first}), and the converted model cannot be "
            f"loaded here to prove it instead: {wanted} is not available ({output_not_loaded}); nothing written"
        )
    if output_not_loaded is not None:
        raise AmpError(
            f"{label}: the input fails onnx.checker but loads in onnxruntime, and the converted model does not "
            f"({output_not_loaded}); nothing written"
        )
    report.proof = f"onnxruntime loads it (the input fails onnx.checker: {first})"
    logger.info("%s: %s", label, report.proof)

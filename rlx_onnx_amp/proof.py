"""The proof that a converted model is sound: onnx's full checker passes on it, or (for an input
the checker refuses) onnxruntime loads the input and the output alike.

The checker is the longest single step of a plain conversion of a large graph without
verification (about a quarter of it at 200,000 nodes) and holds the GIL, so a thread cannot run
beside it. `CheckerRun` runs it in a process of its own, started while the model is converted
(its imports take a quarter of a second) and given the written file: there its checks before
the inference run in a forked copy beside its strict shape inference, so this process (which
fills the conversion's report meanwhile) neither parses the output again nor holds its memory.
Its verdict is `checker_failure`'s, word for word.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import onnx
from onnx import ModelProto

from rlx_onnx_amp.errors import AmpError, InputError, first_line, message_first_line
from rlx_onnx_amp.exits import add_last_resort
from rlx_onnx_amp.files import private_dir, remove_private_dir
from rlx_onnx_amp.reports.conversion import ConversionReport

__all__ = ["SEPARATE_CHECK_NODES", "CheckerRun", "checker_failure", "onnxruntime_failure", "prove", "stop_checkers"]

logger = logging.getLogger(__name__)

#: From this many nodes in the main graph the checker runs in a process of its own: below it the
#: check takes less than that process's start-up.
SEPARATE_CHECK_NODES = 20_000

_LIMIT = 1000  # characters of the checker's first line
_CHECKS_READER = "rlx-amp-checker-checks"  # the thread that reads the checks' verdict
_RELEASE_S = 2.0  # how long `CheckerRun.close` tries to end the wait in the FIFO's open

#: Bytes of heap the checker's process takes per byte of the model file it checks: its parse
#: and strict inference of a 200,000-node chain (19.9 MB) take about 400 MB.
HEAP_PER_MODEL_BYTE = 20
_HEAP_MAX = 8 << 30
_HEAP_MIN = 16 << 20  # one block of the process's faulting-in

#: A model in memory (a protobuf at most 2 GiB) or a model file.
_Checkable = ModelProto | str | os.PathLike[str]

# The checker's process: it reads a model path on stdin (to its end; then a NUL and a FIFO's
# path, where there is one) and runs the full checker on it: its strict shape inference here,
# and, when its first argument names a file descriptor, its checks before the inference
# (`check_model(full_check=False)`) in a copy forked at start-up, which writes a line with its
# process id to that descriptor, waits for the path on a pipe, then writes its verdict there
# (the copy is reaped as it ends: SIGCHLD is ignored here; it runs at nice 5).
# While it waits for its path this process faults in a heap of its second argument's bytes
# (`_heap_budget`), with glibc kept from handing freed memory back and from mapping blocks
# under 32 MiB apart from the heap: onnx's parse and inference then take memory that is mapped
# already, rather than a page fault per 4 KiB (about 100,000 of them, a tenth of the
# inference's time, after a 200,000-node graph). It stops as soon as the path comes, and forks
# its copy before it starts, so that neither writes to pages the other shares.
# Each verdict is "F", the exception's type name, a NUL and its text when it fails, else "P";
# each writer then closes its descriptor and ends. With a FIFO, the inference's output
# file is the FIFO: onnx opens its output only once the inference has passed
# (shape_inference/implementation.cc, InferShapes(model_path, save_path), read for the releases
# of `_FIFO_ONNX`), so that open is the verdict "passed", which `CheckerRun` sees as it happens;
# serializing the inferred model and freeing it (a third of a second after a 200,000-node graph)
# come after it, and this process is stopped instead. Its C++ prints (the checker's warning) go
# to the null device, not into a verdict. It ignores SIGINT (a terminal's ^C reaches the whole
# process group; `CheckerRun` stops it and its copy, which lead a process group of their own).
# `-P`: the working directory is not put on its sys.path.
_INFERENCE_PROCESS = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its forked copy is reaped as it ends: no zombie
import onnx.checker, onnx.shape_inference
checks = int(sys.argv[1]) if len(sys.argv) > 1 else -1
budget = int(sys.argv[2]) if len(sys.argv) > 2 else 0
verdict = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)

def fault_in_heap(budget):
    import ctypes, select
    try:
        libc = ctypes.CDLL(None)
        # M_MMAP_THRESHOLD (its largest) and M_TRIM_THRESHOLD: glibc only; elsewhere no heap is made.
        if not (libc.mallopt(-3, 32 << 20) and libc.mallopt(-1, 2**31 - 1)):
            return
    except (OSError, AttributeError):
        return
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks, block = [], 16 << 20
    try:
        while len(blocks) * block < budget and not select.select([0], [], [], 0)[0]:  # until the path comes
            address = libc.malloc(block)
            if not address:
                break
            ctypes.memset(address, 0, block)
            blocks.append(address)
    finally:
        for address in blocks:
            libc.free(address)  # back to the heap's top, mapped still

def run(check, out, copy=0):
    try:
        check()
        said = "P"
    except Exception as e:
        said = "F" + type(e).__name__ + "\\0" + str(e)
    try:
        os.write(out, said.encode("utf-8", "replace"))
    except OSError:
        pass  # the verdict came another way and its reader is gone
    os.close(out)  # its reader sees the end now, not once this process's memory is unmapped
    if copy:  # the copy ends first: an orphan's zombie waits for an init that may not reap it
        try:
            os.waitpid(copy, 0)
        except ChildProcessError:
            pass  # reaped as it ended
    os._exit(0)  # the verdict is out: no interpreter teardown to wait for

copy = 0
if checks >= 0:
    given, tell = os.pipe()
    copy = os.fork()
    if copy == 0:
        # The checks yield a little to the inference, whose verdict comes last, and to the
        # caller filling its report beside them: on two CPUs the three would share them.
        os.nice(5)
        os.close(verdict)
        os.close(tell)
        os.write(checks, b"%d\\n" % os.getpid())
        said = b""
        while chunk := os.read(given, 1 << 16):
            said += chunk
        if not said:
            os._exit(0)  # no path came: nothing to check
        path = os.fsdecode(said)
        run(lambda: onnx.checker.check_model(path, full_check=False), checks)
    os.close(checks)
    os.close(given)
if budget:
    fault_in_heap(budget)
path, _, fifo = os.fsdecode(sys.stdin.buffer.read()).partition("\\0")
if copy:
    try:
        os.write(tell, os.fsencode(path))
    except OSError:
        pass  # the copy is gone: its reader hears no verdict and says so
    os.close(tell)
if path:
    run(lambda: onnx.shape_inference.infer_shapes_path(path, fifo or os.devnull, check_type=True, strict_mode=True),
        verdict, copy)
"""


def _heap_budget(model_bytes: int) -> int:
    """How much heap the checker's process faults in while it waits for a model file of
    `model_bytes`: what its check takes (`HEAP_PER_MODEL_BYTE`), at most a quarter of the memory
    available and 8 GiB; none on Linux without /proc/meminfo, elsewhere, on one CPU (where the
    faulting-in would take that CPU from the conversion) or below 16 MiB."""
    wanted = min(model_bytes * HEAP_PER_MODEL_BYTE, _HEAP_MAX)
    if wanted < _HEAP_MIN or not sys.platform.startswith("linux"):
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cpus < 2:
        return 0
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            available = next(int(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0
    budget = min(wanted, available // 4)
    return budget if budget >= _HEAP_MIN else 0


def checker_failure(model: _Checkable, limit: int = _LIMIT) -> str | None:
    """The first line of what `onnx.checker.check_model(full_check=True)` says against a model
    file (or a model in memory), or None when it passes: how a failure is told to be the
    input's or ours."""
    try:
        onnx.checker.check_model(model if isinstance(model, ModelProto) else str(model), full_check=True)
    except Exception as e:
        return first_line(e, limit)
    return None


#: Whether a checker's process leads a process group of its own, where its checks run in a
#: forked copy (POSIX): stopping it stops both.
_OWN_GROUP = hasattr(os, "fork") and hasattr(os, "killpg")

#: The checkers' processes that run now (until reaped), each with its run.
_RUNNING: dict[subprocess.Popen[bytes], CheckerRun] = {}


def stop_checkers() -> None:
    """Stop every checker's process this process started (its forked copy first) and reap
    them, a bounded wait: for a process about to end with os._exit (a watchdog's end, a
    stopped batch worker), which would otherwise leave them, still dying, to an init that may
    never reap them."""
    for process, run in list(_RUNNING.items()):
        run._stop(process)
    deadline = time.monotonic() + _RELEASE_S
    for process in list(_RUNNING):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        _RUNNING.pop(process, None)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Stop a checker's process and its forked copy: the process group it leads."""
    if process.returncode is not None:
        return  # reaped: its number may be another's now
    with contextlib.suppress(OSError):
        if _OWN_GROUP:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()


def _kill_and_wait_reaped(kill: list[int], wait: list[int]) -> None:
    """SIGKILL the processes `kill`, then wait (at most `_RELEASE_S`) until every one of
    `wait` is gone: reaped by its parent, a checker's process, which ignores SIGCHLD and so
    has its children reaped as they end, even while it is stopped."""
    for pid in kill:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _RELEASE_S
    for pid in wait:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:  # gone (reaped), or the number is not its own any more
                break
            time.sleep(0.0005)


def _children(pid: int) -> list[int]:
    """The child processes of `pid`, from Linux's /proc (none where it does not list them)."""
    found: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += map(int, listing.read_text().split())
    return found


add_last_resort(stop_checkers)
# And at the end of the run: a checker killed after its verdict is reaped by a daemon thread,
# which the process's end (os._exit) does not wait for.
atexit.register(stop_checkers)
if hasattr(os, "register_at_fork"):  # POSIX; a forked worker's are its own
    os.register_at_fork(after_in_child=_RUNNING.clear)


class CheckerRun:
    """`checker_failure` of a model file, in a process of its own when `separate`: started now,
    given the file with `check`, read with `result`. Without `separate`, or when that process
    cannot start or ends without a verdict, `result` runs the checker in this process. `close`
    (or leaving the `with` block) stops the process, whatever stopped the caller."""

    def __init__(self, separate: bool, model_bytes: int = 0) -> None:
        """`model_bytes`: the size of the model file to come, which sizes the heap the
        process faults in while it waits (`_heap_budget`); 0: none."""
        self._path: Path | None = None
        self._heap = _heap_budget(model_bytes)
        self._process: subprocess.Popen[bytes] | None = None
        self._verdict = False
        self._fifo: Path | None = None
        # The read end of the pipe the checks' verdict comes on (None: the checks run here);
        # its reader closes it.
        self._checks: int | None = None
        self._copy: int | None = None  # the forked copy's process id, once it said it
        self._copy_done = False  # the copy closed its end of the pipe
        self._forks = False  # the checker's process forks a copy for the checks
        # What the process says (its stdout, read by a thread), the checks' verdict and the
        # FIFO's open, in the order they happen: ("said", bytes), ("checked", bytes) or
        # ("opened", b"").
        self._heard: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        if separate:
            self._start()

    def _start(self) -> None:
        """The checker's process, with a pipe for its checks' verdict where it can fork."""
        read_end = write_end = -1
        if _OWN_GROUP:
            with contextlib.suppress(OSError):
                read_end, write_end = os.pipe()
        argv = [sys.executable, "-P", "-c", _INFERENCE_PROCESS, str(write_end), str(self._heap)]
        try:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                pass_fds=(write_end,) if write_end >= 0 else (), start_new_session=_OWN_GROUP,
            )
        except OSError as e:
            logger.debug("cannot start the checker's process (%s): it runs in this process", e)
            if read_end >= 0:
                os.close(read_end)
        else:
            _RUNNING[self._process] = self
            if read_end >= 0:
                self._checks = read_end
                self._forks = True
        finally:
            if write_end >= 0:
                os.close(write_end)  # the process's copy is the only writer: its end is the pipe's

    @property
    def separate(self) -> bool:
        """Whether the checker runs in a process of its own."""
        return self._process is not None

    def check(self, path: str | os.PathLike[str]) -> None:
        """Start the checker on `path` (once)."""
        self._path = Path(path)
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            return
        self._fifo = _make_fifo(self._path.parent)
        said = os.fsencode(self._path) + (b"\0" + os.fsencode(self._fifo) if self._fifo is not None else b"")
        self._listen(_read_said, process.stdout)
        if self._checks is not None:
            self._listen(self._read_checked, self._checks, _CHECKS_READER)
        if self._fifo is not None:
            self._listen(_wait_opened, self._fifo)
        try:
            process.stdin.write(said)
            process.stdin.close()
        except OSError:
            self.close()

    def _listen(
        self, target: Callable[[Any, queue.SimpleQueue[tuple[str, bytes]]], None], source: Any,
        name: str = "rlx-amp-checker",
    ) -> None:
        thread = threading.Thread(target=target, args=(source, self._heard), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read_checked(self, fd: int, heard: queue.SimpleQueue[tuple[str, bytes]]) -> None:
        """The forked copy's process id, then the verdict of the checks before the inference
        (b"" when it ended without a word), read to the pipe's end; then the pipe is closed."""
        said = bytearray()
        try:
            while chunk := os.read(fd, 1 << 16):
                said += chunk
                if self._copy is None and b"\n" in said:
                    line, _, rest = bytes(said).partition(b"\n")
                    self._copy, said = int(line), bytearray(rest)
        except (OSError, ValueError):
            said.clear()
        finally:
            os.close(fd)
            self._copy_done = True
        heard.put(("checked", bytes(said)))

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        """Stop the checker's process and its forked copy, the copy first: killed together,
        the copy could end after its parent, an orphan whose zombie waits for an init that
        may never reap it (a container's first process often does not)."""
        if self._copy is not None:
            copies = [self._copy] if not self._copy_done else []  # done: its number may be another's
            _kill_and_wait_reaped(copies, [self._copy])
        elif self._forks and process.returncode is None:
            # Forked but not named yet (the copy says its number once the checker's process has
            # imported onnx; it is read once `check` is called): the group is frozen, so its
            # leader neither forks nor ends, and the leader's children are the copy.
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGSTOP)
                children = _children(process.pid)
                _kill_and_wait_reaped(children, children)
        _kill(process)

    def result(self) -> str | None:
        """What `checker_failure(path)` says: the checker's first line, or None when it passes.

        onnx's full check is its checks, then strict shape inference (`check_model` with
        `full_check=True`): with a process of its own the inference runs there while the
        checks run in its forked copy (here, where it cannot fork), and the checks' failure
        comes first, as in the full check."""
        assert self._path is not None, "check(path) first"
        if self._process is None or not self._threads:
            return checker_failure(self._path)
        if self._checks is None:
            try:
                onnx.checker.check_model(str(self._path), full_check=False)
            except Exception as e:
                self.close()
                return first_line(e, _LIMIT)
            checked: bytes | None = b"P"
        else:
            checked = None
        _release_memory()  # while the checker runs there
        inferred: bytes | None = None  # what the inference says; the FIFO's open says b"P"
        # The checks' failure comes first, as in the full check: their verdict is awaited even
        # after the inference's.
        while checked is None or inferred is None:
            what, said = self._heard.get()
            if what == "checked":
                checked = said
                if not said.startswith(b"P"):
                    break
            elif inferred is None:
                inferred = b"P" if what == "opened" else said
        assert checked is not None
        # What decides: the checks unless they passed, else the inference (b"": no word).
        decisive = inferred if checked.startswith(b"P") else checked
        self._verdict = decisive is not None and decisive[:1] in (b"P", b"F")
        self.close()
        if decisive is None or not self._verdict:
            logger.debug("the checker's process ended without a verdict: checking in this process")
            return checker_failure(self._path)
        if decisive.startswith(b"F"):
            type_name, _, text = decisive[1:].decode("utf-8", "replace").partition("\0")
            return message_first_line(type_name, text, _LIMIT)
        return None

    def close(self) -> None:
        """Stop the checker's process if it still runs, and reap it: at once, or (a process
        that gave its verdict) in a thread beside the run, since its end waits for its memory
        to be unmapped (30 ms after a 200,000-node graph); remove the FIFO."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        self._stop(process)  # after the FIFO's open, it serializes and frees the inferred model
        # The threads end with the process's stdout and with the FIFO's open, which this
        # process makes itself, again until it lands (the thread may not wait in it yet); a
        # FIFO that cannot be opened any more (its directory removed under the run) leaves
        # its daemon thread waiting rather than this one.
        deadline = time.monotonic() + _RELEASE_S
        for thread in self._threads:
            while self._fifo is not None and thread.is_alive() and time.monotonic() < deadline:
                _release_opener(self._fifo)
                thread.join(0.001)
            # The checks' reader ends with the process group, which no longer writes: a bound
            # all the same, as the pipe's end is not this process's to force.
            bounded = self._fifo is not None or thread.name == _CHECKS_READER
            thread.join(max(0.0, deadline - time.monotonic()) if bounded else None)
        if process.stdout is not None:
            process.stdout.close()
        if self._fifo is not None:
            remove_private_dir(self._fifo.parent)
        if self._verdict:
            threading.Thread(target=_reap, args=(process,), name="rlx-amp-checker-reaper", daemon=True).start()
            return
        _reap(process)

    def __enter__(self) -> CheckerRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The onnx releases whose InferShapes(model_path, save_path) was read to open its output only
#: after the inference (1.14 to 1.23): the FIFO's open is a verdict only for these.
_FIFO_ONNX = ((1, 14), (1, 24))


def _onnx_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of an onnx version string, or None when it does not start with them."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _make_fifo(directory: Path) -> Path | None:
    """A FIFO in a private directory in `directory`, or None (no FIFOs here, or an onnx whose
    order of inference and open was not read)."""
    release = _onnx_release(onnx.__version__)
    if not hasattr(os, "mkfifo") or release is None or not _FIFO_ONNX[0] <= release < _FIFO_ONNX[1]:
        return None
    try:
        fifo = private_dir(".rlx-amp-checker-", directory) / "inferred"
    except OSError:
        return None
    try:
        os.mkfifo(fifo, 0o600)
    except OSError as e:
        logger.debug("no FIFO for the checker in %s (%s)", directory, e)
        remove_private_dir(fifo.parent)
        return None
    return fifo


def _read_said(stdout: IO[bytes], heard: queue.SimpleQueue[tuple[str, bytes]]) -> None:
    """What the checker's process writes, to its end (b"" when it ended without a word)."""
    with contextlib.suppress(OSError, ValueError):  # closed by `close` after a verdict
        heard.put(("said", stdout.read()))
        return
    heard.put(("said", b""))


def _wait_opened(fifo: Path, heard: queue.SimpleQueue[tuple[str, bytes]]) -> None:
    """Block until the FIFO is opened to write (by onnx, once the inference has passed, or by
    `_release_opener`); the open is the news, not the bytes, so the reader closes at once."""
    try:
        fd = os.open(fifo, os.O_RDONLY)
    except OSError:
        return
    heard.put(("opened", b""))  # before the close: onnx's write fails only after it
    os.close(fd)


def _release_opener(fifo: Path) -> None:
    """Open the FIFO to write, which ends `_wait_opened`'s wait if it still waits."""
    with contextlib.suppress(OSError):  # ENXIO: no reader waits (it was opened already)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _reap(process: subprocess.Popen[bytes]) -> None:
    process.wait()
    _RUNNING.pop(process, None)


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

"""One model's run under a supervisor: an onnxruntime crash (SIGSEGV, SIGABRT in its C++) is that
model's exit 3 with one line, not the end of rlx-amp with a signal.

`run_contained(fn, args, outputs, label)` forks this process (everything is imported, no
onnxruntime session is open here: the pipeline opens them all in the child) and runs `fn(*args)`
in the child. The child tells the supervisor, over one pipe, what it is about to do in
onnxruntime (`contain.note`: the model, its role, the provider) and which private directories it
makes and removes (`files.listen_to_dirs`); at the end it sends its answer and what it staged in
its copy of `outputs`, which the supervisor adopts (`OutputSet.adopt`) and commits as if it had
staged it itself. A child that dies without an answer leaves nothing: the supervisor removes the
directories it made (staging beside the outputs, scratch in its own TMPDIR) and raises
`ModelRunError` naming what crashed, from the child's last note.

Where this process's stdout or stderr is no file (a `--jobs` worker's captured output, a test's
runner), the child captures its own and sends the text with its answer. A stop (^C, SIGTERM)
stops the child too: it unwinds as this process would, and the supervisor removes what it left.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import io
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from rlx_onnx_amp import contain
from rlx_onnx_amp.child import warm_up
from rlx_onnx_amp.errors import AmpError, ModelRunError
from rlx_onnx_amp.exits import EXIT_SIGTERM
from rlx_onnx_amp.files import OutputSet, listen_to_dirs, private_dir, remove_private_dir
from rlx_onnx_amp.stops import signals_deferred

__all__ = ["STOP_GRACE_S", "run_contained"]

T = TypeVar("T")

#: How long a stopped child gets to unwind (remove its scratch) before it is killed.
STOP_GRACE_S = 10.0


def run_contained(
    fn: Callable[..., T], args: tuple[Any, ...], outputs: OutputSet, label: str, warm: bool = False
) -> T:
    """`fn(*args)` in a forked child (see the module); its result, or its exception raised here
    again. `outputs` is the set the child stages into; `label` names the model in the line a
    crash gets; `warm`: the child starts its own children's fork server at once (it verifies)."""
    context = multiprocessing.get_context("fork")
    scratch = private_dir("rlx-amp-run-")  # the child's TMPDIR: what it leaves there goes with it
    receive, send = context.Pipe(duplex=False)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # or the child would write this process's buffered lines again
    # The fork waits for no stop signal (one inside the fork's own handlers is "Exception
    # ignored"); the child puts this process's handlers back, not the holding ones.
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    # Garbage that holds an onnxruntime session goes here, where its threads are: a child that
    # collected a copy would wait forever on a condition variable whose waiters stayed behind.
    gc.collect()
    child = context.Process(target=_child, args=(send, fn, args, outputs, scratch, warm, handlers), daemon=False)
    told = _Told()
    try:
        try:
            with signals_deferred():  # a stop that waited for the start raises here: inside the try
                child.start()
        finally:
            send.close()  # the child holds the only writer: its end is the pipe's end
        told.read(receive)
        child.join()
    except BaseException:
        _stop(child)
        with signals_deferred():
            told.read(receive)  # what the child said after the stop: the directories it made
            _remove(told.made, scratch)
        raise
    finally:
        receive.close()
    answer = told.answer
    if answer is not None and answer[0] == "ok":
        remove_private_dir(scratch)
        outputs.adopt(answer[2])  # its staging is this process's to commit or discard now
        return answer[1]
    _remove(told.made, scratch)
    if answer is None:
        raise ModelRunError(_crash_line(label, child.exitcode, told.note))
    kind, error, *trace = answer
    if kind == "bug":
        error.add_note(f"in the supervised child:\n{trace[0]}")
    raise error


class _Told:
    """What the child told so far: its last note, the directories it made, its answer."""

    def __init__(self) -> None:
        self.made: set[Path] = set()
        self.note: str | None = None
        self.answer: tuple[Any, ...] | None = None

    def read(self, receive: Connection) -> None:
        """Every message until the child's end of the pipe closes."""
        while True:
            try:
                receive.poll(None)  # a stop signal may land here: nothing is read yet
                with signals_deferred():  # but never in the middle of a message
                    message = receive.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "note":
                self.note = message[1]
            elif kind == "dir":
                (self.made.add if message[2] else self.made.discard)(message[1])
            elif kind == "out":
                sys.stdout.write(message[1])
                sys.stderr.write(message[2])
            else:
                self.answer = message


def _crash_line(label: str, exit_code: int | None, note: str | None) -> str:
    if exit_code is not None and exit_code < 0:
        number = -exit_code
        known = number in signal.valid_signals()
        how = f"signal {number} ({signal.Signals(number).name})" if known else f"signal {number}"
    else:
        how = f"exit code {exit_code}"
    what = f" {note}" if note else ""
    return f"{label}: onnxruntime crashed ({how}){what}; nothing written"


def _stop(child: multiprocessing.process.BaseProcess) -> None:
    """A stopped supervisor stops its child: SIGTERM (it unwinds), then SIGKILL past the grace."""
    if child.pid is None:  # never started
        return
    if child.exitcode is None:
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGTERM)
    child.join(STOP_GRACE_S)
    if child.exitcode is None:
        child.kill()
        child.join()


def _remove(made: set[Path], scratch: Path) -> None:
    """What a child that did not finish left: its private directories, and its TMPDIR."""
    with signals_deferred():  # all of it, or a second stop would leave some
        for path in (*made, scratch):
            remove_private_dir(path)


def _child(
    send: Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    outputs: OutputSet,
    scratch: Path,
    warm: bool,
    handlers: dict[int, Any],
) -> None:
    """The child's side: notes and directories told as they come, then the answer. A stop
    unwinds it (its own `with` blocks remove their scratch) and ends it quietly: the supervisor,
    stopped too, says so."""
    try:
        gc.freeze()  # what it inherited is never collected here (see run_contained's gc.collect)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        _answer(send, fn, args, outputs, scratch, warm)
    except BaseException:  # ^C, SIGTERM: unwound; no traceback, no answer
        os._exit(EXIT_SIGTERM)


def _answer(
    send: Connection, fn: Callable[..., Any], args: tuple[Any, ...], outputs: OutputSet, scratch: Path, warm: bool
) -> None:
    _fresh_temp(scratch)
    faulthandler.disable()  # a crash is the supervisor's to tell, in one line, not a stack dump
    if warm:
        warm_up(in_child=True)
    contain.listen(lambda what: send.send(("note", what)))
    listen_to_dirs(lambda path, made: send.send(("dir", path, made)))
    captured = not (_has_fd(sys.stdout) and _has_fd(sys.stderr))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if captured:
            _log_to(out, err)
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
        try:
            answer: tuple[Any, ...] = ("ok", fn(*args), outputs.state())
        except AmpError as e:
            answer = ("error", e)
        except Exception as e:  # a bug: its traceback goes with it
            answer = ("bug", e, "".join(traceback.format_exception(e)))
    contain.listen(None)
    listen_to_dirs(None)
    if captured:
        send.send(("out", out.getvalue(), err.getvalue()))
    try:
        send.send(answer)
    except Exception as e:  # an answer that does not pickle is a bug too
        send.send(("bug", RuntimeError(f"the supervised child's answer cannot be sent back: {e}"), ""))
    send.close()
    # The answer told, the child ends here, freeing nothing: an error's traceback holds the frames
    # of its onnxruntime sessions, whose teardown in a forked child can wait forever on a thread
    # pool (a pytest worker's child hung 27 minutes in it). What it leaves, the supervisor removes.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _log_to(out: io.StringIO, err: io.StringIO) -> None:
    """The log handlers that write to this process's stdout or stderr write to the child's
    captured text instead (the text goes back with the answer)."""
    streams = {id(sys.stdout): out, id(sys.stderr): err}
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams:
            handler.setStream(streams[id(handler.stream)])


def _has_fd(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False
    return True


def _fresh_temp(scratch: Path) -> None:
    """The child's temporary files go to `scratch`, and its children (the written model's run,
    from a fork server of its own) start afresh: the fork server a parent started cannot be
    asked from a forked child (it is not the child's to wait on)."""
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = str(scratch)
    multiprocessing.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
    server: Any = forkserver._forkserver
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    server._lock = threading.Lock()

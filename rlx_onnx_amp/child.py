"""Run a function in a child process of its own, so that a crash there (onnxruntime's C++ dying
of SIGSEGV in a session) is an exception here, `ChildCrashed`, not the end of this run. The child
starts fresh (`START_METHOD`: never a fork of this process and its threads), so `fn`, its
arguments and its result must pickle; an exception `fn` raises is raised here again. A stop
signal here ends the wait (its exception unwinds as usual) and the child is killed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any, Generic, TypeVar

from rlx_onnx_amp.stops import signals_deferred

__all__ = [
    "START_METHOD",
    "ChildCrashed",
    "ChildTimeout",
    "Pending",
    "child_event",
    "run_in_child",
    "start_in_child",
    "warm_up",
]

T = TypeVar("T")

START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
#: The fork server listens on a socket in the temporary directory, and a socket's path has at
#: most 107 bytes on Linux: under a longer TMPDIR the child is spawned instead.
_SOCKET_PATH_ROOM = 107 - len("/pymp-xxxxxxxx/listener-xxxxxxxx")
#: Imported once by the fork server, not by each child: onnxruntime and the written model's run
#: (`rlx_onnx_amp.timing`, kept light: the server's start delays the first child).
_PRELOAD = ["rlx_onnx_amp.timing"]


class ChildCrashed(Exception):
    """The child ended without an answer: killed by `signal_number` (None: it exited with
    `exit_code` instead)."""

    def __init__(self, signal_number: int | None, exit_code: int | None) -> None:
        self.signal_number, self.exit_code = signal_number, exit_code
        #: "signal 11 (SIGSEGV)", or "exit code 1".
        self.died_of = f"exit code {exit_code}"
        if signal_number:
            self.died_of = f"signal {signal_number} ({signal.Signals(signal_number).name})"
        super().__init__(f"the child process died of {self.died_of}")


class ChildTimeout(TimeoutError):
    """The child did not answer within its time-out; it was killed."""


def _context() -> multiprocessing.context.BaseContext:
    method = START_METHOD if len(tempfile.gettempdir().encode()) <= _SOCKET_PATH_ROOM else "spawn"
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(_PRELOAD)
    return context


def warm_up(in_child: bool = False) -> None:
    """Start the fork server now (a new Python importing `_PRELOAD`), so that its start-up
    overlaps this process's work instead of delaying the first child. Not in a child process
    (a `--jobs` worker starts its server with its first child, as it forks from a parent that
    may hold one of its own), unless it is one that forgot its parent's (`in_child`: a
    supervised model's run, `supervise`)."""
    if multiprocessing.parent_process() is not None and not in_child:
        return
    if _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        with signals_deferred(), _main_not_imported():
            forkserver.ensure_running()


def child_event() -> Event:
    """An event a child started by `start_in_child` can wait on (`Event.wait`) and this process
    set: how a child is held back from work that must not share the CPUs with this process's."""
    return _context().Event()


@contextlib.contextmanager
def _main_not_imported() -> Iterator[None]:
    """The child (and the fork server) import no `__main__` script: what they run lives in this
    package, and a caller's script without an `if __name__ == "__main__"` guard (the library's
    `rlx_onnx_amp.run` in a plain script) would run again in them and end them (exit code 1).
    multiprocessing reads the script's path from `__main__.__file__`, hidden while they start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class Pending(Generic[T]):
    """A call running in a child process (`start_in_child`): `result` waits for its answer;
    leaving the `with` block (or `close`) kills the child if it is still running."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        context = _context()
        self._receive, send = context.Pipe(duplex=False)
        # Starting the first child imports multiprocessing's fork server modules: a stop signal inside
        # an import lock's callback would be "Exception ignored" and printed, so it waits for the start.
        with signals_deferred(), _main_not_imported():
            self._child = context.Process(target=_child, args=(send, fn, args), daemon=True)  # type: ignore[attr-defined]
            self._child.start()
        send.close()  # the child holds the only writer: its death is the pipe's end

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether the child's answer (or its end) has come, waiting at most `timeout` seconds."""
        return self._receive.poll(timeout)

    def result(self, timeout: float | None = None) -> T:
        """The call's result, or its exception raised here again. Raises `ChildCrashed` when the
        child dies without an answer, `ChildTimeout` after `timeout` seconds (None: no limit)."""
        try:
            if not self._receive.poll(timeout):
                raise ChildTimeout(f"no answer from the child process within {timeout} s")
            ok, value = self._receive.recv()
        except EOFError:
            self._child.join()
            code = self._child.exitcode
            raise ChildCrashed(-code if code is not None and code < 0 else None, code) from None
        finally:
            self.close()
        if ok:
            return value
        raise value

    def close(self) -> None:
        if self._child.exitcode is None:
            self._child.kill()
        self._child.join()
        self._receive.close()

    def __enter__(self) -> Pending[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_in_child(fn: Callable[..., T], *args: Any) -> Pending[T]:
    """`fn(*args)` started in a fresh child process, this one going on meanwhile."""
    return Pending(fn, args)


def run_in_child(fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
    """`fn(*args)` in a fresh child process; its result, or its exception raised here again.
    Raises `ChildCrashed` when the child dies without an answer, `ChildTimeout` after `timeout`
    seconds (None: no limit)."""
    return start_in_child(fn, *args).result(timeout)


def _child(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """The child's side: a terminal's ^C reaches it too, but is the parent's to act on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        answer: tuple[bool, Any] = (True, fn(*args))
    except Exception as e:
        answer = (False, e)
    try:
        send.send(answer)
    except OSError:  # the parent stopped waiting (a stop signal): nobody to answer
        return
    except Exception as e:  # a result or exception that does not pickle
        send.send((False, RuntimeError(f"the child's answer cannot be sent back: {type(e).__name__}: {e}")))
    send.close()

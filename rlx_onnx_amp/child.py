"""Run a function in a child process of its own, so that a crash there (onnxruntime's C++ dying
of SIGSEGV in a session) is an exception here, `ChildCrashed`, not the end of this run. The child
starts fresh (`START_METHOD`: never a fork of this process and its threads), so `fn`, its
arguments and its result must pickle; an exception `fn` raises is raised here again. A stop
signal here ends the wait (its exception unwinds as usual) and the child is killed.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from rlx_onnx_amp.exits import signals_deferred

__all__ = ["START_METHOD", "ChildCrashed", "ChildTimeout", "run_in_child"]

T = TypeVar("T")

START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
#: What the fork server imports once, so that each child it forks starts with it: onnxruntime
#: (a few hundred milliseconds) and the verification's session code.
_PRELOAD = ["rlx_onnx_amp.verification.compare"]


class ChildCrashed(Exception):
    """The child ended without an answer: killed by `signal_number` (None: it exited with
    `exit_code` instead)."""

    def __init__(self, signal_number: int | None, exit_code: int | None) -> None:
        self.signal_number, self.exit_code = signal_number, exit_code
        if signal_number is not None:
            with_what = f"signal {signal_number} ({signal.Signals(signal_number).name})"
        else:
            with_what = f"exit code {exit_code}"
        super().__init__(f"the child process died of {with_what}")


class ChildTimeout(TimeoutError):
    """The child did not answer within its time-out; it was killed."""


def run_in_child(fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
    """`fn(*args)` in a fresh child process; its result, or its exception raised here again.
    Raises `ChildCrashed` when the child dies without an answer, `ChildTimeout` after `timeout`
    seconds (None: no limit)."""
    context = multiprocessing.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        context.set_forkserver_preload(_PRELOAD)
    receive, send = context.Pipe(duplex=False)
    # Starting the first child imports multiprocessing's fork server modules: a stop signal inside
    # an import lock's callback would be "Exception ignored" and printed, so it waits for the start.
    with signals_deferred():
        child = context.Process(target=_child, args=(send, fn, args), daemon=True)  # type: ignore[attr-defined]
        child.start()
    send.close()  # the child holds the only writer: its death is the pipe's end
    try:
        if not receive.poll(timeout):
            raise ChildTimeout(f"no answer from the child process within {timeout} s")
        ok, value = receive.recv()
    except EOFError:
        child.join()
        code = child.exitcode
        raise ChildCrashed(-code if code is not None and code < 0 else None, code) from None
    finally:
        if child.exitcode is None:
            child.kill()
        child.join()
        receive.close()
    if ok:
        return value
    raise value


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

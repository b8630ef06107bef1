"""What SIGINT and SIGTERM do to a run (exit codes 130 and 143: `exits`).

Both raise where the run is (SIGTERM `Terminated`, SIGINT `KeyboardInterrupt`), so that every
cleanup runs, and both record the stop (`stop_requested`): a handler's exception raised inside a
`__del__` is printed and lost, so a commit, or a batch worker's next model, asks. Creating and
removing staging and scratch, and committing, hold the signals until done (`signals_deferred`).
A handler runs between two bytecodes of the main thread, so inside a long C call once it returns
(docs/design.md, "stop-after-the-call").
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = [
    "Terminated", "ignore_stop_signals", "raise_on_stop", "raise_stop", "request_stop", "signal_held_during_commit",
    "signals_deferred", "stop_handlers", "stop_requested",
]  # fmt: skip


class Terminated(BaseException):
    """SIGTERM, raised where the run is: a BaseException, like KeyboardInterrupt."""


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_stop: int | None = None  # the signal that stopped the run, once one arrived
_held_during_commit = False


def request_stop(signum: int | None = signal.SIGTERM) -> None:
    """Record that `signum` stops the run (None: forget it, for a new run)."""
    global _stop
    _stop = signum


def stop_requested() -> bool:
    return _stop is not None


def raise_stop() -> None:
    """Raise the exception of the recorded stop: KeyboardInterrupt for SIGINT, else Terminated."""
    if _stop == signal.SIGINT:
        raise KeyboardInterrupt()
    raise Terminated()


def raise_on_stop(signum: int, frame: object) -> None:
    """The SIGINT and SIGTERM handler: record the stop and raise its exception where the run is."""
    request_stop(signum)
    raise_stop()


@contextlib.contextmanager
def stop_handlers() -> Iterator[None]:
    """A new run: the earlier stop forgotten, SIGTERM and SIGINT (unless ignored) raising; the
    handlers before it back when the block ends."""
    global _held_during_commit
    previous = {number: signal.getsignal(number) for number in _STOP_SIGNALS}
    request_stop(None)
    _held_during_commit = False  # an earlier run's, in this process
    signal.signal(signal.SIGTERM, raise_on_stop)
    if previous[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_on_stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def ignore_stop_signals() -> None:
    """The run is over and its exit code decided: a signal now would kill the interpreter's
    shutdown (-15) after a complete run, so SIGINT and SIGTERM are ignored from here on."""
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def signal_held_during_commit() -> bool:
    """Whether a stop signal came during a commit, which finished first: the outputs are whole."""
    return _held_during_commit


@contextlib.contextmanager
def signals_deferred(committing: bool = False) -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on them as before (`committing`:
    the outputs are being committed, `signal_held_during_commit` says so)."""
    global _held_during_commit
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}

    def hold(number: int, frame: object) -> None:
        caught.append(number)

    for s in _STOP_SIGNALS:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _held_during_commit = _held_during_commit or bool(caught and committing)
        for number in caught[:1]:
            handler = previous[signal.Signals(number)]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)

"""How a run ends: its exit codes (docs/cli.md's table), its one-line error, and what SIGINT
and SIGTERM do to it. A batch, and a merge of batches, exit with the worst code (`SEVERITY`).

SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` where the run is, so that every
cleanup runs, and both record the stop (`stop_requested`): a handler's exception raised inside a
`__del__` is printed and lost, so a commit, or a batch worker's next model, asks. Creating and
removing staging and scratch, and committing, hold the signals until done (`signals_deferred`).
A handler runs between two bytecodes of the main thread: inside a long C call it runs once the
call returns (work that can crash or hang in C runs in a child, `child.run_in_child`, whose
wait a handler interrupts). Standard library only: `__main__` installs the handlers before the
heavy imports.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

__all__ = [
    "EXIT_DRIFT", "EXIT_INTERNAL", "EXIT_LOW_GAIN", "EXIT_OK", "EXIT_SIGINT", "EXIT_SIGPIPE", "EXIT_SIGTERM",
    "EXIT_UNVERIFIED", "EXIT_USAGE", "SEVERITY", "Terminated", "error_line", "fail", "ignore_stop_signals",
    "raise_on_stop", "raise_stop", "request_stop", "signal_held_during_commit", "signals_deferred", "stop_handlers",
    "stop_requested", "worst_exit_code",
]  # fmt: skip

EXIT_OK, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2  # 3 (a model could not be run) comes from errors.ModelRunError
EXIT_UNVERIFIED = 4  # converted and written, not verified: the reference could not run
#: Written and verified, but it keeps less of its multiply-accumulates low than --min-low-share asks.
EXIT_LOW_GAIN = 5
EXIT_INTERNAL = 70  # a bug: sysexits' EX_SOFTWARE (its traceback, then one line)
EXIT_SIGINT, EXIT_SIGTERM, EXIT_SIGPIPE = 130, 143, 141  # nothing written, no scratch left

#: Exit codes from least to most severe: a batch, and a merge of batches, exit with the worst.
SEVERITY = (0, 4, 5, 1, 2, 3, 70)  # 4: written but not verified; 5: buys less than asked; then drift


def worst_exit_code(codes: Sequence[int]) -> int:
    """The most severe of `codes` by `SEVERITY` (a code it does not list is the worst); 0 for none."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=EXIT_OK)


def error_line(message: str) -> str:
    """The one line a user error gets on stderr (CONTRIBUTING, "Rules of the house")."""
    return f"rlx-amp: error: {message}"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """End the run with the one-line error and `code`."""
    import click  # light beside onnx, and loaded by the time a command fails

    click.echo(error_line(message), err=True)
    sys.exit(code)


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

"""How a run ends: its exit codes, its one-line error, and what SIGINT and SIGTERM do to it.

Exit codes (docs/cli.md's table): 0 success; 1 drift over tolerance (models and reports are
written); 2 bad usage or input and 3 a model onnxruntime cannot run (one line on stderr,
nothing written); 4 converted and written, not verified (the reference could not run on the
inputs a default verification uses); 70 an internal error, a bug (its traceback, then one
line); 130 and 143 interrupted by SIGINT or SIGTERM (nothing written, no scratch left); 141 a
closed stdout. A batch, and a merge of batches, exit with the worst of their codes (`SEVERITY`).

Stop state: SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` where the run is, so that
every cleanup runs, and both record the stop (`request_stop`). Python may run a handler inside a
`__del__` or a finalizer, where its exception is printed and ignored and the run would go on as
if nothing happened: what must not happen after a stop (a commit, a batch worker taking its next
model, a batch going on) asks `stop_requested` too, and `raise_stop` raises the exception again.
Creating and removing staging and scratch directories, and committing, hold the signals until
they are done (`signals_deferred`).

Only the standard library here: `__main__` puts the handlers in before the heavy imports.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import NoReturn

__all__ = [
    "EXIT_DRIFT",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_SIGINT",
    "EXIT_SIGPIPE",
    "EXIT_SIGTERM",
    "EXIT_UNVERIFIED",
    "EXIT_USAGE",
    "SEVERITY",
    "Terminated",
    "error_line",
    "fail",
    "ignore_stop_signals",
    "raise_interrupted",
    "raise_stop",
    "raise_terminated",
    "request_stop",
    "signal_held_during_commit",
    "signals_deferred",
    "stop_handlers",
    "stop_requested",
    "worst_exit_code",
]

EXIT_OK, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2  # 3 (a model could not be run) comes from errors.ModelRunError
#: Converted and written, but not verified: the reference could not run on the inputs a default
#: verification uses (guessed axes, an op onnxruntime lacks). With --verify it is an error.
EXIT_UNVERIFIED = 4
EXIT_INTERNAL = 70  # a bug: sysexits' EX_SOFTWARE
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
EXIT_SIGPIPE = 141  # 128 + SIGPIPE

#: Exit codes from least to most severe: a batch, and a merge of batches, exit with the worst.
SEVERITY = (0, 4, 1, 2, 3, 70)  # 4: written but not verified, below a measured drift


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
    """SIGTERM, raised where the run is so that every cleanup (staged outputs, scratch) runs.
    A BaseException, like KeyboardInterrupt: no `except Exception` may swallow it."""


#: The signal that stopped the run (SIGINT or SIGTERM), once one arrived (see the docstring).
_stop: int | None = None


def request_stop(signum: int | None = signal.SIGTERM) -> None:
    """Record that `signum` stops the run (None: forget it, for a new run in this process)."""
    global _stop
    _stop = signum


def stop_requested() -> bool:
    return _stop is not None


def raise_stop() -> None:
    """Raise the exception of the recorded stop: KeyboardInterrupt for SIGINT, else Terminated."""
    if _stop == signal.SIGINT:
        raise KeyboardInterrupt()
    raise Terminated()


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler: raise Terminated where the run is (and record the stop)."""
    request_stop(signal.SIGTERM)
    raise Terminated()


def raise_interrupted(signum: int, frame: object) -> None:
    """The SIGINT handler: raise KeyboardInterrupt, as Python's own does (and record the stop)."""
    request_stop(signal.SIGINT)
    raise KeyboardInterrupt()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_handlers() -> Iterator[None]:
    """A new run: the stop (and a signal held during a commit) forgotten, SIGTERM raising
    `Terminated`, SIGINT `KeyboardInterrupt` (not where SIGINT is ignored); the handlers before
    it are back when the block ends."""
    global _held_during_commit
    previous = {number: signal.getsignal(number) for number in _STOP_SIGNALS}
    request_stop(None)
    _held_during_commit = False  # an earlier run's, in this process
    signal.signal(signal.SIGTERM, raise_terminated)
    if previous[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupted)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def ignore_stop_signals() -> None:
    """The run is over: its outputs are committed or removed, and its exit code decided. A
    signal now would find Python's handlers gone while the interpreter shuts down and kill the
    process (-15) after a complete run: from here on SIGINT and SIGTERM are ignored."""
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


_held_during_commit = False


def signal_held_during_commit() -> bool:
    """Whether a SIGINT or SIGTERM arrived while outputs were being committed: the commit
    finished first, so the outputs are whole and in place."""
    return _held_during_commit


@contextlib.contextmanager
def signals_deferred(committing: bool = False) -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on them as before: creating and
    removing staging and scratch directories, and committing, are never cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    for s in _STOP_SIGNALS:
        signal.signal(s, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught and committing:
            global _held_during_commit
            _held_during_commit = True
        for number in caught[:1]:
            handler = previous[signal.Signals(number)]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)

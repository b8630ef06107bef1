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

A handler runs between two bytecodes of the main thread: inside a long C call that releases the
GIL (onnxruntime opening a large float16 model on its CPU provider takes minutes) it waits for
the call to return. So while `stop_handlers` runs, a watchdog thread learns of SIGINT and SIGTERM
at once (the signal module's wakeup fd); when no handler has acted on one `STOP_GRACE_S` later,
it takes the commit lock (a commit under way finishes first; none starts after), runs the last
resorts (`add_last_resort`: staging and scratch removed, a checker's process killed), writes the
run's one line and ends the process with its exit code.

Only the standard library here: `__main__` puts the handlers in before the heavy imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
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
    "STOP_GRACE_S",
    "Terminated",
    "add_last_resort",
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
    "watch_stops",
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
    _handled.set()
    request_stop(signal.SIGTERM)
    raise Terminated()


def raise_interrupted(signum: int, frame: object) -> None:
    """The SIGINT handler: raise KeyboardInterrupt, as Python's own does (and record the stop)."""
    _handled.set()
    request_stop(signal.SIGINT)
    raise KeyboardInterrupt()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_handlers(stuck: Callable[[int], tuple[str | None, int]] | None = None) -> Iterator[None]:
    """A new run: the stop (and a signal held during a commit) forgotten, SIGTERM raising
    `Terminated`, SIGINT `KeyboardInterrupt` (not where SIGINT is ignored); the handlers before
    it are back when the block ends. With `stuck` a watchdog (`watch_stops`) ends the run for a
    main thread that cannot act on the signal: `stuck(signum)` gives its line and exit code."""
    global _held_during_commit
    previous = {number: signal.getsignal(number) for number in _STOP_SIGNALS}
    request_stop(None)
    _held_during_commit = False  # an earlier run's, in this process
    signal.signal(signal.SIGTERM, raise_terminated)
    if previous[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupted)
    try:
        with watch_stops(stuck) if stuck is not None else contextlib.nullcontext():
            yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


#: How long the main thread has to act on SIGINT or SIGTERM before the watchdog acts for it.
STOP_GRACE_S = 2.0

#: Set when a handler of this module acted on a stop signal (or held it, `signals_deferred`).
_handled = threading.Event()
#: Held while outputs are committed (`signals_deferred(committing=True)`), and by a watchdog
#: that ends the process: a commit under way finishes first, and none starts after.
_commit_lock = threading.RLock()
#: What the watchdog runs before it ends the process: each removes what a run would leave.
_last_resorts: list[Callable[[], None]] = []


#: The last object `spare_until_exit` was given, in a process that ends with os._exit
#: (`__main__.run`); None in any other process, which frees everything as it goes.
_spared: list[object] | None = None


def ends_with_os_exit() -> None:
    """Say that this process ends with os._exit once its run is over (`__main__.run`): what is
    alive then is never freed, so `spare_until_exit` may keep an object alive."""
    global _spared
    _spared = []


def spare_until_exit(obj: object) -> None:
    """In a process that ends with os._exit, hold `obj` (freeing the one held before) so that
    its free, needless work after the run, is skipped: a 200,000-node conversion's report takes
    30 ms (one path string per node). Anywhere else, nothing: `obj` is freed as usual."""
    if _spared is not None:
        _spared[:] = [obj]


def add_last_resort(cleanup: Callable[[], None]) -> None:
    """Have a watchdog that ends the process run `cleanup` first (once per process: the
    callable looks up what is live itself)."""
    if cleanup not in _last_resorts:
        _last_resorts.append(cleanup)


class _Watchdog:
    """The thread `watch_stops` starts: reads signal numbers from the wakeup fd and acts for a
    main thread that does not act on them."""

    def __init__(self, stuck: Callable[[int], tuple[str | None, int]]) -> None:
        self.stuck = stuck
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        self.closing = False
        _handled.clear()
        try:
            self.previous = signal.set_wakeup_fd(self.write, warn_on_full_buffer=False)
        except ValueError:  # not the interpreter's main thread after all
            os.close(self.read)
            os.close(self.write)
            raise
        self.thread = threading.Thread(target=self._watch, name="rlx-amp-stop-watchdog", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            try:
                numbers = os.read(self.read, 64)
            except OSError:
                return
            if not numbers or self.closing:
                return
            stops = [n for n in numbers if n in _STOP_SIGNALS]
            if not stops or _handled.wait(STOP_GRACE_S):
                continue
            with _commit_lock:  # a commit under way holds the signal and acts on it when done
                if self.closing or _handled.is_set():
                    continue
                self._end(stops[0])

    def _end(self, signum: int) -> None:
        """Clean up and end the process (with the commit lock held: no commit starts)."""
        request_stop(signum)
        message, code = self.stuck(signum)
        for cleanup in list(_last_resorts):
            with contextlib.suppress(Exception):
                cleanup()
        if message is not None:
            with contextlib.suppress(OSError):
                os.write(2, (error_line(message) + "\n").encode())
        os._exit(code)

    def close(self) -> None:
        self.closing = True
        signal.set_wakeup_fd(self.previous)
        os.close(self.write)
        _handled.set()  # a thread in its grace wait returns now
        self.thread.join()
        os.close(self.read)

    def forget(self) -> None:
        """In a forked child: the parent's thread is not here; its pipe and wakeup fd go."""
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for fd in (self.read, self.write):
            with contextlib.suppress(OSError):
                os.close(fd)


_watchdog: _Watchdog | None = None


@contextlib.contextmanager
def watch_stops(stuck: Callable[[int], tuple[str | None, int]]) -> Iterator[None]:
    """While the block runs (in the main thread), a watchdog for SIGINT and SIGTERM (see the
    module's docstring): `stuck(signum)` gives the line it writes (None: none) and the exit code.
    Elsewhere than the main thread, within another watch, and off POSIX (where the wakeup fd
    must be a socket), nothing is added."""
    global _watchdog
    if _watchdog is not None or os.name != "posix" or threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        _watchdog = _Watchdog(stuck)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        watchdog, _watchdog = _watchdog, None
        watchdog.close()


def _forget_watchdog_in_child() -> None:
    global _watchdog, _commit_lock
    if _watchdog is not None:
        _watchdog.forget()
        _watchdog = None
    _commit_lock = threading.RLock()  # another thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_watchdog_in_child)


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

    def hold(number: int, frame: object) -> None:
        _handled.set()
        caught.append(number)

    for s in _STOP_SIGNALS:
        signal.signal(s, hold)
    try:
        with _commit_lock if committing else contextlib.nullcontext():
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

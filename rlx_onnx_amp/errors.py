"""Exceptions. `AmpError` and its subclasses are user errors: the CLI prints their message on
one line and exits with their `exit_code`. Anything else is a bug and keeps its traceback."""

from __future__ import annotations

import signal

__all__ = [
    "AmpError",
    "InputError",
    "ModelRunError",
    "PolicyError",
    "Terminated",
    "first_line",
    "raise_interrupted",
    "raise_stop",
    "raise_terminated",
    "request_stop",
    "stop_requested",
]


class AmpError(Exception):
    """A problem with the user's input or request."""

    exit_code = 2


class InputError(AmpError):
    """A model file, input file or output path that cannot be used."""


class PolicyError(AmpError):
    """An unknown policy, kind or precision, or a malformed custom map."""


class ModelRunError(AmpError):
    """onnxruntime could not create a session for, or run, a model."""

    exit_code = 3


class Terminated(BaseException):
    """SIGTERM, raised where the run is so that every cleanup (staged outputs, scratch) runs.
    A BaseException, like KeyboardInterrupt: no `except Exception` may swallow it."""


#: The signal that stopped the run (SIGINT or SIGTERM), once one arrived. The handler's
#: exception can be lost: Python may run a handler inside a `__del__` or a finalizer, where an
#: exception is printed and ignored, and the run would go on as if nothing happened. What
#: must not happen after a stop (a commit, a batch worker taking its next model, a batch
#: going on) asks `stop_requested` too, and `raise_stop` raises the exception again.
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


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's message cut to its first line (for one-line errors); its type's name
    when it has none."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__

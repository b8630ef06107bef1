"""Exceptions. `AmpError` and its subclasses are user errors: the CLI prints their message on
one line and exits with their `exit_code`. Anything else is a bug and keeps its traceback.
(SIGTERM's `Terminated` and the stop state are `rlx_onnx_amp.exits`'.)"""

from __future__ import annotations

__all__ = [
    "AmpError",
    "InputError",
    "ModelRunError",
    "PolicyError",
    "first_line",
    "message_first_line",
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


def first_line(e: BaseException, limit: int = 200) -> str:
    """An exception's message cut to its first line (for one-line errors); its type's name
    when it has none."""
    return message_first_line(type(e).__name__, str(e), limit)


def message_first_line(type_name: str, message: str, limit: int = 200) -> str:
    """`first_line` of an exception known only by its type's name and its message (one
    raised in another process)."""
    text = message.strip()
    return text.splitlines()[0][:limit] if text else type_name

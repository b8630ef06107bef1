"""Exceptions. `AmpError` and its subclasses are user errors: the CLI prints their message on
one line and exits with their `exit_code`. Anything else is a bug and keeps its traceback.
(SIGTERM's `Terminated` and the stop state are `rlx_onnx_amp.exits`'.)"""

from __future__ import annotations

import re

__all__ = [
    "LINE_LIMIT",
    "AmpError",
    "InputError",
    "ModelRunError",
    "PolicyError",
    "first_line",
    "message_first_line",
    "summarized",
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


#: A line of default output holds at most this many characters (issue 41).
LINE_LIMIT = 160


def summarized(text: str, limit: int = LINE_LIMIT, least: int = 40) -> str:
    """A long message in about `limit` characters, for a line of default output: onnxruntime's
    "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : " shortened to "NOT_IMPLEMENTED: ", then the
    middle of its longest part in parentheses (onnxruntime's words, quoted in ours) left out at
    words, with "...", down to `least` characters: what rlx-amp says around it (the paths as given
    among it) and how onnxruntime's message ends (the node, the op) stay. Without such a part
    the text is rlx-amp's own (a crash: the model, the provider, the signal) and stays whole.
    The whole text is in the JSON report and behind -v."""
    if len(text) <= limit:
        return text
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : (\w+) : ", r"\1: ", text)
    start, end = _longest_parenthesized(text)
    inner = text[start + 1 : end]
    if len(inner) < 48:  # nothing quoted worth cutting inside
        return text
    return text[: start + 1] + _elided(inner, max(len(inner) - (len(text) - limit), least)) + text[end:]


def _elided(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: its middle left out at words, " ... " in its place."""
    if len(text) <= limit:
        return text
    if limit < 24:
        return "..."
    keep = limit - len(" ... ")
    space = text.rfind(" ", 0, keep * 2 // 5 + 1)
    space = space if space > 0 else text.find(" ")  # else the first word whole (onnxruntime's code)
    head = text[:space] if 0 < space <= keep - 10 else ""
    tail = text[len(text) - (keep - len(head)) :]
    tail = tail.split(" ", 1)[1] if " " in tail else ""  # never a word cut in two
    if not head and not tail:  # one long word: its start
        return text[: limit - 4] + " ..."
    return " ".join(part for part in (head.rstrip(" ,;:"), "...", tail) if part)


def _longest_parenthesized(text: str) -> tuple[int, int]:
    """Where the longest outermost "(...)" of `text` opens and closes; (0, 0) without one."""
    best, depth, opened = (0, 0), 0, 0
    for k, c in enumerate(text):
        if c == "(":
            opened, depth = (k if depth == 0 else opened), depth + 1
        elif c == ")" and depth > 0:
            depth -= 1
            if depth == 0 and k - opened > best[1] - best[0]:
                best = (opened, k)
    return best

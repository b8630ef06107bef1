"""How a run ends: its exit codes (docs/cli.md's table) and its one-line error. A batch, and a
merge of batches, exit with the worst code (`SEVERITY`). What SIGINT and SIGTERM do: `stops`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from rlx_onnx_amp.errors import LINE_LIMIT, ModelRunError, summarized

__all__ = [
    "EXIT_DRIFT", "EXIT_INTERNAL", "EXIT_LOW_GAIN", "EXIT_OK", "EXIT_SIGINT", "EXIT_SIGPIPE", "EXIT_SIGTERM",
    "EXIT_UNVERIFIED", "EXIT_USAGE", "SEVERITY", "error_line", "error_message", "fail", "worst_exit_code",
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


_ERROR_PREFIX = "rlx-amp: error: "


def error_line(message: str) -> str:
    """The one line a user error gets on stderr (CONTRIBUTING, "Rules of the house")."""
    return f"{_ERROR_PREFIX}{message}"


def error_message(message: str, code: int, verbose: int = 0) -> str:
    """What the error line of a run ending with `code` says: where a model could not run (exit
    3), onnxruntime's words summarized to fit the line, unless -v; the reports keep them whole."""
    if code != ModelRunError.exit_code or verbose:
        return message
    return summarized(message, LINE_LIMIT - len(_ERROR_PREFIX))


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """End the run with the one-line error and `code`."""
    import click  # light beside onnx, and loaded by the time a command fails

    click.echo(error_line(message), err=True)
    sys.exit(code)

"""`python -m rlx_onnx_amp` and the `rlx-amp` command.

The signal handlers go in before the heavy imports (onnx, onnxruntime: half a second), so
Ctrl-C or SIGTERM at any moment ends the run with one line and its own exit code (130, 143),
never a traceback or click's "Aborted!" with exit 1, the drift code. During those imports the
signals are held and acted on right after: an exception raised inside a C extension's
initialization would surface as "ImportError: initialization failed" instead.

A closed stdout (`rlx-amp inspect MODEL | head -1`: BrokenPipeError, Python ignores SIGPIPE)
ends any command quietly, nothing on stderr, with exit 141: what a shell reports for a tool that
SIGPIPE killed (`yes | head`), next to 130 and 143 for the other signals; click's own answer, 1,
is the drift code. Unlike a real SIGPIPE death, the run's cleanup runs first: what was not
committed is removed, as for SIGTERM.

Once the run is over (its files committed or removed, its streams flushed, the `atexit`
handlers run) the process ends without the interpreter's teardown (`run`): freeing every module
and object one by one takes 40 to 60 ms after a large model's conversion and changes nothing
the run did. For the same reason the last conversion's report is held to that end rather than
freed (`exits.spare_until_exit`: 30 ms after a 200,000-node graph). `main` is the same run
without either, for a caller in the same process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

from rlx_onnx_amp.exits import (
    EXIT_SIGINT,
    EXIT_SIGPIPE,
    EXIT_SIGTERM,
    EXIT_USAGE,
    Terminated,
    ends_with_os_exit,
    fail,
    ignore_stop_signals,
    raise_terminated,
    signals_deferred,
)

NO_ONNXRUNTIME = (
    "onnxruntime is not installed: pip install 'rlx-onnx-amp[cpu]' (or 'rlx-onnx-amp[gpu]' for onnxruntime-gpu "
    "and its CUDA provider)"
)


def run() -> None:
    """The `rlx-amp` command: `main`, then the process ends with its exit code at once."""
    ends_with_os_exit()
    code: str | int | None = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    # Out of the except block: the exit's exception, and the frames its chain holds (an object a
    # signal left half-built among them), are gone before the atexit handlers run.
    _exit_now(code)
    sys.exit(code)


def _exit_now(code: object) -> None:
    """End the process with `code` (an int or None) after what the interpreter's exit would do
    that matters: the `atexit` handlers (logging's flush among them) and the streams' flush.
    Returns, for the interpreter's own exit, when the code is a message or a thread other
    than a daemon still runs (the interpreter waits for it)."""
    if not (code is None or isinstance(code, int)) or any(
        not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
    ):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed: nothing left to say
            stream.flush()
    os._exit(code or 0)


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            _main(argv)
        finally:
            # Text still buffered must fail here, where it is caught, not in the interpreter's
            # shutdown ("Exception ignored ... BrokenPipeError", exit 120).
            sys.stdout.flush()
    except BrokenPipeError:
        _stdout_closed()
    finally:
        ignore_stop_signals()


def _stdout_closed() -> None:
    """The reader of stdout is gone: exit quietly, with stdout on devnull so that nothing
    flushed later raises again (Python's documented recipe, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test's captured stdout)
        pass
    sys.exit(EXIT_SIGPIPE)


def _main(argv: list[str] | None) -> None:
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        with signals_deferred():
            import click

            # Every command needs onnxruntime, a C extension: imported here, with the signals
            # held (a signal inside its initialization would be "ImportError: initialization
            # failed"), though the package imports it only where it is used.
            try:
                import onnxruntime  # noqa: F401
            except ModuleNotFoundError as e:
                if e.name != "onnxruntime":
                    raise
                fail(NO_ONNXRUNTIME, EXIT_USAGE)
            from rlx_onnx_amp.cli import main as command

        stdout = sys.stdout
        try:
            command.main(args=argv, prog_name="rlx-amp", standalone_mode=False)
        except SystemExit:
            # click answers a write to a closed stdout (EPIPE, let through by cli._run_guarded)
            # with exit 1, the drift code, after putting a wrapper that hides later failures in
            # sys.stdout's place: that swap is the sign.
            if sys.stdout is not stdout:
                _stdout_closed()
            raise
        except click.exceptions.Exit as e:  # --help, --version
            sys.exit(e.exit_code)
        except click.ClickException as e:  # usage errors: one short line naming the option
            fail(e.format_message(), e.exit_code)
        except click.Abort:  # click's name for Ctrl-C
            fail("interrupted; nothing written", EXIT_SIGINT)
    except KeyboardInterrupt:
        fail("interrupted; nothing written", EXIT_SIGINT)
    except Terminated:
        fail("terminated; nothing written", EXIT_SIGTERM)
    sys.exit(0)


if __name__ == "__main__":
    run()

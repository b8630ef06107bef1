"""`python -m rlx_onnx_amp` and the `rlx-amp` command.

The signal handlers go in before the heavy imports, which run with the signals held (a signal
inside a C extension's initialization would surface as "ImportError: initialization failed"), so
Ctrl-C or SIGTERM at any moment ends the run with one line and its own exit code (130, 143),
never a traceback or click's "Aborted!" with exit 1, the drift code. A closed stdout (`rlx-amp
inspect M | head -1`) ends any command quietly with exit 141, what a shell reports for a tool
that SIGPIPE killed, after the run's cleanup.
"""

from __future__ import annotations

import os
import signal
import sys

from rlx_onnx_amp import __version__, exits, stops


def run() -> None:
    """The `rlx-amp` command: `main`, which ends with the run's exit code."""
    main()


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            _main(argv)
        finally:
            # Buffered text fails here, where it is caught, not in the interpreter's shutdown.
            sys.stdout.flush()
    except BrokenPipeError:
        _stdout_closed()
    finally:
        stops.ignore_stop_signals()


def _stdout_closed() -> None:
    """The reader of stdout is gone: exit quietly, with stdout on devnull so that nothing
    flushed later raises again (Python's documented recipe, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test's captured stdout)
        pass
    sys.exit(exits.EXIT_SIGPIPE)


def _main(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:  # answered before the command line loads
        print(f"rlx-amp, version {__version__}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stops.raise_on_stop)
    try:
        with stops.signals_deferred():
            import click

            import rlx_onnx_amp.cli as cli  # no onnx: a command loads it, and onnxruntime, as it runs

            command = cli.main
            cli.COMMAND_LINE = ["rlx-amp", *args]  # for the reports' run.command

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
            exits.fail(e.format_message(), e.exit_code)
        except click.Abort:  # click's name for Ctrl-C
            exits.fail("interrupted; nothing written", exits.EXIT_SIGINT)
        finally:
            cli.COMMAND_LINE = None  # a caller in this process runs the next command afresh
    except KeyboardInterrupt:
        exits.fail("interrupted; nothing written", exits.EXIT_SIGINT)
    except stops.Terminated:
        exits.fail("terminated; nothing written", exits.EXIT_SIGTERM)
    sys.exit(0)


if __name__ == "__main__":
    run()

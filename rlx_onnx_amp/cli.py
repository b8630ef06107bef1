"""The `rlx-amp` command line: its commands and options, on top of the library.

`rlx-amp MODEL ... -o OUT` is the `convert` command; `inspect`, `verify`, `merge-reports` and
`demo` are subcommands. This module defines them and loads no onnx: a command's work is in
`rlx_onnx_amp.commands`, imported (with onnx and onnxruntime) only when the command runs, so
`--help` answers at once (issue 41). Each model of a convert command is converted, verified and
printed by `rlx_onnx_amp.batch`; exit codes and signals are `rlx_onnx_amp.exits`'. Every path a
run writes is planned and checked against the paths it reads before work starts, and all
outputs are committed together at the end (`rlx_onnx_amp.files`).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import click

from rlx_onnx_amp.errors import AmpError
from rlx_onnx_amp.exits import EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, error_message, fail
from rlx_onnx_amp.files import live_dirs, remove_leftover_dirs
from rlx_onnx_amp.names import TASK_NAMES
from rlx_onnx_amp.stops import Terminated, signal_held_during_commit, signals_deferred, stop_handlers

#: Spelled here, not imported, so that --help loads no onnx; tests/test_first_hour.py checks them
#: against policy.POLICY_NAMES, verification.task.TASKS (which asserts its table against
#: names.TASK_NAMES) and verification.options' DEFAULT_BUDGET and DEFAULT_GENERATE_STEPS.
POLICY_NAMES = (
    "always-f32", "always-f16", "auto-mixed-conservative", "auto-mixed", "auto-mixed-bf16", "auto", "custom"
)
TASKS = TASK_NAMES
DEFAULT_BUDGET = 24
DEFAULT_GENERATE_STEPS = 8

NO_ONNXRUNTIME = (
    "onnxruntime is not installed: pip install 'rlx-onnx-amp[cpu]' (or 'rlx-onnx-amp[gpu]' for onnxruntime-gpu "
    "and its CUDA provider)"
)


def _commands() -> ModuleType:
    """The commands' work, with onnx and onnxruntime, which every command needs. Imported with the
    signals held: a signal inside a C extension's initialization would surface as ImportError."""
    with signals_deferred():
        try:
            import onnxruntime  # noqa: F401
        except ModuleNotFoundError as e:
            if e.name != "onnxruntime":
                raise
            fail(NO_ONNXRUNTIME, EXIT_USAGE)
        import rlx_onnx_amp.commands as commands
    return commands


class _DefaultGroup(click.Group):
    """A group whose first argument, when it names no subcommand, goes to `convert`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            first = args[0]
            close = difflib.get_close_matches(first, list(self.commands), n=1, cutoff=0.75)
            if close and not os.path.exists(first) and not first.lower().endswith(".onnx"):
                raise click.UsageError(
                    f"no command {first!r}; did you mean {close[0]!r}? (a model file {first!r} does not exist)"
                )
            args = ["convert", *args]
        return super().parse_args(ctx, args)


def _run_guarded(fn: Callable[[], int], inputs: Sequence[str] = (), batch: bool = False, verbose: int = 0) -> None:
    """Run a command: user errors become one line and their exit code (onnxruntime's words
    summarized unless `verbose`); anything else is a bug (traceback, exit 70) unless an input
    model fails onnx.checker, which is bad input. `batch`: the models of a batch are committed
    one by one, so an interrupt says so."""
    def stopped(signum: int) -> tuple[str, int]:  # the line and code of a stop
        word, code = ("interrupted", EXIT_SIGINT) if signum == signal.SIGINT else ("terminated", EXIT_SIGTERM)
        return f"{word}; {_what_was_written(batch)}", code

    before = live_dirs()
    with stop_handlers():
        try:
            code = fn()
        except AmpError as e:
            fail(error_message(str(e), e.exit_code, verbose), e.exit_code)
        except KeyboardInterrupt:
            fail(*stopped(signal.SIGINT))
        except Terminated:
            fail(*stopped(signal.SIGTERM))
        except BrokenPipeError:  # stdout's reader is gone, no bug: __main__ ends the run quietly (141)
            raise
        except Exception as e:
            fail(*_commands().unexpected_failure(e, inputs))
        finally:
            with contextlib.suppress(KeyboardInterrupt, Terminated):  # the run's exit code stands
                remove_leftover_dirs(before)
    sys.exit(code)


def _what_was_written(batch: bool = False) -> str:
    if batch:
        reports = (
            "the batch reports were being moved into place: they are complete"
            if signal_held_during_commit()
            else "no batch report written"
        )
        return f"the models converted before it are written whole, the others not at all; {reports}"
    if signal_held_during_commit():
        return "the signal came while the outputs were being moved into place: they are complete and written"
    return "nothing written"


def _policy_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--target",
        default="cuda",
        show_default=True,
        metavar="cuda|cpu",
        help="Execution provider the model is meant for: a node without an onnxruntime kernel there "
        "for its low precision stays f32 (bf16 needs this: onnxruntime's CPU provider has few bf16 kernels).",
    )(f)
    f = click.option(
        "--low",
        default="f16",
        show_default=True,
        type=click.Choice(["f16", "bf16"]),
        help="The low precision --policy auto searches with (bf16 where the target runs it).",
    )(f)
    f = click.option("--map-file", "map_file", metavar="FILE", help="JSON or TOML kind map for --policy custom.")(f)
    f = click.option(
        "--map", "map_text", metavar="KIND=P,...", help="Kind map for --policy custom, e.g. compute=f16,reduction=f32."
    )(f)
    f = click.option(
        "--policy",
        "-p",
        default="auto-mixed",
        show_default=True,
        metavar="|".join(POLICY_NAMES),
        help="Precision policy. auto: the most low-precision compute that passes the verdict (it verifies, "
        "and keeps in f32 the fewest nodes that make the drift pass).",
    )(f)
    return f


def _verify_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--provider",
            default="auto",
            show_default=True,
            type=click.Choice(["auto", "cpu", "cuda", "coreml"]),
            help="onnxruntime execution provider; auto picks CUDA, then CoreML, then CPU.",
        ),
        click.option(
            "--emulate/--no-emulate",
            default=None,
            help="Verify an emulated candidate (the f32 graph with low-precision values rounded). "
            "Default: when the provider cannot run the candidate, or is the CPU provider.",
        ),
        click.option(
            "--inputs",
            "inputs_path",
            metavar="FILE|DIR",
            help="Inputs: an .npz of name -> array (NAME#k for set k), Polygraphy's JSON inputs, a directory of "
            "input_N.pb; or samples: images (.png .jpg .bmp .webp), audio (.wav), text (.txt, one prompt per "
            "line), a directory of them, made into inputs by the model folder's preprocessor_config.json and "
            'tokenizer.json (pip install "rlx-amp[samples]").',
        ),
        click.option(
            "--preprocess",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override how --inputs samples are made into inputs: size=HxW (an image's final size), "
            "mean=R,G,B and std=R,G,B (its normalization), rate=HZ (audio's sample rate).",
        ),
        click.option("--seed", default=0, show_default=True, help="Seed of synthesized inputs."),
        click.option("--samples", default=1, show_default=True, help="Number of synthesized input sets."),
        click.option(
            "--shape", "shapes", multiple=True, metavar="NAME:1x128", help="Shape of an input with dynamic dimensions."
        ),
        click.option(
            "--input-range", "ranges", multiple=True, metavar="NAME:LO,HI", help="Value range of a synthesized input."
        ),
        click.option("--save-inputs", metavar="FILE.npz", help="Write the inputs used."),
        click.option("--atol", multiple=True, metavar="[NAME:]X", help="Absolute tolerance, global or per output."),
        click.option(
            "--rtol-of-max",
            multiple=True,
            metavar="[NAME:]X",
            help="Tolerance relative to max|reference|: max_abs <= atol + X * max|reference| (the default check).",
        ),
        click.option(
            "--rtol",
            multiple=True,
            metavar="[NAME:]X",
            help="Element-wise relative tolerance, as in np.allclose and Polygraphy: |c - r| <= atol + X * |r| "
            "for every element (off unless given).",
        ),
        click.option(
            "--min-cosine", multiple=True, metavar="[NAME:]X", help="Minimum cosine similarity, global or per output."
        ),
        click.option(
            "--localize",
            is_flag=True,
            help="Compare every shared intermediate tensor and name the first nodes where drift jumps.",
        ),
        click.option(
            "--task",
            default="auto",
            show_default=True,
            type=click.Choice(TASKS),
            help="What the verdict judges: generate (a decoder's greedy tokens over --generate-steps steps, "
            "teacher-forced, near-ties set apart), detect (boxes matched by class and IoU), segment (the class "
            "per pixel of an N x C x H x W output: agreement and mean IoU), classify (the class per row, "
            "near-ties set apart), embed (the lowest per-row cosine), logits (element-wise on the logits alone), "
            "none (element-wise on every output); auto picks from the model's inputs and outputs and says so. "
            "Element-wise figures stay as diagnostics; a task that compared nothing (every row a near-tie) "
            "leaves the verdict to them.",
        ),
        click.option(
            "--generate-steps",
            default=DEFAULT_GENERATE_STEPS,
            show_default=True,
            metavar="N",
            help="Greedy steps per prompt of the generate task, the prompt's own step included.",
        ),
        click.option(
            "--latency-runs",
            default=5,
            show_default=True,
            metavar="N",
            help="Time the original and the written model over N warm runs on the provider (the median is in "
            "the report); 0: not timed.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    # A stop signal inside the handler's constructor would leave logging a handler without a
    # stream, which its atexit flush then trips over (a traceback after "terminated").
    with signals_deferred():
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@click.group(
    cls=_DefaultGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example: rlx-amp model.onnx -o model16.onnx --policy auto. Each command's --help lists its exit codes.",
)
@click.version_option(package_name="rlx-onnx-amp")
def main() -> None:
    """Rewrite ONNX models to mixed precision and prove the result.

    \b
    rlx-amp MODEL --policy auto-mixed -o OUT.onnx      convert (the default command)
    rlx-amp inspect MODEL [--policy P]                 what each kind and op would get, and by which rule
    rlx-amp verify REFERENCE CANDIDATE                 measure output drift
    rlx-amp merge-reports SHARD.json...                one summary from several runs' JSON reports
    rlx-amp demo [PATH]                                write the bundled demo model
    rlx-amp olive-config                               Olive's package config with the RlxAmp pass
    """


#: The convert command's exit codes, as its --help ends (docs/cli.md's table).
_CONVERT_EXITS = (
    "Exit codes: 0 pass, 1 drift (written), 2 bad usage or input, 3 onnxruntime cannot run a model, "
    "4 written unverified, 5 below --min-low-share (written), 70 a bug, 130/143 interrupted."
)


@main.command(
    "convert",
    epilog="\b\nExamples:\n"
    "  rlx-amp model.onnx -o model16.onnx             screen, convert (auto-mixed) and verify\n"
    "  rlx-amp model.onnx -o fast.onnx --policy auto  the most f16 compute that passes\n"
    "  rlx-amp optimum_export/ -o export16/           a whole export directory, as one unit\n\n"
    + _CONVERT_EXITS,
)
@click.argument("models", nargs=-1, required=True, metavar="MODEL...")
@_policy_options
@click.option("-o", "--output", metavar="OUT", help="Output model path (one MODEL).")
@click.option("--out-dir", metavar="DIR", help="Output directory (several MODELs); outputs keep their file names.")
@click.option("--keep-f32-op", multiple=True, metavar="OP", help="Keep every node of this op type in f32 (repeatable).")
@click.option(
    "--keep-f32-node", multiple=True, metavar="REGEX", help="Keep nodes whose name matches in f32 (repeatable)."
)
@click.option(
    "--keep-io-types/--no-keep-io-types",
    default=True,
    show_default=True,
    help="Graph inputs and outputs keep their element type.",
)
@click.option(
    "--data-name", metavar="NAME", help="Exact external data file name for the output (default OUT.<hash>.data)."
)
@click.option("--report-json", metavar="PATH", help="Write the conversion report as JSON.")
@click.option("--report-md", metavar="PATH", help="Write a Markdown summary (with --verify: the drift report).")
@click.option(
    "--report-html",
    metavar="PATH",
    help="Write one self-contained HTML page: plots of the drift, the conversion and the repair.",
)
@click.option(
    "--verify/--no-verify",
    "do_verify",
    default=None,
    help="Verify each output against its input model (drift report, exit 1 on drift). Default: verify, and "
    "write an unverified model with exit 4 when the reference cannot run; --verify makes that an error; "
    "--no-verify measures nothing.",
)
@click.option(
    "--screen/--no-screen",
    default=True,
    show_default=True,
    help="Keep in f32 the nodes whose values pass the low type's range on the reference run (rule range-screen).",
)
@click.option(
    "--repair",
    "do_repair",
    is_flag=True,
    help="Verify, and keep the nodes responsible for drift in f32 until it passes.",
)
@click.option(
    "--repair-budget", default=DEFAULT_BUDGET, show_default=True, help="Most candidate evaluations --repair may use."
)
@click.option(
    "--min-low-share",
    type=float,
    metavar="X",
    help="Fail (exit 5, everything written) when the written model keeps less than X (0 to 1) of its "
    "multiply-accumulates in low precision; quantized compute counts as low.",
)
@click.option(
    "--jobs",
    "-j",
    default=1,
    show_default=True,
    metavar="N",
    help="Convert (and verify) the models of a batch in N worker processes; 0: one per CPU.",
)
@_verify_options
@click.option("--quiet", "-q", is_flag=True, help="No table, no progress.")
@click.option("-v", "--verbose", count=True, help="Log what the rewrite does (-vv for debug).")
def convert_cmd(**params: Any) -> None:
    """Convert MODEL to mixed precision under a policy, and verify it. MODEL may be several
    files (with --out-dir), or an optimum or onnxruntime-genai export directory (with -o DIR)."""
    _setup_logging(params["verbose"])
    ctx, models = click.get_current_context(), params["models"]

    def work() -> int:
        return _commands().convert(ctx, _command(), **params)

    _run_guarded(work, models, len(models) > 1, params["verbose"])


#: The command line as given, for a report's `run` (set by `__main__`; else the process's).
COMMAND_LINE: list[str] | None = None


def _command() -> list[str]:
    return COMMAND_LINE or ["rlx-amp", *sys.argv[1:]]



@main.command(
    "verify",
    epilog="\b\nExample:\n  rlx-amp verify model.onnx model16.onnx --provider cpu --localize\n\n"
    "Exit codes: 0 pass, 1 drift, 2 bad usage or input, 3 onnxruntime cannot run a model, 70 a bug.",
)
@click.argument("reference")
@click.argument("candidate")
@_verify_options
@click.option(
    "--target",
    type=click.Choice(["cuda", "cpu"]),
    help="The provider CANDIDATE is meant for. Where the provider at hand only stands in for it, a candidate "
    "that cannot run here is verified emulated, and says so; otherwise that is exit 3. Default: the provider at hand.",
)
@click.option("--report-json", metavar="PATH", help="Write the drift report as JSON (under the key `verify`).")
@click.option("--report-md", metavar="PATH", help="Write the drift report as Markdown.")
@click.option("--report-html", metavar="PATH", help="Write the drift report as a self-contained HTML page with plots.")
@click.option("--quiet", "-q", is_flag=True, help="No table.")
@click.option("-v", "--verbose", count=True, help="Also the column legend and the tolerances that would pass.")
def verify_cmd(**params: Any) -> None:
    """Compare CANDIDATE against REFERENCE on the same inputs."""
    _setup_logging(params["verbose"])
    inputs = (params["reference"], params["candidate"])
    _run_guarded(lambda: _commands().verify(_command(), **params), inputs, verbose=params["verbose"])


@main.command(
    "merge-reports",
    epilog="\b\nExample:\n  rlx-amp merge-reports shard*/report.json --report-md summary.md\n\n"
    "Exit code: the worst of the shards' (0 pass, 4 unverified, 5 gate, 1 drift, 2 a bad shard, 3, 70).",
)
@click.argument("reports", nargs=-1, required=True, metavar="REPORT.json...")
@click.option("--report-json", metavar="PATH", help="Write the merged batch report as JSON.")
@click.option("--report-md", metavar="PATH", help="Write the merged summary as Markdown (default: print it).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing; the exit code still says how the shards ended.")
def merge_reports_cmd(**params: Any) -> None:
    """Merge the JSON reports of several runs (CI shards) into one summary; exit with the worst code."""
    _run_guarded(lambda: _commands().merge(_command(), **params))


@main.command("demo")
@click.argument("path", default="demo_transformer.onnx", metavar="[PATH]")
def demo_cmd(path: str) -> None:
    """Write the bundled demo model (a transformer block with a -1e9 attention mask) to PATH."""
    _run_guarded(lambda: _commands().demo(path))


@main.command("olive-config")
def olive_config_cmd() -> None:
    """Print Olive's package config with the RlxAmp pass added (olive run --package-config FILE)."""
    _run_guarded(lambda: _commands().olive_config())



@main.command(
    "inspect",
    epilog="\b\nExample:\n  rlx-amp inspect model.onnx --compare-policies\n\n"
    "Exit codes: 0, 2 bad usage or input, 3 onnxruntime cannot run the model (--screen).",
)
@click.argument("model")
@_policy_options
@click.option("--keep-f32-op", multiple=True, metavar="OP", help="Keep every node of this op type in f32.")
@click.option("--keep-f32-node", multiple=True, metavar="REGEX", help="Keep nodes whose name matches in f32.")
@click.option(
    "--shape", "shapes", multiple=True, metavar="NAME:1x128", help="Shape of an input with dynamic dimensions (cost)."
)
@click.option(
    "--compare-policies",
    is_flag=True,
    help="Every preset side by side (and --map's custom policy): low share of MACs and weights, Casts, kept nodes.",
)
@click.option(
    "--screen",
    is_flag=True,
    help="Run the reference once on synthesized inputs (--shape, --input-range) or --inputs and show what "
    "rule range-screen would keep, as the plain convert command does.",
)
@click.option("--inputs", "inputs_path", metavar="FILE.npz|DIR", help="With --screen: the inputs to run.")
@click.option("--input-range", "ranges", multiple=True, metavar="NAME:LO,HI", help="With --screen: an input's range.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-kind and per-op counts as JSON.")
def inspect_cmd(**params: Any) -> None:
    """Show per kind and per op type the node counts and the precision each would get, and for
    each of the rewrite's rules the nodes it kept from the policy's table."""
    ctx = click.get_current_context()
    _run_guarded(lambda: _commands().inspect(ctx, **params), (params["model"],))

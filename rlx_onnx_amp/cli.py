"""The `rlx-amp` command line: parsing, files and output on top of the library.

`rlx-amp MODEL ... -o OUT` is the `convert` command; `inspect`, `verify`, `merge-reports` and
`demo` are subcommands. Each model of a convert command is converted, verified and printed by
`rlx_onnx_amp.batch`; exit codes and signals are `rlx_onnx_amp.exits`'. Every path a run writes
is planned and checked against the paths it reads before work starts, and all outputs are
committed together at the end (`rlx_onnx_amp.files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from rlx_onnx_amp.api import load_model, make_options, plan_model_reads, write_demo
from rlx_onnx_amp.batch import (
    ConvertJob,
    JobSettings,
    RunResults,
    StagedProgress,
    convert_directory,
    run_in_workers,
    status,
    unexpected_failure,
)
from rlx_onnx_amp.directory import with_genai_folder_hint
from rlx_onnx_amp.errors import AmpError, InputError, first_line
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, fail
from rlx_onnx_amp.files import OutputSet, RunPaths, live_dirs, remove_leftover_dirs
from rlx_onnx_amp.inspect import inspect_model
from rlx_onnx_amp.policy import AUTO, POLICY_NAMES, Policy, load_kind_map_file, parse_kind_map, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.reports.merge import merge_reports, merged_markdown
from rlx_onnx_amp.reports.record import ModelResult, report_document, report_text, run_record
from rlx_onnx_amp.reports.text import (
    compare_policies_table,
    failed_verdict,
    inspect_table,
    next_step,
    verify_markdown,
    verify_table,
)
from rlx_onnx_amp.stops import Terminated, signal_held_during_commit, signals_deferred, stop_handlers
from rlx_onnx_amp.tensors import WeightSource
from rlx_onnx_amp.verification.inputs import GuessedAxesError, InputSpec, parse_range, parse_shape
from rlx_onnx_amp.verification.options import DEFAULT_BUDGET, VerifyOptions, resolve_provider, verify_options_from
from rlx_onnx_amp.verification.task import TASKS


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


def _run_guarded(fn: Callable[[], int], inputs: Sequence[str] = (), batch: bool = False) -> None:
    """Run a command: user errors become one line and their exit code; anything else is a bug
    (traceback, exit 70) unless an input model fails onnx.checker, which is bad input. `batch`:
    the models of a batch are committed one by one, so an interrupt says so."""
    def stopped(signum: int) -> tuple[str, int]:  # the line and code of a stop
        word, code = ("interrupted", EXIT_SIGINT) if signum == signal.SIGINT else ("terminated", EXIT_SIGTERM)
        return f"{word}; {_what_was_written(batch)}", code

    before = live_dirs()
    with stop_handlers():
        try:
            code = fn()
        except AmpError as e:
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            fail(*stopped(signal.SIGINT))
        except Terminated:
            fail(*stopped(signal.SIGTERM))
        except BrokenPipeError:  # stdout's reader is gone, no bug: __main__ ends the run quietly (141)
            raise
        except Exception as e:
            fail(*unexpected_failure(e, inputs))
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


def _policy(policy: str, map_text: str | None, map_file: str | None, low: str = "f16") -> Policy:
    kind_map = None
    if map_text and map_file:
        raise InputError("give --map or --map-file, not both")
    if map_text:
        kind_map = parse_kind_map(map_text)
    elif map_file:
        kind_map = load_kind_map_file(Path(map_file))
    return policy_from_name(policy, kind_map, Precision(low))


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
            metavar="FILE.npz|FILE.json|DIR",
            help="Inputs: an .npz of name -> array (NAME#k for set k), Polygraphy's JSON inputs, or a directory of "
            "input_N.pb.",
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
            help="What the verdict judges: classify (the class per row, near-ties set apart), embed (the "
            "lowest per-row cosine), none (element-wise only); auto picks from the output names (logits, "
            "embeddings) and says so. Element-wise figures stay as diagnostics.",
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


def _plan_reports(
    paths: RunPaths,
    report_json: str | None,
    report_md: str | None,
    verify_options: VerifyOptions | None,
    map_file: str | None = None,
    report_html: str | None = None,
) -> None:
    """Add the run's other files to its plan: reports and saved inputs written, map and input files read."""
    for path, role in (
        (report_json, "--report-json file"),
        (report_md, "--report-md file"),
        (report_html, "--report-html file"),
    ):
        if path:
            paths.write(path, role)
    if verify_options is not None:
        if verify_options.save_inputs:
            paths.write(verify_options.save_inputs, "--save-inputs file")
        if verify_options.inputs:
            paths.read(verify_options.inputs, "--inputs file")
    if map_file:
        paths.read(map_file, "--map-file")


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
def convert_cmd(
    models: Sequence[str],
    policy: str,
    map_text: str | None,
    map_file: str | None,
    low: str,
    target: str,
    output: str | None,
    out_dir: str | None,
    keep_f32_op: Sequence[str],
    keep_f32_node: Sequence[str],
    keep_io_types: bool,
    data_name: str | None,
    report_json: str | None,
    report_md: str | None,
    report_html: str | None,
    do_verify: bool | None,
    screen: bool,
    do_repair: bool,
    repair_budget: int,
    min_low_share: float | None,
    jobs: int,
    quiet: bool,
    verbose: int,
    **verify_kwargs: Any,
) -> None:
    """Convert MODEL to mixed precision under a policy, and verify it. MODEL may be several
    files (with --out-dir), or an optimum or onnxruntime-genai export directory (with -o DIR)."""
    _setup_logging(verbose)
    ctx = click.get_current_context()

    def run() -> int:
        started = time.time()  # the report's run.started
        resolved = _policy(policy, map_text, map_file, low)
        searching = _searches(resolved, do_verify, do_repair, min_low_share)
        _refuse_idle_options(ctx, do_verify, searching)
        directory = _export_directory(models, output, out_dir, data_name)
        verifying = do_verify is not False or searching
        shapes = dict(parse_shape(text) for text in verify_kwargs["shapes"])
        # The cost model costs a shape inference: only where something shows it, or the gate reads it.
        shown = not quiet or bool(report_json or report_md or report_html) or min_low_share is not None
        options = make_options(keep_io_types, keep_f32_op, keep_f32_node, target=target, shapes=shapes, cost=shown)
        verify_options = verify_options_from(**verify_kwargs) if verifying else None
        if verify_options is not None:  # where the provider only stands in for the target, it says so
            verify_options = dataclasses.replace(verify_options, target=options.target.value)
        if repair_budget < 1:
            raise InputError("--repair-budget must be at least 1")
        targets = [output or ""] if directory else _output_paths(models, output, out_dir)
        if data_name is not None and len(models) > 1:
            raise InputError("--data-name names one output's data file; with several models each gets its own")
        paths = RunPaths()
        for src, dst in zip(models, targets) if not directory else ():
            paths.read(src, "input model")
            paths.write(dst, "output model")
        _plan_reports(paths, report_json, report_md, verify_options, map_file, report_html)
        paths.check()
        settings = JobSettings(
            resolved,
            options,
            verify_options,
            repair=searching,
            budget=repair_budget,
            min_low_share=min_low_share,
            data_name=data_name,
            screen=screen,
            verify_required=bool(do_verify),
            quiet=quiet,
            verbose=verbose,
        )
        job = ConvertJob(settings, paths)
        if not verifying and not quiet:
            click.echo("rlx-amp: note: --no-verify: nothing was measured; the output's drift is unknown", err=True)
        batch = len(models) > 1 or directory is not None
        if jobs < 0:
            raise InputError("--jobs must be 0 (one per CPU) or more")
        workers = min(jobs or os.cpu_count() or 1, len(models))
        with OutputSet(paths.protected()) as outputs:
            if directory:  # staged and put in place whole, before the reports
                results = convert_directory(job, directory, Path(targets[0]))
            elif not batch:  # one model: model and reports are committed together
                results = [job.convert(models[0], targets[0], outputs)]
            elif workers > 1:
                results = run_in_workers(job, list(zip(models, targets)), workers)
            else:
                results = [job.convert_own(src, dst) for src, dst in zip(models, targets)]
            run_results = RunResults(tuple(results), verifying)
            if report_json:
                provider = resolve_provider(verify_options.provider) if verify_options is not None else None
                run_info = run_record(started, provider, options.target.value, _command())
                outputs.write_text(report_json, report_text(run_results.json(batch, run_info)))
            if report_md:
                outputs.write_text(report_md, run_results.markdown())
            if report_html:
                outputs.write_text(report_html, run_results.html())
            outputs.commit()
        summary = run_results.summary(quiet) if batch else None
        if summary is not None:
            click.echo(summary)
        _say_next(run_results.results)
        return run_results.exit_code

    _run_guarded(run, models, batch=len(models) > 1)


#: The command line as given, for a report's `run` (set by `__main__`; else the process's).
COMMAND_LINE: list[str] | None = None


def _command() -> list[str]:
    return COMMAND_LINE or ["rlx-amp", *sys.argv[1:]]


def _say_next(results: Sequence[ModelResult]) -> None:
    """A run that did not pass ends with the next step, in one line (with -q too)."""
    advice = next_step(results)
    if advice is not None:
        click.echo(f"rlx-amp: next: {advice}", err=True)


def _searches(policy: Policy, do_verify: bool | None, do_repair: bool, min_low_share: float | None) -> bool:
    """Whether the run repairs: --repair, or --policy auto (a search that verifies and repairs)."""
    if policy.searches and do_verify is False:
        raise InputError("--policy auto searches by verifying its candidates: it cannot run with --no-verify")
    if min_low_share is not None and not 0 <= min_low_share <= 1:
        raise InputError(f"--min-low-share: expected a share from 0 to 1, got {min_low_share:g}")
    return do_repair or policy.searches


#: Options that only mean something with --verify or --repair (parameter name -> flag).
_VERIFY_ONLY = {
    "provider": "--provider",
    "emulate": "--emulate/--no-emulate",
    "inputs_path": "--inputs",
    "seed": "--seed",
    "samples": "--samples",
    "ranges": "--input-range",
    "save_inputs": "--save-inputs",
    "atol": "--atol",
    "rtol_of_max": "--rtol-of-max",
    "rtol": "--rtol",
    "min_cosine": "--min-cosine",
    "localize": "--localize",
    "latency_runs": "--latency-runs",
    "task": "--task",
}


def _refuse_idle_options(ctx: click.Context, do_verify: bool | None, do_repair: bool) -> None:
    """Options that would do nothing are an error, never silently ignored."""
    given = [
        flag for name, flag in _VERIFY_ONLY.items() if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    ]
    if do_verify is False and do_repair:
        raise InputError("--no-verify and --repair: repair verifies every candidate")
    if given and do_verify is False:
        raise InputError(f"{given[0]} does nothing with --no-verify")
    if ctx.get_parameter_source("screen") is not ParameterSource.DEFAULT and (do_verify is False or do_repair):
        raise InputError(
            "--screen/--no-screen needs the reference run: not with --no-verify, and --repair screens on its own"
        )
    if ctx.get_parameter_source("repair_budget") is not ParameterSource.DEFAULT and not do_repair:
        raise InputError("--repair-budget needs --repair")


def _export_directory(
    models: Sequence[str], output: str | None, out_dir: str | None, data_name: str | None
) -> Path | None:
    """The export directory when the one MODEL is a directory (`rlx_onnx_amp.directory`)."""
    if len(models) != 1 or not os.path.isdir(models[0]):
        return None
    if out_dir or not output:
        raise InputError(f"{models[0]}: a directory converts into -o OUT_DIR (not --out-dir)")
    if data_name is not None:
        raise InputError("--data-name names one output's data file; each model of a directory gets its own")
    return Path(models[0])


def _output_paths(models: Sequence[str], output: str | None, out_dir: str | None) -> list[str]:
    if output and out_dir:
        raise InputError("give -o/--output or --out-dir, not both")
    if len(models) > 1:
        if not out_dir:
            raise InputError("several models need --out-dir DIR")
    elif not output and not out_dir:
        raise InputError("missing -o/--output OUT")
    if out_dir:
        if not os.path.isdir(out_dir):
            raise InputError(f"{out_dir}: output directory does not exist")
        names = [Path(m).name for m in models]
        if len(set(names)) != len(names):
            raise InputError("--out-dir: two input models share a file name")
        return [os.path.join(out_dir, n) for n in names]
    assert output is not None
    return [output]


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
def verify_cmd(
    reference: str,
    candidate: str,
    target: str | None,
    report_json: str | None,
    report_md: str | None,
    report_html: str | None,
    quiet: bool,
    verbose: int,
    **verify_kwargs: Any,
) -> None:
    """Compare CANDIDATE against REFERENCE on the same inputs."""
    _setup_logging(verbose)

    def run() -> int:
        started = time.time()  # the report's run.started
        # The verification is imported where it runs: a conversion with --no-verify,
        # inspect and merge-reports do not load its modules.
        from rlx_onnx_amp.verification.core import verify

        verify_options = dataclasses.replace(verify_options_from(**verify_kwargs), target=target)
        paths = RunPaths()
        plan_model_reads(paths, reference, "reference model")
        plan_model_reads(paths, candidate, "candidate model")
        _plan_reports(paths, report_json, report_md, verify_options, report_html=report_html)
        paths.check()
        with OutputSet(paths.protected()) as outputs:
            status(f"verifying {candidate} against {reference} ...", enabled=not quiet)
            with StagedProgress(enabled=not quiet) as progress:
                try:
                    result = verify(reference, candidate, verify_options, progress=progress, outputs=outputs)
                except GuessedAxesError as e:  # a genai decoder: its folder's config has the sizes
                    raise with_genai_folder_hint(e, Path(reference)) from None
            if not quiet:
                click.echo(verify_table(result, verbose=verbose > 0))
            elif not result.passed:  # -q still says that something failed, in one line
                click.echo(failed_verdict(result))
            if report_json:
                run_info = run_record(started, result.provider, target, _command())
                outputs.write_text(report_json, report_text(report_document({"verify": result.to_json()}, run_info)))
            if report_md:
                outputs.write_text(report_md, verify_markdown([ModelResult(verify=result)]))
            if report_html:
                from rlx_onnx_amp.reports.html import html_report  # matplotlib: only when a page is asked for

                outputs.write_text(report_html, html_report([ModelResult(verify=result)], title="rlx-amp drift report"))
            outputs.commit()
        _say_next([ModelResult(verify=result)])
        return EXIT_OK if result.passed else EXIT_DRIFT

    _run_guarded(run, (reference, candidate))


@main.command(
    "merge-reports",
    epilog="\b\nExample:\n  rlx-amp merge-reports shard*/report.json --report-md summary.md\n\n"
    "Exit code: the worst of the shards' (0 pass, 4 unverified, 5 gate, 1 drift, 2 a bad shard, 3, 70).",
)
@click.argument("reports", nargs=-1, required=True, metavar="REPORT.json...")
@click.option("--report-json", metavar="PATH", help="Write the merged batch report as JSON.")
@click.option("--report-md", metavar="PATH", help="Write the merged summary as Markdown (default: print it).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing; the exit code still says how the shards ended.")
def merge_reports_cmd(reports: Sequence[str], report_json: str | None, report_md: str | None, quiet: bool) -> None:
    """Merge the JSON reports of several runs (CI shards) into one summary; exit with the worst code."""

    def run() -> int:
        started = time.time()  # the report's run.started
        paths = RunPaths()
        for path in reports:
            paths.read(path, "report")
        _plan_reports(paths, report_json, report_md, None)
        paths.check()
        merged = merge_reports(reports)
        markdown = merged_markdown(merged)
        with OutputSet(paths.protected()) as outputs:
            if report_json:
                run_info = run_record(started, None, None, _command())
                outputs.write_text(report_json, report_text(merged.to_json(run_info)))
            if report_md:
                outputs.write_text(report_md, markdown)
            outputs.commit()
        if not quiet and not report_md:
            click.echo(markdown, nl=False)
        return merged.exit_code

    _run_guarded(run)


@main.command("demo")
@click.argument("path", default="demo_transformer.onnx", metavar="[PATH]")
def demo_cmd(path: str) -> None:
    """Write the bundled demo model (a transformer block with a -1e9 attention mask) to PATH."""

    def run() -> int:
        write_demo(path)
        click.echo(f"wrote {path}; try: rlx-amp {path} --policy auto-mixed -o demo_auto_mixed.onnx --verify")
        return EXIT_OK

    _run_guarded(run)


@main.command("olive-config")
def olive_config_cmd() -> None:
    """Print Olive's package config with the RlxAmp pass added (olive run --package-config FILE)."""

    def run() -> int:
        try:
            from rlx_onnx_amp.olive import package_config  # Olive, and torch behind it: only here
        except ImportError as e:
            raise InputError(f"olive-config: {first_line(e, 300)}") from None
        click.echo(json.dumps(package_config(), indent=2))
        return EXIT_OK

    _run_guarded(run)


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
def inspect_cmd(
    model: str,
    policy: str,
    map_text: str | None,
    map_file: str | None,
    low: str,
    target: str,
    keep_f32_op: Sequence[str],
    keep_f32_node: Sequence[str],
    shapes: Sequence[str],
    compare_policies: bool,
    screen: bool,
    inputs_path: str | None,
    ranges: Sequence[str],
    as_json: bool,
) -> None:
    """Show per kind and per op type the node counts and the precision each would get, and for
    each of the rewrite's rules the nodes it kept from the policy's table."""
    ctx = click.get_current_context()

    def run() -> int:
        options = make_options(
            True, keep_f32_op, keep_f32_node, target=target, shapes=dict(parse_shape(t) for t in shapes)
        )
        if (inputs_path or ranges) and not screen:
            raise InputError(f"{'--inputs' if inputs_path else '--input-range'} needs --screen")
        if screen:
            from rlx_onnx_amp.verification.reference import prepare_reference  # the verification's

            spec = InputSpec(dict(options.shapes), dict(parse_range(r) for r in ranges))
            screen_options = VerifyOptions(provider="cpu", inputs=inputs_path, spec=spec)
            screen_options.check()
            reference = prepare_reference(model, screen_options, screen=True)
            options = dataclasses.replace(options, value_ranges=reference.value_ranges)
        source = WeightSource(Path(model).parent, model)
        if compare_policies:
            if ctx.get_parameter_source("policy") is not ParameterSource.DEFAULT and policy != "custom":
                raise InputError("--compare-policies compares every preset; --policy chooses one (drop it)")
            policies = [policy_from_name(name) for name in POLICY_NAMES if name not in ("custom", AUTO)]
            if map_text or map_file:
                policies.append(_policy("custom", map_text, map_file))
            loaded = load_model(model)
            rows = [inspect_model(loaded, p, options, model_name=model, source=source) for p in policies]
            click.echo(json.dumps(rows, indent=2) if as_json else compare_policies_table(rows))
            return EXIT_OK
        resolved = _policy(policy, map_text, map_file, low)
        loaded = load_model(model)
        summary = inspect_model(loaded, resolved, options, model_name=model, source=source)
        click.echo(json.dumps(summary, indent=2) if as_json else inspect_table(summary))
        return EXIT_OK

    _run_guarded(run, (model,))


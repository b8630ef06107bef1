"""The commands' work, behind `rlx_onnx_amp.cli`'s options: each function takes a command's
parsed parameters and returns its exit code. `cli` imports this module (and with it onnx and
onnxruntime) only when a command runs, so that `--help` loads neither (issue 41).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from rlx_onnx_amp.api import load_model, make_options, plan_model_reads, write_demo
from rlx_onnx_amp.batch import RunResults, convert_directory, run_in_workers
from rlx_onnx_amp.directory import with_genai_folder_hint
from rlx_onnx_amp.errors import InputError, first_line
from rlx_onnx_amp.exits import EXIT_OK
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.inspect import inspect_model
from rlx_onnx_amp.pipeline import ConvertJob, JobSettings, unexpected_failure
from rlx_onnx_amp.policy import AUTO, POLICY_NAMES, Policy, load_kind_map_file, parse_kind_map, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.progress import StagedProgress, StageLines, TerminalReporters, status, warn
from rlx_onnx_amp.reports.inspect_text import compare_policies_table, inspect_table
from rlx_onnx_amp.reports.merge import merge_reports, merged_markdown
from rlx_onnx_amp.reports.record import ModelResult, Verification, report_document, report_text, run_record
from rlx_onnx_amp.reports.text import (
    failed_verdict,
    next_step,
    verify_markdown,
    verify_table,
    written_line,
)
from rlx_onnx_amp.supervise import run_contained
from rlx_onnx_amp.tensors import WeightSource
from rlx_onnx_amp.verification.inputs import GuessedAxesError, InputSpec, parse_range, parse_shape
from rlx_onnx_amp.verification.options import VerifyOptions, resolve_provider, verify_options_from

__all__ = ["convert", "demo", "inspect", "merge", "olive_config", "unexpected_failure", "verify"]

def _policy(policy: str, map_text: str | None, map_file: str | None, low: str = "f16") -> Policy:
    kind_map = None
    if map_text and map_file:
        raise InputError("give --map or --map-file, not both")
    if map_text:
        kind_map = parse_kind_map(map_text)
    elif map_file:
        kind_map = load_kind_map_file(Path(map_file))
    return policy_from_name(policy, kind_map, Precision(low))


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


def convert(
    ctx: click.Context,
    command: list[str],
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
) -> int:
    """The convert command: MODEL... (or an export directory) converted, verified, reported."""
    started = time.time()  # the report's run.started
    resolved = _policy(policy, map_text, map_file, low)
    directory = _export_directory(models, output, out_dir, data_name)
    verifying = do_verify is not False or do_repair or resolved.searches  # as JobSettings.checked
    shapes = dict(parse_shape(text) for text in verify_kwargs["shapes"])
    # The cost model costs a shape inference: only where something shows it, or the gate reads it.
    shown = not quiet or bool(report_json or report_md or report_html) or min_low_share is not None
    options = make_options(keep_io_types, keep_f32_op, keep_f32_node, target=target, shapes=shapes, cost=shown)
    settings = JobSettings.checked(
        resolved,
        options,
        verify_options_from(**verify_kwargs) if verifying else None,
        verify=do_verify,
        repair=do_repair,
        budget=repair_budget,
        min_low_share=min_low_share,
        data_name=data_name,
        screen=screen,
        contain=True,  # an onnxruntime crash is one model's exit 3, never the end of rlx-amp
    )
    _refuse_idle_options(ctx, do_verify, settings.repair)
    verify_options = settings.verify_options
    targets = [output or ""] if directory else _output_paths(models, output, out_dir)
    if data_name is not None and len(models) > 1:
        raise InputError("--data-name names one output's data file; with several models each gets its own")
    paths = RunPaths()
    for src, dst in zip(models, targets) if not directory else ():
        paths.read(src, "input model")
        paths.write(dst, "output model")
    _plan_reports(paths, report_json, report_md, verify_options, map_file, report_html)
    paths.check()
    job = ConvertJob(settings, paths, TerminalReporters(quiet, verbose, StageLines.wanted(quiet)))
    if not verifying and not quiet:
        click.echo("rlx-amp: note: --no-verify: nothing was measured; the output's drift is unknown", err=True)
    batch = len(models) > 1 or directory is not None
    if jobs < 0:
        raise InputError("--jobs must be 0 (one per CPU) or more")
    workers = min(jobs or os.cpu_count() or 1, len(models))
    pairs = list(zip(models, targets))
    with OutputSet(paths.protected()) as outputs:
        timed: list[tuple[ModelResult, float | None]]
        if directory:  # staged and put in place whole, before the reports
            timed = list(convert_directory(job, directory, Path(targets[0])))
        elif not batch:  # one model: model and reports are committed together
            timed = [(job.convert_contained(models[0], targets[0], outputs), None)]
        elif workers > 1:
            timed = list(run_in_workers(job, pairs, workers))
        else:
            timed = [_timed(job, src, dst, f"[{k}/{len(pairs)}] ") for k, (src, dst) in enumerate(pairs, 1)]
        run_results = RunResults(tuple(r for r, _ in timed), verifying, tuple(t for _, t in timed))
        if report_json:
            provider = resolve_provider(verify_options.provider) if verify_options is not None else None
            run_info = run_record(started, provider, options.target.value, command)
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


def _timed(job: ConvertJob, src: str, dst: str, position: str) -> tuple[ModelResult, float]:
    """One model of a batch (`ConvertJob.convert_own`), and its seconds."""
    started = time.monotonic()
    result = job.convert_own(src, dst, position)
    return result, time.monotonic() - started


def _say_next(results: Sequence[ModelResult]) -> None:
    """A run that did not pass ends with the next step, in one line (with -q too)."""
    advice = next_step(results)
    if advice is not None:
        click.echo(f"rlx-amp: next: {advice}", err=True)


#: Options that only mean something with --verify or --repair (parameter name -> flag).
_VERIFY_ONLY = {
    "provider": "--provider",
    "emulate": "--emulate/--no-emulate",
    "inputs_path": "--inputs",
    "preprocess": "--preprocess",
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
    "generate_steps": "--generate-steps",
}


def _refuse_idle_options(ctx: click.Context, do_verify: bool | None, do_repair: bool) -> None:
    """Options that would do nothing are an error, never silently ignored."""
    given = [
        flag for name, flag in _VERIFY_ONLY.items() if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    ]
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



def verify(
    command: list[str],
    reference: str,
    candidate: str,
    target: str | None,
    report_json: str | None,
    report_md: str | None,
    report_html: str | None,
    quiet: bool,
    verbose: int,
    **verify_kwargs: Any,
) -> int:
    """The verify command: CANDIDATE against REFERENCE."""
    started = time.time()  # the report's run.started
    # The verification is imported where it runs: a conversion with --no-verify,
    # inspect and merge-reports do not load its modules.
    from rlx_onnx_amp.verification.core import verify as verify_models

    verify_options = dataclasses.replace(verify_options_from(**verify_kwargs), target=target)
    paths = RunPaths()
    plan_model_reads(paths, reference, "reference model")
    plan_model_reads(paths, candidate, "candidate model")
    _plan_reports(paths, report_json, report_md, verify_options, report_html=report_html)
    paths.check()
    with OutputSet(paths.protected()) as outputs:
        status(f"verifying {candidate} against {reference} ...", enabled=not quiet)
        lines = StageLines(candidate, StageLines.wanted(quiet))

        def run() -> Verification:
            with StagedProgress(enabled=not quiet, lines=lines) as progress:
                try:
                    return verify_models(reference, candidate, verify_options, progress=progress, outputs=outputs)
                except GuessedAxesError as e:  # a genai decoder: its folder's config has the sizes
                    raise with_genai_folder_hint(e, Path(reference)) from None

        # Under a supervisor: an onnxruntime crash is exit 3 with one line, never the end of rlx-amp.
        result = run_contained(run, (), outputs, label=candidate, warm=True)
        if not quiet:
            click.echo(verify_table(result, verbose=verbose > 0))
        elif not result.passed:  # -q still says that something failed, in one line
            click.echo(failed_verdict(result))
        elif result.written_unproven:  # and why it exits 4
            click.echo(written_line(result))
        if result.passed and result.unmoved_why is not None:  # exit 4, said as every exit 4 is
            warn(f"{candidate}: not verified (exit 4): {result.unmoved_why}")
        if report_json:
            run_info = run_record(started, result.provider, target, command)
            outputs.write_text(report_json, report_text(report_document({"verify": result.to_json()}, run_info)))
        if report_md:
            outputs.write_text(report_md, verify_markdown([ModelResult(verify=result)]))
        if report_html:
            from rlx_onnx_amp.reports.html import html_report  # matplotlib: only when a page is asked for

            outputs.write_text(report_html, html_report([ModelResult(verify=result)], title="rlx-amp drift report"))
        outputs.commit()
    _say_next([ModelResult(verify=result)])
    return ModelResult(verify=result).exit_code  # 4 where the written file crashed a stand-in provider


def merge(
    command: list[str], reports: Sequence[str], report_json: str | None, report_md: str | None, quiet: bool
) -> int:
    """The merge-reports command."""
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
            run_info = run_record(started, None, None, command)
            outputs.write_text(report_json, report_text(merged.to_json(run_info)))
        if report_md:
            outputs.write_text(report_md, markdown)
        outputs.commit()
    if not quiet and not report_md:
        click.echo(markdown, nl=False)
    return merged.exit_code


def demo(path: str) -> int:
    write_demo(path)
    click.echo(f"wrote {path}; try: rlx-amp {path} --policy auto-mixed -o demo_auto_mixed.onnx --verify")
    return EXIT_OK


def olive_config() -> int:
    try:
        from rlx_onnx_amp.olive import package_config  # Olive, and torch behind it: only here
    except ImportError as e:
        raise InputError(f"olive-config: {first_line(e, 300)}") from None
    click.echo(json.dumps(package_config(), indent=2))
    return EXIT_OK


def inspect(
    ctx: click.Context,
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
) -> int:
    """The inspect command."""
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

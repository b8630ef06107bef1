"""Batch processing for the convert command: each model converted (verified, repaired) and
printed by a `ConvertJob`, alone or in a pool of worker processes (`--jobs N`, `run_in_workers`),
an export directory whole or not at all (`convert_directory`), and the progress shown on a
terminal.

A worker converts, verifies and commits its model exactly as the parent does alone; the parent
prints what each printed and gathers the results in input order, so reports, order, output and
exit code are those of `--jobs 1`. Ctrl-C or SIGTERM stops every worker (the pool's own
terminate): each removes its staging and scratch (a worker in the middle of a commit finishes it
first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rlx_onnx_amp.api import checker_failure, stage_conversion
from rlx_onnx_amp.cost import policy_hint
from rlx_onnx_amp.directory import (
    StagedDirectory,
    check_cache_types,
    config_shapes,
    config_task,
    genai_cache_shapes,
    scan_export_dir,
    with_genai_folder_hint,
)
from rlx_onnx_amp.errors import LINE_LIMIT, AmpError, InputError, first_line, summarized
from rlx_onnx_amp.exits import (
    EXIT_INTERNAL,
    EXIT_LOW_GAIN,
    EXIT_SIGTERM,
    EXIT_UNVERIFIED,
    EXIT_USAGE,
    error_line,
    error_message,
    worst_exit_code,
)
from rlx_onnx_amp.files import OutputSet, RunPaths, remove_leftover_dirs
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.record import (
    Conversion,
    Failure,
    Gate,
    ModelResult,
    Run,
    batch_json,
    report_document,
)
from rlx_onnx_amp.reports.text import (
    batch_table,
    conversion_markdown,
    conversion_table,
    failed_verdict,
    gain_line,
    latency_line,
    repair_summary,
    verify_markdown,
    verify_table,
)
from rlx_onnx_amp.rewrite import ConvertOptions
from rlx_onnx_amp.stops import Terminated, raise_on_stop, raise_stop, stop_requested
from rlx_onnx_amp.verification.inputs import GuessedAxesError
from rlx_onnx_amp.verification.options import DEFAULT_BUDGET, VerifyOptions, session_threads

if TYPE_CHECKING:
    from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable

__all__ = [
    "ConvertJob",
    "JobSettings",
    "Progress",
    "RunResults",
    "StageLines",
    "StagedProgress",
    "WorkerOutcome",
    "convert_directory",
    "invalid_input",
    "run_in_workers",
    "status",
    "warn",
]


@dataclass(frozen=True)
class JobSettings:
    """What the convert command asks of each model."""

    policy: Policy
    options: ConvertOptions
    verify_options: VerifyOptions | None  # None: --no-verify
    repair: bool = False
    budget: int = DEFAULT_BUDGET
    data_name: str | None = None
    screen: bool = True  # rule range-screen from the reference run (unread with --repair: it screens itself)
    verify_required: bool = False  # --verify: a reference that cannot run is an error, not exit 4
    quiet: bool = False
    verbose: int = 0
    stage_lines: bool = False  # stderr no terminal, and not --quiet: `StageLines`
    #: onnxruntime's intra-op threads per session (0: onnxruntime's choice, every core); batch
    #: workers share the CPUs out.
    session_threads: int = 0
    export_dir: bool = False  # the models of an export directory (`convert_directory`)
    #: --min-low-share: the least share of the written model's MACs in low precision (exit 5 below it).
    min_low_share: float | None = None


class ConvertJob:
    """Converts (verifies, repairs) the models of one convert command, one at a time, printing
    each one's tables as it goes; each call answers what its model came to. It holds no results:
    the one the parent runs and the copies the workers get are alike."""

    def __init__(self, settings: JobSettings, paths: RunPaths) -> None:
        self.settings, self.paths = settings, paths

    def in_folder(self, shapes: Mapping[str, tuple[int, ...]], task: tuple[str, str] | None) -> ConvertJob:
        """This job with `shapes` for inputs its verification synthesizes, where `--shape`
        names none (an export directory's `genai_cache_shapes`), and the task the folder's
        config names (`directory.config_task`)."""
        verify_options = self.settings.verify_options
        if verify_options is None or (not shapes and task is None):
            return self
        spec = dataclasses.replace(verify_options.spec, shapes={**shapes, **verify_options.spec.shapes})
        verify_options = dataclasses.replace(verify_options, spec=spec, folder_task=task)
        return ConvertJob(dataclasses.replace(self.settings, verify_options=verify_options), self.paths)

    def convert(
        self, src: str, dst: str, outputs: OutputSet, shown: str | None = None, position: str = ""
    ) -> ModelResult:
        """Convert (verify, repair) `src` into `dst`, staged in `outputs`; `shown` is the path
        the reports name (a directory's file, staged elsewhere until the directory is whole);
        `position` is its `[k/N] ` in a batch."""
        lines = StageLines(src, self.settings.stage_lines, position)
        with session_threads(self.settings.session_threads):
            if self.settings.repair:
                result = self._repair(src, dst, outputs, shown or dst, lines)
            else:
                result = self._convert(src, dst, outputs, shown or dst, lines)
        result = self._gated(result)
        lines.done(result.exit_code)
        return result

    def _gated(self, result: ModelResult) -> ModelResult:
        """The result with its `--min-low-share` verdict; one line when it falls short."""
        least = self.settings.min_low_share
        if least is None or result.conversion is None:
            return result
        cost = result.conversion.cost
        share = cost.mac_low_share if cost is not None else None
        gate = Gate(least, share, share is not None and share >= least)
        if not gate.passed:
            kept = "an unknown share" if share is None else f"{share:.1%}"
            warn(
                f"{result.conversion.output}: keeps {kept} of its multiply-accumulates in low precision, under "
                f"--min-low-share {least:g} (exit {EXIT_LOW_GAIN}; written)"
            )
        return dataclasses.replace(result, gate=gate)

    def _repair(self, src: str, dst: str, outputs: OutputSet, shown: str, lines: StageLines) -> ModelResult:
        from rlx_onnx_amp.repair import repair_file  # the verification's modules: not for a conversion alone
        from rlx_onnx_amp.verification.reference import ReferenceUnavailable

        s = self.settings
        assert s.verify_options is not None
        lines.begin("repairing")
        try:
            conversion, verified, repaired = repair_file(
                src,
                dst,
                s.policy,
                options=s.options,
                verify_options=s.verify_options,
                budget=s.budget,
                data_name=s.data_name,
                outputs=outputs,
                paths=self.paths,
                progress=None if s.quiet else (lambda line: click.echo(f"repair: {line}", err=True)),
            )
        except ReferenceUnavailable as e:  # as the plain command: written unverified (exit 4), or --verify's error
            lines.release()
            lines.end()
            return self._convert(src, dst, outputs, shown, lines, unavailable=self._unavailable(e, src))
        lines.release()
        lines.end()
        result = ModelResult(dataclasses.replace(conversion, output=shown), verified, repaired)
        self._converted(result)
        return result

    def _convert(
        self, src: str, dst: str, outputs: OutputSet, shown: str, lines: StageLines, unavailable: str | None = None
    ) -> ModelResult:
        """Convert and verify `src`; with `unavailable` (why the reference cannot run, found by
        --repair) written unverified without another reference run."""
        s = self.settings
        reference, unverified = (None, unavailable) if unavailable else self._reference(src, lines)
        options = s.options
        if reference is not None:
            # The MACs are counted at the shapes the verification runs (`--shape` first).
            options = dataclasses.replace(
                options, value_ranges=reference.value_ranges, shapes={**reference.shapes(), **options.shapes}
            )
        lines.begin("converting")
        with Progress(f"converting {Path(src).name}", enabled=not s.quiet) as progress:
            staged = stage_conversion(
                src, dst, outputs, self.paths, s.policy, options=options, data_name=s.data_name, progress=progress
            )
        lines.release()
        lines.end()
        conversion = dataclasses.replace(staged.conversion, output=shown)
        self._converted(ModelResult(conversion))
        if reference is None:
            if unverified is not None:  # exit 4 (`ModelResult.exit_code`); the whole reason with -v and in the JSON
                line = f"{shown}: written, not verified (exit {EXIT_UNVERIFIED}): {unverified}"
                warn(line if s.verbose else summarized(line, LINE_LIMIT - len("rlx-amp: warning: ")))
            return ModelResult(conversion, unverified=unverified)
        from rlx_onnx_amp.verification.core import verify  # the verification's modules: not for a conversion alone

        status(f"verifying {shown} against {src} ...", enabled=not s.quiet)
        with StagedProgress(enabled=not s.quiet, lines=lines) as verify_progress:
            verified = verify(
                src,
                staged.path,
                s.verify_options,
                progress=verify_progress,
                candidate_label=shown,
                outputs=outputs,
                prepared=reference,
            )
        result = ModelResult(conversion, verified)
        self._verified(result)
        return result

    def _reference(self, src: str, lines: StageLines) -> tuple[Reference | None, str | None]:
        """The reference's one run (screened unless --no-screen), or why there is none: with
        verification by default a reference that cannot run leaves the model unverified."""
        s = self.settings
        if s.verify_options is None:
            return None, None
        # The verification's modules, here: a conversion without verification does not load them.
        from rlx_onnx_amp.verification.reference import ReferenceUnavailable, prepare_reference

        with StagedProgress(enabled=not s.quiet, lines=lines) as progress:
            try:
                return prepare_reference(src, s.verify_options, screen=s.screen, progress=progress), None
            except ReferenceUnavailable as e:
                return None, self._unavailable(e, src)

    def _unavailable(self, e: ReferenceUnavailable, src: str) -> str:
        """Why the reference cannot run, for a model written unverified; with --verify, the error."""
        error = e.error
        if isinstance(error, GuessedAxesError) and not self.settings.export_dir:  # say where the sizes are
            error = with_genai_folder_hint(error, Path(src))
        if self.settings.verify_required:
            raise error from None
        return str(error)

    def convert_own(self, src: str, dst: str, position: str = "") -> ModelResult:
        """One model of a batch: committed on its own; a failure is reported and the rest go on."""
        try:
            with OutputSet(self.paths.protected()) as own:
                result = self.convert(src, dst, own, position=position)
                own.commit()
            return result
        except AmpError as e:
            return self._failed(src, str(e), e.exit_code)
        except Exception as e:
            return self._failed(src, *unexpected_failure(e, [src]))

    def _converted(self, result: ModelResult) -> None:
        """What a conversion prints: the warnings of options that matched nothing, its table and
        the policy's hint (with --repair, then the repair and the drift)."""
        assert result.conversion is not None
        self._warn_idle(result.conversion)
        if not self.settings.quiet:
            click.echo(conversion_table(result.conversion))
            gain = gain_line(result.conversion)
            if gain:
                click.echo(gain)
            self._hint(result.conversion)
            if result.repair is not None:
                click.echo(repair_summary(result.repair))
        if result.verify is not None:
            self._verified(result)

    def _verified(self, result: ModelResult) -> None:
        assert result.verify is not None
        if not self.settings.quiet:
            click.echo(verify_table(result.verify, verbose=self.settings.verbose > 0))
            latency = latency_line(result.verify, result.conversion.target if result.conversion else None)
            if latency:
                click.echo(latency)
        elif not result.verify.passed:  # -q still says that something failed, in one line
            click.echo(failed_verdict(result.verify))

    def _hint(self, c: Conversion) -> None:
        """One line when the policy buys little: the policy itself is never changed."""
        if c.cost is not None and c.policy is not None:
            hint = policy_hint(c.cost, c.casts_inserted, c.policy.name)
            if hint:
                click.echo(f"rlx-amp: hint: {hint}", err=True)

    def _warn_idle(self, c: Conversion) -> None:
        """Options that matched nothing in this model: a warning, since they may match others."""
        options, data_name = self.settings.options, self.settings.data_name
        ops = {op.rpartition(".")[2] for op in c.by_op}
        for op in options.keep_f32_ops:
            if op not in ops:
                close = difflib.get_close_matches(op, sorted(ops), n=3)
                hint = f" (close: {', '.join(close)})" if close else ""
                warn(f"--keep-f32-op {op}: {c.model} has no {op} node{hint}")
        for pattern in options.keep_f32_nodes:
            if not any(k.reason == f"user: --keep-f32-node {pattern}" for k in c.kept_f32):
                warn(f"--keep-f32-node {pattern}: no node of {c.model} that the policy lowers matches")
        if data_name is not None and not c.data_files:
            warn(f"--data-name {data_name}: {c.output} is written without external data")

    def _failed(self, src: str, message: str, code: int) -> ModelResult:
        """A model of a batch that failed: one line (onnxruntime's words summarized unless -v), and
        the whole message in the reports."""
        click.echo(error_line(error_message(message, code, self.settings.verbose)), err=True)
        return ModelResult(failure=Failure(src, message, code))


@dataclass(frozen=True)
class RunResults:
    """What the models of one convert command came to, in input order: its reports, its
    summary line and its exit code (the worst of its models')."""

    results: tuple[ModelResult, ...]
    verifying: bool  # not --no-verify
    seconds: tuple[float | None, ...] = ()  # each model's, where timed (a batch)

    @property
    def exit_code(self) -> int:
        return worst_exit_code([r.exit_code for r in self.results])

    def json(self, batch: bool, run: Run | None = None) -> dict[str, Any]:
        if batch:
            return batch_json(self.results, self.exit_code, run)
        return report_document(self.results[0].to_json(), run)

    def markdown(self) -> str:
        failed = any(r.failure is not None for r in self.results)
        if any(r.verify is not None for r in self.results) or (failed and self.verifying):
            return verify_markdown(self.results)
        return conversion_markdown(self.results)

    def html(self) -> str:
        from rlx_onnx_amp.reports.html import html_report  # matplotlib: only when a page is asked for

        return html_report(self.results, title="rlx-amp conversion report")

    def summary(self, quiet: bool) -> str | None:
        """A batch's end: a table of its models (more than one, not -q), then one line: how many
        passed (or were converted), which failed, which were written unverified; with -q only
        when something did not pass."""
        bad = [r.verify.candidate for r in self.results if r.verify is not None and not r.verify.passed]
        bad += [r.failure.model for r in self.results if r.failure is not None]
        unverified = [r.output or r.model for r in self.results if r.unverified is not None]
        if not (bad or unverified or not quiet):
            return None
        line = f"{len(self.results) - len(bad) - len(unverified)} of {len(self.results)} models "
        line += "passed" if self.verifying else "converted"
        line += f"; failed: {', '.join(bad)}" if bad else ""
        line += f"; not verified: {', '.join(unverified)}" if unverified else ""
        if quiet or len(self.results) < 2:
            return line
        return f"{batch_table(self.results, self.seconds)}\n{line}"


def invalid_input(models: Sequence[str]) -> str | None:
    """One line naming the first input model that fails onnx.checker (full check), if any."""
    for model in models:
        first = checker_failure(model, 300)
        if first is not None:
            return f"{model}: not a valid ONNX model (onnx.checker: {first}); nothing written"
    return None


def unexpected_failure(error: Exception, models: Sequence[str]) -> tuple[str, int]:
    """What an exception that is no AmpError says, and its exit code: an input model that fails
    onnx.checker is bad input (`invalid_input`, exit 2); anything else is a bug, whose traceback
    goes to stderr now (exit 70)."""
    invalid = invalid_input(models)
    if invalid is not None:
        return invalid, EXIT_USAGE
    traceback.print_exception(error)
    bug = f"internal error ({type(error).__name__}: {first_line(error)}); this is a bug in rlx-amp"
    return f"{bug}, please report it with the model", EXIT_INTERNAL


@dataclass(frozen=True)
class WorkerOutcome:
    """What a worker's model came to, and what it printed."""

    result: ModelResult
    stdout: str
    stderr: str
    seconds: float


#: Forked where the platform can (at once, all imported; no onnxruntime session open yet).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"

_converting = False  # converting (SIGTERM unwinds) or waiting in the pool's queue (it exits)
STOP_GRACE_S = 10.0  # how long a stopped batch waits for its workers before it kills them


def _worker_start() -> None:
    """A worker: SIGTERM unwinds a conversion (staging cleaned, a commit finished first) and
    ends an idle worker at once; SIGINT is the parent's, which stops every worker with SIGTERM."""
    signal.signal(signal.SIGTERM, _worker_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A pool's workers are daemons, which multiprocessing lets start no child: a worker's
    # verification runs the written model in one (`child.run_in_child`), as the parent's does.
    multiprocessing.current_process().daemon = False


def _worker_sigterm(signum: int, frame: object) -> None:
    if _converting:
        raise_on_stop(signum, frame)
    os._exit(EXIT_SIGTERM)  # between models: nothing staged, nothing to clean


def _worker_convert(task: tuple[int, ConvertJob, str, str, str]) -> tuple[int, WorkerOutcome]:
    global _converting
    index, job, src, dst, position = task
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    try:
        _converting = True
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = job.convert_own(src, dst, position)
    except Terminated:  # the parent stops the batch; staging and scratch are already removed
        with contextlib.suppress(Terminated):  # but for a signal that cut an owner short
            remove_leftover_dirs()
        os._exit(EXIT_SIGTERM)
    finally:
        _converting = False
    # A stop whose exception was lost (`stops.stop_requested`): the worker never takes another
    # model, as the stopping parent holds the task queue's lock and it would wait for ever.
    if stop_requested():
        os._exit(EXIT_SIGTERM)
    return index, WorkerOutcome(result, out.getvalue(), err.getvalue(), time.monotonic() - started)


def _model_bytes(path: str) -> int:
    """A model's size with its data files: the larger go first, so no worker finishes alone."""
    p = Path(path)
    try:
        return sum(f.stat().st_size for f in p.parent.iterdir() if f.name.startswith(p.name) and f.is_file())
    except OSError:
        return 0


def run_in_workers(job: ConvertJob, pairs: list[tuple[str, str]], workers: int) -> list[tuple[ModelResult, float]]:
    """The batch in `workers` processes, the largest model first, each as `convert_own` does it;
    the parent prints what each printed and gathers the results and seconds in input order (see
    the module)."""
    threads = max(1, (os.cpu_count() or 1) // workers)  # onnxruntime shares the CPUs out
    worker_job = ConvertJob(dataclasses.replace(job.settings, session_threads=threads), job.paths)
    results: list[tuple[ModelResult, float]] = []
    order = sorted(range(len(pairs)), key=lambda i: -_model_bytes(pairs[i][0]))
    tasks = [(i, worker_job, *pairs[i], f"[{i + 1}/{len(pairs)}] ") for i in order]
    done: dict[int, WorkerOutcome] = {}
    pool = multiprocessing.get_context(START_METHOD).Pool(workers, initializer=_worker_start)
    try:
        for index, outcome in pool.imap_unordered(_worker_convert, tasks):
            if stop_requested():  # a signal whose exception was lost: the batch still stops
                raise_stop()
            done[index] = outcome
            while len(results) in done:  # in input order, as soon as the next one is there
                results.append(_take(done.pop(len(results))))
        pool.close()
        pool.join()  # inside the try: a signal while the workers wind down stops them too
    except BaseException:
        # SIGTERM to every worker, then a wait for each; one stuck past the grace (a lock a
        # killed worker held, a long C call) gets SIGKILL, so a stopped batch always ends.
        killer = threading.Timer(STOP_GRACE_S, _kill_workers)
        killer.daemon = True
        killer.start()
        try:
            pool.terminate()
            pool.join()
        finally:
            killer.cancel()
        raise
    return results


def _kill_workers() -> None:
    for worker in multiprocessing.active_children():
        worker.kill()


def _take(outcome: WorkerOutcome) -> tuple[ModelResult, float]:
    """A worker's model into the batch: what it printed, then its result and seconds."""
    click.echo(outcome.stdout, nl=False)
    click.echo(outcome.stderr, nl=False, err=True)
    return outcome.result, outcome.seconds


def warn(message: str) -> None:
    click.echo(f"rlx-amp: warning: {message}", err=True)


def status(line: str, enabled: bool) -> None:
    """A status line for long steps, on a terminal only."""
    if enabled and sys.stderr.isatty():
        click.echo(line, err=True)


class Progress:
    """A progress bar on stderr, only when stderr is a terminal and not --quiet."""

    def __init__(self, label: str, enabled: bool, min_total: int = 64 << 20) -> None:
        self.label = label
        self.min_total = min_total  # below this the work ends before a bar helps
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.shown = 0

    def __enter__(self) -> Progress:
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < self.min_total:
            return
        if self.bar is None:
            self.bar = click.progressbar(
                length=total, label=self.label, file=sys.stderr, show_pos=False, show_percent=True
            )
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


class StageLines:
    """Where stderr is no terminal (a CI log) and not --quiet: one plain line as each stage of a
    model ends, with its seconds (`[k/N] ` before the model in a batch), and one as the model
    ends, with its exit code; no bar, no carriage return. A stage that an error ends says
    nothing: the error is the line. The lines wait until the output's paths have passed their
    checks (`release`), so bad input still gets one line, though the reference runs first."""

    @staticmethod
    def wanted(quiet: bool) -> bool:
        """Whether a run prints them: stderr is no terminal (a CI log), and not --quiet."""
        return not quiet and not sys.stderr.isatty()

    def __init__(self, model: str, enabled: bool, position: str = "") -> None:
        self.enabled = enabled
        self.prefix = f"rlx-amp: {position}{model if len(model) <= 90 else '...' + model[-87:]}"
        self.stage: str | None = None
        self.since = self.started = time.monotonic()
        self.held: list[str] | None = []

    def _echo(self, line: str) -> None:
        if self.held is None:
            click.echo(line, err=True)
        else:
            self.held.append(line)

    def release(self) -> None:
        """The inputs and outputs are good: the lines held so far, and the rest as they come."""
        held, self.held = self.held or [], None
        for line in held:
            click.echo(line, err=True)

    def begin(self, stage: str) -> None:
        if stage != self.stage:
            self.end()
            self.stage = stage

    def end(self) -> None:
        """The stage ends: its line, with the seconds since the line before (or the model's start)."""
        now = time.monotonic()
        if self.enabled and self.stage is not None:
            self._echo(f"{self.prefix}: {self.stage}: {now - self.since:.1f} s")
        self.stage, self.since = None, now

    def done(self, exit_code: int) -> None:
        self.end()
        self.release()
        if self.enabled:
            click.echo(f"{self.prefix}: exit {exit_code} after {time.monotonic() - self.started:.1f} s", err=True)


class StagedProgress:
    """One progress bar per stage of a verification, on a terminal only; one `StageLines` line
    per stage elsewhere."""

    def __init__(self, enabled: bool, lines: StageLines | None = None) -> None:
        self.enabled = enabled
        self.lines = lines
        self.stage: str | None = None
        self.bar: Progress | None = None

    def __enter__(self) -> StagedProgress:
        return self

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self._close_bar()
            if self.lines is not None:
                self.lines.begin(stage)
            # Bars only for work long enough to watch: many weights, or several input sets.
            self.stage, self.bar = (
                stage,
                Progress(stage, self.enabled, min_total=64 if stage == "rounding weights" else 4),
            )
        assert self.bar is not None
        self.bar(done, total)

    def __exit__(self, error: type[BaseException] | None = None, *exc: object) -> None:
        self._close_bar()
        if self.lines is not None and error is None:
            self.lines.end()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.__exit__()
            self.bar = None


def convert_directory(job: ConvertJob, src: Path, out: Path) -> list[tuple[ModelResult, float]]:
    """An export directory into `out`, whole or not at all (`rlx_onnx_amp.directory`): every
    model converted (verified, repaired) under its relative name, with its seconds, every other
    file copied, the caches' types checked across files; a model that fails leaves nothing written."""
    if out.resolve() == src.resolve() or out.resolve().is_relative_to(src.resolve()) or src.resolve().is_relative_to(
        out.resolve()
    ):
        raise InputError(f"{out}: the output directory must lie outside {src}, and {src} outside it")
    export = scan_export_dir(src)
    cache_shapes = genai_cache_shapes(src)
    for rel, shapes in config_shapes(src, export.models).items():
        cache_shapes[rel] = {**shapes, **cache_shapes.get(rel, {})}
    folder_task = config_task(src)
    job = ConvertJob(dataclasses.replace(job.settings, export_dir=True), job.paths)
    results: list[tuple[ModelResult, float]] = []
    with StagedDirectory(out) as staged:
        with OutputSet(job.paths.protected()) as outputs:
            for k, rel in enumerate(export.models, 1):
                model_job, started = job.in_folder(cache_shapes.get(rel, {}), folder_task), time.monotonic()
                position = f"[{k}/{len(export.models)}] " if len(export.models) > 1 else ""
                result = model_job.convert(str(src / rel), str(staged.path(rel)), outputs, str(out / rel), position)
                results.append((result, time.monotonic() - started))
            outputs.commit()
        for rel in export.others:
            staged.copy(src / rel, rel)
        for rel in export.empty_dirs:
            staged.make_dir(rel)
        check_cache_types(staged.root, export.models)
        staged.commit()
    return results

"""What the command line shows while a model converts: one-line warnings, status lines, progress
bars on a terminal, a stage line per finished stage in a log (`StageLines`), and the tables of each
model as its conversion and verification end (`TerminalReporter`, the pipeline's `Reporter` for the
command line). The library never prints: its doors get `pipeline.LogReporter`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from rlx_onnx_amp.cost import policy_hint
from rlx_onnx_amp.errors import LINE_LIMIT, summarized
from rlx_onnx_amp.exits import error_line, error_message
from rlx_onnx_amp.reports.record import Conversion, ModelResult
from rlx_onnx_amp.reports.text import (
    conversion_table,
    failed_verdict,
    gain_line,
    latency_line,
    repair_summary,
    verify_table,
    written_line,
)

__all__ = [
    "Progress",
    "StageLines",
    "StagedProgress",
    "TerminalReporter",
    "TerminalReporters",
    "status",
    "warn",
]


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


class TerminalReporter:
    """The pipeline's `Reporter` for the command line: what one model's conversion shows on the
    terminal (or in a log: `StageLines`), as it goes."""

    def __init__(self, model: str, quiet: bool, verbose: int, stage_lines: bool, position: str = "") -> None:
        self.quiet, self.verbose = quiet, verbose
        self.lines = StageLines(model, stage_lines, position)

    # -- stages and progress ------------------------------------------------------------------

    def begin(self, stage: str) -> None:
        self.lines.begin(stage)

    def end(self) -> None:
        self.lines.end()

    def release(self) -> None:
        self.lines.release()

    def done(self, exit_code: int) -> None:
        self.lines.done(exit_code)

    def staged(self) -> StagedProgress:
        return StagedProgress(enabled=not self.quiet, lines=self.lines)

    def conversion_progress(self, label: str) -> Progress:
        return Progress(label, enabled=not self.quiet)

    def status(self, line: str) -> None:
        status(line, enabled=not self.quiet)

    # -- what a model came to ----------------------------------------------------------------

    def warning(self, message: str) -> None:
        warn(message)

    def repair_line(self, line: str) -> None:
        if not self.quiet:
            click.echo(f"repair: {line}", err=True)

    def unverified(self, line: str) -> None:
        warn(line if self.verbose else summarized(line, LINE_LIMIT - len("rlx-amp: warning: ")))

    def converted(self, result: ModelResult) -> None:
        """A conversion's table and the policy's hint (with --repair, then the repair and the drift)."""
        assert result.conversion is not None
        if not self.quiet:
            click.echo(conversion_table(result.conversion))
            gain = gain_line(result.conversion)
            if gain:
                click.echo(gain)
            self._hint(result.conversion)
            if result.repair is not None:
                click.echo(repair_summary(result.repair))
        if result.verify is not None:
            self.verified(result)

    def verified(self, result: ModelResult) -> None:
        assert result.verify is not None
        if not self.quiet:
            click.echo(verify_table(result.verify, verbose=self.verbose > 0))
            latency = latency_line(result.verify, result.conversion.target if result.conversion else None)
            if latency:
                click.echo(latency)
        elif not result.verify.passed:  # -q still says that something failed, in one line
            click.echo(failed_verdict(result.verify))
        elif result.verify.written_unproven:  # and why it exits 4
            click.echo(written_line(result.verify))

    def failed(self, message: str, code: int) -> None:
        click.echo(error_line(error_message(message, code, self.verbose)), err=True)

    def _hint(self, c: Conversion) -> None:
        """One line when the policy buys little: the policy itself is never changed."""
        if c.cost is not None and c.policy is not None:
            hint = policy_hint(c.cost, c.casts_inserted, c.policy.name)
            if hint:
                click.echo(f"rlx-amp: hint: {hint}", err=True)


class TerminalReporters:
    """Makes each model's `TerminalReporter` (picklable: a `--jobs` worker gets a copy)."""

    def __init__(self, quiet: bool = False, verbose: int = 0, stage_lines: bool = False) -> None:
        self.quiet, self.verbose, self.stage_lines = quiet, verbose, stage_lines

    def __call__(self, model: str, position: str = "") -> TerminalReporter:
        return TerminalReporter(model, self.quiet, self.verbose, self.stage_lines, position)

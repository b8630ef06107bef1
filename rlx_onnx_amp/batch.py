"""Batches for the convert command: the models of one command in input order, alone or in a pool
of worker processes (`--jobs N`, `run_in_workers`), an export directory whole or not at all
(`convert_directory`), and what they came to together (`RunResults`). Each model goes through the
pipeline (`pipeline.ConvertJob`).

A worker converts, verifies and commits its model exactly as the parent does alone; the parent
prints what each printed and gathers the results in input order, so reports, order, output and
exit code are those of `--jobs 1`. Ctrl-C or SIGTERM stops every worker (the pool's own
terminate): each removes its staging and scratch (a worker in the middle of a commit finishes it
first).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rlx_onnx_amp.directory import (
    StagedDirectory,
    check_cache_types,
    config_shapes,
    config_task,
    genai_cache_shapes,
    scan_export_dir,
)
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.exits import EXIT_SIGTERM, worst_exit_code
from rlx_onnx_amp.files import OutputSet, remove_leftover_dirs
from rlx_onnx_amp.pipeline import ConvertJob
from rlx_onnx_amp.reports.record import ModelResult, Run, batch_json, report_document
from rlx_onnx_amp.reports.text import batch_table, conversion_markdown, verify_markdown
from rlx_onnx_amp.stops import Terminated, raise_on_stop, raise_stop, stop_requested
from rlx_onnx_amp.verification.generate import folder_encoder

__all__ = ["RunResults", "WorkerOutcome", "convert_directory", "run_in_workers"]


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
        unverified = [r.output or r.model for r in self.results
                      if r.unverified is not None or (r.verify is not None and r.verify.written_unproven)]
        if not (bad or unverified or not quiet):
            return None
        line = f"{len(self.results) - len(bad) - len(unverified)} of {len(self.results)} models "
        line += "passed" if self.verifying else "converted"
        line += f"; failed: {', '.join(bad)}" if bad else ""
        line += f"; not verified: {', '.join(unverified)}" if unverified else ""
        if quiet or len(self.results) < 2:
            return line
        return f"{batch_table(self.results, self.seconds)}\n{line}"


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
    worker_job = job.replaced(session_threads=threads)
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
    encoder = folder_encoder(src, export.models)  # a seq2seq folder: its decoders read the encoder's states
    job = job.replaced(export_dir=True)
    results: list[tuple[ModelResult, float]] = []
    with StagedDirectory(out) as staged:
        with OutputSet(job.paths.protected()) as outputs:
            for k, rel in enumerate(export.models, 1):
                model_job, started = job.in_folder(cache_shapes.get(rel, {}), folder_task, encoder), time.monotonic()
                position = f"[{k}/{len(export.models)}] " if len(export.models) > 1 else ""
                result = model_job.convert_contained(
                    str(src / rel), str(staged.path(rel)), outputs, str(out / rel), position
                )
                results.append((result, time.monotonic() - started))
            outputs.commit()
        for rel in export.others:
            staged.copy(src / rel, rel)
        for rel in export.empty_dirs:
            staged.make_dir(rel)
        check_cache_types(staged.root, export.models)
        staged.commit()
    return results

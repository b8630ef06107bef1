"""A model file's time per inference on a provider, with onnxruntime's default session options,
and the written file's own run: its outputs on every input set, then its time.

The written model runs in a child process (`child.start_in_child`) before any verdict: its
outputs are judged against the reference's beside the emulation's (`verification.core`), and a
crash there is an error, not the end of the run. This is what that child runs, so it imports
onnxruntime (through `sessions`) and nothing heavier: the fork server preloads
this module (`child._PRELOAD`), and a lighter preload starts the first child sooner (0.17 s for
onnxruntime alone against 0.46 s for `verification.compare`, with onnx and the emulation). The
caller gives everything a process of its own cannot know: onnxruntime's provider, the feeds
already in the model's input types (`compare.typed_feeds`), and the intra-op threads.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Event

import numpy as np

from rlx_onnx_amp.errors import AmpError, ModelRunError, first_line
from rlx_onnx_amp.sessions import OrtSession

__all__ = ["TimedRun", "WrittenAnswer", "measure_latency", "time_written_model"]


@dataclass(frozen=True)
class TimedRun:
    """What to time: the model file at `path` on `provider` (the CLI's name; `ort_provider`,
    onnxruntime's), `runs` warm runs (0: it runs once, untimed) with `threads` intra-op threads
    (0: all cores); `label` names it in an error, `role` says what it is ("the written file")."""

    path: str
    provider: str
    ort_provider: str
    runs: int
    label: str
    threads: int = 0
    role: str | None = None


@dataclass(frozen=True)
class WrittenAnswer:
    """The written file's run in its child process (`time_written_model`): its outputs `names`
    on each input set, its milliseconds per inference (None: not timed), or why it cannot run."""

    outputs: list[dict[str, np.ndarray]] | None
    ms: float | None
    error: str | None


def _session(run: TimedRun) -> OrtSession:
    """A session with onnxruntime's default session options (graph optimizations and prepacking
    on, as a user's session has them)."""
    return OrtSession(run.path, run.ort_provider, run.label, role=run.role, shown=run.provider, threads=run.threads)


def _fed(session: OrtSession, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = {i.name for i in session.session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in inputs}


def _timed(session: OrtSession, run: TimedRun, typed: Mapping[str, np.ndarray], go: Event | None) -> float:
    """Median milliseconds of `run.runs` runs on `typed` (the session already warm); with `go`,
    they wait for it to be set (the process that set it no longer busy on the CPUs)."""
    if go is not None and run.runs:
        go.wait()
    times = []
    for _ in range(run.runs):
        start = time.perf_counter()
        session.run(None, typed)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 4) if times else 0.0  # runs 0: it ran once, untimed


def _cannot_run(run: TimedRun, e: Exception) -> ModelRunError:
    if isinstance(e, AmpError):
        return ModelRunError(str(e))
    return ModelRunError(f"{run.label}: onnxruntime cannot run it on {run.provider} ({first_line(e, 200)})")


def measure_latency(run: TimedRun, feeds: Mapping[str, np.ndarray], go: Event | None = None) -> float:
    """Median milliseconds per inference of `run` on `feeds` (in the model's input types), one
    untimed run first; with `go`, the timed runs wait for it to be set."""
    try:
        session = _session(run)
        typed = _fed(session, feeds)
        session.run(None, typed)
        return _timed(session, run, typed, go)
    except Exception as e:
        raise _cannot_run(run, e) from None


def time_written_model(
    run: TimedRun, sets: Sequence[Mapping[str, np.ndarray]], names: Sequence[str], go: Event | None = None
) -> WrittenAnswer:
    """The written file's run as a child process runs it: its outputs `names` on every input set
    of `sets` (in the model's input types), then its time per inference on the first (`run.runs`
    0: not timed); or why it cannot run."""
    try:
        session = _session(run)
        outputs = [dict(zip(names, session.run(names, _fed(session, feeds)))) for feeds in sets]
        ms = _timed(session, run, _fed(session, sets[0]), go) if run.runs else None
    except Exception as e:
        return WrittenAnswer(None, None, str(_cannot_run(run, e)))
    return WrittenAnswer(outputs, ms, None)

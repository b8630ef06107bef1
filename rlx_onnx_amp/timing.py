"""A model file's time per inference on a provider, with onnxruntime's default session options.

The written model runs once in a child process (`child.start_in_child`) before any verdict; this
is what that child runs, so it imports onnxruntime and nothing heavier: the fork server preloads
this module (`child._PRELOAD`), and a lighter preload starts the first child sooner (0.17 s for
onnxruntime alone against 0.46 s for `verification.compare`, with onnx and the emulation). The
caller gives everything a process of its own cannot know: onnxruntime's provider list, the feeds
already in the model's input types (`compare.typed_feeds`), and the intra-op threads.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.synchronize import Event

import numpy as np
import onnxruntime as ort

from rlx_onnx_amp.errors import ModelRunError, first_line

__all__ = ["TimedRun", "measure_latency", "time_written_model"]


@dataclass(frozen=True)
class TimedRun:
    """What to time: the model file at `path` on `provider` (onnxruntime's `providers`), `runs`
    warm runs (0: it runs once, untimed) with `threads` intra-op threads (0: all cores); `label`
    names it in an error."""

    path: str
    provider: str
    providers: tuple[str, ...]
    runs: int
    label: str
    threads: int = 0


def measure_latency(run: TimedRun, feeds: Mapping[str, np.ndarray], go: Event | None = None) -> float:
    """Median milliseconds per inference of `run` on `feeds` (in the model's input types), one
    untimed run first, with onnxruntime's default session options (graph optimizations and
    prepacking on, as a user's session has them). With `go`, the timed runs wait for it to be
    set (the process that set it no longer busy on the CPUs)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = run.threads
    try:
        session = ort.InferenceSession(run.path, opts, providers=list(run.providers))
        inputs = {i.name for i in session.get_inputs()}
        typed = {k: v for k, v in feeds.items() if k in inputs}
        session.run(None, typed)
        if go is not None and run.runs:
            go.wait()
        times = []
        for _ in range(run.runs):
            start = time.perf_counter()
            session.run(None, typed)
            times.append(time.perf_counter() - start)
    except Exception as e:
        why = first_line(e, 200)
        raise ModelRunError(f"{run.label}: onnxruntime cannot run it on {run.provider} ({why})") from None
    return round(statistics.median(times) * 1000, 4) if times else 0.0  # runs 0: it ran once, untimed


def time_written_model(
    run: TimedRun, feeds: Mapping[str, np.ndarray], go: Event | None = None
) -> tuple[float | None, str | None]:
    """`measure_latency` as a child process runs it: (milliseconds per inference, None), or
    (None, why it cannot run); with `run.runs` 0 the model runs once, untimed."""
    try:
        ms = measure_latency(run, feeds, go)
    except ModelRunError as e:
        return None, str(e)
    return (ms if run.runs else None), None

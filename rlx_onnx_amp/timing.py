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
from collections.abc import Mapping, Sequence
from multiprocessing.synchronize import Event
from pathlib import Path

import numpy as np
import onnxruntime as ort

from rlx_onnx_amp.errors import ModelRunError, first_line

__all__ = ["measure_latency", "time_written_model"]


def measure_latency(
    path: Path,
    provider: str,
    providers: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    runs: int,
    label: str,
    threads: int = 0,
    go: Event | None = None,
) -> float:
    """Median milliseconds per inference of the model file at `path` on `provider` (onnxruntime's
    `providers`) over `runs` warm runs (one untimed run first), with onnxruntime's default session
    options (graph optimizations and prepacking on, as a user's session has them) and `threads`
    intra-op threads (0: all cores). With `go`, the timed runs wait for it to be set (the process
    that set it no longer busy on the CPUs)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(path), opts, providers=list(providers))
        inputs = {i.name for i in session.get_inputs()}
        typed = {k: v for k, v in feeds.items() if k in inputs}
        session.run(None, typed)
        if go is not None and runs:
            go.wait()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run(None, typed)
            times.append(time.perf_counter() - start)
    except Exception as e:
        raise ModelRunError(f"{label}: onnxruntime cannot run it on {provider} ({first_line(e, 200)})") from None
    return round(statistics.median(times) * 1000, 4) if times else 0.0  # runs 0: it ran once, untimed


def time_written_model(
    path: str,
    provider: str,
    providers: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    runs: int,
    label: str,
    threads: int = 0,
    go: Event | None = None,
) -> tuple[float | None, str | None]:
    """`measure_latency` as a child process runs it: (milliseconds per inference, None), or
    (None, why it cannot run); with `runs` 0 the model runs once, untimed."""
    try:
        ms = measure_latency(Path(path), provider, providers, feeds, runs, label, threads, go)
    except ModelRunError as e:
        return None, str(e)
    return (ms if runs else None), None

"""Where rlx-amp's convert_file spends time and memory, phase by phase.

    python bench/profile_rlx.py MODEL [--policy auto-mixed] [--cost] [--cprofile N] [--tracemalloc N]

Without --cost it times what `rlx-amp MODEL -o OUT -q --no-verify` runs.

Wraps the phases of `convert_file` (load, the plan, type inference, the three passes,
initializer conversion, the report, the checker) and prints for each: inclusive wall time, RSS at
its end, and the peak RSS reached while it ran (VmHWM, reset before each phase through
/proc/self/clear_refs when the kernel allows it). --cprofile N also prints the top N functions
by own time; --tracemalloc N the top N Python allocation sites at the end of the sweeps
(protobuf's upb arena is C memory and is invisible to tracemalloc; the RSS column sees it).
Nothing in rlx_onnx_amp is modified: the wrapping is done on the imported modules.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

_PHASES: list[tuple[int, int, str, float, float, float, float]] = []  # (seq, depth, label, s, rss0, rss1, hwm)
_DEPTH = [0]
_SEQ = [0]


def _status() -> tuple[float, float]:
    rss = hwm = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return rss, hwm


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _wrap(owner: object, attr: str, label: str) -> None:
    fn = getattr(owner, attr, None)
    if fn is None:  # the library moved on: say so rather than stop
        print(f"note: {getattr(owner, '__name__', owner)}.{attr} not found; phase '{label}' not timed", file=sys.stderr)
        return

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        depth = _DEPTH[0]
        _DEPTH[0] += 1
        seq = _SEQ[0]
        _SEQ[0] += 1
        rss0, _ = _status()
        if depth == 0:
            _reset_hwm()
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            dt = time.perf_counter() - t0
            rss1, hwm = _status()
            _DEPTH[0] -= 1
            _PHASES.append((seq, depth, label, dt, rss0, rss1, hwm))

    setattr(owner, attr, wrapper)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--policy", default="auto-mixed")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="N")
    ap.add_argument("--out", help="output path (default: a temporary directory, deleted)")
    ap.add_argument("--cost", action="store_true",
                    help="fill the report's cost estimate too (the CLI does unless -q and no report file)")
    args = ap.parse_args(argv)

    import importlib

    import onnx

    api = importlib.import_module("rlx_onnx_amp.api")
    convert = importlib.import_module("rlx_onnx_amp.rewrite.convert")
    types = importlib.import_module("rlx_onnx_amp.types")
    passes = {name: importlib.import_module(f"rlx_onnx_amp.rewrite.{name}") for name in ("decide", "store", "emit")}
    weights = importlib.import_module("rlx_onnx_amp.rewrite.weights")
    proof = importlib.import_module("rlx_onnx_amp.proof")

    rss_start, _ = _status()
    # Top-level phases of convert_file (depth 0) and their parts (depth 1+).
    _wrap(api, "_load", "load (parse, find and check every tensor)")
    _wrap(convert, "_plan", "plan (node fields, order check, weights' maxima)")
    _wrap(types.NodeFields, "read", "read every node's fields")
    _wrap(convert, "sort_topologically", "order check (sort when out of order)")
    _wrap(passes["decide"].DecidePass, "__init__", "decide pass set-up (weights' maxima)")
    _wrap(passes["decide"], "infer_types", "infer_types (only when schema typing gives up)")
    _wrap(onnx.shape_inference, "infer_shapes", "onnx.shape_inference.infer_shapes")
    _wrap(passes["decide"].DecidePass, "call", "decide (typing included)")
    _wrap(passes["store"].StorePass, "call", "store")
    _wrap(passes["emit"].EmitPass, "call", "emit (incl. weights)")
    _wrap(weights.Retyper, "convert_initializers", "convert_initializers (read/narrow/write)")
    _wrap(weights.Retyper, "run_batches", "run_batches (small tensors narrowed together)")
    _wrap(convert.RewrittenModel, "finish", "finish: the report")
    _wrap(proof, "checker_failure", "onnx.checker full_check in this process")

    tm = None
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(8)
        tm = tracemalloc
        orig_fill = convert.fill_report

        def snap_then_fill(cx, main):
            snap = tm.take_snapshot()
            cur, peak = tm.get_traced_memory()
            print(f"tracemalloc after sweeps: current {cur / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")
            for stat in snap.statistics("lineno")[: args.tracemalloc]:
                print(f"  {stat.size / 2**20:8.1f} MiB {stat.count:9d} blocks  {stat.traceback[0]}")
            return orig_fill(cx, main)

        convert.fill_report = snap_then_fill

    with tempfile.TemporaryDirectory(dir=Path(args.model).resolve().parent) as tmp:
        out = args.out or str(Path(tmp) / "out.onnx")
        prof = None
        if args.cprofile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        options = api.make_options(cost=args.cost)
        api.convert_file(args.model, out, args.policy, options=options)
        total = time.perf_counter() - t0
        if prof:
            prof.disable()
    _, hwm_end = _status()

    # ru_maxrss is reset together with VmHWM by clear_refs, so take the largest phase peak.
    peak_total = max([hwm_end, *(p[6] for p in _PHASES if p[1] == 0)])
    print(f"\n{args.model} --policy {args.policy}: convert_file {total:.2f}s; RSS before {rss_start:.0f} MB, "
          f"process peak {peak_total:.0f} MB")
    print(f"{'phase':<58} {'s':>8} {'%':>6} {'RSS end MB':>11} {'dRSS MB':>8} {'peak MB':>8}")
    for _, depth, label, dt, rss0, rss1, hwm in sorted(_PHASES):
        print(f"{'  ' * depth + label:<58} {dt:>8.2f} {100 * dt / total:>6.1f} {rss1:>11.0f} {rss1 - rss0:>+8.0f} "
              f"{hwm if depth == 0 else float('nan'):>8.0f}")
    if prof:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.cprofile)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

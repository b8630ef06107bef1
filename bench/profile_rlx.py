"""Where rlx-amp's convert_file spends time and memory, phase by phase.

    python bench/profile_rlx.py MODEL [--policy auto-mixed] [--cprofile N] [--tracemalloc N]

Wraps the phases of `convert_file` (load, name collection, type inference, the three sweeps,
initializer conversion, report, save, checker) and prints for each: inclusive wall time, RSS at
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
    def wrapper(*a, **kw):  # noqa: ANN002, ANN003, ANN202
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
    args = ap.parse_args(argv)

    import onnx

    import importlib

    api = importlib.import_module("rlx_onnx_amp.api")
    convert = importlib.import_module("rlx_onnx_amp.rewrite")  # the module, not the function
    types = importlib.import_module("rlx_onnx_amp.types")

    rss_start, _ = _status()
    # Top-level phases of convert_file (depth 0) and their parts (depth 1+).
    _wrap(api, "_load", "load (parse, find tensors, check external data)")
    _wrap(api, "external_locations", "external_locations")
    _wrap(api, "convert_model", "convert_model")
    _wrap(convert._Converter, "_collect_names", "_collect_names")
    _wrap(convert, "infer_types", "infer_types (only when schema typing gives up)")
    _wrap(types, "_structure_copy", "_structure_copy")
    _wrap(onnx.shape_inference, "infer_shapes", "onnx.shape_inference.infer_shapes")
    _wrap(types, "_collect", "types._collect")
    _wrap(convert._Converter, "decide_scope", "sweep 1 decide_scope (typing included)")
    _wrap(convert._Converter, "store_scope", "sweep 2 store_scope")
    _wrap(convert._Converter, "emit_scope", "sweep 3 emit_scope (incl. weights)")
    _wrap(convert._Converter, "_convert_initializers", "_convert_initializers (read/narrow/write)")
    _wrap(convert._Converter, "_run_batches", "_run_batches (small tensors narrowed together)")
    _wrap(convert._Converter, "_fill_report", "_fill_report")
    _wrap(api.Path, "write_bytes", "write model bytes")
    _wrap(api, "_check", "_check (onnx.checker full_check)")

    tm = None
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(8)
        tm = tracemalloc
        orig_fill = convert._Converter._fill_report

        def snap_then_fill(self, main):  # noqa: ANN001, ANN202
            snap = tm.take_snapshot()
            cur, peak = tm.get_traced_memory()
            print(f"tracemalloc after sweeps: current {cur / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")
            for stat in snap.statistics("lineno")[: args.tracemalloc]:
                print(f"  {stat.size / 2**20:8.1f} MiB {stat.count:9d} blocks  {stat.traceback[0]}")
            return orig_fill(self, main)

        convert._Converter._fill_report = snap_then_fill

    with tempfile.TemporaryDirectory(dir=Path(args.model).resolve().parent) as tmp:
        out = args.out or str(Path(tmp) / "out.onnx")
        prof = None
        if args.cprofile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        api.convert_file(args.model, out, args.policy)
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

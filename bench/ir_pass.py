"""Peak memory of the onnx-ir pass beside the command line's, on a model with external data.

    python bench/ir_pass.py --model /work/bench_data/llama/llama.onnx

Contenders (--contenders, comma separated), each converting MODEL with always-f16 (--policy):
  ir   `ir.load(MODEL)` → `PassManager([MixedPrecisionPass(policy=P)])` →
       `ir.save(model, OUT, external_data=OUT.data)`, in one process (this script's --worker ir);
       it prints the peak RSS after each phase (getrusage) and their wall times
  cli  `rlx-amp MODEL -p P -o OUT --no-verify -q` (python -m rlx_onnx_amp)

Both run with PYTHONPATH set to this checkout, from its root. Measurement is bench/scale.py's
(`run_one`): each contender runs as
    /usr/bin/time -v -o TIMEFILE prlimit --as=MEM -- timeout -s KILL T  CMD...
with the input read once into the page cache before it, wall time around the subprocess, peak
RSS from /usr/bin/time's "Maximum resident set size", and the `sync` after it timed apart
(sync_s). Outputs go to --work (default: a temporary directory) and are deleted after each
contender unless --keep. JSON goes to bench/out/ir_pass.json (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import _machine, _outputs, run_one  # bench/ is on sys.path: the scripts run as bench/NAME.py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_ir(model: str, out: str, policy: str) -> None:
    import onnx_ir as ir

    from rlx_onnx_amp.ir import MixedPrecisionPass

    phases = {}
    t0 = time.perf_counter()
    loaded = ir.load(model)
    phases["load"] = {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(_peak_mb())}
    t0 = time.perf_counter()
    result = ir.passes.PassManager([MixedPrecisionPass(policy=policy)])(loaded)
    phases["pass"] = {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(_peak_mb())}
    t0 = time.perf_counter()
    ir.save(result.model, out, external_data=Path(out).name + ".data")
    phases["save"] = {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(_peak_mb())}
    print(json.dumps({"modified": result.modified, "phases": phases}))


def _cmd(name: str, model: Path, out: Path, policy: str) -> list[str]:
    if name == "ir":
        return [sys.executable, str(Path(__file__).resolve()), "--worker", "ir", str(model), str(out), "--policy", policy]
    return [sys.executable, "-m", "rlx_onnx_amp", str(model), "-p", policy, "-o", str(out), "--no-verify", "-q"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("/work/bench_data/llama/llama.onnx"))
    ap.add_argument("--policy", default="always-f16")
    ap.add_argument("--contenders", default="ir,cli")
    ap.add_argument("--work", type=Path, default=None, help="where outputs go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--mem-gb", type=float, default=64.0, help="address-space limit per contender")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "MODEL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:  # --worker ir MODEL OUT: one contender, in this process
        worker_ir(args.worker[1], args.worker[2], policy=args.policy)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="rlx-amp-ir-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    need = sum(p.stat().st_size for p in (args.model, args.model.with_name(args.model.name + ".data")) if p.exists())
    free = shutil.disk_usage(work).free
    print(f"model {args.model} ({need / 1e9:.2f} GB with its data); {free / 1e9:.1f} GB free in {work}", flush=True)
    if free < need:
        print("not enough free disk for one output and the scratch file", file=sys.stderr)
        return 1
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    warm = [args.model, args.model.with_name(args.model.name + ".data")]
    rows = []
    for name in args.contenders.split(","):
        out = work / f"{name}.onnx"
        rows.append(run_one(name, _cmd(name, args.model, out, args.policy), out, warm, args.mem_gb, args.timeout,
                            work, env=env, cwd=REPO))
        if not args.keep:
            for p in _outputs(out):
                p.unlink(missing_ok=True)
    result = {"model": str(args.model), "policy": args.policy, "machine": _machine(),
              "onnx_ir": subprocess.run([sys.executable, "-c", "import onnx_ir; print(onnx_ir.__version__)"],
                                        capture_output=True, text=True).stdout.strip(),
              "contenders": rows}
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "ir_pass.json").write_text(json.dumps(result, indent=2))
    print(f"\n{'contender':10s} {'status':8s} {'wall s':>8s} {'sync s':>7s} {'peak RSS MB':>12s}")
    for r in rows:
        print(f"{r['name']:10s} {r['status'][:8]:8s} {r['wall_s']:8.1f} {r['sync_s']:7.1f} {r['peak_rss_mb'] or 0:12.0f}")
        if "worker" in r:
            print("           phases:", json.dumps(r["worker"]["phases"]))
    if args.work is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

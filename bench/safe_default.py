"""What the safe default costs: the plain command (range screen and verification on one
reference run) against `--no-verify`, side by side in one run, on one model.

    python3 bench/safe_default.py --model /work/bench_data/llama/llama.onnx [--policy always-f16]
                                  [--repeat 3] [--json bench/out/safe_default.json]

Each mode runs `--repeat` times, alternating, under `/usr/bin/time -v` (wall time and peak
resident set), into a scratch directory outside the repository; the page cache is warmed by
one read of the model's files first. Prints the median of each mode, the ratio of the medians,
and the peak RSS against the model's float32 weights (the size of its external data files).
The mission's bounds: the plain command at most 3.5x the wall time of `--no-verify`, with peak
RSS at most 1.3x the f32 weights.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"no-verify": ["--no-verify"], "plain": []}


def _warm(model: Path) -> int:
    """Read the model and the files beside it that its name prefixes; their bytes."""
    total = 0
    for path in model.parent.iterdir():
        if path.name.startswith(model.name) and path.is_file():
            with open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
    return total


def _weights(model: Path) -> int:
    return sum(p.stat().st_size for p in model.parent.iterdir() if p.name.startswith(model.name) and p != model)


def run_once(model: Path, out: Path, policy: str, extra: list[str]) -> dict[str, float]:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "rlx_onnx_amp", str(model), "--policy", policy,
           "-o", str(out), "-q", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert wall and rss, done.stderr[-2000:]
    hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups())
    return {"wall_s": hours * 3600 + minutes * 60 + seconds, "rss_mb": int(rss.group(1)) / 1024,
            "exit": done.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--policy", default="always-f16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=str(Path(__file__).parent / "out" / "safe_default.json"))
    args = ap.parse_args(argv)
    model = Path(args.model).resolve()
    _warm(model)
    weights_mb = _weights(model) / 2**20
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    work = Path(tempfile.mkdtemp(prefix="rlx-amp-bench-safe-"))
    try:
        for _ in range(args.repeat):
            for mode, extra in MODES.items():
                runs[mode].append(run_once(model, work / f"{mode}.onnx", args.policy, extra))
                print(mode, runs[mode][-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {m: statistics.median(r["wall_s"] for r in rs) for m, rs in runs.items()}
    peak = {m: max(r["rss_mb"] for r in rs) for m, rs in runs.items()}
    result = {
        "model": str(model), "policy": args.policy, "repeat": args.repeat,
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version(),
                    "onnxruntime": __import__("onnxruntime").__version__, "platform": platform.platform()},
        "weights_mb": round(weights_mb, 1), "median_wall_s": median, "peak_rss_mb": peak,
        "ratio_plain_to_no_verify": round(median["plain"] / median["no-verify"], 3),
        "rss_to_weights": {m: round(v / weights_mb, 3) for m, v in peak.items()} if weights_mb else None,
        "runs": runs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"median wall: --no-verify {median['no-verify']:.2f} s, plain {median['plain']:.2f} s "
          f"({result['ratio_plain_to_no_verify']:.2f}x); peak RSS {peak['no-verify']:.0f} / {peak['plain']:.0f} MB "
          f"against {weights_mb:.0f} MB of f32 weights ({result['rss_to_weights']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

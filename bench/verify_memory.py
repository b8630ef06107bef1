"""Peak memory and wall time of `rlx-amp verify` (and `--localize`) on a large model, this
checkout against an earlier revision, side by side in one run.

    python3 bench/verify_memory.py --reference /work/bench_data/llama/llama.onnx \
        --candidate /work/bench_data/llama/llama16.onnx [--baseline-rev b33b657] [--localize]
        [--repeat 1] [--out bench/out/verify_memory.json]

Each contender runs `rlx-amp verify REFERENCE CANDIDATE --provider cpu -q [--localize]` as
    /usr/bin/time -v python3 -m rlx_onnx_amp ...
with PYTHONPATH pointing at its source tree: this checkout, and the baseline revision checked
out with `git worktree` into a temporary directory (the two-session verifier before issue 14).
Peak RSS is /usr/bin/time's "Maximum resident set size"; wall time is taken around the
subprocess. The page cache is warmed once (the model files read) before the first contender.
The model's size is the sum of its file and its external data files, so `rss / model` is the
figure issue 14 targets (at most 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from baseline import worktree  # bench/ is on sys.path: the scripts run as bench/NAME.py

REPO = Path(__file__).resolve().parent.parent


def model_bytes(path: Path) -> int:
    """The model file and every file in its directory that its name prefixes (its data)."""
    total = path.stat().st_size
    for other in path.parent.iterdir():
        if other != path and other.name.startswith(path.name) and other.is_file():
            total += other.stat().st_size
    return total


def run(tree: Path, args: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        start = time.perf_counter()
        proc = subprocess.run(
            ["/usr/bin/time", "-v", "-o", timing.name, sys.executable, "-m", "rlx_onnx_amp", *args],
            capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(),
        )
        wall = time.perf_counter() - start
        text = Path(timing.name).read_text()
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_gb": round(int(match.group(1)) * 1024 / 1e9, 2) if match else None,
        "stderr_tail": proc.stderr[-400:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, default=Path("/work/bench_data/llama/llama.onnx"))
    parser.add_argument("--candidate", type=Path, default=Path("/work/bench_data/llama/llama16.onnx"))
    parser.add_argument("--baseline-rev", default="b33b657", help="the revision to compare with (two sessions)")
    parser.add_argument("--localize", action="store_true", help="also time verify --localize")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "verify_memory.json")
    args = parser.parse_args()

    size = model_bytes(args.reference)
    for path in (args.reference, args.candidate):  # warm the page cache once for both contenders
        for f in [path, *path.parent.glob(path.name + "*")]:
            with open(f, "rb") as handle:
                while handle.read(1 << 24):
                    pass
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    modes = [("verify", [])] + ([("verify --localize", ["--localize"])] if args.localize else [])
    rows = []
    with worktree(args.baseline_rev) as (baseline, _):
        for mode, extra in modes:
            for label, tree in ((f"baseline {args.baseline_rev}", baseline), (f"this {head.strip()}", REPO)):
                cmd = ["verify", str(args.reference), str(args.candidate), "--provider", "cpu", "-q", *extra]
                row = {"mode": mode, "tree": label, **run(tree, cmd)}
                row["rss_over_model"] = round(row["peak_rss_gb"] * 1e9 / size, 2) if row["peak_rss_gb"] else None
                rows.append(row)
                print(f"{mode:18s} {label:18s} exit {row['exit']}  wall {row['wall_s']:7.1f} s  "
                      f"peak RSS {row['peak_rss_gb']} GB  ({row['rss_over_model']} x the model)", flush=True)
    print(f"\nmodel {args.reference} ({size / 1e9:.2f} GB with its data), candidate {args.candidate}")
    print("| mode | tree | exit | wall s | peak RSS GB | RSS / model size |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['tree']} | {r['exit']} | {r['wall_s']} | {r['peak_rss_gb']} | {r['rss_over_model']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model_bytes": size, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

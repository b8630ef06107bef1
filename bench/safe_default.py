"""What the safe default costs: the plain command (range screen and verification on one
reference run) against `--no-verify`, side by side in one run, on one model.

    python3 bench/safe_default.py --model /work/bench_data/llama/llama.onnx [--policy always-f16]
                                  [--repeat 3] [--json bench/out/safe_default.json]
    # bench/scale.py's synthetic chain of N nodes, this tree against git revision REV
    python3 bench/safe_default.py --nodes 5000 --policy auto-mixed --baseline-rev 54ac721 --repeat 3

Each mode runs `--repeat` times, alternating, under `/usr/bin/time -v` (wall time and peak
resident set), into a scratch directory outside the repository; the page cache is warmed by
one read of the model's files first. Prints the median of each mode, the ratio of the medians,
and the peak RSS against the model's float32 weights (the size of its external data files).
The mission's bounds: the plain command at most 3.5x the wall time of `--no-verify`, with peak
RSS at most 1.3x the f32 weights.

--nodes N builds `scale.build_chain(N)` instead of --model. --baseline-rev REV runs each mode
with the code of REV too (`baseline.worktree`; both trees as `python3 -m rlx_onnx_amp` with
their own PYTHONPATH, from a directory outside the repo, `scale._tree_at`), alternating: rows
`rlx MODE` and `rlx@REV MODE`, and each tree's plain / `--no-verify` ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from baseline import REPO, worktree  # bench/ is on sys.path: the scripts run as bench/NAME.py
from scale import Tree, _tree_at, build_chain

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


def run_once(model: Path, out: Path, policy: str, extra: list[str], tree: Tree | None = None) -> dict[str, float]:
    base = tree.base if tree is not None else [sys.executable, "-m", "rlx_onnx_amp"]
    cmd = ["/usr/bin/time", "-v", *base, str(model), "--policy", policy, "-o", str(out), "-q", *extra]
    env, cwd = (tree.env, tree.cwd) if tree is not None else (None, None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert wall and rss, done.stderr[-2000:]
    hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups())
    return {"wall_s": hours * 3600 + minutes * 60 + seconds, "rss_mb": int(rss.group(1)) / 1024,
            "exit": done.returncode}


def _alternate(model: Path, work: Path, policy: str, repeat: int,
               trees: dict[str, Tree | None]) -> dict[str, list[dict[str, float]]]:
    """Each mode under each tree, `repeat` rounds, alternating; rows named MODE (one tree) or
    `TREE MODE`."""
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeat):
        for label, tree in trees.items():
            for mode, extra in MODES.items():
                row = mode if len(trees) == 1 else f"{label} {mode}"
                runs.setdefault(row, []).append(run_once(model, work / f"{mode}.onnx", policy, extra, tree))
                print(row, runs[row][-1], flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--model")
    source.add_argument("--nodes", type=int, help="bench/scale.py's synthetic chain of this many nodes")
    ap.add_argument("--policy", default="always-f16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline-rev", help="also run each mode with the code of this git revision")
    ap.add_argument("--json", default=str(Path(__file__).parent / "out" / "safe_default.json"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rlx-amp-bench-safe-"))
    try:
        if args.nodes:
            model = work / f"chain_{args.nodes}.onnx"
            build_chain(args.nodes, model)
        else:
            model = Path(args.model).resolve()
        _warm(model)
        weights_mb = _weights(model) / 2**20
        with contextlib.ExitStack() as stack:
            trees: dict[str, Tree | None] = {"rlx": None}
            baseline_commit = None
            if args.baseline_rev:
                root, baseline_commit = stack.enter_context(worktree(args.baseline_rev))
                cwd = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlx-amp-cwd-")))
                trees = {"rlx": _tree_at("rlx", REPO, cwd), f"rlx@{args.baseline_rev}": _tree_at(f"rlx@{args.baseline_rev}", root, cwd)}
            runs = _alternate(model, work, args.policy, args.repeat, trees)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {m: statistics.median(r["wall_s"] for r in rs) for m, rs in runs.items()}
    peak = {m: max(r["rss_mb"] for r in rs) for m, rs in runs.items()}
    if args.baseline_rev:
        for label in trees:
            print(f"{label}: plain {median[f'{label} plain']:.2f} s / --no-verify {median[f'{label} no-verify']:.2f} s"
                  f" = {median[f'{label} plain'] / median[f'{label} no-verify']:.2f}x", flush=True)
        median["plain"], median["no-verify"] = median["rlx plain"], median["rlx no-verify"]
        peak["plain"], peak["no-verify"] = peak["rlx plain"], peak["rlx no-verify"]
    result = {
        "model": str(model) if not args.nodes else f"bench/scale.py build_chain({args.nodes})",
        "policy": args.policy, "repeat": args.repeat, "baseline_rev": args.baseline_rev,
        "baseline_commit": baseline_commit,
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

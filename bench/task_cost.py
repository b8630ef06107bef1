"""What the task verdicts cost (issue 39): each export folder converted and verified with its
task picked (`--task auto`: greedy generation for decoders, classes, embeddings) beside the
element-wise verdict alone (`--task none`), side by side in one run.

    python3 bench/task_cost.py FOLDER... [--runs 3] [--policy always-f16] [--out bench/out/task_cost.json]

FOLDER: export directories (fixtures/export_optimum.py's, fixtures/models/genai-llama). Each
command is `rlx-amp FOLDER -p POLICY -o OUT --provider cpu -q --latency-runs 0 --task T` in a
fresh process, run `--runs` times after one untimed warm run, alternating the two tasks; the
table gives the median wall time of each and their ratio, and the task each file was judged on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(folder: Path, out: Path, policy: str, task: str, report: Path) -> float:
    command = [sys.executable, "-m", "rlx_onnx_amp", str(folder), "-p", policy, "-o", str(out), "--provider", "cpu",
               "-q", "--latency-runs", "0", "--task", task, "--report-json", str(report)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{folder}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default="always-f16")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "task_cost.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlx-task-cost-") as tmp:
        for folder in args.folders:
            times: dict[str, list[float]] = {"none": [], "auto": []}
            report = Path(tmp) / "r.json"
            for task in times:  # warm the file cache and the imports
                _run(folder, Path(tmp) / "out", args.policy, task, report)
            for _ in range(args.runs):
                for task in times:
                    times[task].append(_run(folder, Path(tmp) / f"out-{task}", args.policy, task, report))
            tasks = {Path(m["output"]).name: m["verify"]["task"]["task"]
                     for m in json.loads(report.read_text())["models"]}
            none, auto = statistics.median(times["none"]), statistics.median(times["auto"])
            rows.append({"folder": folder.name, "none_s": none, "auto_s": auto, "ratio": auto / none, "tasks": tasks})
    print("| folder | files: task | --task none s | --task auto s | auto / none |")
    print("|---|---|---|---|---|")
    for r in rows:
        tasks = ", ".join(f"{name}: {task}" for name, task in sorted(r["tasks"].items()))
        print(f"| {r['folder']} | {tasks} | {r['none_s']:.2f} | {r['auto_s']:.2f} | {r['ratio']:.2f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"policy": args.policy, "runs": args.runs, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

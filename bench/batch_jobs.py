"""A batch converted and verified with `--jobs 1` against `--jobs N`, side by side.

    python3 bench/batch_jobs.py [--models M1.onnx ...] [--jobs 2] [--rounds 3] [--workdir DIR]
                                [--out bench/out/batch_jobs.json]

Without --models the batch is eight small models written by fixtures/make_fixtures.py:
`mlp_external` at widths 512 to 1024 (2 to 8 MiB of external weights each, seeds 0 to 7) and
the demo transformer is not used, so every model does comparable work. Each round runs

    rlx-amp MODELS... --policy always-f16 --out-dir OUT --verify --provider cpu --samples 4
            --report-json OUT/report.json -q --jobs J

for J = 1 and J = N, alternating (1, N, 1, N, ...), each into a fresh output directory, with
wall time taken around the subprocess (start-up and imports included). It prints the median
wall time of each, the speed-up, and whether the two JSON reports and exit codes are identical
(output paths normalised).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def default_models(workdir: Path) -> list[Path]:
    from fixtures.make_fixtures import mlp_external, write_external

    paths = []
    for k in range(8):
        path = workdir / "models" / f"mlp{k}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_external(mlp_external(salt=100 + k, width=2048 + 128 * k), path)
        paths.append(path)
    return paths


def run(models: list[Path], jobs: int, out: Path) -> tuple[float, int, str]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "rlx_onnx_amp", *map(str, models), "--policy", "always-f16", "--out-dir", str(out),
           "--verify", "--provider", "cpu", "--samples", "4", "--report-json", str(out / "report.json"), "-q",
           "--jobs", str(jobs)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    report = (out / "report.json").read_text().replace(str(out), "OUT") if (out / "report.json").exists() else ""
    return wall, proc.returncode, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "batch_jobs.json")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rlx-amp-batch-"))
    models = args.models or default_models(work)
    walls: dict[int, list[float]] = {1: [], args.jobs: []}
    reports: dict[int, set[str]] = {1: set(), args.jobs: set()}
    codes: dict[int, set[int]] = {1: set(), args.jobs: set()}
    for r in range(args.rounds):
        for jobs in (1, args.jobs):
            wall, code, report = run(models, jobs, work / f"out{jobs}")
            walls[jobs].append(wall)
            reports[jobs].add(report)
            codes[jobs].add(code)
            print(f"round {r + 1} --jobs {jobs}: {wall:.2f} s, exit {code}", flush=True)
    one, many = statistics.median(walls[1]), statistics.median(walls[args.jobs])
    same = reports[1] == reports[args.jobs] and len(reports[1]) == 1 and codes[1] == codes[args.jobs]
    print(f"\n{len(models)} models, median of {args.rounds}: --jobs 1 {one:.2f} s, --jobs {args.jobs} {many:.2f} s, "
          f"speed-up {one / many:.2f}x; reports and exit codes identical: {same}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"models": [str(m) for m in models], "walls": walls, "speedup": one / many,
                                    "identical": same}, indent=2) + "\n")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

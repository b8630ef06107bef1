"""How long rlx-amp takes before it does anything: `--version`, `--help`, a subcommand's help,
and the imports a conversion needs, each in a fresh interpreter.

    python3 bench/startup.py [--runs 7] [--out bench/out/startup.json]

Each command runs `--runs` times (after one untimed run that warms the file cache); the table
gives the median and the fastest wall time, and, from `python -X importtime`, whether onnx or
onnxruntime was imported and the cumulative import time of the slowest top-level module. The
baseline is `python3 -c pass`: the interpreter's own start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "rlx-amp --version": ["-m", "rlx_onnx_amp", "--version"],
    "rlx-amp --help": ["-m", "rlx_onnx_amp", "--help"],
    "rlx-amp convert --help": ["-m", "rlx_onnx_amp", "convert", "--help"],
    "a conversion's imports": ["-c", "import rlx_onnx_amp.commands, rlx_onnx_amp.verification.core"],
}


def _imports(args: list[str]) -> tuple[bool, str, float]:
    """(onnx or onnxruntime imported, the slowest top-level import, its cumulative seconds)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=REPO)
    heavy, slowest, most = False, "", 0.0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not cumulative.isdigit():
            continue
        heavy = heavy or name.strip() in ("onnx", "onnxruntime")
        if not name.startswith(" ") and int(cumulative) / 1e6 > most:
            slowest, most = name.strip(), int(cumulative) / 1e6
    return heavy, slowest, most


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "startup.json")
    args = parser.parse_args()
    rows = []
    for label, command in COMMANDS.items():
        subprocess.run([sys.executable, *command], capture_output=True, cwd=REPO, check=True)  # warm
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, *command], capture_output=True, cwd=REPO, check=True)
            times.append(time.perf_counter() - start)
        heavy, slowest, most = _imports(command)
        rows.append({"command": label, "median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                     "onnx_imported": heavy, "slowest_import": slowest, "slowest_import_s": round(most, 3)})
    print("| command | median s | fastest s | onnx/onnxruntime imported | slowest import (cumulative s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f} | {'yes' if r['onnx_imported'] else 'no'} "
              f"| {r['slowest_import']} ({r['slowest_import_s']:.3f}) |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

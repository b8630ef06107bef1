"""Seeded mutation fuzzing of the CLI (tools/fuzz_mutants.py): a few hundred mutants of the
fixture models, in two driver processes, within a wall-clock limit.

Per mutant: an exit code of the documented set (0, 1, 2, 3, 4; 4 only without --verify; 70, the
internal error, fails), no traceback, an exit 2 or 3 prints exactly one `rlx-amp: error:` line and
an exit 4 one "written, not verified" line with the model written, an exit 2 writes nothing, the
input files are untouched, no stray files appear, a model whose external data lies outside its
directory is not converted, and a mutant whose input passes `onnx.checker` (full) and loads in
onnxruntime never exits 0, 1 or 4 with an output that fails either.

RLX_FUZZ_SEED and RLX_FUZZ_COUNT (per driver) change the run; `make fuzz` runs thousands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.fuzz_mutants import check_record, describe_failure

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("RLX_FUZZ_SEED", "20261130"))
PER_DRIVER = int(os.environ.get("RLX_FUZZ_COUNT", "400"))
DRIVERS = 2
TIMEOUT_S = 100.0  # the whole run; a hang shows as a timeout naming the last mutant started


def _last_started(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[fuzz] ")]
    return lines[-1][len("[fuzz] "):] if lines else "none"


@pytest.mark.slow  # 800 mutants: CI runs it; `make test-fast` leaves it out
def test_fuzz_mutants(tmp_path: Path) -> None:
    procs = []
    started = time.monotonic()
    for d in range(DRIVERS):
        work, jsonl, log = tmp_path / f"w{d}", tmp_path / f"records{d}.jsonl", tmp_path / f"driver{d}.log"
        cmd = [sys.executable, "-m", "tools.fuzz_mutants", "--seed", str(SEED), "--start", str(d * PER_DRIVER),
               "--count", str(PER_DRIVER), "--workdir", str(work), "--jsonl", str(jsonl), "--verify-share", "0.1",
               "--timeout", str(TIMEOUT_S / 2)]
        with open(log, "wb") as err:
            procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err), jsonl, log))

    crashed = []
    for proc, _, log in procs:
        try:
            rc = proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            crashed.append(f"driver timed out after {TIMEOUT_S:.0f} s (a hang?) in mutant: seed {_last_started(log)}")
            continue
        if rc != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            crashed.append(f"driver exited {rc} (negative: killed by a signal) in mutant: seed {_last_started(log)}\n{tail}")
    elapsed = time.monotonic() - started

    records = [json.loads(line) for _, jsonl, _ in procs if jsonl.exists() for line in jsonl.read_text().splitlines()]
    failures = [describe_failure(r, p) for r in records if (p := check_record(r))]
    skipped = [r for r in records if r.get("skipped")]
    message = [f"{len(records)} mutants in {elapsed:.1f} s ({len(skipped)} skipped)"]
    if crashed:
        message += ["driver failures:", *crashed]
    if failures:
        message += [f"{len(failures)} mutants break the contract:", *failures]
    if crashed or failures:
        pytest.fail("\n".join(message), pytrace=False)
    assert len(records) == DRIVERS * PER_DRIVER, "\n".join(message)
    assert len(skipped) < len(records) // 10, "too many mutants could not be written: " + "; ".join(
        str(r["skipped"]) for r in skipped[:5])
    codes = {r["exit"] for r in records}
    assert {0, 2} <= codes, f"the mutants should reach both success and refusal, got exit codes {codes}"

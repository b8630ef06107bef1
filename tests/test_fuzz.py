"""Seeded mutation fuzzing of the CLI (tools/fuzz_mutants.py): two hundred mutants of the
fixture models, in two driver processes. No limit on the run's wall time (a loaded machine takes
longer): a hang is a mutant that runs past MUTANT_LIMIT_S (the driver dumps its stacks and exits
1) or a driver that starts no new mutant for STALL_S (the test kills it).

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
PER_DRIVER = int(os.environ.get("RLX_FUZZ_COUNT", "40"))
DRIVERS = 2
#: Hang guards, not budgets: one mutant takes well under a second.
MUTANT_LIMIT_S = 600.0  # the driver's own per-mutant limit (faulthandler: every stack, then exit 1)
STALL_S = MUTANT_LIMIT_S + 300.0  # no new line in a driver's log this long: the test kills it
POLL_S = 0.5


def _last_started(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[fuzz] ")]
    return lines[-1][len("[fuzz] "):] if lines else "none"


def _wait_for_drivers(procs: list[tuple[subprocess.Popen[bytes], Path, Path]]) -> list[str]:
    """Wait until every driver has exited; a driver whose log stops growing for STALL_S is
    killed. Returns the drivers' failures."""
    crashed = []
    progress = {log: (log.stat().st_size, time.monotonic()) for _, _, log in procs}
    pending = list(procs)
    while pending:
        for item in list(pending):
            proc, _, log = item
            rc = proc.poll()
            if rc is None:
                size, since = progress[log]
                if log.stat().st_size != size:
                    progress[log] = (log.stat().st_size, time.monotonic())
                elif time.monotonic() - since > STALL_S:
                    proc.kill()
                    proc.wait()
                    pending.remove(item)
                    crashed.append(f"driver started nothing for {STALL_S:.0f} s (a hang?) in mutant: {_last_started(log)}")
                continue
            pending.remove(item)
            if rc != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                crashed.append(f"driver exited {rc} (negative: killed by a signal) in mutant: {_last_started(log)}\n{tail}")
        if pending:
            time.sleep(POLL_S)  # the interval between looks at the drivers, not a guess of when they end
    return crashed


@pytest.mark.slow  # 80 mutants: CI runs it; `make test-fast` leaves it out
def test_fuzz_mutants(tmp_path: Path) -> None:
    procs = []
    started = time.monotonic()
    for d in range(DRIVERS):
        work, jsonl, log = tmp_path / f"w{d}", tmp_path / f"records{d}.jsonl", tmp_path / f"driver{d}.log"
        cmd = [sys.executable, "-m", "tools.fuzz_mutants", "--seed", str(SEED), "--start", str(d * PER_DRIVER),
               "--count", str(PER_DRIVER), "--workdir", str(work), "--jsonl", str(jsonl), "--verify-share", "0.1",
               "--timeout", str(MUTANT_LIMIT_S)]
        with open(log, "wb") as err:
            procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err), jsonl, log))
    crashed = _wait_for_drivers(procs)
    elapsed = time.monotonic() - started  # said in the message, never asserted on

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


def test_a_driver_that_stops_is_killed_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall guard, with a small limit on purpose: a driver that started a mutant and then
    writes nothing is killed, and the failure names the mutant it was in."""
    monkeypatch.setattr(sys.modules[__name__], "STALL_S", 1.0)
    log = tmp_path / "driver.log"
    with open(log, "wb") as err:
        stuck = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                  "print('[fuzz] seed 1 index 7', file=sys.stderr, flush=True)\ntime.sleep(3600)"],
                                 stdout=subprocess.DEVNULL, stderr=err)
    crashed = _wait_for_drivers([(stuck, tmp_path / "records.jsonl", log)])
    assert stuck.returncode is not None and stuck.returncode < 0  # killed, not left running
    assert len(crashed) == 1 and "a hang?" in crashed[0] and crashed[0].endswith("seed 1 index 7"), crashed


def test_a_mutant_past_its_limit_stops_the_driver(tmp_path: Path) -> None:
    """The driver's own per-mutant limit, set small on purpose: it dumps the stacks and exits 1,
    and the last line it started names the mutant."""
    log = tmp_path / "driver.log"
    with open(log, "wb") as err:
        rc = subprocess.run([sys.executable, "-m", "tools.fuzz_mutants", "--seed", "1", "--count", "1",
                             "--workdir", str(tmp_path / "w"), "--timeout", "0.001"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, timeout=600).returncode
    text = log.read_text(errors="replace")
    # faulthandler's exit is _exit(1) from its watchdog thread; landing inside a C extension's
    # import, that exit can die of SIGSEGV instead (-11 under a busy suite): stopped, either way.
    assert rc == 1 or rc < 0, text
    assert _last_started(log) == "seed 1 index 0" and "Timeout" in text, text

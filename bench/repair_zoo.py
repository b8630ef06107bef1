"""rlx-amp --repair over the torchvision zoo of bench/export_torchvision.py.

    python3 bench/repair_zoo.py [--data-dir /work/bench_data/torchvision] [--models a,b,...]
                                [--budget N] [--timeout 1200] [--out bench/out/repair_zoo.json]

For each exported model DATA_DIR/NAME/model.onnx (with its fixed input DATA_DIR/NAME/inputs.npz),
in its own subprocess, with wall time taken around it (perf_counter; start-up, imports, load and
save included), killed after --timeout seconds:

    rlx-amp DATA_DIR/NAME/model.onnx --policy always-f16 -o WORK/NAME/repaired.onnx --repair
            --provider cpu --inputs DATA_DIR/NAME/inputs.npz --report-json WORK/NAME/report.json
            [--repair-budget N]     (only with --budget; otherwise rlx-amp's default)

(WORK is the --out file's directory + repair_zoo/.) One table row per model: nodes (the report's
nodes.total), evaluations, wall s, nodes kept f32, compute_low_share, the verdict (pass = exit 0,
drift = exit 1, crash = any other exit code or a traceback on stderr, timeout) with the exit code,
and whether the model written is the best one seen:

  best ok   repair.best.evaluation is the minimum of repair.history under the rule of
            rlx_onnx_amp/repair.py (recomputed here, not imported): a passing candidate beats a
            failing one; among passing ones the fewest kept nodes, then the lowest score; among
            failing ones the lowest score; the earlier evaluation on a tie. Also: exactly one
            history entry has written: true, and it is best.evaluation; best.kept and
            best.score match that entry; len(kept_f32) == best.kept; evaluations ==
            len(history); repair.passed agrees with the exit code.

Any check that fails is listed under the table as a note for that model (as are a used-up
budget, a NaN score and a missing output). A crash prints the last lines of the traceback.
Writes the rows (with notes, stderr tail and the repro command) as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = [
    "efficientnet_b0",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "ssdlite320_mobilenet_v3_large",
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "retinanet_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
]
DEFAULT_BUDGET = 24  # rlx-amp's documented default; used only to flag a used-up budget


def _score(v) -> float:
    """Scores compare as floats; NaN (or a missing score) sorts last."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(f) else f


def best_key(e: dict) -> tuple:
    if e.get("passed"):
        return (0, e.get("kept", 0), _score(e.get("score")), e.get("evaluation", 0))
    return (1, 0, _score(e.get("score")), e.get("evaluation", 0))


def check_repair(rep: dict, rc: int, budget: int) -> tuple[str, list[str]]:
    """('yes' | 'NO' | '-', notes) for the report's repair key."""
    notes: list[str] = []
    history = rep.get("history") or []
    best = rep.get("best") or {}
    if not history:
        return "-", ["repair.history is empty"]
    expected = min(history, key=best_key)
    ok = best.get("evaluation") == expected.get("evaluation")
    if not ok:
        notes.append(f"best.evaluation {best.get('evaluation')} is not the best of history "
                     f"(evaluation {expected.get('evaluation')}: stage {expected.get('stage')!r}, "
                     f"passed {expected.get('passed')}, kept {expected.get('kept')}, score {expected.get('score')})")
    written = [e for e in history if e.get("written")]
    if len(written) != 1:
        ok = False
        notes.append(f"{len(written)} history entries have written: true (evaluations "
                     f"{[e.get('evaluation') for e in written]})")
    elif written[0].get("evaluation") != best.get("evaluation"):
        ok = False
        notes.append(f"written entry is evaluation {written[0].get('evaluation')}, best.evaluation is "
                     f"{best.get('evaluation')}")
    entry = next((e for e in history if e.get("evaluation") == best.get("evaluation")), None)
    if entry is None:
        ok = False
        notes.append(f"best.evaluation {best.get('evaluation')} is not in history")
    else:
        if entry.get("kept") != best.get("kept"):
            ok = False
            notes.append(f"best.kept {best.get('kept')} != history entry's kept {entry.get('kept')}")
        if _score(entry.get("score")) != _score(best.get("score")):
            ok = False
            notes.append(f"best.score {best.get('score')} != history entry's score {entry.get('score')}")
        if bool(entry.get("passed")) != bool(rep.get("passed")):
            notes.append(f"repair.passed {rep.get('passed')} but the written candidate's evaluation passed "
                         f"{entry.get('passed')} (final verification disagrees with the search)")
    if len(rep.get("kept_f32") or []) != best.get("kept"):
        ok = False
        notes.append(f"len(kept_f32) {len(rep.get('kept_f32') or [])} != best.kept {best.get('kept')}")
    if rep.get("evaluations") != len(history):
        notes.append(f"evaluations {rep.get('evaluations')} != len(history) {len(history)}")
    if rc in (0, 1) and bool(rep.get("passed")) != (rc == 0):
        notes.append(f"repair.passed {rep.get('passed')} but exit code {rc}")
    if any(isinstance(e.get("score"), float) and math.isnan(e["score"]) for e in history):
        notes.append("a history score is NaN")
    if (rep.get("evaluations") or 0) >= budget:
        notes.append(f"used the whole budget ({rep.get('evaluations')} of {budget} evaluations)")
    if not rep.get("passed"):
        notes.append(f"fails verification after repair (best: stage {best.get('stage')!r}, score {best.get('score')}, "
                     f"kept {best.get('kept')}; minimality {rep.get('minimality')!r})")
    return ("yes" if ok else "NO"), notes


def traceback_tail(stderr: str, lines: int = 15) -> str | None:
    if "Traceback (most recent call last)" not in stderr:
        return None
    tail = stderr[stderr.rindex("Traceback (most recent call last)"):].rstrip().splitlines()
    return "\n".join(tail[-lines:])


def run_model(name: str, data_dir: Path, work: Path, budget: int | None, timeout: float) -> dict:
    model = data_dir / name / "model.onnx"
    inputs = data_dir / name / "inputs.npz"
    target = work / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    out, report = target / "repaired.onnx", target / "report.json"
    exe = shutil.which("rlx-amp")
    base = [exe] if exe else [sys.executable, "-m", "rlx_onnx_amp"]
    cmd = [*base, str(model), "--policy", "always-f16", "-o", str(out), "--repair", "--provider", "cpu",
           "--inputs", str(inputs), "--report-json", str(report)]
    if budget is not None:
        cmd += ["--repair-budget", str(budget)]
    row: dict = {"model": name, "command": shlex.join(["rlx-amp", *cmd[len(base):]])}
    if not model.exists() or not inputs.exists():
        row.update(verdict="missing", rc=None, notes=[f"{model} or {inputs} is missing (export it first)"])
        return row
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        timed_out = False
    except subprocess.TimeoutExpired as exc:
        rc, timed_out = None, True
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    row["rc"] = rc
    row["stderr_tail"] = stderr[-4000:]
    row["stdout_tail"] = stdout[-2000:]
    tb = traceback_tail(stderr)
    notes: list[str] = []
    if timed_out:
        row["verdict"] = "timeout"
        notes.append(f"killed after {timeout:.0f}s")
    elif rc in (0, 1) and tb is None:
        row["verdict"] = "pass" if rc == 0 else "drift"
    else:
        row["verdict"] = "crash"
        row["traceback"] = tb
        if tb is None:
            notes.append("exit code " + str(rc) + "; stderr tail: " + " | ".join(stderr.strip().splitlines()[-3:]))
    rep = None
    if report.exists():
        try:
            rep = json.loads(report.read_text())
        except ValueError as exc:
            notes.append(f"report.json does not parse: {exc}")
    elif rc in (0, 1):
        notes.append("exit 0/1 but no report.json written")
    if rc in (0, 1) and not out.exists():
        notes.append("exit 0/1 but no output model written")
    if rep is not None:
        row["nodes"] = (rep.get("nodes") or {}).get("total")
        r = rep.get("repair")
        if r is None:
            notes.append("report has no repair key")
        else:
            row.update(evaluations=r.get("evaluations"), kept_f32=len(r.get("kept_f32") or []),
                       compute_low_share=r.get("compute_low_share"), weight_low_share=r.get("weight_low_share"),
                       passed=r.get("passed"), minimality=r.get("minimality"), best=r.get("best"),
                       history=r.get("history"),
                       kept_reasons=_count(k.get("reason") for k in r.get("kept_f32") or []),
                       kept_ops=_count(k.get("op") for k in r.get("kept_f32") or []))
            row["best_ok"], more = check_repair(r, rc if rc is not None else -1, budget or DEFAULT_BUDGET)
            notes += more
        v = rep.get("verify") or {}
        row["verify_outputs"] = _outputs_summary(v)
    else:
        try:
            import onnx

            row["nodes"] = len(onnx.load(str(model), load_external_data=False).graph.node)
        except Exception:
            pass
    row["notes"] = notes
    return row


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[str(i)] = out.get(str(i), 0) + 1
    return out


def _outputs_summary(v: dict) -> list[dict]:
    """A compact per-output view of the final verification, whatever its exact layout."""
    outs = v.get("outputs")
    if isinstance(outs, dict):
        outs = [{"name": k, **(x if isinstance(x, dict) else {"value": x})} for k, x in outs.items()]
    if not isinstance(outs, list):
        return []
    keep = ("name", "passed", "max_abs", "cosine", "shape", "reason", "nan_inf", "ref_max_abs")
    return [{k: o[k] for k in keep if k in o} for o in outs if isinstance(o, dict)]


def _fmt(v, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/work/bench_data/torchvision")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--budget", type=int, default=None, help="--repair-budget (default: rlx-amp's own, 24)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per model (default 1200)")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "repair_zoo.json"))
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / "repair_zoo"
    data_dir = Path(args.data_dir)
    rows = []
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        row = run_model(name, data_dir, work, args.budget, args.timeout)
        rows.append(row)
        out.write_text(json.dumps({"data_dir": str(data_dir), "budget": args.budget, "rows": rows}, indent=2) + "\n")
    header = ["model", "nodes", "evals", "wall s", "kept f32", "compute_low_share", "verdict", "best written"]
    table = [header]
    for r in rows:
        verdict = r["verdict"] + (f" ({r['rc']})" if r.get("rc") is not None else "")
        table.append([r["model"], _fmt(r.get("nodes")), _fmt(r.get("evaluations")), _fmt(r.get("wall_s"), ".1f"),
                      _fmt(r.get("kept_f32")), _fmt(r.get("compute_low_share"), ".3f"), verdict,
                      _fmt(r.get("best_ok"))])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    for r in rows:
        if r.get("notes") or r.get("traceback"):
            print(f"\n{r['model']}: {r['command']}")
            for n in r.get("notes") or []:
                print(f"  - {n}")
            if r.get("traceback"):
                print("  traceback (last lines):")
                print("    " + r["traceback"].replace("\n", "\n    "))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Are this tree's conversion outputs byte-identical to an earlier revision's?

    python3 bench/identical_outputs.py [--baseline-rev HEAD] [--node-cases 400] [--emulation]
                                       [--out bench/out/identical.json]

Converts, in memory (`rlx_onnx_amp.convert`, then `SerializeToString`), every model of
fixtures/make_fixtures.py (HEALTHY, BROKEN_IN_F16, REPAIR_CASES, COST_CASES), every model of
onnx's `backend/test/data/light`, and the first --node-cases models of
`onnx.backend.test.case.node.collect_testcases(None)`, under every preset policy, with this
checkout and with the baseline revision (checked out with `git worktree` into a temporary
directory), each in its own subprocess, and compares the SHA-256 of each serialized output (or
the error text when the conversion refuses the model). Prints how many were compared and every
difference; exits 1 when any differs. A refactor of the converter must leave this at 0.

With --emulation it also compares, for every conversion, the emulated candidate the verifier
builds (`verification.emulate.emulate(model, converted)`, with the candidate's own weights where
that revision reads them): a change to the emulation must leave this at 0 as well.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from baseline import worktree  # bench/ is on sys.path: the scripts run as bench/NAME.py

REPO = Path(__file__).resolve().parent.parent

#: Runs inside a subprocess with PYTHONPATH set to one tree; prints {key: digest or error}.
_DIGEST = r"""
import hashlib, inspect, json, sys
from pathlib import Path
import onnx, onnx.backend.test
from onnx.backend.test.case.node import collect_testcases
sys.path.insert(0, sys.argv[1])
from fixtures import make_fixtures as fx
from rlx_onnx_amp import convert
from rlx_onnx_amp.policy import POLICY_NAMES
from rlx_onnx_amp.tensors import WeightSource
from rlx_onnx_amp.verification.emulate import emulate

emulation = sys.argv[3] == "1"
# The candidate's weights, where this revision's emulation can take them (inline here).
own_weights = {"candidate_source": WeightSource(None)} if "candidate_source" in inspect.signature(emulate).parameters else {}

models = {}
for group in ("HEALTHY", "BROKEN_IN_F16", "REPAIR_CASES", "COST_CASES"):
    for name, build in getattr(fx, group, {}).items():
        models[f"fixture/{name}"] = build().model
light = Path(onnx.backend.test.__file__).parent / "data" / "light"
for path in sorted(light.glob("*.onnx")):
    models[f"light/{path.stem}"] = onnx.load(str(path))
for case in collect_testcases(None)[: int(sys.argv[2])]:
    models[f"node/{case.name}"] = case.model
out = {}
for key, model in models.items():
    for policy in (p for p in POLICY_NAMES if p != "custom"):
        try:
            converted = convert(model, policy)
            out[f"{key}@{policy}"] = hashlib.sha256(converted.SerializeToString()).hexdigest()
        except Exception as e:
            out[f"{key}@{policy}"] = f"error: {type(e).__name__}: {str(e)[:200]}"
            continue
        if emulation:
            try:
                emulated, _ = emulate(model, converted, **own_weights)
                out[f"{key}@{policy}/emulated"] = hashlib.sha256(emulated.SerializeToString()).hexdigest()
            except Exception as e:
                out[f"{key}@{policy}/emulated"] = f"error: {type(e).__name__}: {str(e)[:200]}"
print(json.dumps(out))
"""


def digests(tree: Path, node_cases: int, emulation: bool = False) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", _DIGEST, str(tree), str(node_cases), "1" if emulation else "0"],
                          capture_output=True, text=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"digest run failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--node-cases", type=int, default=400)
    parser.add_argument("--emulation", action="store_true", help="also compare each conversion's emulated candidate")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "identical.json")
    args = parser.parse_args()
    with worktree(args.baseline_rev) as (baseline, _):
        before = digests(baseline, args.node_cases, args.emulation)
    after = digests(REPO, args.node_cases, args.emulation)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    errors = sum(v.startswith("error") for k, v in after.items() if not k.endswith("/emulated"))
    emulated = sum(k.endswith("/emulated") for k in after)
    print(f"{len(after) - emulated} conversions" + (f" and {emulated} emulations" if emulated else "")
          + f" compared against {args.baseline_rev} ({errors} conversions refused alike by both): {len(differ)} differ")
    for key in differ[:50]:
        print(f"  {key}: {before.get(key, '-')[:70]} -> {after.get(key, '-')[:70]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"baseline": args.baseline_rev, "compared": len(after), "differ": differ}, indent=2))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

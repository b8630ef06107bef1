"""Are this tree's conversion outputs byte-identical to an earlier revision's?

    python3 bench/identical_outputs.py [--baseline-rev HEAD] [--node-cases 400] [--out bench/out/identical.json]

Converts, in memory (`rlx_onnx_amp.convert`, then `SerializeToString`), every model of
fixtures/make_fixtures.py (HEALTHY, BROKEN_IN_F16, REPAIR_CASES, COST_CASES), every model of
onnx's `backend/test/data/light`, and the first --node-cases models of
`onnx.backend.test.case.node.collect_testcases(None)`, under every preset policy, with this
checkout and with the baseline revision (checked out with `git worktree` into a temporary
directory), each in its own subprocess, and compares the SHA-256 of each serialized output (or
the error text when the conversion refuses the model). Prints how many were compared and every
difference; exits 1 when any differs. A refactor of the converter must leave this at 0.
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
import hashlib, json, sys
from pathlib import Path
import onnx, onnx.backend.test
from onnx.backend.test.case.node import collect_testcases
sys.path.insert(0, sys.argv[1])
from fixtures import make_fixtures as fx
from rlx_onnx_amp import convert
from rlx_onnx_amp.policy import POLICY_NAMES

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
            out[f"{key}@{policy}"] = hashlib.sha256(convert(model, policy).SerializeToString()).hexdigest()
        except Exception as e:
            out[f"{key}@{policy}"] = f"error: {type(e).__name__}: {str(e)[:200]}"
print(json.dumps(out))
"""


def digests(tree: Path, node_cases: int) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", _DIGEST, str(tree), str(node_cases)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"digest run failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--node-cases", type=int, default=400)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "identical.json")
    args = parser.parse_args()
    with worktree(args.baseline_rev) as (baseline, _):
        before = digests(baseline, args.node_cases)
    after = digests(REPO, args.node_cases)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    errors = sum(v.startswith("error") for v in after.values())
    print(f"{len(after)} conversions compared against {args.baseline_rev} ({errors} refused alike by both): "
          f"{len(differ)} differ")
    for key in differ[:50]:
        print(f"  {key}: {before.get(key, '-')[:70]} -> {after.get(key, '-')[:70]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"baseline": args.baseline_rev, "compared": len(after), "differ": differ}, indent=2))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

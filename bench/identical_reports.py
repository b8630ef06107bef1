"""Are this tree's reports byte-identical to an earlier revision's?

    python3 bench/identical_reports.py [--baseline-rev HEAD] [--keep DIR]
                                       [--out bench/out/identical_reports.json]

Runs the command line (`python -m rlx_onnx_amp`, one subprocess per command, PYTHONPATH set to
one tree) over a handful of fixture models, with this checkout and with the baseline revision
(checked out with `git worktree` into a temporary directory, `bench/baseline.py`), and compares
the SHA-256 of everything each command writes: its exit code, its stdout and stderr (the
terminal tables, verdicts, warnings and summaries), and every file under the run's directory
(`--report-json`, `--report-md`, `--report-html`, the converted models and their data files).

The models are built once, by this checkout's fixtures/make_fixtures.py (plus
fixtures/models/demo_transformer.onnx, a directory of fixtures/models/genai-llama, a file that
is no model, and a Conv whose reference cannot run on guessed shapes), and copied into each
tree's run directory, so both trees read the same bytes. The commands:

- a model that passes (auto-mixed, the default verification; once more with `-v` and options
  that match nothing);
- one that drifts (always-f16, `--localize`, `--rtol`; once more with `-q`), one whose
  outputs' shapes differ;
- two repaired (`--repair`: an overflow, an underflowing tail);
- a batch with a passing, a drifting, an unreadable and an unverifiable model (`--no-screen`),
  with `--jobs 2` and with `--jobs 1`, and a batch under `--no-verify`;
- a model with external data, an export directory (onnxruntime-genai's), and its decoder alone
  (written unverified);
- the `verify` command (with `--localize`);
- `merge-reports` over those reports (written, and printed), over a merged report, over an
  unverified model's, and over a missing file;
- `inspect` (its table, `--json`, `--compare-policies`).

Each writes every report format it has. What legitimately varies from one run to the next is
normalized before hashing: the run directory's absolute path (`<RUN>`) and the random names of
staging and scratch directories (`<TMP>`), and measured times (`run.started`, `run.seconds`,
`latency`, the latency line and the size and speed-up ratios: `<T>`, `<X>`). Prints how
many outputs were compared and every difference (with the first lines of a diff for text);
exits 1 when any differs. A refactor of the reports or the command line must leave this at 0.
`--keep DIR` keeps both run directories there for a look.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from baseline import worktree  # bench/ is on sys.path: the scripts run as bench/NAME.py

REPO = Path(__file__).resolve().parent.parent

#: Runs with PYTHONPATH set to this checkout: writes the fixture models into argv[1].
_MODELS = r"""
import shutil, sys
from pathlib import Path
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
from fixtures import make_fixtures as fx

out = Path(sys.argv[1])
out.mkdir(parents=True)
for name in ("transformer_block", "conv_net", "qdq_model"):
    save(fx.HEALTHY[name]().model, str(out / f"{name}.onnx"))
for name in ("exp_overflow", "mask_softmax"):
    save(fx.BROKEN_IN_F16[name]().model, str(out / f"{name}.onnx"))
for name in ("data_dependent_shapes", "tiny_tail"):
    save(fx.REPAIR_CASES[name]().model, str(out / f"{name}.onnx"))
fx.write_external(fx.mlp_external(), out / "mlp_external.onnx")
shutil.copy(Path("fixtures/models") / fx.DEMO, out / fx.DEMO)
shutil.copytree(Path("fixtures/models/genai-llama"), out / "genai-llama")
(out / "broken.onnx").write_bytes(b"\x08\x07 not a model")
# A 1x1xT Conv of width 10: the guessed length of a symbolic T is too short to run (exit 4).
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "T"])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "U"])
w = numpy_helper.from_array(np.full((1, 1, 10), 0.1, np.float32), "w")
graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "wide", [x], [y], [w])
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(out / "wide.onnx"))
"""

_CPU = ("--provider", "cpu")
_BATCH = ("m/transformer_block.onnx", "m/exp_overflow.onnx", "m/broken.onnx", "m/conv_net.onnx", "m/wide.onnx",
          "--no-screen")


def _reports(name: str) -> tuple[str, ...]:
    return ("--report-json", f"r/{name}.json", "--report-md", f"r/{name}.md", "--report-html", f"r/{name}.html")


#: (name, arguments), run in this order in the run directory (later ones read earlier reports).
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pass", ("m/transformer_block.onnx", "-o", "o/pass.onnx", *_CPU, *_reports("pass"))),
    ("pass-verbose", ("m/demo_transformer.onnx", "-o", "o/demo.onnx", *_CPU, "-v", "--report-md", "r/demo.md",
                      "--keep-f32-op", "Softmx", "--keep-f32-node", "no-such-node", "--data-name", "demo.data")),
    ("drift", ("m/exp_overflow.onnx", "-p", "always-f16", "-o", "o/drift.onnx", *_CPU, "--localize", "--no-screen",
               "--rtol", "0.5", *_reports("drift"))),
    ("shapes-differ", ("m/data_dependent_shapes.onnx", "-p", "always-f16", "-o", "o/shapes.onnx", *_CPU,
                       "--localize", "--no-screen", *_reports("shapes"))),
    ("drift-quiet", ("m/mask_softmax.onnx", "-p", "always-f16", "-o", "o/drift-q.onnx", *_CPU, "-q", "--no-screen",
                     "--report-json", "r/drift-q.json")),
    ("repair", ("m/exp_overflow.onnx", "-p", "always-f16", "-o", "o/repaired.onnx", *_CPU, "--repair",
                *_reports("repair"))),
    ("repair-underflow", ("m/tiny_tail.onnx", "-p", "always-f16", "-o", "o/tiny.onnx", *_CPU, "--repair",
                          "--report-md", "r/tiny.md", "--report-html", "r/tiny.html")),
    ("batch-jobs2", (*_BATCH, "-p", "always-f16", "--out-dir", "b2", *_CPU, "--jobs", "2", *_reports("b2"))),
    ("batch-jobs1", (*_BATCH, "-p", "always-f16", "--out-dir", "b1", *_CPU, "--jobs", "1", *_reports("b1"))),
    ("batch-no-verify", ("m/conv_net.onnx", "m/qdq_model.onnx", "m/broken.onnx", "--out-dir", "nv", "--no-verify",
                         *_reports("nv"))),
    ("external", ("m/mlp_external.onnx", "-o", "o/mlp.onnx", *_CPU, *_reports("mlp"))),
    ("directory", ("m/genai-llama", "-p", "always-f16", "-o", "o/genai", *_CPU, *_reports("dir"))),
    # The genai decoder alone, outside its folder: its cache's head size is a symbolic axis, so
    # it is written unverified (exit 4).
    ("genai-file", ("m/genai-llama/model.onnx", "-p", "always-f16", "-o", "o/genai-file.onnx", *_CPU,
                    "--report-json", "r/genai-file.json")),
    ("verify", ("verify", "m/transformer_block.onnx", "o/pass.onnx", *_CPU, "--localize", *_reports("verify"))),
    ("merge", ("merge-reports", "r/b2.json", "r/pass.json", "r/drift.json", "r/repair.json", "r/verify.json",
               "r/mlp.json", "r/shapes.json", "--report-json", "r/merged.json", "--report-md", "r/merged.md")),
    ("merge-merged", ("merge-reports", "r/merged.json", "r/nv.json")),
    ("merge-printed", ("merge-reports", "r/b1.json", "r/nv.json", "r/drift-q.json", "r/dir.json")),
    ("merge-unverified", ("merge-reports", "r/genai-file.json", "r/pass.json", "--report-json",
                          "r/merged-unverified.json")),
    ("merge-missing", ("merge-reports", "r/missing.json")),
    ("inspect", ("inspect", "m/transformer_block.onnx")),
    ("inspect-json", ("inspect", "m/exp_overflow.onnx", "--json", "-p", "always-f16")),
    ("inspect-compare", ("inspect", "m/conv_net.onnx", "--compare-policies")),
)

#: Random names of staging and scratch directories (`files.STAGE_PREFIX`, `tempfile`).
_RANDOM = re.compile(r"(\.rlx-amp-stage-|rlx-amp-[a-z]+-|tmp)[A-Za-z0-9_]{6,}")


#: What differs from one run to the next by nature: measured times (`run`, `latency`, the
#: latency line and the speed-up column) and the report's start time and duration.
_TIMINGS = (
    (re.compile(r'"(started|seconds|reference_ms|candidate_ms)": [^,\n]+'), r'"\1": <T>'),
    (re.compile(r"([Ll]atency on \w+): [^\n<]*"), r"\1: <T>"),
    (re.compile(r"\b\d+\.\d\dx\b"), "<X>x"),
)


def _normalized(data: bytes, run: Path) -> bytes:
    text = data.decode("utf-8", errors="surrogateescape")
    text = text.replace(str(run), "<RUN>")
    text = _RANDOM.sub(r"\1<TMP>", text)
    for pattern, replacement in _TIMINGS:
        text = pattern.sub(replacement, text)
    return text.encode("utf-8", errors="surrogateescape")


def _is_text(path: str) -> bool:
    return path.startswith("$") or path.endswith((".json", ".md", ".html"))


def outputs(tree: Path, models: Path, work: Path) -> dict[str, bytes]:
    """Every command run with `tree`'s code in a fresh directory: {"NAME $rc|$stdout|$stderr"
    or a written file's relative path: its normalized bytes}."""
    run = work / "run"
    shutil.copytree(models, run / "m")
    for folder in ("o", "r", "b1", "b2", "nv"):
        (run / folder).mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": str(work), "MPLCONFIGDIR": str(work / "mpl")}
    found: dict[str, bytes] = {}
    for name, args in COMMANDS:
        proc = subprocess.run([sys.executable, "-m", "rlx_onnx_amp", *args], capture_output=True, cwd=run, env=env,
                              timeout=900)
        found[f"{name} $rc"] = str(proc.returncode).encode()
        found[f"{name} $stdout"] = _normalized(proc.stdout, run)
        found[f"{name} $stderr"] = _normalized(proc.stderr, run)
    for path in sorted(p for p in run.rglob("*") if p.is_file() and p.relative_to(run).parts[0] != "m"):
        rel = str(path.relative_to(run))
        found[rel] = _normalized(path.read_bytes(), run) if _is_text(rel) else path.read_bytes()
    return found


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _diff(key: str, before: bytes | None, after: bytes | None, lines: int = 12) -> list[str]:
    if before is None or after is None or not (_is_text(key) or " $" in key):
        return []
    old = before.decode(errors="replace").splitlines()
    new = after.decode(errors="replace").splitlines()
    return [f"      {line[:160]}" for line in list(difflib.unified_diff(old, new, lineterm="", n=1))[2 : 2 + lines]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--keep", type=Path, help="keep both run directories under this directory")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "identical_reports.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlx-amp-reports-") as tmp:
        models = Path(tmp) / "models"
        made = subprocess.run([sys.executable, "-c", _MODELS, str(models)], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        if made.returncode != 0:
            raise SystemExit(f"building the models failed:\n{made.stderr[-2000:]}")
        with worktree(args.baseline_rev) as (baseline, commit):
            (Path(tmp) / "before").mkdir()
            before = outputs(baseline, models, Path(tmp) / "before")
        (Path(tmp) / "after").mkdir()
        after = outputs(REPO, models, Path(tmp) / "after")
        if args.keep is not None:
            shutil.rmtree(args.keep, ignore_errors=True)
            shutil.copytree(Path(tmp), args.keep, ignore=shutil.ignore_patterns("mpl", "models"))
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    codes = {name: int(after[f"{name} $rc"]) for name, _ in COMMANDS}
    print(f"{len(COMMANDS)} commands (exit codes {', '.join(f'{n} {c}' for n, c in codes.items())}), "
          f"{len(after)} outputs compared against {args.baseline_rev} ({commit[:7]}): {len(differ)} differ")
    for key in differ[:50]:
        old, new = before.get(key), after.get(key)
        print(f"  {key}: {_digest(old)[:16] if old is not None else '-'} -> {_digest(new)[:16] if new is not None else '-'}")
        for line in _diff(key, old, new):
            print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"baseline": args.baseline_rev, "commit": commit, "compared": len(after),
                                    "digests": {k: _digest(v) for k, v in sorted(after.items())}, "differ": differ},
                                   indent=2))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()

"""Is onnx's full checker, split as `proof.CheckerRun` splits it, the same verdict?

    python3 bench/checker_split.py [--seed 7] [--count 1500]

`check_model(path, full_check=True)` is the checks, then strict shape inference. CheckerRun runs
the checks in this process and the inference (`infer_shapes_path(path, os.devnull,
check_type=True, strict_mode=True)`) in another, and reports the checks' failure first. This
script compares the first line of both, in one process, on the fuzzer's mutants
(tools/fuzz_mutants.py, most of which the checker refuses) and prints how many differ; it exits
1 when any does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from onnx import checker, shape_inference  # noqa: E402

from rlx_onnx_amp.errors import first_line  # noqa: E402
from rlx_onnx_amp.proof import checker_failure  # noqa: E402
from tools.fuzz_mutants import make_mutant, write_mutant  # noqa: E402


def split_verdict(path: Path) -> str | None:
    try:
        checker.check_model(str(path), full_check=False)
        shape_inference.infer_shapes_path(str(path), os.devnull, check_type=True, strict_mode=True)
    except Exception as e:
        return first_line(e, 1000)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--count", type=int, default=1500)
    args = ap.parse_args(argv)
    refused = differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.count):
            path = write_mutant(make_mutant(args.seed, index), Path(tmp) / str(index))
            full, split = checker_failure(path), split_verdict(path)
            refused += full is not None
            if full != split:
                differ += 1
                print(f"mutant {index}:\n  full check: {full}\n  split:      {split}")
    print(f"{args.count} mutants (seed {args.seed}), {refused} refused by the full checker: {differ} verdicts differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

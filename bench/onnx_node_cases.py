"""ONNX's operator test cases through rlx-amp and two peer float16 converters, side by side.

For each case whose original runs on onnxruntime's CPU provider (fixtures/onnx_cases.py), each
converter's output must: convert without an exception, pass onnx.checker (full check, when the
original does), load and run in onnxruntime, and match the original within f16 tolerance.

    python bench/onnx_node_cases.py [--json bench/out/node_cases.json]

Peers: onnxconverter-common's float16.convert_float_to_float16 and onnxruntime's
transformers.float16.convert_float_to_float16, both with keep_io_types=True (the same graph
interface as rlx-amp's default).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.onnx_cases import check_case, collect_eligible
from rlx_onnx_amp import convert


def contenders() -> dict[str, object]:
    found: dict[str, object] = {
        "rlx-amp always-f16": lambda m: convert(m, "always-f16"),
        "rlx-amp auto-mixed": lambda m: convert(m, "auto-mixed"),
        "rlx-amp auto-mixed-bf16 --target cpu": lambda m: convert(m, "auto-mixed-bf16", target="cpu"),
    }
    try:
        from onnxconverter_common import float16 as occ

        found["onnxconverter-common"] = lambda m: occ.convert_float_to_float16(m, keep_io_types=True)
    except ImportError:
        print("onnxconverter-common not installed: skipped (pip install onnxconverter-common)")
    try:
        from onnxruntime.transformers import float16 as ortf16

        found["onnxruntime transformers"] = lambda m: ortf16.convert_float_to_float16(m, keep_io_types=True)
    except ImportError as e:
        print(f"onnxruntime.transformers.float16 unavailable ({e}): skipped")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=str(Path(__file__).parent / "out" / "node_cases.json"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    cases, collected = collect_eligible()
    print(f"{collected} cases collected, {len(cases)} run on onnxruntime's CPU provider in their original form")
    results = {}
    for name, fn in contenders().items():
        start = time.perf_counter()
        failures: dict[str, str] = {}
        for case in cases:
            problem = check_case(case, fn)  # type: ignore[arg-type]
            if problem:
                failures[case.name] = problem
        kinds = collections.Counter(v.split(":")[0] if not v.startswith("output") else "numbers" for v in failures.values())
        passed = len(cases) - len(failures)
        seconds = time.perf_counter() - start
        # The same cases judged without the checker: does the output at least run and match?
        runs = sum(1 for case in cases if case.name not in failures or check_case(case, fn, require_checker=False) is None)  # type: ignore[arg-type]
        results[name] = {"passed": passed, "eligible": len(cases), "rate": passed / len(cases), "seconds": seconds,
                         "runs_and_matches_ignoring_checker": runs, "failures_by_stage": dict(kinds), "failures": failures}
        print(f"{name:28s} {passed:5d}/{len(cases)}  {100 * passed / len(cases):5.1f}%  "
              f"(ignoring the checker: {100 * runs / len(cases):5.1f}%)  {seconds:6.1f}s  {dict(kinds)}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()

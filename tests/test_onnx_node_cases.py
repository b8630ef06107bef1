"""ONNX's own operator test cases: every case whose original runs on onnxruntime's CPU provider
converts, passes the checker, loads, runs and matches the original within f16 tolerance."""

from __future__ import annotations

import onnx
import pytest

from fixtures.onnx_cases import check_case, collect_eligible
from rlx_onnx_amp import Conversion, convert_and_report

#: A sweep over a whole zoo: make test and CI run it, make test-fast leaves it out.
pytestmark = pytest.mark.sweep


@pytest.mark.parametrize("policy, target", [("always-f16", "cuda"), ("auto-mixed", "cuda"), ("auto-mixed-bf16", "cpu")])
def test_every_eligible_node_case_passes(policy: str, target: str) -> None:
    # auto-mixed-bf16 for the CPU target runs its bf16 nodes for real on onnxruntime's CPU
    # provider (the bf16 kernels it has); for CUDA it could only be emulated here.
    cases, collected = collect_eligible()
    assert collected > 1500 and len(cases) > 1400  # not vacuous
    failures = {}
    lowered = 0
    for case in cases:
        reports: list[Conversion] = []

        def converted(model: onnx.ModelProto, reports: list[Conversion] = reports) -> onnx.ModelProto:
            out, report = convert_and_report(model, policy, target=target, screen=False)  # the rewrite itself
            reports.append(report)
            return out

        problem = check_case(case, converted)
        lowered += bool(reports) and reports[0].nodes.by_precision["f16"] + reports[0].nodes.by_precision["bf16"] > 0
        if problem:
            failures[case.name] = problem
    assert failures == {}, f"{len(failures)} of {len(cases)} cases fail: {failures}"
    assert lowered > {"always-f16": 1000, "auto-mixed": 600, "auto-mixed-bf16": 300}[policy], lowered

"""ONNX's own operator test cases: every case whose original runs on onnxruntime's CPU provider
converts, passes the checker, loads, runs and matches the original within f16 tolerance."""

from __future__ import annotations

import pytest

from fixtures.onnx_cases import check_case, collect_eligible
from rlx_onnx_amp import convert


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed"])
def test_every_eligible_node_case_passes(policy: str) -> None:
    cases, collected = collect_eligible()
    assert collected > 1500 and len(cases) > 1400  # not vacuous
    failures = {}
    for case in cases:
        problem = check_case(case, lambda m: convert(m, policy))
        if problem:
            failures[case.name] = problem
    assert failures == {}, f"{len(failures)} of {len(cases)} cases fail: {failures}"

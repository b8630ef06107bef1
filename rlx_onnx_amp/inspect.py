"""`rlx-amp inspect`: what a policy would do to a model, without writing anything."""

from __future__ import annotations

from typing import Any

from onnx import ModelProto

from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.conversion import ConversionReport
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model
from rlx_onnx_amp.tensors import WeightSource

__all__ = ["inspect_model"]


def inspect_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions,
    model_name: str = "",
    source: WeightSource | None = None,
) -> dict[str, Any]:
    """Per kind and per op type: node counts and the precision each would get; per rule of
    the rewrite's list, how many nodes it kept from the policy's precision. `source` reads
    the weights (external data beside the model) that rule weight-range looks at."""
    work = ModelProto()
    work.CopyFrom(model)
    report = ConversionReport(model=model_name)
    convert_model(work, policy, options, source=source, report=report, weights=False)
    return {
        "model": model_name,
        "policy": policy.to_json(),
        "target": report.target,
        "nodes": {"total": report.nodes_total, "by_precision": report.by_precision},
        "by_kind": report.by_kind,
        "by_op": dict(sorted(report.by_op.items())),
        "casts_inserted": report.casts_inserted,
        "kept_f32": [k.to_json() for k in report.kept_f32],
        "by_rule": report.by_rule(),
        "unknown_ops": report.unknown_ops,
        "cost": report.cost.to_json() if report.cost is not None else None,
    }

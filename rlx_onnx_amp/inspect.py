"""`rlx-amp inspect`: what a policy would do to a model, without writing anything."""

from __future__ import annotations

from typing import Any

from onnx import ModelProto

from rlx_onnx_amp.policy import Policy
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
    record = convert_model(work, policy, options, source=source, weights=False, label=model_name or "model")
    return {
        "model": model_name,
        "policy": policy.to_json(),
        "target": record.target,
        "nodes": record.nodes.to_json(),
        "by_kind": record.by_kind,
        "by_op": dict(sorted(record.by_op.items())),
        "casts_inserted": record.casts_inserted,
        "kept_f32": [k.to_json() for k in record.kept_f32],
        "by_rule": record.by_rule,
        "unknown_ops": list(record.unknown_ops),
        "cost": record.cost.to_json() if record.cost is not None else None,
    }

"""The op taxonomy covers every schema the installed onnx knows, and only real ops."""

from __future__ import annotations

import onnx.defs
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

from rlx_onnx_amp.policy import POLICY_NAMES, Policy, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.taxonomy import KERNEL_GAPS, OP_KINDS, OpKind, kind_of

# The contrib ops that exporters and onnxruntime's optimizer emit (issue 2).
CONTRIB = ["Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "FusedMatMul", "FusedConv", "RotaryEmbedding", "MatMulNBits", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearSigmoid", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearWhere", "DynamicQuantizeMatMul"]


def test_every_onnx_schema_has_a_kind() -> None:
    missing = sorted({(s.domain, s.name) for s in onnx.defs.get_all_schemas()} - set(OP_KINDS))
    assert missing == [], f"ops without a kind: {missing}"


@pytest.mark.parametrize("op", CONTRIB)
def test_listed_contrib_ops_have_a_kind(op: str) -> None:
    assert kind_of("com.microsoft", op) is not None


def test_every_contrib_op_of_onnxruntime_has_a_kind() -> None:
    contrib = {s.name for s in ort_c.get_all_operator_schema() if s.domain == "com.microsoft"}
    assert sorted(op for op in contrib if kind_of("com.microsoft", op) is None) == []


def test_every_entry_is_a_real_op() -> None:
    known = {(s.domain, s.name) for s in onnx.defs.get_all_schemas()}
    known |= {(s.domain, s.name) for s in ort_c.get_all_operator_schema()}
    assert sorted(set(OP_KINDS) - known) == []
    assert all((d, op) in known for d, op in KERNEL_GAPS)


def test_ai_onnx_alias_and_unknown_ops() -> None:
    assert kind_of("ai.onnx", "MatMul") is OpKind.COMPUTE
    assert kind_of("", "Softmax") is OpKind.REDUCTION
    assert kind_of("", "Relu") is OpKind.ELEMENTWISE
    assert kind_of("", "Reshape") is OpKind.DATA_MOVEMENT
    assert kind_of("", "Constant") is OpKind.BOUNDARY
    assert kind_of("my.domain", "MatMul") is None


# docs/design.md, "Op taxonomy and policies", row by row.
TABLE = {
    "always-f32": ("f32", "f32", "f32", "f32"),
    "always-f16": ("f16", "f16", "f16", "f16"),
    "auto-mixed-conservative": ("f32", "f32", "f16", "f32"),
    "auto-mixed": ("f32", "f16", "f16", "f32"),
    "auto-mixed-bf16": ("bf16", "bf16", "bf16", "bf16"),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_policy_table_matches_the_spec(name: str) -> None:
    policy = policy_from_name(name)
    kinds = (OpKind.COMPUTE, OpKind.REDUCTION, OpKind.ELEMENTWISE, OpKind.DATA_MOVEMENT)
    assert tuple(policy.precision_for(k).value for k in kinds) == TABLE[name]
    assert policy.precision_for(OpKind.BOUNDARY) is Precision.F32
    assert name in POLICY_NAMES


def test_custom_policy_omitted_kinds_stay_f32() -> None:
    policy = Policy("custom", {OpKind.COMPUTE: Precision.F16})
    assert policy.precision_for(OpKind.COMPUTE) is Precision.F16
    assert policy.precision_for(OpKind.REDUCTION) is Precision.F32

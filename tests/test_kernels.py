"""Provider kernel tables: a converted model loads on the execution provider it targets.

bf16 is where this matters: ONNX admits bf16 for most ops from opset 13, onnxruntime's CPU
provider has bf16 kernels for few of them, and it has no f32 fallback for bf16 as it has for f16.
Converting with `target="cpu"` must give a model that onnxruntime's CPU provider loads and runs
for real (not emulated); `target="cuda"` follows onnxruntime's CUDA kernel table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.kernels import Target, kernel_block, kernel_table
from rlx_onnx_amp.precision import Precision
from tests.helpers import all_nodes, assert_close, elem_types, feeds_for, run

FIXTURES = {**HEALTHY, **BROKEN_IN_F16}
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _single_op(op: str, opset: int = 21, n_inputs: int = 1, **attrs: Any) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(n_inputs)]
    node = helper.make_node(op, names, ["y"], name=op.lower(), **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # The output's shape as inference gives it: a model the checker takes (convert() proves what it returns).
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.output[0].CopyFrom(next(v for v in (*inferred.graph.output, *inferred.graph.value_info) if v.name == "y"))
    return model


def test_cpu_table_is_the_installed_registry() -> None:
    table = kernel_table(Target.CPU)
    assert table.provider == "CPUExecutionProvider" and table.source.startswith("onnxruntime ")
    # Facts of onnxruntime's CPU provider that the rule relies on (they fail if a release adds
    # a bf16 Add kernel, which would only mean more bf16 work is possible).
    assert kernel_block(Target.CPU, Precision.BF16, "", "Add", 14, ("T",)) == "kernel: no bf16 Add-14 kernel on CPUExecutionProvider"
    assert kernel_block(Target.CPU, Precision.BF16, "", "Transpose", 21, ("T",)) is None
    # f16 on the CPU provider always loads: onnxruntime runs nodes without an f16 kernel in f32.
    assert kernel_block(Target.CPU, Precision.F16, "", "Add", 14, ("T",)) is None


def test_cuda_snapshot_records_its_source() -> None:
    table = kernel_table(Target.CUDA)
    assert table.provider == "CUDAExecutionProvider"
    assert len(table.kernels) > 200
    if not HAS_CUDA:
        assert "OperatorKernels.md at " in table.source
    assert kernel_block(Target.CUDA, Precision.BF16, "", "MatMul", 13, ("T",)) is None
    assert kernel_block(Target.CUDA, Precision.F16, "", "MatMul", 13, ("T",)) is None


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_bf16_for_cpu_loads_and_runs_on_the_cpu_provider(name: str) -> None:
    fixture = FIXTURES[name]()
    original = fixture.model
    converted, report = convert_and_report(original, "auto-mixed-bf16", target="cpu")
    onnx.checker.check_model(converted, full_check=True)
    assert report.target == "cpu"
    again = convert(converted, "auto-mixed-bf16", target="cpu")
    assert again.SerializeToString() == converted.SerializeToString()  # idempotent for this target too
    assert set(elem_types(converted).values()) & {TensorProto.FLOAT16} <= set(elem_types(original).values())
    # Every node kept for a kernel names the CPU provider; every node left in bf16 has a kernel.
    kernel_kept = [k for k in report.kept_f32 if k.code in ("kernel-table", "kernel-gap")]
    assert all("CPUExecutionProvider" in k.reason for k in kernel_kept)
    if name in ("transformer_block", "contrib_block", "conv_net"):
        assert report.nodes.by_precision["bf16"] > 0 and kernel_kept
    # Real bf16 execution on onnxruntime's CPU provider, not emulation.
    feeds = feeds_for(fixture, original)
    expected = run(original, feeds)
    actual = run(converted, feeds)
    if name in BROKEN_IN_F16:
        return  # built to drift in low precision; test_verify and test_repair cover them
    assert_close(expected, actual, 5e-2, 5e-2, 0.995)


def test_bf16_op_without_cpu_kernel_stays_f32_for_cpu_and_lowers_for_cuda() -> None:
    model = _single_op("Add", n_inputs=2)
    for_cpu, cpu_report = convert_and_report(model, "auto-mixed-bf16", target="cpu")
    for_cuda, cuda_report = convert_and_report(model, "auto-mixed-bf16", target="cuda")
    assert cpu_report.nodes.by_precision["bf16"] == 0
    assert [(k.op, k.reason) for k in cpu_report.kept_f32] == [("Add", "kernel: no bf16 Add-14 kernel on CPUExecutionProvider")]
    assert [n.op_type for n in for_cpu.graph.node] == ["Add"]
    assert cuda_report.nodes.by_precision["bf16"] == 1 and not cuda_report.kept_f32
    assert [n.op_type for n in for_cuda.graph.node].count("Cast") == 3
    feeds = {"x0": np.ones((2, 3), np.float32), "x1": np.full((2, 3), 2.0, np.float32)}
    np.testing.assert_array_equal(run(for_cpu, feeds)[0], np.full((2, 3), 3.0, np.float32))


@pytest.mark.parametrize("op, opset", [("Log", 13), ("LeakyRelu", 16), ("ReduceMean", 18), ("TopK", 24)])
def test_cuda_target_keeps_f32_where_cuda_has_no_bf16_kernel(op: str, opset: int) -> None:
    # ONNX admits bf16 for these ops; onnxruntime's CUDA kernels are f32/f16 only. Lowering one
    # would push it to the CPU provider, which has no bf16 kernel either: the model would not load.
    schema = onnx.defs.get_schema(op, opset)
    assert "tensor(bfloat16)" in next(c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == "T")
    model = _single_op(op, opset=opset) if op != "TopK" else _topk(opset)
    converted, report = convert_and_report(model, "auto-mixed-bf16", target="cuda")
    assert report.nodes.by_precision["bf16"] == 0
    assert [(k.op, k.reason) for k in report.kept_f32] == [(op, f"kernel: no bf16 {op}-{schema.since_version} kernel on CUDAExecutionProvider")]
    assert not [n for n in all_nodes(converted) if n.op_type == "Cast"]
    # The same op has a CUDA f16 kernel: always-f16 lowers it.
    _, f16_report = convert_and_report(model, "always-f16", target="cuda")
    assert f16_report.nodes.by_precision["f16"] == 1 and not f16_report.kept_f32


def _topk(opset: int) -> onnx.ModelProto:
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="topk")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("indices", TensorProto.INT64, None)], initializer=[k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="onnxruntime's CUDA execution provider is not installed here")
@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_bf16_for_cuda_loads_and_runs_on_cuda(name: str) -> None:
    fixture = HEALTHY[name]()
    original = fixture.model
    converted = convert(original, "auto-mixed-bf16", target="cuda")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(converted.SerializeToString(), opts, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    feeds = feeds_for(fixture, original)
    assert_close(run(original, feeds), session.run(None, feeds), 5e-2, 5e-2, 0.995)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="onnxruntime's CUDA execution provider is not installed here")
def test_cuda_snapshot_agrees_with_the_installed_registry() -> None:
    # With onnxruntime-gpu installed, the live registry is used; the shipped snapshot must say
    # the same about bf16/f16 for the ops the taxonomy lowers, or it is stale.
    from rlx_onnx_amp.kernels import _from_registry, _from_snapshot

    live, snapshot = _from_registry("CUDAExecutionProvider"), _from_snapshot("CUDAExecutionProvider")
    assert live is not None
    differ = []
    for (domain, op), kernels in snapshot.kernels.items():
        for k in kernels:
            for precision in (Precision.F16, Precision.BF16):
                name = precision.info.type_str[len("tensor("):-1]
                said = k.takes(tuple(k.types), name)
                now = any(lk.takes(tuple(k.types), name) for lk in live.serving(domain, op, k.since))
                if said != now:
                    differ.append((domain, op, k.since, precision.value, said, now))
    assert differ == []

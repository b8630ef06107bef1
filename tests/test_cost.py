"""The cost model: multiply-accumulates, weights, Casts and islands against hand counts; the
policy hint; `inspect --compare-policies`; and the figures in every report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fixtures.make_fixtures import COST_CASES, HEALTHY, MAC_ZOO_MACS, cast_chain, mac_zoo
from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.cost import HINT_MIN_CASTS, estimate_cost
from rlx_onnx_amp.verification.inputs import InputSpec, synthesize
from tests.helpers import rlx

BATCHED = {"MatMul", "Conv", "ConvTranspose", "Einsum"}  # Gemm's input has no batch axis


def _save(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(COST_CASES[name]().model, str(path))
    return path


def test_macs_match_hand_counts_and_scale_with_the_given_batch() -> None:
    model = mac_zoo().model
    cost = estimate_cost(model)
    assert cost.input_shapes == {"a": [1, 3, 4], "g_in": [6, 7], "img": [1, 3, 8, 8], "e_in": [1, 4, 5]}
    assert cost.macs == sum(MAC_ZOO_MACS.values()) == 11976
    assert cost.unknown_macs_nodes == 0
    batch4 = estimate_cost(model, {"a": [4, 3, 4], "img": [4, 3, 8, 8], "e_in": [4, 4, 5]})
    assert batch4.macs == sum(4 * n if op in BATCHED else n for op, n in MAC_ZOO_MACS.items()) == 46896
    assert cost.weight_elements == 4 * 5 + 7 * 8 + 4 * 3 * 3 * 3 + 4 * 2 * 3 * 3  # 256
    assert (cost.casts, cost.islands, cost.mac_low_share) == (0, 0, 0.0)


def test_what_each_policy_runs_low() -> None:
    model = mac_zoo().model
    f16, report = convert_and_report(model, "always-f16", screen=False)  # the cost model alone, no run
    cost = report.cost
    assert cost is not None and cost.to_json() == estimate_cost(f16).to_json()
    assert cost.macs_low == cost.macs and cost.weight_low_share == 1.0
    # A Cast in per graph input (f32 -> f16: 6 bytes an element) and one back per output.
    inputs = 3 * 4 + 6 * 7 + 3 * 8 * 8 + 4 * 5
    outputs = 3 * 5 + 6 * 8 + 2 * 8 * 8 + 3 * 5
    assert (cost.casts, cost.cast_bytes) == (8, 6 * (inputs + outputs))
    # Islands join low nodes that read each other: matmul+relu_m, einsum, gemm+relu_g, conv+relu_c+convtranspose.
    assert cost.islands == 4
    _, mixed = convert_and_report(model, "auto-mixed")
    assert mixed.cost is not None
    assert (mixed.cost.macs_low, mixed.cost.weight_elements_low) == (0, 0)  # Compute (and its weights) stay f32
    assert mixed.cost.islands == 3  # the three Relus, each alone between Casts
    assert mixed.cost.casts == mixed.casts_inserted == 6


def test_the_hint_names_the_alternative_without_changing_the_policy(tmp_path: Path) -> None:
    src = _save(tmp_path, "cast_chain")
    out = tmp_path / "o.onnx"
    result = rlx(src, "--policy", "auto-mixed", "-o", out, "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    hints = [line for line in result.stderr.splitlines() if line.startswith("rlx-amp: hint:")]
    assert len(hints) == 1
    assert "auto-mixed lowers none of the" in hints[0] and "--policy auto" in hints[0]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["casts_inserted"] >= HINT_MIN_CASTS and report["cost"]["macs_low"] == 0
    assert report["policy"]["name"] == "auto-mixed"  # the hint changes nothing
    assert report["by_kind"]["compute"] == {"f32": 12}
    quiet = rlx(src, "--policy", "auto-mixed", "-o", out, "-q")
    assert quiet.returncode == 0 and "hint:" not in quiet.stderr
    f16 = rlx(src, "--policy", "always-f16", "-o", out)
    assert f16.returncode == 0 and "hint:" not in f16.stderr


def test_compare_policies_shows_every_preset(tmp_path: Path) -> None:
    src = tmp_path / "mac_zoo.onnx"
    onnx.save(mac_zoo().model, str(src))
    result = rlx("inspect", src, "--compare-policies", "--shape", "a:2x3x4", "--shape", "img:2x3x8x8",
                 "--shape", "e_in:2x4x5")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[4:] if line.strip()}
    assert set(rows) == {"always-f32", "always-f16", "auto-mixed-conservative", "auto-mixed", "auto-mixed-bf16"}
    assert rows["always-f16"][1:3] == ["100%", "100%"] and rows["always-f32"][1:4] == ["0%", "0%", "0"]
    assert "a=2x3x4" in result.stdout and "23.6 k MACs" in result.stdout  # 2 x 11,640 + 336
    data = json.loads(rlx("inspect", src, "--compare-policies", "--json", "--map", "compute=f16").stdout)
    assert [r["policy"]["name"] for r in data][-1] == "custom"
    assert data[-1]["cost"]["mac_low_share"] == 1.0
    assert all(r["cost"]["macs"] == 11976 for r in data)
    refused = rlx("inspect", src, "--compare-policies", "--policy", "always-f16")
    assert refused.returncode == 2 and "--compare-policies" in refused.stderr and "Traceback" not in refused.stderr


def test_cost_is_in_every_report(tmp_path: Path) -> None:
    src = tmp_path / "mac_zoo.onnx"
    onnx.save(mac_zoo().model, str(src))
    out = tmp_path / "o.onnx"
    result = rlx(src, "--policy", "always-f16", "-o", out, "--shape", "a:2x3x4", "--report-json", tmp_path / "r.json",
                 "--report-md", tmp_path / "r.md")
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    # --shape a:2x3x4 sizes the axis name `n` in every input (img, e_in too): every op but the
    # Gemm (no batch axis, 336 MACs) counts twice.
    assert data["cost"]["input_shapes"]["img"] == [2, 3, 8, 8] and data["cost"]["macs"] == 336 + 2 * (11976 - 336)
    line = "23.6 k MACs, 100% low; weights 100% low; 8 float Casts moving 5.12 kB per inference; 4 low-precision islands"
    assert f"cost: {line}" in result.stdout
    assert f"Cost: {line}" in (tmp_path / "r.md").read_text()
    verified = rlx(src, "--policy", "always-f16", "-o", out, "--verify", "--provider", "cpu", "--report-md",
                   tmp_path / "v.md")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "Cost: 12 k MACs, 100% low" in (tmp_path / "v.md").read_text()  # the drift report's conversion facts


def test_shape_inference_gaps_are_counted_not_guessed() -> None:
    """A MatMul behind an op onnx cannot infer (a contrib op) has no known shapes: it is
    counted in unknown_macs_nodes, and its MACs are not guessed."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13, "com.microsoft" : 1]>
        g (float[2,4] x, float[4,4] w) => (float[2,4] y) {
            m = com.microsoft.Gelu (x)
            y = MatMul (m, w)
        }
    """)
    cost = estimate_cost(model)
    assert (cost.macs, cost.unknown_macs_nodes) == (0, 1)


@pytest.mark.parametrize("policy", ["auto-mixed", "always-f16"])
def test_cost_runs_on_the_models_it_describes(policy: str) -> None:
    """The figures describe a model that runs: the converted mac_zoo loads and computes."""
    model = mac_zoo().model
    converted = convert(model, policy)
    feeds = synthesize(model, InputSpec(seed=1))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for r, g in zip(ref, got):
        assert r.shape == g.shape and np.allclose(r, g, atol=5e-2, rtol=5e-2)


def test_a_declared_minus_one_dimension_is_unknown_not_a_negative_count() -> None:
    """A graph may declare a dim as -1 (exporters do): the MatMul it reaches is counted as of
    unknown shape, never as a negative number of MACs (the report schema's minimum caught it)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])], [w],
    )
    graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cost = estimate_cost(model)
    assert cost.macs >= 0 and cost.macs_low >= 0
    assert cost.macs == 2 * 4 * 3 or cost.unknown_macs_nodes == 1


def test_a_policy_that_lowers_no_mac_says_so_whatever_its_cast_count(tmp_path: Path) -> None:
    """One line names --policy auto when no multiply-accumulate runs low, with few Casts too;
    a model whose compute is quantized already gets no such advice."""
    src = tmp_path / "m.onnx"
    onnx.save(cast_chain(pairs=1).model, str(src))  # one MatMul, two Casts
    result = rlx(src, "--policy", "auto-mixed", "-o", tmp_path / "o.onnx", "--report-json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.returncode == 0 and report["casts_inserted"] < HINT_MIN_CASTS and report["cost"]["macs_low"] == 0
    assert [line for line in result.stderr.splitlines() if "hint:" in line and "--policy auto" in line]
    quantized = tmp_path / "q.onnx"
    onnx.save(HEALTHY["dynamic_quant_model"]().model, str(quantized))
    result = rlx(quantized, "--policy", "auto-mixed", "-o", tmp_path / "q16.onnx", "--report-json", tmp_path / "q.json")
    report = json.loads((tmp_path / "q.json").read_text())
    assert report["cost"]["macs_by_precision"]["int8"] > 0 and "hint:" not in result.stderr


def test_macs_behind_a_contrib_op_and_a_weight_dequantized_by_hand() -> None:
    """x (symbolic batch) -> com.microsoft Gelu -> MatMul(Cast(int8 W) * scale): onnx's inference
    stops at the contrib op and onnxruntime's symbolic inference takes over; it folds what reads
    only constants, and the int8 weight (512x256: the cost model's copy holds no bytes for it)
    must not stop it (it did: 0 MACs, the MatMul unknown, as on a weight-only int8 BERT export)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(5).integers(-127, 127, (512, 256), dtype=np.int8)
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
             helper.make_node("Cast", ["wq"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "s"], ["w"]),
             helper.make_node("MatMul", ["g", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
            [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.array(0.01, np.float32), "s")],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    cost = estimate_cost(model, {"x": [4, 512]})
    assert (cost.macs, cost.unknown_macs_nodes) == (4 * 512 * 256, 0)
    assert cost.macs_by_precision["int8"] == cost.macs  # an f32 MatMul of a dequantized int8 weight

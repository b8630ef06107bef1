"""Quantized models (issue 43): their integer compute counts as low, in its own class, in every
report and in the `--min-low-share` gate; a weight's dequantization follows its consumer; the
q4 -> q4f16 recipe. Models made with onnxruntime's own quantizers (fixtures/quantized.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.quantized import feeds, write_quantized
from tests.helpers import integer_digest, rlx, run


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer", reason="onnxruntime's quantizers")
    return write_quantized(tmp_path_factory.mktemp("quantized"))


def _convert(src: Path, out: Path, policy: str, *extra: str) -> tuple[int, dict]:
    report = out.with_suffix(".json")
    result = rlx(src, "-p", policy, "-o", out, "--provider", "cpu", "-q", "--report-json", report, *extra)
    return result.returncode, json.loads(report.read_text())


@pytest.mark.parametrize(
    "name, compute_class",
    [("dynamic", "int8"), ("qdq", "int8"), ("weight_only", "int8"), ("q4", "int4")],
)
def test_quantized_compute_counts_as_low_and_its_integers_keep_their_bytes(
    models: dict[str, Path], tmp_path: Path, name: str, compute_class: str
) -> None:
    src = models[name]
    code, data = _convert(src, tmp_path / "mixed.onnx", "auto-mixed")
    assert code == 0 and data["verify"]["passed"]
    cost = data["cost"]
    # 3 layers of 4x64 @ 64x64: every MAC known (symbolic inference follows the contrib ops), all quantized.
    assert cost["macs"] == 3 * 4 * 64 * 64 and cost["unknown_macs_nodes"] == 0
    assert cost["macs_by_precision"][compute_class] == cost["macs"] and cost["mac_low_share"] == 1.0
    assert cost["weight_bytes"][compute_class] > 0
    assert integer_digest(onnx.load(str(tmp_path / "mixed.onnx"))) == integer_digest(onnx.load(str(src)))
    model = onnx.load(str(src))
    np.testing.assert_allclose(run(onnx.load(str(tmp_path / "mixed.onnx")), feeds(3))[0], run(model, feeds(3))[0],
                               atol=5e-2, rtol=5e-2)


def test_no_advice_to_lower_a_quantized_model(models: dict[str, Path], tmp_path: Path) -> None:
    result = rlx(models["dynamic"], "-p", "always-f16", "-o", tmp_path / "o.onnx", "--provider", "cpu")
    assert result.returncode == 0 and "hint:" not in result.stderr and "--repair" not in result.stderr


def test_a_dequantization_follows_its_consumer(models: dict[str, Path], tmp_path: Path) -> None:
    """Cast(int8 -> f32) -> Mul(scale) -> MatMul: under auto-mixed (MatMul f32) the Mul stays
    f32 with its MatMul, by its own rule, and no Cast enters the dequantization; under
    always-f16 it lowers with the MatMul."""
    src = models["weight_only"]
    code, data = _convert(src, tmp_path / "mixed.onnx", "auto-mixed")
    assert code == 0
    kept = {k["node"]: k["code"] for k in data["kept_f32"]}
    assert {kept.get(f"w{i}_dequant") for i in range(3)} == {"dequantize-follows-consumer"}
    converted = onnx.load(str(tmp_path / "mixed.onnx"))
    readers = {i for n in converted.graph.node for i in n.input}
    producers = {o: n for n in converted.graph.node for o in n.output}
    for i in range(3):  # the MatMul reads the f32 Mul directly: no Cast between
        matmul = next(n for n in converted.graph.node if n.name == f"fc{i}")
        assert producers[matmul.input[1]].name == f"w{i}_dequant" and f"w{i}" in readers
    code, low = _convert(src, tmp_path / "f16.onnx", "always-f16")
    assert code == 0 and "dequantize-follows-consumer" not in low["by_rule"]
    assert low["cost"]["macs_by_precision"]["f16"] == low["cost"]["macs"]
    # Lowered, the dequantization is low from its source: Cast(int8 -> f16) -> Mul(f16 scale),
    # not Cast(int8 -> f32) -> Cast(f32 -> f16). The only other Casts are the model's input and output.
    f16 = onnx.load(str(tmp_path / "f16.onnx"))
    producers = {o: n for n in f16.graph.node for o in n.output}
    inits = {t.name: t for t in f16.graph.initializer}
    for i in range(3):
        mul = next(n for n in f16.graph.node if n.name == f"w{i}_dequant")
        cast = producers[mul.input[0]]
        assert cast.op_type == "Cast" and cast.input == [f"w{i}_q"], cast
        assert cast.attribute[0].i == onnx.TensorProto.FLOAT16
        assert inits[mul.input[1]].data_type == onnx.TensorProto.FLOAT16
    casts = [n for n in f16.graph.node if n.op_type == "Cast"]
    assert len(casts) == 5 and low["casts_inserted"] - low["casts_removed"] == 2, low
    assert integer_digest(f16) == integer_digest(onnx.load(str(src)))
    np.testing.assert_allclose(run(f16, feeds(3))[0], run(onnx.load(str(src)), feeds(3))[0], atol=2e-2, rtol=2e-2)


def test_a_dequantize_linear_is_never_read_through_a_cast(models: dict[str, Path], tmp_path: Path) -> None:
    """QDQ (DequantizeLinear -> MatMul -> QuantizeLinear): onnxruntime fuses the group into an
    integer kernel, so under every policy the group keeps its types (rule qdq-region), no Cast
    reads a DequantizeLinear's output, its int8 weights stay byte-identical, and the MACs count
    as int8."""
    src = models["qdq"]
    for policy in ("auto-mixed", "always-f16", "auto"):
        code, data = _convert(src, tmp_path / f"{policy}.onnx", policy)
        assert code == 0, policy
        converted = onnx.load(str(tmp_path / f"{policy}.onnx"))
        dequantized = {o for n in converted.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        assert not [n.name for n in converted.graph.node if n.op_type == "Cast" and n.input[0] in dequantized]
        assert integer_digest(converted) == integer_digest(onnx.load(str(src)))
        assert data["cost"]["macs_by_precision"]["int8"] == data["cost"]["macs"] > 0


def test_q4_to_q4f16_is_a_recipe_the_gate_passes(models: dict[str, Path], tmp_path: Path) -> None:
    src, out = models["q4"], tmp_path / "q4f16.onnx"
    code, data = _convert(src, out, "always-f16", "--min-low-share", "0.9")
    assert code == 0 and data["gate"] == {"min_low_share": 0.9, "low_share": 1.0, "passed": True}
    converted, original = onnx.load(str(out)), onnx.load(str(src))
    assert integer_digest(converted) == integer_digest(original)  # the packed 4-bit weights, byte for byte
    scales = [t for t in converted.graph.initializer if t.name.endswith("_scales")]
    assert scales and all(t.data_type == onnx.TensorProto.FLOAT16 for t in scales)
    assert data["file_bytes"]["after"] < data["file_bytes"]["before"]
    np.testing.assert_allclose(run(converted, feeds(5))[0], run(original, feeds(5))[0], atol=1e-2, rtol=1e-2)


def test_shape_inference_writes_nothing_where_the_run_was_not_told_to(models: dict[str, Path], tmp_path: Path) -> None:
    """onnxruntime's symbolic shape inference (the cost model's fallback for contrib ops) saves a
    model into the working directory where it stops short; the run must leave that directory as
    it was, for a model it follows and for one it does not."""
    from fixtures.make_fixtures import HEALTHY

    work = tmp_path / "cwd"
    work.mkdir()
    onnx.save(HEALTHY["contrib_block"]().model, str(tmp_path / "contrib.onnx"))
    for src in (models["q4"], tmp_path / "contrib.onnx"):
        result = rlx(src, "-p", "always-f16", "-o", tmp_path / f"{src.stem}.out.onnx", "--provider", "cpu", "-q",
                     cwd=work)
        assert result.returncode in (0, 1, 4), result.stderr
    assert list(work.iterdir()) == []

"""The safe default on a real export: a torch-exported BERT, dynamically quantized by
onnxruntime (`quantize_dynamic`, QUInt8 weights, MatMul only), converts under auto-mixed with
the plain command (exit 0, verified) because rule `dequantize-arithmetic` keeps the arithmetic
around each `MatMulInteger` in f32; the converter with the new rules switched off writes a
model that fails verification.

Why it breaks without the rule: `quantize_dynamic` turns each MatMul into
DynamicQuantizeLinear -> MatMulInteger (int32 accumulator) -> Cast(to=float) -> Mul(scale) ->
Add(bias). Without the rule, auto-mixed lowers that `Mul` to f16, so the accumulator is cast to
f16 first; an accumulator past 65504 becomes inf, and the LayerNorm after it NaN.

The model: BERT, 2 layers, hidden 128, 4 heads, intermediate 512, vocabulary 128, built from a
config with random weights after `torch.manual_seed(0)` and exported with the dynamo exporter
(nothing downloaded). Not the 32-wide BERT of fixtures/export_transformers.py: with its
K = 32 / 64 the largest |accumulator| on the default synthesized inputs is about 36k (55k at
best over single-token inputs), which f16 holds, and its off conversion passes. With K = 128 /
512, as in real checkpoints (BERT-base: 768 / 3072), the int32 accumulators of real hidden
states pass f16's range: on the default synthesized inputs (the plain command's, seed 0) the
largest are about 82k (layer 1's FFN output, K = 512) and 73k (layer 0's), so the default
inputs are enough and no --input-range or --inputs is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.helpers import rlx

pytestmark = pytest.mark.slow

HIDDEN, INTERMEDIATE = 128, 512


@pytest.fixture(scope="module")
def quantized_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    quantization = pytest.importorskip("onnxruntime.quantization")
    from transformers import BertConfig, BertModel

    from fixtures import export_transformers as ft

    out = tmp_path_factory.mktemp("quantized_bert")
    ft._quiet_transformers()
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=ft.VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=INTERMEDIATE, max_position_embeddings=64, type_vocab_size=2))
    f32 = ft._export(model, ft.bert_inputs(), out / "bert.onnx", ["last_hidden_state", "pooler_output"])
    quantized = out / "bert_quant.onnx"
    quantization.quantize_dynamic(str(f32), str(quantized), weight_type=quantization.QuantType.QUInt8,
                                  op_types_to_quantize=["MatMul"])
    ops = [n.op_type for n in onnx.load(str(quantized)).graph.node]
    assert ops.count("MatMulInteger") == 13 and "MatMul" in ops  # 2 x 6 linears + the pooler; attention stays f32
    return quantized


def test_the_plain_command_keeps_the_dequantize_arithmetic_of_a_quantized_bert(quantized_bert: Path,
                                                                              tmp_path: Path) -> None:
    out, report_path = tmp_path / "out.onnx", tmp_path / "report.json"
    result = rlx(quantized_bert, "--policy", "auto-mixed", "-o", out, "--report-json", report_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["verify"]["passed"] is True
    assert all(o["new_nan"] == 0 and o["new_inf"] == 0 for o in report["verify"]["outputs"])
    codes = {k["code"] for k in report["kept_f32"]}
    assert "dequantize-arithmetic" in codes, codes
    assert report["by_rule"]["dequantize-arithmetic"] >= 13  # at least the scale Mul of each MatMulInteger
    dequant_ops = {k["op"] for k in report["kept_f32"] if k["code"] == "dequantize-arithmetic"}
    assert "Mul" in dequant_ops, dequant_ops


def test_the_quantized_bert_fails_verification_without_the_new_rules(quantized_bert: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_onnx_amp import convert
    from rlx_onnx_amp.rewrite import decide as decide_module
    from rlx_onnx_amp.rewrite.emit import EmitPass
    from rlx_onnx_amp.verification import VerifyOptions, verify

    # Control: the same in-process conversion with the rules on passes.
    on = tmp_path / "on.onnx"
    onnx.save(convert(str(quantized_bert), "auto-mixed"), str(on))
    assert verify(quantized_bert, on, VerifyOptions(provider="cpu")).passed
    # The converter as it was before rules dequantize-arithmetic, weight-range and range-screen
    # (as tests/test_safe_default.py's _without_the_new_rules).
    kept = tuple(r for r in decide_module.PER_NODE_RULES if r.code == "user-keep")
    monkeypatch.setattr(decide_module, "PER_NODE_RULES", kept)
    monkeypatch.setattr(EmitPass, "_narrowed_copy", lambda self, owner, name, want: None)
    out = tmp_path / "off.onnx"
    onnx.save(convert(str(quantized_bert), "auto-mixed"), str(out))
    result = verify(quantized_bert, out, VerifyOptions(provider="cpu"))
    assert not result.passed
    # It fails on non-finite values (an accumulator past 65504 cast to f16), not on rounding.
    assert any(o.new_nan + o.new_inf > 0 for o in result.outputs), [(o.name, o.max_abs) for o in result.outputs]

"""`auto` stops where nothing can be gained (issue 51): an int8 model (onnxruntime's
`quantize_dynamic`, or int8 weights dequantized by hand) has no f32 compute left for an f16
search to lower, so it writes the model f32 after no evaluation and says why; the report holds
the evaluations, the budget, the seconds and the stop."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest

from fixtures.quantized import write_quantized
from rlx_onnx_amp.cost import MAC_CLASSES, Cost, no_gain
from rlx_onnx_amp.repair import Evaluation
from rlx_onnx_amp.verification.options import DEFAULT_BUDGET
from tests.helpers import rlx


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer", reason="onnxruntime's quantizers")
    return write_quantized(tmp_path_factory.mktemp("quantized"))


def _auto(src: Path, tmp_path: Path) -> tuple[int, dict, str]:
    out, report = tmp_path / "auto.onnx", tmp_path / "auto.json"
    result = rlx(src, "--policy", "auto", "-o", out, "--provider", "cpu", "--report-json", report)
    return result.returncode, json.loads(report.read_text()), result.stdout


@pytest.mark.parametrize("name", ["dynamic", "weight_only"])
def test_auto_does_not_search_an_int8_model(models: dict[str, Path], tmp_path: Path, name: str) -> None:
    code, report, stdout = _auto(models[name], tmp_path)
    repair = report["repair"]
    assert code == 0 and report["verify"]["passed"] and repair["passed"]
    assert (repair["evaluations"], repair["budget"], repair["history"], repair["best"]) == (0, DEFAULT_BUDGET, [], None)
    assert repair["stopped"] == "100.0% of MACs are int8 already; no f16 search"
    assert isinstance(repair["seconds"], float)
    assert "repair: auto stopped early: 100.0% of MACs are int8 already" in stdout
    assert f"after 0 of {DEFAULT_BUDGET} evaluations in " in stdout
    written = onnx.load(str(tmp_path / "auto.onnx"))
    floats = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    assert not [t.name for t in written.graph.initializer if t.data_type in floats]
    assert not [n.name for n in written.graph.node for a in n.attribute if a.name == "to" and a.i in floats]
    assert report["cost"]["macs_by_precision"]["int8"] == report["cost"]["macs"] > 0


def test_auto_still_searches_a_float_model(models: dict[str, Path], tmp_path: Path) -> None:
    code, report, _ = _auto(models["float"], tmp_path)
    repair = report["repair"]
    assert code == 0 and repair["evaluations"] >= 1 and "stopped" not in repair
    assert report["cost"]["macs_by_precision"]["f16"] > 0


def _cost(**macs: int) -> Cost:
    by = {**dict.fromkeys(MAC_CLASSES, 0), **macs}
    return Cost(macs=sum(by.values()), macs_by_precision=by)


def test_the_no_gain_rule() -> None:
    assert no_gain(_cost(f32=1, int8=999)) == "99.9% of MACs are int8 already; no f16 search"
    assert no_gain(_cost(f32=0, int4=30, int8=70)) == "100.0% of MACs are int8/int4 already; no f16 search"
    assert no_gain(_cost(f32=2, int8=98)) is None  # 2% of the MACs to lower: worth a search
    assert no_gain(_cost()) is None  # no MACs counted: nothing to go on
    unknown = _cost(int8=100)
    unknown.unknown_macs_nodes = 1
    assert no_gain(unknown) is None


def _history(*steps: tuple[str, int, bool]) -> SimpleNamespace:
    history = [Evaluation(i, stage, dict.fromkeys(map(str, range(kept)), "drift"), ok, 0.0)
               for i, (stage, kept, ok) in enumerate(steps)]
    return SimpleNamespace(history=history, best=min(history, key=lambda e: (not e.passed, len(e.keep))))



"""Typing values from op schemas (the fast path) agrees with onnx's shape inference wherever it
answers, and gives up rather than guess."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from fixtures.onnx_cases import collect_eligible
from rlx_onnx_amp import ConversionReport, convert
from rlx_onnx_amp.types import infer_types, model_types, schema_types

LIGHT = sorted((Path(onnx.backend.test.__file__).parent / "data" / "light").glob("light_*.onnx"))


@functools.lru_cache(maxsize=1)  # collecting the eligible node cases runs each once; read-only after
def _models() -> dict[str, onnx.ModelProto]:
    models = {name: build().model for name, build in {**HEALTHY, **BROKEN_IN_F16}.items()}
    models.update((p.stem, onnx.load(str(p))) for p in LIGHT)
    cases, _ = collect_eligible()
    models.update((f"case:{c.name}", c.model) for c in cases)
    return models


def test_schema_types_agree_with_onnx_inference() -> None:
    typed, gave_up, disagreements = 0, 0, {}
    for name, model in _models().items():
        fast = schema_types(model)
        if fast is None:
            gave_up += 1
            continue
        typed += 1
        ours, onnx_types = fast[""], infer_types(model)[""]
        wrong = {k: (ours[k], onnx_types[k]) for k in ours.keys() & onnx_types.keys() if ours[k] != onnx_types[k]}
        missing = sorted(onnx_types.keys() - ours.keys())
        if wrong or missing:
            disagreements[name] = (wrong, missing)
    assert disagreements == {}
    # Most graphs take the fast path; control flow and sequences fall back.
    assert typed > 1400 and gave_up > 0, (typed, gave_up)


def test_schema_types_give_up_on_control_flow_and_untyped_outputs() -> None:
    assert schema_types(HEALTHY["control_flow"]().model) is None
    # RandomNormalLike's output type comes from its `dtype` attribute: not a schema question.
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], dtype=TensorProto.FLOAT16)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert schema_types(model) == {"": {"x": TensorProto.FLOAT, "y": TensorProto.FLOAT16}}  # declared output stands
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
    assert schema_types(model) is None
    # model_types then falls back to onnx's inference, which reads the attribute.
    assert model_types(model)[""]["y"] == TensorProto.FLOAT16


def test_converter_typing_as_it_goes_matches_onnx_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The converter types the main graph from the schemas while it decides (one sweep); forced
    onto onnx's inference instead, it must write the same model and the same report."""
    converter = importlib.import_module("rlx_onnx_amp.rewrite.decide")
    models = _models()
    inferred: list[str] = []
    infer_types = converter.infer_types
    monkeypatch.setattr(converter, "infer_types", lambda model: inferred.append(model.graph.name) or infer_types(model))
    fast = {}
    for name, model in models.items():
        report = ConversionReport()
        fast[name] = (convert(model, "always-f16", report=report).SerializeToString(), report.to_json())
    fell_back = len(inferred)
    monkeypatch.setattr(converter, "declared_types", lambda graph: None)
    differ = []
    for name, model in models.items():
        report = ConversionReport()
        slow = (convert(model, "always-f16", report=report).SerializeToString(), report.to_json())
        if slow != fast[name]:
            differ.append(name)
    assert differ == []
    assert len(models) - fell_back > 1400 and fell_back, (len(models), fell_back)  # most typed as they go; some cannot be

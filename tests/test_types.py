"""Typing values from op schemas (the fast path) agrees with onnx's shape inference wherever it
answers, and gives up rather than guess."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import onnx
import onnx.backend.test
import pytest
from onnx import ModelProto, NodeProto, TensorProto, helper

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from fixtures.onnx_cases import collect_eligible
from rlx_onnx_amp import convert, convert_and_report
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

    def counted_infer_types(model: ModelProto) -> object:
        inferred.append(model.graph.name)
        return infer_types(model)

    monkeypatch.setattr(converter, "infer_types", counted_infer_types)
    fast = {}
    for name, model in models.items():
        out, report = convert_and_report(model, "always-f16", screen=False)
        fast[name] = (out.SerializeToString(), report.to_json())
    fell_back = len(inferred)
    monkeypatch.setattr(converter, "declared_types", lambda graph, fields=None: None)
    differ = []
    for name, model in models.items():
        out, report = convert_and_report(model, "always-f16", screen=False)
        slow = (out.SerializeToString(), report.to_json())
        if slow != fast[name]:
            differ.append(name)
    assert differ == []
    assert len(models) - fell_back > 1400 and fell_back, (len(models), fell_back)  # most typed as they go; some cannot be


def test_fresh_names_never_reuse_a_name_the_model_has() -> None:
    # x and y (f32) feed ops run in f16: their Casts would make `x__f16` and `y__f16`, in nodes
    # `x__f16__cast` and `y__f16__cast`. This model already has a value `x__f16`, an
    # initializer `x__f16_1` and a node `y__f16__cast`: every name stays unique, the model is
    # valid, and it computes what the input does.
    import numpy as np
    import onnxruntime as ort

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "y"))
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="y__f16__cast"),
        helper.make_node("Add", ["r", "x__f16_1"], ["x__f16"], name="add"),
        helper.make_node("Mul", ["x__f16", "y"], ["out"], name="mul"),
    ]
    weight = helper.make_tensor("x__f16_1", TensorProto.FLOAT, [4], [0.5, -1.0, 2.0, 0.25])
    graph = helper.make_graph(nodes, "clash", [x, y], [out], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    converted = convert(model, "always-f16")
    values = [o for n in converted.graph.node for o in n.output] + [t.name for t in converted.graph.initializer]
    node_names = [n.name for n in converted.graph.node]
    assert len(values) == len(set(values)) and len(node_names) == len(set(node_names))
    casts = {n.input[0]: n for n in converted.graph.node if n.op_type == "Cast"}
    assert casts["x"].output[0] == "x__f16_2" and casts["y"].output[0] == "y__f16"
    assert casts["y"].name == "y__f16__cast_1"
    feeds = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32), "y": np.array([2.0, 1.0, -1.0, 4.0], np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_fresh_names_take_only_names_that_could_collide() -> None:
    from rlx_onnx_amp.types import FreshNames

    fresh = FreshNames(["a", "b_", "_c", "d__fp16"])
    assert fresh.taken == {"d__fp16"}  # "b_" and "_c" never join into a mark
    assert fresh("d__fp16") == "d__fp16_1" and fresh("a__fp16") == "a__fp16"
    assert fresh("a__fp16") == "a__fp16_1"
    with pytest.raises(ValueError, match="holds '__'"):
        fresh("plain")


def test_attributes_read_once_give_what_the_node_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load reads the main graph's tensor holders' attributes and its initializers' names
    and types once (`NodeFields`), and the typing, the weights' facts and the store pass use
    that read: on every fixture and onnx case, the initializers, declared types, tensors,
    Constant types and Constant values are those read from the graph itself, and no holder's
    attributes are read twice."""
    from rlx_onnx_amp import types
    from rlx_onnx_amp.ranges import _source_tensor
    from rlx_onnx_amp.taxonomy import SOURCE_VALUE_ATTRIBUTES

    reads: list[int] = []
    real = types.read_attributes

    def counted_read_attributes(node: NodeProto) -> object:
        reads.append(id(node))
        return real(node)

    monkeypatch.setattr(types, "read_attributes", counted_read_attributes)
    checked = 0
    for name, model in _models().items():
        fields = types.NodeFields.read(model.graph)
        inits = list(model.graph.initializer)
        assert fields.initializer_names == [t.name for t in inits], name
        assert fields.initializer_types == [t.data_type for t in inits], name
        assert types.declared_types(model.graph, fields) == types.declared_types(model.graph), name
        cached = [t.SerializeToString() for t in types.all_tensors(model, fields)]
        assert cached == [t.SerializeToString() for t in types.all_tensors(model)], name
        reads.clear()
        for i, (node, op) in enumerate(zip(fields.nodes, fields.ops)):
            if op not in SOURCE_VALUE_ATTRIBUTES or node.domain:
                continue
            attributes = fields.attributes(i)
            assert types.constant_type(node, attributes) == types.constant_type(node), (name, i)
            value, direct = _source_tensor(node, op, attributes), _source_tensor(node)
            if isinstance(direct, onnx.TensorProto):
                assert isinstance(value, onnx.TensorProto) and value.SerializeToString() == direct.SerializeToString()
            else:
                assert value == direct, (name, i)
            checked += 1
        # The load read them; only the direct reads above read them again.
        assert len(reads) == len(set(reads)), name
    assert checked > 50

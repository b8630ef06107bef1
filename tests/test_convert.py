"""The rewrite on the fixture zoo: every hard case under every policy, structure and numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY, Fixture, write_external
from rlx_onnx_amp import convert, convert_and_report, convert_file
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.verification.emulate import emulate
from rlx_onnx_amp.verification.inputs import InputSpec, synthesize
from tests.helpers import (
    LOW,
    POLICIES,
    all_graphs,
    all_nodes,
    assert_close,
    cast_duplicates,
    data_file,
    elem_types,
    feeds_for,
    integer_digest,
    run,
    value_names,
)

CASES = [(name, policy) for name in {**HEALTHY, **BROKEN_IN_F16} for policy in POLICIES]
# Every float node of the QDQ model sits in a quantized region that onnxruntime runs in int8.
NOTHING_TO_LOWER = {"qdq_model"}
TOLERANCE = {"always-f32": (0.0, 0.0), "always-f16": (2e-2, 2e-2), "auto-mixed-conservative": (1e-2, 1e-2),
             "auto-mixed": (1e-2, 1e-2)}

REPO = Path(__file__).resolve().parent.parent


def _build(name: str) -> Fixture:
    return {**HEALTHY, **BROKEN_IN_F16}[name]()


@pytest.mark.parametrize("name, policy", CASES)
def test_fixture_converts_validly(name: str, policy: str, tmp_path: Path) -> None:
    fixture = _build(name)
    original = fixture.model
    before = original.SerializeToString()
    converted, report = convert_and_report(original, policy)
    assert original.SerializeToString() == before, "the input model was modified"

    path = tmp_path / "out.onnx"
    onnx.save(converted, str(path))
    onnx.checker.check_model(str(path), full_check=True)

    # Structure: integer tensors untouched, one Cast per (source, type) per graph, names kept,
    # graph I/O types kept, Casts that were there keep their `to`.
    assert integer_digest(converted) == integer_digest(original)
    assert cast_duplicates(converted) == []
    # Rule idle-cast: an original Cast may go (or become an Identity for a graph output);
    # only its output name may then disappear.
    kept_casts = {n.name for n in all_nodes(converted) if n.op_type == "Cast"}
    gone = [n for n in all_nodes(original) if n.op_type == "Cast" and n.name not in kept_casts]
    assert len(gone) == report.casts_removed
    assert value_names(original) - {n.output[0] for n in gone} <= value_names(converted)
    for a, b in zip(original.graph.input, converted.graph.input):
        assert (a.name, a.type.tensor_type.elem_type) == (b.name, b.type.tensor_type.elem_type)
    for a, b in zip(original.graph.output, converted.graph.output):
        assert (a.name, a.type.tensor_type.elem_type) == (b.name, b.type.tensor_type.elem_type)
    original_casts = {n.name: n.attribute[0].i for n in all_nodes(original) if n.op_type == "Cast"}
    converted_casts = {n.name: n.attribute[0].i for n in all_nodes(converted) if n.op_type == "Cast"}
    assert {k: converted_casts[k] for k in original_casts if k in kept_casts} == {
        k: v for k, v in original_casts.items() if k in kept_casts
    }
    inserted = len(converted_casts) - (len(original_casts) - len(gone))
    assert inserted == report.casts_inserted

    low_types = {t for t in elem_types(converted).values() if t in LOW}
    if policy == "always-f32":
        assert converted.SerializeToString() == before
    elif policy == "auto-mixed-bf16":
        assert low_types <= {TensorProto.BFLOAT16}
        assert (report.nodes.by_precision["bf16"] > 0) == (name not in NOTHING_TO_LOWER)
    else:
        assert low_types <= {TensorProto.FLOAT16}
        assert (report.nodes.by_precision["f16"] > 0) == (name not in NOTHING_TO_LOWER)

    # Converting the converted model again with the same policy changes nothing.
    again = convert(converted, policy)
    assert again.SerializeToString() == converted.SerializeToString()

    feeds = feeds_for(fixture, original)
    expected = run(original, feeds)
    if policy == "auto-mixed-bf16":
        # onnxruntime's CPU provider has no bf16 kernels: compare the emulated candidate.
        emulated, rounded = emulate(original, converted)
        assert rounded > 0 or name in NOTHING_TO_LOWER
        actual = run(emulated, feeds)
        atol, rtol, min_cosine = 5e-2, 5e-2, 0.995
    else:
        actual = run(str(path), feeds)  # it loads and runs on onnxruntime's CPU provider ...
        (atol, rtol), min_cosine = TOLERANCE[policy], 0.999
    if name in BROKEN_IN_F16:
        return  # built to drift in f16: test_verify proves that it is caught
    assert_close(expected, actual, atol, rtol, min_cosine)
    if policy in ("always-f16", "auto-mixed-conservative", "auto-mixed"):
        # ... which computes most f16 nodes in f32: the f16 numbers are judged emulated too.
        emulated, rounded = emulate(original, converted)
        assert rounded > 0 or name in NOTHING_TO_LOWER
        assert_close(expected, run(emulated, feeds), atol, rtol, min_cosine)


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in all_nodes(model) if n.name == name)


def _path_of(model: onnx.ModelProto, name: str) -> str:
    """The node path (index, prefixed by its body's path) of the node named `name`."""

    def walk(graph: onnx.GraphProto, prefix: str) -> str | None:
        for i, node in enumerate(graph.node):
            if node.name == name:
                return f"{prefix}{i}"
            for attr in node.attribute:
                bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                for body in bodies:
                    found = walk(body, f"{prefix}{i}/{attr.name}/")
                    if found is not None:
                        return found
        return None

    path = walk(model.graph, "")
    assert path is not None, name
    return path


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for g in all_graphs(model.graph) for t in g.initializer if t.name == name)


def test_shared_initializer_gets_one_cast_under_auto_mixed() -> None:
    model = HEALTHY["shared_initializer"]().model
    converted = convert(model, "auto-mixed")
    assert _init(converted, "w").data_type == TensorProto.FLOAT  # MatMul (Compute) keeps reading it in f32
    casts = [n for n in converted.graph.node if n.op_type == "Cast" and n.input[0] == "w"]
    assert len(casts) == 1 and casts[0].attribute[0].i == TensorProto.FLOAT16
    assert _node(converted, "add").input[1] == casts[0].output[0]
    # under always-f16 every consumer wants f16: converted in place, no Cast
    f16 = convert(model, "always-f16")
    assert _init(f16, "w").data_type == TensorProto.FLOAT16
    assert not [n for n in f16.graph.node if n.op_type == "Cast" and n.input[0] == "w"]


def test_cast_counts_on_a_small_chain() -> None:
    # x -> MatMul(f32) -> Add(f16) -> Mul(f16) -> Sigmoid(f16) -> y under auto-mixed:
    # one Cast into the f16 region (the MatMul output) and one back to the graph output.
    converted, report = convert_and_report(HEALTHY["constant_weights"]().model, "auto-mixed")
    assert report.casts_inserted == 2
    kinds = [n.op_type for n in converted.graph.node]
    assert kinds.count("Cast") == 2
    assert converted.graph.node[-1].op_type == "Cast" and converted.graph.node[-1].output[0] == "y"


def test_constants_convert_like_initializers_and_clamp() -> None:
    converted, report = convert_and_report(HEALTHY["constant_of_shape"]().model, "always-f16")
    plane = _node(converted, "mask_plane")
    value = onnx.numpy_helper.to_array(plane.attribute[0].t)
    assert value.dtype == np.float16 and float(value[0]) == -65504.0
    assert report.clamped["neg"]["clamped"] == 1 and report.clamped["neg"]["worst"] == pytest.approx(-3.4e38, rel=1e-6)

    block, report = convert_and_report(HEALTHY["transformer_block"]().model, "auto-mixed")
    mask = onnx.numpy_helper.to_array(_node(block, "neg_big_const").attribute[0].t)
    assert mask.dtype == np.float16 and float(mask) == -65504.0
    assert report.clamped["neg_big"]["clamped"] == 1

    weights = convert(HEALTHY["constant_weights"]().model, "always-f16")
    for name in ("w_const", "b_const", "s_const"):
        attr = _node(weights, name).attribute[0]
        assert attr.name == "value" and attr.t.data_type == TensorProto.FLOAT16


def test_float_attribute_constants_become_one_low_tensor_attribute() -> None:
    """A Constant's value_float / value_floats and a ConstantOfShape without a value each become
    the node's one `value` attribute, a low tensor named after the output, computing the same."""
    h = onnx.helper
    model = h.make_model(
        h.make_graph(
            [
                h.make_node("Constant", [], ["a"], name="scalar", value_float=0.5),
                h.make_node("Constant", [], ["b"], name="vector", value_floats=[1.5, -2.0, 1e-8]),
                h.make_node("Constant", [], ["shape"], name="shape", value_ints=[3]),
                h.make_node("ConstantOfShape", ["shape"], ["c"], name="zeros"),
                h.make_node("Mul", ["x", "a"], ["xa"]),
                h.make_node("Add", ["xa", "b"], ["xab"]),
                h.make_node("Add", ["xab", "c"], ["y"]),
            ],
            "constants",
            [h.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [h.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        ),
        opset_imports=[h.make_opsetid("", 17)],
    )
    onnx.checker.check_model(model, full_check=True)
    converted, report = convert_and_report(model, "always-f16")
    expected = {"scalar": ([], [0.5]), "vector": ([3], [1.5, -2.0, 0.0]), "zeros": ([1], [0.0])}
    for name, (dims, values) in expected.items():
        node = _node(converted, name)
        assert [a.name for a in node.attribute] == ["value"], name
        tensor = node.attribute[0].t
        assert node.attribute[0] == h.make_attribute("value", tensor)  # a tensor and nothing else
        assert tensor.data_type == TensorProto.FLOAT16
        assert tensor.name == node.output[0] and list(tensor.dims) == dims
        assert onnx.numpy_helper.to_array(tensor).reshape(-1).tolist() == values
    assert report.clamped["b"]["flushed_to_zero"] == 1  # 1e-8 is below f16's smallest value
    assert [n.attribute[0].ints for n in converted.graph.node if n.name == "shape"] == [[3]]  # integers stay
    x = {"x": np.array([1.0, -3.0, 0.25], dtype=np.float32)}
    assert_close(run(model, x), run(converted, x), atol=1e-2, rtol=1e-2)


def test_existing_casts_keep_their_to() -> None:
    converted, report = convert_and_report(HEALTHY["existing_casts"]().model, "always-f16")
    assert _node(converted, "to_half").attribute[0].i == TensorProto.FLOAT16
    assert _node(converted, "pos_cast").attribute[0].i == TensorProto.FLOAT
    # relu_half reads the f16 value directly; the f32 round trip is not folded away
    assert _node(converted, "relu_half").input[0] == "x16"
    # add_pos wants r32 = Cast(r16 -> f32) back at f16: the chain adds nothing, so it reads r16,
    # and to_float, left without a reader, is removed (rule idle-cast)
    assert _node(converted, "add_pos").input[0] == "r16"
    assert "to_float" not in {n.name for n in converted.graph.node} and report.casts_removed == 1
    # Under always-f32 nothing is lowered: to_float keeps its reader and its `to`.
    mixed = convert(HEALTHY["existing_casts"]().model, "always-f32")
    assert _node(mixed, "to_float").attribute[0].i == TensorProto.FLOAT


def test_no_cast_is_wasted_when_a_mixed_model_is_converted_again(tmp_path: Path) -> None:
    """An auto-mixed output converted under always-f16: its Cast(to=f16) after each f32 node
    would now cast f16 to f16, and its Cast(to=f32) would have no reader. Both go; the numbers
    are those of converting the original under always-f16."""
    from rlx_onnx_amp.types import model_types

    original = HEALTHY["transformer_block"]().model
    mixed = convert(original, "auto-mixed")
    again, again_report = convert_and_report(mixed, "always-f16")
    types = model_types(again)[""]
    casts = [n for n in again.graph.node if n.op_type == "Cast"]
    assert not [n.name for n in casts if types.get(n.input[0]) == n.attribute[0].i]  # none to its own type
    read = {i for n in again.graph.node for i in n.input} | {o.name for o in again.graph.output}
    assert not [n.name for n in casts if n.output[0] not in read]  # none without a reader
    mixed_casts = sum(n.op_type == "Cast" for n in mixed.graph.node)
    assert again_report.casts_removed >= 6 and len(casts) < mixed_casts
    direct = convert(original, "always-f16")
    assert len(casts) == sum(n.op_type == "Cast" for n in direct.graph.node)
    path = tmp_path / "again.onnx"
    onnx.save(again, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    feeds = synthesize(original, InputSpec(seed=3))
    run = {m: ort.InferenceSession(x.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
           for m, x in (("again", again), ("direct", direct))}
    for a, b in zip(run["again"], run["direct"]):
        np.testing.assert_array_equal(a, b)  # the same f16 graph, computed the same way


def test_schema_keeps_resize_scales_and_dynamic_quantize_input() -> None:
    conv = convert(HEALTHY["conv_net"]().model, "always-f16")
    assert _init(conv, "resize_scales").data_type == TensorProto.FLOAT  # Resize-13 scales: tensor(float)
    assert _node(conv, "upsample").input[2] == "resize_scales"
    dq, report = convert_and_report(HEALTHY["dynamic_quant_model"]().model, "always-f16")
    assert _node(dq, "dyn_q").input[0] == "x"  # DynamicQuantizeLinear takes float only
    assert report.index.decisions["0"] == "f32"  # Boundary: never lowered
    # A type variable that does not admit the target keeps the whole node when nothing else can move:
    # Einsum admits no bfloat16 at any opset.
    einsum = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 13]>
        g (float[2,3] a, float[3,4] b) => (float[2,4] y) { y = Einsum <equation: string = "ij,jk->ik"> (a, b) }
    """)
    out, report = convert_and_report(einsum, "auto-mixed-bf16")
    assert [(k.reason, k.code) for k in report.kept_f32] == [("schema: Einsum-12 does not admit bf16 for T", "schema-admits")]
    assert out.graph.node[0].input[:] == ["a", "b"] and report.casts_inserted == 0


def test_qdq_region_stays_f32() -> None:
    converted, report = convert_and_report(HEALTHY["qdq_model"]().model, "always-f16")
    kept = {k.node: k.code for k in report.kept_f32}
    assert kept["conv"] == kept["relu"] == "qdq-region"
    assert report.casts_inserted == 0
    assert _node(converted, "conv").input[:2] == ["x_dq", "w_dq"]


def test_control_flow_bodies_are_rewritten() -> None:
    converted, report = convert_and_report(HEALTHY["control_flow"]().model, "always-f16")
    # Every node of the original, bodies included, has a decision; the body nodes run in f16.
    original = HEALTHY["control_flow"]().model
    assert len(report.index.decisions) == sum(1 for _ in all_nodes(original))
    assert report.index.decisions[_path_of(original, "inner_tanh")] == "f16"
    assert report.index.decisions[_path_of(original, "then_mul")] == "f16"
    kept = {k.node: k.code for k in report.kept_f32}
    assert kept["branch"] == kept["outer_loop"] == "control-flow"
    inferred = elem_types(onnx.shape_inference.infer_shapes(converted))
    body_types = [inferred[n] for n in ("vt", "a_else__f16", "e")]
    assert body_types == [TensorProto.FLOAT16] * 3
    # A branch output computed low is renamed at its producer and cast back under its own name,
    # so the value named as the interface has is the interface's type (f32).
    assert inferred["a_else"] == TensorProto.FLOAT


def test_user_keeps(tmp_path: Path) -> None:
    model = HEALTHY["transformer_block"]().model
    _, report = convert_and_report(model, "always-f16", keep_f32_ops=["Softmax"], keep_f32_nodes=["^fc[12]$"])
    kept = {k.node: k.reason for k in report.kept_f32}
    assert kept["softmax"] == "user: --keep-f32-op Softmax"
    assert kept["fc1"].startswith("user: --keep-f32-node") and kept["fc2"].startswith("user")
    assert "fc1_bias" not in kept


def test_no_keep_io_types_lowers_inputs_and_outputs() -> None:
    converted = convert(HEALTHY["shared_initializer"]().model, "always-f16", keep_io_types=False)
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert not [n for n in converted.graph.node if n.op_type == "Cast"]
    onnx.checker.check_model(converted, full_check=True)
    feeds = {"x": np.linspace(-1, 1, 25, dtype=np.float16).reshape(5, 5)}
    assert run(converted, feeds)[0].dtype == np.float16


def test_report_json_keys_and_bytes() -> None:
    _, report = convert_and_report(HEALTHY["mlp_external"]().model, "always-f16")
    data = report.to_json()
    for key in ("model", "output", "policy", "nodes", "by_kind", "casts_inserted", "kept_f32", "clamped", "initializer_bytes"):
        assert key in data
    assert data["nodes"]["total"] == 6
    assert set(data["nodes"]["by_precision"]) >= {"f32", "f16", "bf16"}
    floats = 2 * (256 * 256 + 256) * 4
    ints = 64 * 4 * 8
    assert data["initializer_bytes"] == {"before": floats + ints, "after": floats // 2 + ints}


@pytest.mark.parametrize("chunk", [1 << 22, 1000])
def test_external_data_streaming_matches_in_memory(chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_onnx_amp.tensors

    monkeypatch.setattr(rlx_onnx_amp.tensors, "CHUNK_ELEMENTS", chunk)  # 1000: every weight streams in chunks
    fixture = HEALTHY["mlp_external"]()
    src = write_external(fixture, tmp_path / "mlp.onnx")
    data_before = (tmp_path / "mlp.onnx.data").read_bytes()
    for policy in ("always-f16", "auto-mixed-bf16"):
        out = tmp_path / f"out_{policy}.onnx"
        convert_file(src, out, policy)
        data_file(out)  # OUT.<content hash>.data beside it
        onnx.checker.check_model(str(out), full_check=True)
        streamed = onnx.load(str(out))  # loads the external data
        in_memory = convert(onnx.load(str(src)), policy)
        for a, b in zip(streamed.graph.initializer, in_memory.graph.initializer):
            assert (a.name, a.data_type) == (b.name, b.data_type)
            assert onnx.numpy_helper.to_array(a).tobytes() == onnx.numpy_helper.to_array(b).tobytes()
        assert [n.SerializeToString() for n in streamed.graph.node] == [n.SerializeToString() for n in in_memory.graph.node]
    assert (tmp_path / "mlp.onnx.data").read_bytes() == data_before
    feeds = feeds_for(fixture, fixture.model)
    assert_close(run(str(src), feeds), run(str(tmp_path / "out_always-f16.onnx"), feeds), 2e-2, 2e-2)


def test_precision_table_agrees_with_numpy_and_onnx() -> None:
    """The precision table's facts, derived: each element type maps to its numpy type, whose
    largest finite value and smallest subnormal the table repeats."""
    from onnx import helper

    from rlx_onnx_amp.precision import PRECISIONS

    for info in PRECISIONS.values():
        assert helper.tensor_dtype_to_np_dtype(info.elem_type) == info.np_dtype
        limits = np.finfo(info.np_dtype) if info.np_dtype != np.dtype("bfloat16") else __import__("ml_dtypes").finfo(info.np_dtype)
        assert float(limits.max) == info.max_finite and float(limits.smallest_subnormal) == info.smallest_subnormal
        assert float(limits.smallest_normal) == info.smallest_normal
        if info.precision is Precision.F32:
            continue
        # An f32 value at overflow_at rounds to Inf, the f32 value just below it does not.
        at = np.float32(info.overflow_at)
        with np.errstate(over="ignore"):  # the overflow is what this asserts
            assert np.isinf(np.array(at).astype(info.np_dtype))
        assert np.isfinite(np.array(np.nextafter(at, np.float32(0))).astype(info.np_dtype))


def _repeated_chain(n: int = 6) -> onnx.ModelProto:
    """x -> (Add b, Relu) * n -> y: every Add and every Relu repeats one template."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes, inits, prev = [], [], "x"
    for k in range(n):
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), f"b{k}"))
        nodes.append(helper.make_node("Add", [prev, f"b{k}"], [f"a{k}"], name=f"add{k}"))
        nodes.append(helper.make_node("Relu", [f"a{k}"], [f"r{k}"], name=f"relu{k}"))
        prev = f"r{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_user_keeps_apply_to_nodes_that_share_a_template() -> None:
    model = _repeated_chain()
    converted, report = convert_and_report(model, "always-f16", keep_f32_nodes=["^add3$"], keep_f32_ops=["Relu"],
                        keep_f32_paths={"4": "repair: kept"})
    kept = {k.node: k.reason for k in report.kept_f32}
    assert kept == {"add3": "user: --keep-f32-node ^add3$", "add2": "repair: kept",
                    **{f"relu{k}": "user: --keep-f32-op Relu" for k in range(6)}}
    precisions = {n: report.index.decisions[str(i)] for i, n in enumerate(f"{op}{k}" for k in range(6) for op in ("add", "relu"))}
    assert [precisions[f"add{k}"] for k in range(6)] == ["f16", "f16", "f32", "f32", "f16", "f16"]
    adds = {n.name: n for n in converted.graph.node if n.op_type == "Add"}
    casts = {n.output[0]: n.attribute[0].i for n in converted.graph.node if n.op_type == "Cast"}
    assert casts.get(adds["add1"].input[0]) == TensorProto.FLOAT16 and adds["add3"].input[0] == "r2"  # f16 Adds read via Casts
    onnx.checker.check_model(converted, full_check=True)
    feeds = {"x": np.linspace(-2, 2, 4, dtype=np.float32)}
    assert_close(run(model, feeds), run(converted, feeds), 2e-2, 2e-2)


def test_schema_typing_starts_over_with_inference_when_a_late_value_cannot_be_typed(caplog: pytest.LogCaptureFixture) -> None:
    """RandomNormalLike's output type is its `dtype` attribute, which schema typing does not
    read: met after other nodes, the converter must start over with onnx's inference."""
    from onnx import helper

    model = _repeated_chain(3)
    tail = helper.make_node("RandomNormalLike", ["r2"], ["noise"], dtype=TensorProto.FLOAT, name="noise")
    mix = helper.make_node("Mul", ["r2", "noise"], ["z"], name="mix")
    model.graph.node.extend([tail, mix])
    del model.graph.output[:]
    model.graph.output.extend([helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    with caplog.at_level("DEBUG", logger="rlx_onnx_amp.rewrite"):
        converted, report = convert_and_report(model, "always-f16")
    assert any("schema typing gave up (output 'noise' of RandomNormalLike)" in r.message for r in caplog.records)
    onnx.checker.check_model(converted, full_check=True)
    noise = next(n for n in converted.graph.node if n.name == "noise")
    assert [a.i for a in noise.attribute if a.name == "dtype"] == [TensorProto.FLOAT16]  # lowered with its node (rule typed-attributes)
    assert report.index.decisions == {str(i): "f16" for i in range(len(model.graph.node))}
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    out = run(converted, {"x": np.ones(4, np.float32)})[0]
    assert out.dtype == np.float32 and out.shape == (4,)


def test_a_source_kept_f32_is_clamped_for_its_low_readers() -> None:
    """ConstantOfShape cannot hold bf16 before opset 20, so under auto-mixed-bf16 its -3.4e38
    mask plane stays f32 and is cast to bf16 where it is read. Past bf16's range that Cast
    would give -Inf (and -Inf * 0 = NaN in the mask multiply): the value is clamped in f32."""
    fixture = HEALTHY["constant_of_shape"]()
    converted, report = convert_and_report(fixture.model, "auto-mixed-bf16")
    neg = _node(converted, "mask_plane")
    value = onnx.numpy_helper.to_array(neg.attribute[0].t)
    assert neg.attribute[0].t.data_type == TensorProto.FLOAT
    assert value.tolist() == [-3.3895313892515355e38]  # bf16's largest finite value
    assert report.clamped["neg"]["clamped"] == 1
    readers = [n for n in all_nodes(converted) if n.op_type == "Cast" and n.input[0] == "neg"]
    assert [n.attribute[0].i for n in readers] == [TensorProto.BFLOAT16]
    assert convert(converted, "auto-mixed-bf16").SerializeToString() == converted.SerializeToString()


def test_every_kept_node_has_a_stable_reason_code() -> None:
    """Reports name why a node keeps its types by a code (report.REASON_CODES), whatever the
    wording of the reason: every kept node of every fixture, policy and target has one, and
    the fixtures built for a rule get that rule's code."""
    from rlx_onnx_amp.rewrite.rules import REASON_CODES

    seen: dict[str, set[str]] = {}
    for name, build in {**HEALTHY, **BROKEN_IN_F16}.items():
        for policy in ("always-f16", "auto-mixed", "auto-mixed-bf16"):
            for target in ("cuda", "cpu"):
                _, report = convert_and_report(build().model, policy, target=target)
                for k in report.kept_f32:
                    assert k.code in REASON_CODES, (name, policy, target, k)
                    assert k.to_json()["code"] == k.code
                    seen.setdefault(name, set()).add(k.code)
    assert "qdq-region" in seen["qdq_model"] and "control-flow" in seen["control_flow"]
    assert "kernel-table" in seen["conv_net"]  # bf16 Conv on either provider
    _, report = convert_and_report(HEALTHY["transformer_block"]().model, "always-f16", keep_f32_ops=["Softmax"])
    assert {(k.op, k.code) for k in report.kept_f32} == {("Softmax", "user-keep")}


def test_a_conversion_that_changed_nothing_says_so(tmp_path: Path) -> None:
    for name, build in {**HEALTHY, **BROKEN_IN_F16}.items():
        _, report = convert_and_report(build().model, "always-f32")
        assert not report.changed and report.to_json()["changed"] is False, name
    _, report = convert_and_report(HEALTHY["transformer_block"]().model, "always-f16")
    assert report.changed
    src = tmp_path / "m.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    from tests.helpers import rlx

    same = rlx(src, "--policy", "always-f32", "-o", tmp_path / "o.onnx", cwd=REPO)
    assert same.returncode == 0 and "nothing changed: every node keeps its original types" in same.stdout
    lowered = rlx(src, "--policy", "always-f16", "-o", tmp_path / "o.onnx", cwd=REPO)
    assert lowered.returncode == 0 and "nothing changed" not in lowered.stdout

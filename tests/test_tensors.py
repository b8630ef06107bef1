"""Narrowing weights: the batched path for small tensors gives what `narrow` gives, tensor by tensor."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp import convert_and_report
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.tensors import SMALL_TENSOR_ELEMENTS, NarrowBatch, check_inline_data, narrow, tensor_nbytes

# Inf, NaN, signed zeros, values each precision clamps (past 65504; f32's max past bf16's) or
# flushes to zero (1e-30 in f16, 1e-44 in bf16), and the edges of f16's rounding to Inf.
_SPECIALS = np.array([np.inf, -np.inf, np.nan, 1e9, -7e4, 1e-9, -1e-30, 1e-44, 0.0, -0.0, 3e38,
                      np.finfo(np.float32).max, 65519.0, 65520.0], dtype=np.float32)


def _arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [_SPECIALS.copy()]
    for _ in range(int(rng.integers(1, 40))):
        n = int(rng.integers(1, SMALL_TENSOR_ELEMENTS + 1))
        a = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 6)).astype(np.float32)
        if rng.random() < 0.3:
            a[rng.integers(0, n, size=3)] = rng.choice(_SPECIALS, size=3)
        arrays.append(a)
    return arrays


@pytest.mark.parametrize("precision", [Precision.F16, Precision.BF16])
@pytest.mark.parametrize("seed", range(20))
def test_batch_matches_narrow_per_tensor(precision: Precision, seed: int) -> None:
    arrays = _arrays(seed)
    tensors = [numpy_helper.from_array(a, f"t{k}") for k, a in enumerate(arrays)]
    batch = NarrowBatch(precision)
    assert all(batch.add(t, t.name) for t in tensors)
    results = batch.run()
    assert [key for key, _ in results] == [t.name for t in tensors] and len(batch) == 0
    for array, tensor, (_, stats) in zip(arrays, tensors, results):
        low, expected = narrow(array, precision)
        assert tensor.data_type == precision.elem_type
        assert tensor.raw_data == low.tobytes()
        assert (stats.clamped, stats.flushed) == (expected.clamped, expected.flushed)
        assert stats.worst == expected.worst
    assert results[0][1].clamped and results[0][1].flushed  # the specials exercise both counts


def test_batch_refuses_what_it_cannot_narrow_alone() -> None:
    batch = NarrowBatch(Precision.F16)
    big = numpy_helper.from_array(np.ones(SMALL_TENSOR_ELEMENTS + 1, np.float32), "big")
    ints = numpy_helper.from_array(np.ones(4, np.int64), "ints")
    empty = numpy_helper.from_array(np.ones(0, np.float32), "empty")
    listed = TensorProto(name="listed", data_type=TensorProto.FLOAT, dims=[2], float_data=[1.0, 2.0])  # no raw_data
    external = numpy_helper.from_array(np.ones(4, np.float32), "external")
    external.data_location = TensorProto.EXTERNAL
    short = numpy_helper.from_array(np.ones(4, np.float32), "short")
    short.dims[0] = 5  # raw_data holds 4 values
    for tensor in (big, ints, empty, listed, external, short):
        assert not batch.add(tensor, tensor.name), tensor.name
    assert len(batch) == 0 and batch.run() == []


def test_many_small_constants_clamp_and_count_like_one() -> None:
    """A graph of many small weights (the batched path) reports the same clamps per tensor."""
    from onnx import helper

    rng = np.random.default_rng(7)
    nodes, inits, prev = [], [], "x"
    expected: dict[str, tuple[int, int]] = {}
    for k in range(30):
        bias = rng.standard_normal(8).astype(np.float32)
        if k % 3 == 0:
            bias[k % 8] = 1e6 * (1 if k % 2 else -1)  # clamped under f16
        if k % 5 == 0:
            bias[(k + 1) % 8] = 1e-9  # flushed to zero
        inits.append(numpy_helper.from_array(bias, f"b{k}"))
        _low, stats = narrow(bias, Precision.F16)
        if stats.clamped or stats.flushed:
            expected[f"b{k}"] = (stats.clamped, stats.flushed)
        # Each bias is added before a Softmax: a mask sentinel (rule weight-range), so it is clamped.
        nodes.append(helper.make_node("Add", [prev, f"b{k}"], [f"a{k}"], name=f"add{k}"))
        nodes.append(helper.make_node("Softmax", [f"a{k}"], [f"p{k}"], name=f"softmax{k}"))
        prev = f"p{k}"
    graph = helper.make_graph(nodes, "adds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    converted, report = convert_and_report(model, "always-f16")
    assert {k: (v["clamped"], v["flushed_to_zero"]) for k, v in report.clamped.items()} == expected
    for init, original in zip(converted.graph.initializer, inits):
        assert init.data_type == TensorProto.FLOAT16
        assert np.array_equal(numpy_helper.to_array(init), narrow(numpy_helper.to_array(original), Precision.F16)[0])


def test_the_largest_finite_magnitude_reads_in_chunks(tmp_path, monkeypatch) -> None:
    """WeightSource.max_finite_abs (rule weight-range's scan): Inf and NaN are left out, the
    sign is not, and an external tensor read chunk by chunk gives what the whole array gives."""
    import rlx_onnx_amp.tensors as tensors_module
    from rlx_onnx_amp.tensors import WeightSource

    monkeypatch.setattr(tensors_module, "CHUNK_ELEMENTS", 7)
    values = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    values[[3, 50, 97]] = [np.inf, np.nan, -np.inf]
    values[61] = -70000.0
    inline = numpy_helper.from_array(values, "w")
    assert WeightSource(None).max_finite_abs(inline) == 70000.0
    (tmp_path / "w.data").write_bytes(b"\0" * 64 + values.tobytes())
    external = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[100], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "w.data"), ("offset", "64"), ("length", "400")):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    assert WeightSource(tmp_path).max_finite_abs(external) == 70000.0
    assert WeightSource(None).max_finite_abs(numpy_helper.from_array(np.array([np.nan, np.inf], np.float32))) == 0.0


def _tensors_of_every_storage() -> list[TensorProto]:
    """Inline tensors stored every way the load's check reads: raw bytes, typed fields, packed
    4-bit, strings, scalars and empty ones."""
    rng = np.random.default_rng(5)
    found = [
        numpy_helper.from_array(rng.standard_normal((3, 4)).astype(dtype), name=f"raw_{np.dtype(dtype).name}")
        for dtype in (np.float32, np.float16, np.float64, np.int64, np.int8, np.bool_)
    ]
    found.append(helper.make_tensor("typed_float", TensorProto.FLOAT, [2, 3], [1.0] * 6))
    found.append(helper.make_tensor("typed_int64", TensorProto.INT64, [4], [1, 2, 3, 4]))
    found.append(helper.make_tensor("typed_f16", TensorProto.FLOAT16, [2], np.array([1, 2], np.float16).view(np.uint16)))
    found.append(helper.make_tensor("int4", TensorProto.INT4, [5], [1, -2, 3, -4, 5]))
    found.append(numpy_helper.from_array(np.array([b"a", b"bc"], dtype=object), name="strings"))
    found.append(helper.make_tensor("scalar", TensorProto.FLOAT, [], [2.5]))
    found.append(helper.make_tensor("empty", TensorProto.FLOAT, [0, 3], []))
    return found


@pytest.mark.parametrize("tensor", _tensors_of_every_storage(), ids=lambda t: t.name)
def test_the_loads_check_gives_each_tensors_size(tensor: TensorProto) -> None:
    # The load checks every tensor and takes its size from the same read: what it returns is
    # what tensor_nbytes says (the external-data decision and the progress total add these up).
    assert check_inline_data(tensor, "m.onnx") == tensor_nbytes(tensor)


def _short_raw() -> TensorProto:
    """A float [2, 3] with 20 bytes of raw data, not 24 (make_tensor refuses to make such tensors)."""
    return TensorProto(name="short", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=b"\0" * 20)


@pytest.mark.parametrize(
    ("tensor", "said"),
    [
        (_short_raw(), "holds 20 bytes of data, its type and dims \\[2, 3\\] need 24"),
        (TensorProto(name="few", data_type=TensorProto.FLOAT, dims=[2, 3], float_data=[1.0] * 5), "holds 5 values, its dims \\[2, 3\\] need 6"),
        (TensorProto(name="negative", data_type=TensorProto.FLOAT, dims=[-1]), "has negative dims \\[-1\\]"),
    ],
    ids=["raw", "typed", "dims"],
)
def test_the_loads_check_refuses_data_that_does_not_fit(tensor: TensorProto, said: str) -> None:
    with pytest.raises(InputError, match=f"m.onnx: tensor '{tensor.name}' {said}"):
        check_inline_data(tensor, "m.onnx")

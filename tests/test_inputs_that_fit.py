"""Inputs that fit the model (issue 39): integer inputs that index another tensor are drawn
within its extent, a degenerate range is a constant, and an integer scalar the graph compares
with a constant gets that constant; a scalar nothing hints at writes the model unverified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.verification.inputs import InputSpec, synthesize
from tests.helpers import rlx, save_integer_scalar_model


def _gather_elements() -> onnx.ModelProto:
    """y = GatherElements(data [2, 5], idx [2, 5], axis 1) * 1.0: indices up to 4 are valid."""
    graph = helper.make_graph(
        [helper.make_node("GatherElements", ["data", "idx"], ["g"], axis=1),
         helper.make_node("Mul", ["g", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 5]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _sample_rate_model() -> onnx.ModelProto:
    """A voice model's branch on its sample rate: If(Equal(sr, 16000)) scales x, else fails
    (a Div by zero shape: a Reshape to an impossible shape), as a trained VAD's does."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "half"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    bad = numpy_helper.from_array(np.array([3, 3], np.int64), "bad")
    other = helper.make_graph([helper.make_node("Reshape", ["x", "bad"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])], [bad])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
         helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other)],
        "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate"), numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_index_inputs_are_drawn_within_what_they_index(tmp_path: Path) -> None:
    model = _gather_elements()
    feeds = synthesize(model, InputSpec(samples=1))
    assert feeds["idx"].min() >= 0 and feeds["idx"].max() < 5 and feeds["idx"].max() >= 2  # all of 0..4, not 0..1
    src = tmp_path / "g.onnx"
    onnx.save(model, str(src))
    assert rlx(src, "-p", "always-f16", "-o", tmp_path / "o.onnx", "--provider", "cpu", "-q").returncode == 0


def test_a_degenerate_range_is_a_constant(tmp_path: Path) -> None:
    feeds = synthesize(_gather_elements(), InputSpec(ranges={"idx": (0, 0), "data": (0.5, 0.5)}))
    assert not feeds["idx"].any() and np.all(feeds["data"] == 0.5)
    src = tmp_path / "g.onnx"
    onnx.save(_gather_elements(), str(src))
    result = rlx(src, "-o", tmp_path / "o.onnx", "--provider", "cpu", "--input-range", "idx:0,0", "-q")
    assert result.returncode == 0, result.stderr


def test_an_integer_scalar_the_graph_compares_gets_that_value(tmp_path: Path) -> None:
    src = tmp_path / "vad.onnx"
    onnx.save(_sample_rate_model(), str(src))
    assert int(synthesize(_sample_rate_model(), InputSpec())["sr"]) == 16000
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "o.onnx", "--provider", "cpu", "--report-json",
                 tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["verify"]["passed"]


def test_an_integer_scalar_nothing_hints_at_is_written_unverified(tmp_path: Path) -> None:
    src = save_integer_scalar_model(tmp_path / "n.onnx")
    plain = rlx(src, "-o", tmp_path / "o.onnx", "--provider", "cpu")
    assert plain.returncode == 4 and (tmp_path / "o.onnx").exists()
    assert "--input-range n:LO,HI" in plain.stderr
    strict = rlx(src, "-o", tmp_path / "o2.onnx", "--provider", "cpu", "--verify")
    assert strict.returncode == 2 and not (tmp_path / "o2.onnx").exists()


def _merged_step() -> onnx.ModelProto:
    """A merged decoder's interface, as optimum writes it: ids, mask and positions of symbolic
    lengths, a past cache, and `use_cache_branch` choosing the If's cached branch."""
    i64, f = TensorProto.INT64, TensorProto.FLOAT

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Cast", ["input_ids"], [f"logits_{name}"], to=f)], name, [],
                                 [helper.make_tensor_value_info(f"logits_{name}", f, ["batch", "seq"])])

    graph = helper.make_graph(
        [helper.make_node("If", ["use_cache_branch"], ["logits"], then_branch=branch("cached"),
                          else_branch=branch("first"))],
        "merged",
        [helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
         helper.make_tensor_value_info("position_ids", i64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key_values.0.key", f, ["batch", 2, "past", 4]),
         helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info("logits", f, ["batch", "seq"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_merged_decoders_cached_branch_takes_one_new_token_after_its_past() -> None:
    """The set that takes the cached branch feeds one new token after the past, with the mask
    over past and token and the token's position after the past, as a generator's next step
    does; the other set feeds the whole prompt. A given --shape for the ids stays."""
    from rlx_onnx_amp.verification.inputs import synthesized_sets

    first, cached, *longer = synthesized_sets(_merged_step(), InputSpec(samples=2))
    # and as much again at the second size: twice the prompt, the cached step one token still
    assert [s["input_ids"].shape[1] for s in longer] == [2 * first["input_ids"].shape[1], 1]
    past = first["past_key_values.0.key"].shape[2]
    assert not first["use_cache_branch"][0] and cached["use_cache_branch"][0]
    prompt = first["input_ids"].shape[1]
    assert prompt > 1 and first["attention_mask"].shape == (1, past + prompt)
    assert cached["input_ids"].shape == (1, 1) and cached["past_key_values.0.key"].shape[2] == past
    assert cached["attention_mask"].shape == (1, past + 1) and (cached["attention_mask"] == 1).all()
    assert cached["position_ids"].tolist() == [[past]]
    given = synthesized_sets(_merged_step(), InputSpec(shapes={"input_ids": (1, 3)}, samples=2))
    assert [s["input_ids"].shape for s in given][:2] == [(1, 3), (1, 3)]


def test_a_merged_decoders_second_size_is_its_prompt_at_twice_the_length(tmp_path: Path) -> None:
    """The report's second size is the first set drawn at it (twice the prompt), not the cached
    branch's one-token set at the first size, whose shape differs too."""
    from rlx_onnx_amp.verification.options import VerifyOptions
    from rlx_onnx_amp.verification.reference import prepare_reference

    path = tmp_path / "merged.onnx"
    onnx.save(_merged_step(), str(path))
    reference = prepare_reference(path, VerifyOptions(provider="cpu"))
    second = reference.second_size()
    assert second is not None and second["input_ids"] == (1, 2 * reference.shapes()["input_ids"][1])

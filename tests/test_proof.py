"""The proof of a written model (`proof.prove`, run in this process): onnx's full checker, or
onnxruntime for an input the checker refuses, with its verdicts and messages word for word;
the report a conversion fills after the model is written is the one it filled before
(`rewrite.rewrite_model`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from rlx_onnx_amp import api
from rlx_onnx_amp.errors import AmpError, InputError
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.policy import policy_from_name
from rlx_onnx_amp.proof import checker_failure, prove
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model, rewrite_model
from tests.helpers import rlx


def _chain(path: Path, blocks: int = 3, broken: str = "") -> Path:
    """x -> (MatMul W_i -> Add b_i -> Relu) * blocks -> y. `broken="types"`: the last Add reads
    an Int64 bias, which the full checker's strict shape inference refuses (its type variable
    binds two types); `broken="op"`: the last Relu is an op no schema has, which its checks
    before the inference refuse (and onnxruntime cannot load)."""
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        last = i == blocks - 1
        bias_type = TensorProto.INT64 if broken == "types" and last else TensorProto.FLOAT
        inits += [h.make_tensor(f"W{i}", TensorProto.FLOAT, [4, 4], [0.1 * (k % 5) for k in range(16)]),
                  h.make_tensor(f"b{i}", bias_type, [4], [1, 2, 3, 4])]
        nodes += [h.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  h.make_node("NoSuchOp" if broken == "op" and last else "Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    graph = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def _genai_style(path: Path) -> Path:
    """onnxruntime's SimplifiedLayerNormalization in the default domain, as onnxruntime-genai's
    builder writes it: onnxruntime loads it, onnx.checker has no schema for it."""
    w = numpy_helper.from_array(np.full((8, 8), 0.1, np.float32), "W")
    g = numpy_helper.from_array(np.ones(8, np.float32), "g")
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"]),
             h.make_node("SimplifiedLayerNormalization", ["m", "g"], ["y"], axis=-1, epsilon=1e-5)]
    graph = h.make_graph(nodes, "genai", [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, g])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_sound_output_is_proved_by_the_checker(tmp_path: Path) -> None:
    model = _chain(tmp_path / "m.onnx")
    assert prove(model, model, "cpu", "in.onnx", "out.onnx") == "onnx.checker"
    assert prove(onnx.load(model), model, "cuda", "in.onnx", "out.onnx") == "onnx.checker"  # in memory too


@pytest.mark.parametrize("broken", ["types", "op"])
def test_a_broken_output_of_a_valid_input_is_our_bug(tmp_path: Path, broken: str) -> None:
    valid, output = _chain(tmp_path / "in.onnx"), _chain(tmp_path / "out.onnx", broken=broken)
    found = checker_failure(output)
    assert found is not None and ("NoSuchOp" in found) == (broken == "op")
    with pytest.raises(AmpError) as raised:
        prove(output, valid, "cpu", "in.onnx", "out.onnx")
    assert not isinstance(raised.value, InputError)
    assert str(raised.value) == f"out.onnx: the converted model fails onnx.checker; nothing written ({found})"


def test_an_input_neither_the_checker_nor_onnxruntime_accepts_is_bad_input(tmp_path: Path) -> None:
    bad = _chain(tmp_path / "in.onnx", broken="op")
    made: list[str] = []

    def source() -> Path:  # called only once the output fails the checker
        made.append("source")
        return bad

    with pytest.raises(InputError) as raised:
        prove(bad, source, "cpu", "in.onnx", "out.onnx")
    assert str(raised.value) == f"in.onnx: the input model fails onnx.checker ({checker_failure(bad)}); nothing written"
    assert made == ["source"]
    assert prove(_chain(tmp_path / "ok.onnx"), source, "cpu", "in.onnx", "out.onnx") == "onnx.checker"
    assert made == ["source"]


def test_an_input_only_onnxruntime_loads_is_proved_by_onnxruntime(tmp_path: Path) -> None:
    model = _genai_style(tmp_path / "genai.onnx")
    first = checker_failure(model)
    assert first is not None and first.startswith("No Op registered for SimplifiedLayerNormalization")
    assert prove(model, model, "cpu", "in.onnx", "out.onnx") == f"onnxruntime loads it (the input fails onnx.checker: {first})"


def test_the_report_names_the_proof(tmp_path: Path) -> None:
    """What prove returns is the report's `proof`, through the CLI's conversion."""
    for name, model in (("chain", _chain(tmp_path / "m.onnx")), ("genai", _genai_style(tmp_path / "g.onnx"))):
        report = tmp_path / f"{name}.json"
        result = rlx(model, "--policy", "always-f16", "-o", tmp_path / f"{name}.f16.onnx", "--no-verify",
                     "--report-json", report, "-q")
        assert result.returncode == 0, result.stderr
        proof = json.loads(report.read_text())["proof"]
        if name == "chain":
            assert proof == "onnx.checker"
        else:
            assert proof == f"onnxruntime loads it (the input fails onnx.checker: {checker_failure(model)})"


@pytest.mark.parametrize("policy", ["always-f16", "auto-mixed"])
def test_the_report_filled_after_the_model_is_written_is_the_same(tmp_path: Path, policy: str) -> None:
    model = onnx.load(_chain(tmp_path / "m.onnx"))
    once, twice = onnx.ModelProto(), onnx.ModelProto()
    once.CopyFrom(model)
    twice.CopyFrom(model)
    report = convert_model(once, policy_from_name(policy), ConvertOptions())
    with rewrite_model(twice, policy_from_name(policy), ConvertOptions()) as rewritten:
        saved = twice.SerializeToString()  # the model is whole before its report is filled
        later = rewritten.finish()
    assert saved == once.SerializeToString()
    assert later == report


def test_the_collector_runs_again_after_a_conversion_however_it_ends(tmp_path: Path) -> None:
    """stage_conversion pauses the garbage collector (a collection would walk the live plan)
    and restores it, after a refused input as after a written model."""
    import gc

    model = _chain(tmp_path / "m.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert gc.isenabled()
    with OutputSet() as staging:
        api.stage_conversion(model, tmp_path / "o.onnx", staging, RunPaths(), "always-f16")
    assert gc.isenabled()
    with OutputSet() as staging, pytest.raises(api.InputError, match="not a valid ONNX model"):
        api.stage_conversion(bad, tmp_path / "o2.onnx", staging, RunPaths(), "always-f16")
    assert gc.isenabled()


def test_the_checker_fallback_is_one_default_line_and_in_the_reports(tmp_path: Path) -> None:
    # Issue 49: an input the checker refuses but onnxruntime loads is converted and passes; the
    # default output says in one line that the proof was onnxruntime's, and so do the reports.
    model = _genai_style(tmp_path / "in.onnx")
    first = checker_failure(model)
    assert first is not None
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    done = rlx(model, "-o", tmp_path / "out.onnx", "--policy", "always-f16", "--report-md", md, "--report-html", page)
    assert done.returncode == 0, done.stderr
    line = f"proof: onnx.checker refuses the input ({first}); onnxruntime loads the input and the output"
    assert [x for x in done.stdout.splitlines() if x.startswith("proof:")] == [line]
    assert f"**{line[0].upper() + line[1:]}.**" in md.read_text()
    assert "onnx.checker refuses the input" in page.read_text()
    again = rlx(tmp_path / "out.onnx", "-o", tmp_path / "again.onnx", "--policy", "always-f16", "-q")
    assert "proof:" not in again.stdout  # -q: no table, no proof line

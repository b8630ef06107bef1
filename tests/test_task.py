"""Verdicts on the task (issue 39): where the element-wise check and the task disagree, the task
decides. A classifier whose logits drift past the element-wise bound but keep every class
passes; one whose class flips on a row that is no near-tie fails though element-wise passes at
the first step; an embedding is judged by its worst row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.directory import config_task
from rlx_onnx_amp.reports.record import TaskVerdict
from rlx_onnx_amp.verification.task import Task, choose_task, judge_task
from rlx_onnx_amp.verification.tolerance import Tolerance
from tests.helpers import rlx

TOL = Tolerance(atol=1e-2, rtol_of_max=1e-2, min_cosine=0.999)


def _verdict(task: Task, r: np.ndarray, c: np.ndarray) -> TaskVerdict:
    verdict = judge_task(task, "--task", {"y": (r, c)}, {"y": TOL})
    assert verdict is not None
    return verdict


def test_classify_judges_the_class_per_row_and_sets_near_ties_apart() -> None:
    r = np.array([[5.0, 1.0, 0.0], [2.0, 2.001, 0.0], [0.0, 3.0, 1.0]])
    moved = r + np.array([[0.9, 0.0, 0.0], [0.0, -0.01, 0.0], [0.0, 0.0, 0.0]])  # big drift, class kept; a tie flips
    v = _verdict(Task.CLASSIFY, r, moved)
    assert v.passed and v.outputs[0].set_apart == 1 and v.outputs[0].top1_agreement == 1.0
    flipped = r.copy()
    flipped[2] = [0.0, 1.0, 3.0]  # a clear class turned
    v = _verdict(Task.CLASSIFY, r, flipped)
    assert not v.passed and v.outputs[0].top1_agreement == 0.5


def test_embed_judges_the_worst_row_not_the_whole_tensor() -> None:
    rng = np.random.default_rng(0)
    r = rng.standard_normal((64, 16))
    c = r.copy()
    c[7] = -r[7]  # one row turned around: the cosine over the whole tensor is still 0.97
    v = _verdict(Task.EMBED, r, c)
    assert not v.passed and v.outputs[0].min_cosine is not None and v.outputs[0].min_cosine < -0.99
    assert _verdict(Task.EMBED, r, r * 1.001).passed
    # A row of zeros in the reference is counted apart; a candidate row gone NaN is the worst row.
    zeros, broken = r.copy(), r.copy()
    zeros[3] = 0.0
    z = _verdict(Task.EMBED, zeros, zeros * 1.001)
    assert z.passed and z.outputs[0].set_apart == 1
    broken[5, 2] = np.nan
    b = _verdict(Task.EMBED, r, broken)
    assert not b.passed and b.outputs[0].min_cosine == -1.0


def test_classify_counts_top5_agreement_per_row() -> None:
    """The reference's class among the candidate's five largest: a row whose top two swapped
    (no near-tie) fails top-1 and keeps top-5."""
    r = np.tile(np.arange(8, dtype=np.float64), (4, 1))  # class 7 on every row, margins of 1
    c = r.copy()
    c[1, [6, 7]] = c[1, [7, 6]]
    c[2, 7] = -10.0  # the class falls to the last place
    v = _verdict(Task.CLASSIFY, r, c)
    result = v.outputs[0]
    assert not v.passed and result.top1_agreement == 0.5 and result.top5_agreement == 0.75


def test_auto_picks_the_task_from_the_output_names_and_says_so() -> None:
    assert choose_task("auto", {"logits": (1, 8, 32)}) == (Task.CLASSIFY, ("logits",), "auto: output 'logits'")
    assert choose_task("auto", {"last_hidden_state": (1, 8, 16)})[0] is Task.EMBED
    assert choose_task("auto", {"y": (2, 3)}) == (Task.NONE, (), "auto: no output names a task")
    assert choose_task("classify", {"y": (2, 3)})[1] == ("y",)


def test_auto_takes_the_task_the_folders_config_names_where_the_interface_allows_it(tmp_path: Path) -> None:
    vit = ("classify", "config.json architectures ViTForImageClassification")
    assert choose_task("auto", {"y": (1, 10)}, None, vit) == (Task.CLASSIFY, ("y",), f"auto: {vit[1]}")
    # A seq2seq folder names generate; its encoder is no decoder step: its outputs decide.
    t5 = ("generate", "config.json architectures T5ForConditionalGeneration")
    assert choose_task("auto", {"last_hidden_state": (1, 8, 16)}, None, t5) == (
        Task.EMBED, ("last_hidden_state",), "auto: output 'last_hidden_state'")
    assert choose_task("none", {"y": (1, 10)}, None, vit)[0] is Task.NONE  # --task given: the config is not asked
    for files, want in [
        ({"genai_config.json": "{}"}, ("generate", "genai_config.json")),
        ({"modules.json": "[]", "config.json": '{"architectures": ["BertModel"]}'},
         ("embed", "modules.json (sentence-transformers)")),
        ({"config.json": '{"architectures": ["GPT2LMHeadModel"]}'}, ("generate", "config.json architectures GPT2LMHeadModel")),
        ({"config.json": '{"architectures": ["DetrForObjectDetection"]}'}, ("detect", "config.json architectures DetrForObjectDetection")),
        ({"config.json": '{"architectures": ["BertModel"]}'}, ("embed", "config.json architectures BertModel")),
        ({"config.json": '{"architectures": ["SomethingElse"]}'}, None),
        ({"config.json": "not json"}, None),
        ({}, None),
    ]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        assert config_task(folder) == want, files


def test_a_folders_config_decides_the_task_its_output_names_do_not(tmp_path: Path) -> None:
    """A classifier whose output is named `y`: alone, no output names a task and the element-wise
    check (too strict for f16 here) fails; in a folder whose config.json names an image
    classifier, its class per row is judged, and passes."""
    strict = ("--atol", "1e-6", "--rtol-of-max", "0", "--min-cosine", "1")
    alone = tmp_path / "alone"
    alone.mkdir()
    onnx.save(_logits_model(3.0, "y"), str(alone / "model.onnx"))
    result = rlx(alone, "-p", "always-f16", "-o", tmp_path / "a", "--provider", "cpu", *strict, "-q",
                 "--report-json", tmp_path / "a.json")
    assert result.returncode == 1
    assert "task" not in json.loads((tmp_path / "a.json").read_text())["models"][0]["verify"]  # element-wise decides
    folder = tmp_path / "vit"
    folder.mkdir()
    onnx.save(_logits_model(3.0, "y"), str(folder / "model.onnx"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["ViTForImageClassification"]}))
    result = rlx(folder, "-p", "always-f16", "-o", tmp_path / "b", "--provider", "cpu", *strict,
                 "--report-json", tmp_path / "b.json")
    assert result.returncode == 0, result.stdout + result.stderr
    task = json.loads((tmp_path / "b.json").read_text())["models"][0]["verify"]["task"]
    assert (task["task"], task["passed"]) == ("classify", True)
    assert task["chosen_by"] == "auto: config.json architectures ViTForImageClassification"
    assert "task classify (auto: config.json architectures ViTForImageClassification): PASSED" in result.stdout


def _logits_model(scale: float, output: str = "logits") -> onnx.ModelProto:
    """logits = x @ W * scale: a large scale moves every logit past the element-wise bound in
    f16 while the class of each row stays (the rows are far from ties)."""
    w = np.zeros((4, 6), np.float32)
    for i in range(4):
        w[i, i] = 1.0 + i
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "s"], [output])], "clf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [8, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(scale, np.float32), "s")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_task_decides_the_exit_code_where_element_wise_would_fail(tmp_path: Path) -> None:
    src = tmp_path / "clf.onnx"
    onnx.save(_logits_model(3.0), str(src))
    strict = ("--atol", "1e-6", "--rtol-of-max", "0", "--min-cosine", "1")  # element-wise fails any f16 rounding
    none = rlx(src, "-p", "always-f16", "-o", tmp_path / "a.onnx", "--provider", "cpu", "--task", "none", *strict,
               "-q", "--report-json", tmp_path / "none.json")
    assert none.returncode == 1
    auto = rlx(src, "-p", "always-f16", "-o", tmp_path / "b.onnx", "--provider", "cpu", *strict,
               "--report-json", tmp_path / "auto.json")
    assert auto.returncode == 0, auto.stderr
    verify = json.loads((tmp_path / "auto.json").read_text())["verify"]
    assert verify["passed"] and verify["task"]["task"] == "classify" and verify["task"]["chosen_by"] == "auto: output 'logits'"
    assert not verify["outputs"][0]["passed"]  # the element-wise row stays, as a diagnostic
    assert "task classify (auto: output 'logits'): PASSED" in auto.stdout

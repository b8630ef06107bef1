"""Verdicts on the task (issue 39): where the element-wise check and the task disagree, the task
decides. A classifier whose logits drift past the element-wise bound but keep every class
passes; one whose class flips on a row that is no near-tie fails though element-wise passes at
the first step; an embedding is judged by its worst row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.directory import config_task
from rlx_onnx_amp.reports.record import TaskVerdict
from rlx_onnx_amp.verification.task import Task, choose_task, judge_task
from rlx_onnx_amp.verification.tolerance import Tolerance
from tests.helpers import rlx, run

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


# -- issue 49: segmentation, verdicts that compare nothing, near-ties by the output's own scale --


def _segmenter(weight: np.ndarray) -> onnx.ModelProto:
    """A 1x1 Conv segmentation head: 8 feature channels in, one logit per class and pixel out
    (1 x C x 16 x 16)."""
    classes = weight.shape[0]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["logits"])], "seg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes, 16, 16])],
        [numpy_helper.from_array(weight.astype(np.float32), "w"),
         numpy_helper.from_array(np.linspace(-0.2, 0.2, classes, dtype=np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


SEG_WEIGHT = np.random.default_rng(49).standard_normal((5, 8, 1, 1))


def test_auto_judges_an_n_c_h_w_logits_output_per_pixel_over_its_classes() -> None:
    """The issue's case: a 1x21x64x64 `logits` is 4,096 pixels of 21 classes, not 1,344 rows of
    64 along the last axis; the input sets stack in front."""
    task, named, why = choose_task("auto", {"logits": (1, 21, 64, 64)})
    assert (task, named) == (Task.SEGMENT, ("logits",))
    assert why == "auto: output 'logits' (N x C x H x W: 21 classes on axis 1 for each of 4096 pixels)"
    r = np.random.default_rng(0).standard_normal((3, 1, 21, 64, 64))  # three input sets
    v = judge_task(task, why, {"logits": (r, r + 1e-6)}, {"logits": TOL})
    assert v is not None and v.judged and v.passed
    result = v.outputs[0]
    assert (result.rows, result.classes, result.top1_agreement, result.mean_iou) == (3 * 4096, 21, 1.0, 1.0)
    # An image of 3 channels named `output` is no segmenter's; asked for, any N x C x H x W is.
    assert choose_task("auto", {"output": (1, 3, 64, 64)})[0] is Task.NONE
    assert choose_task("segment", {"output": (1, 3, 64, 64)})[1] == ("output",)
    assert choose_task("auto", {"out": (1, 21, 64, 64), "aux": (1, 21, 64, 64)})[1] == ("out",)  # torchvision's
    assert choose_task("auto", {"logits": (1, 1000, 1, 1)})[0] is Task.NONE  # more classes than pixels
    vit = ("segment", "config.json architectures SegformerForSemanticSegmentation")
    assert choose_task("auto", {"y": (1, 150, 128, 128)}, None, vit) == (Task.SEGMENT, ("y",), f"auto: {vit[1]}")


def test_segment_counts_pixel_agreement_and_mean_iou_against_onnxruntime(tmp_path: Path) -> None:
    """A 1x1 Conv head auto-judged as `segment`: f16 keeps every pixel's class; a candidate whose
    classes 0 and 1 trade weights flips them on many pixels and fails, with the figures numpy
    gives on both models' onnxruntime outputs over the same inputs."""
    src = tmp_path / "seg.onnx"
    onnx.save(_segmenter(SEG_WEIGHT), str(src))
    f16 = rlx(src, "-p", "always-f16", "-o", tmp_path / "seg16.onnx", "--provider", "cpu",
              "--report-json", tmp_path / "f16.json")
    assert f16.returncode == 0, f16.stdout + f16.stderr
    task = json.loads((tmp_path / "f16.json").read_text())["verify"]["task"]
    assert (task["task"], task["passed"]) == ("segment", True)
    assert task["chosen_by"] == "auto: output 'logits' (N x C x H x W: 5 classes on axis 1 for each of 256 pixels)"
    result = task["outputs"][0]
    assert result["rows"] == 256 and result["classes"] == 5 and result["top1_agreement"] >= 0.99
    assert result["mean_iou"] >= 0.95 and "task segment (auto: output 'logits'" in f16.stdout
    assert "of 256 pixels keep their class of 5, mean IoU" in f16.stdout

    swapped = SEG_WEIGHT.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    cand = tmp_path / "swapped.onnx"
    onnx.save(_segmenter(swapped), str(cand))
    bad = rlx("verify", src, cand, "--provider", "cpu", "--samples", "2", "--save-inputs", tmp_path / "in.npz",
              "--report-json", tmp_path / "bad.json")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    verify = json.loads((tmp_path / "bad.json").read_text())["verify"]
    result = verify["task"]["outputs"][0]
    assert verify["task"]["task"] == "segment" and not verify["task"]["passed"] and not verify["passed"]
    feeds = np.load(tmp_path / "in.npz")
    runs = [(run(_segmenter(SEG_WEIGHT), {"x": feeds[k]})[0], run(_segmenter(swapped), {"x": feeds[k]})[0])
            for k in ("x", "x#1")]
    ref, got = (np.moveaxis(np.stack([r[i] for r in runs]), 2, -1).reshape(-1, 5) for i in (0, 1))
    top2 = np.sort(ref, axis=1)[:, -2:]
    judged = top2[:, 1] - top2[:, 0] > verify["rtol_of_max"][""] * (ref.max() - ref.min())
    ref_class, got_class = ref[judged].argmax(1), got[judged].argmax(1)
    ious = [((ref_class == k) & (got_class == k)).sum() / ((ref_class == k) | (got_class == k)).sum()
            for k in np.unique(ref_class)]
    assert result["rows"] == 512 and result["set_apart"] == int((~judged).sum())
    assert result["top1_agreement"] == pytest.approx(float(np.mean(ref_class == got_class)))
    assert result["mean_iou"] == pytest.approx(float(np.mean(ious)))
    assert result["top1_agreement"] < 0.8 and result["mean_iou"] < 0.8


def test_near_ties_are_judged_by_the_outputs_own_scale() -> None:
    """Logits of 1e-7 with clear margins are judged as logits of 1 are (an absolute atol of 1e-2
    made every such row a near-tie); a constant output is all near-ties and judged by nothing."""
    r = np.array([[5.0, 1.0, 0.0], [2.0, 2.001, 0.0], [0.0, 3.0, 1.0]])
    flipped = r.copy()
    flipped[2] = [0.0, 1.0, 3.0]
    for scale in (1.0, 1e-7):
        v = _verdict(Task.CLASSIFY, r * scale, flipped * scale)
        assert v.judged and not v.passed and v.outputs[0].set_apart == 1 and v.outputs[0].top1_agreement == 0.5
    flat = _verdict(Task.CLASSIFY, np.zeros((2, 4)), np.eye(2, 4))
    assert not flat.judged and not flat.passed and flat.not_judged == "every row of y is a near-tie"


def test_a_verdict_that_compared_nothing_leaves_the_exit_code_to_element_wise(tmp_path: Path) -> None:
    """The issue's 3-node classifier, logits near 1e-7, two rows, under always-f16: its top two
    logits are equal on every row (a near-tie whatever the scale), so the task judges nothing
    and says so; f16 flushes the logits towards zero and the element-wise row (cosine) fails:
    exit 1, where `classify: PASSED` used to exit 0."""
    w = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "s"], ["y"]),
         helper.make_node("ReduceMax", ["y"], ["top"], axes=[1], keepdims=1),
         helper.make_node("Concat", ["y", "top"], ["logits"], axis=1)], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1e-7, np.float32), "s")],
    )
    src = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(src))
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "t16.onnx", "--provider", "cpu",
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 1, result.stdout + result.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    task = verify["task"]
    assert (task["task"], task["passed"], task["not_judged"]) == ("classify", False, "every row of logits is a near-tie")
    assert task["outputs"][0]["set_apart"] == 2 and not verify["passed"]
    assert verify["outputs"][0]["failed_checks"] == ["cosine"]
    assert ("task classify (auto: output 'logits'): not judged (every row of logits is a near-tie); "
            "the element-wise verdict decides") in result.stdout


def test_a_detection_verdict_with_every_detection_at_the_cut_is_not_judged() -> None:
    """A Faster R-CNN's case: every detection within the tolerance of the score cut is set apart,
    recall and precision are n/a; that is no pass, the element-wise rows decide."""
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 40]], np.float32)
    ref = {"boxes": boxes, "scores": np.array([0.505, 0.498], np.float32), "labels": np.array([1, 2])}
    cand = {"boxes": boxes[::-1].copy(), "scores": np.array([0.51, 0.499], np.float32), "labels": np.array([2, 1])}
    pairs = {n: (ref[n], cand[n]) for n in ref}
    v = judge_task(Task.DETECT, "--task", pairs, dict.fromkeys(pairs, TOL), runs=([ref], [cand]))
    assert v is not None and not v.judged and not v.passed
    assert v.not_judged == "every detection of boxes is at the score cut" and v.outputs[0].set_apart == 4
    high = np.array([0.9, 0.8], np.float32)  # off the cut: judged, the same detections in another order
    runs = ([{**ref, "scores": high}], [{**cand, "scores": high[::-1].copy()}])
    v = judge_task(Task.DETECT, "--task", pairs, dict.fromkeys(pairs, TOL), runs=runs)
    assert v is not None and v.judged and v.passed and v.outputs[0].summary == (
        "recall 100%, precision 100%, mean IoU 1.000 over 1 images")


def test_a_generation_with_no_token_step_is_not_judged() -> None:
    """A decoder whose candidate took no greedy step (no prompt set could take a second one) is
    judged by nothing: its verdict does not pass and says why."""
    v = judge_task(Task.GENERATE, "--task", {"logits": (np.zeros((1, 4)), np.zeros((1, 4)))}, {"logits": TOL},
                   steps=([], []))
    assert v is not None and not v.judged and not v.passed and v.not_judged == "no token step of logits"

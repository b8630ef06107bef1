"""The detector families users ship, judged on `detect` (issue 50): ultralytics' raw YOLOv8 head
and its end-to-end export (tiny random-weight files from fixtures/export_ultralytics.py, read
as committed), YOLOv5's raw head, an `N x 300 x 6` end-to-end output and DETR's `logits` +
`pred_boxes` (built here, seeded). Each is decoded to detections (confidence cut, class-aware
NMS for the raw heads), matched against onnxruntime's f32 run; where nothing reaches the cut,
the verdict says so and the element-wise rows decide."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.verification.detect import (
    LAYOUTS,
    DetectLayout,
    Layout,
    decoded,
    detection_outputs,
    layout_of,
    metadata_task,
)
from rlx_onnx_amp.verification.task import Task, choose_task, judge_task
from rlx_onnx_amp.verification.tolerance import Tolerance
from tests.helpers import rlx

ULTRA = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "ultralytics"
TOL = Tolerance(atol=1e-2, rtol_of_max=1e-2, min_cosine=0.999)
NO_DETECTION = "no detection of output0 reaches the score cut on these inputs; give images with --inputs"


def _run_model(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _layout(name: Layout) -> DetectLayout:
    return next(row for row in LAYOUTS if row.layout is name)


def _convert(src: Path, tmp_path: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    result = rlx(src, "-p", "always-f16", "-o", tmp_path / "out.onnx", "--provider", "cpu",
                 "--report-json", tmp_path / "r.json", *args)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, result.stdout, json.loads((tmp_path / "r.json").read_text())["verify"]


# -- ultralytics, exported -----------------------------------------------------------------------


def test_the_raw_yolov8_head_decodes_to_ultralytics_own_detections() -> None:
    """onnxruntime's run of the raw head, cut at conf 0.25 and NMS'd at IoU 0.7 here, gives the
    detections ultralytics' `non_max_suppression` gave on the PyTorch model (saved by the
    export script): the same 19 boxes, scores and classes."""
    expected = np.load(ULTRA / "yolov8-nc3.expected.npz")
    run = _run_model(ULTRA / "yolov8-nc3.onnx", {"images": expected["images"]})
    shapes = {n: v.shape for n, v in run.items()}
    assert detection_outputs(shapes) == ("output0",) and layout_of(("output0",), shapes).layout is Layout.YOLO_V8
    boxes, scores, classes, _ = decoded(_layout(Layout.YOLO_V8), ("output0",), run, 0.25)[0]
    want = expected["detections"]
    assert len(scores) == len(want) == 19
    np.testing.assert_allclose(scores, want[:, 4], atol=1e-5)
    np.testing.assert_array_equal(classes, want[:, 5].astype(np.int64))
    np.testing.assert_allclose(boxes, want[:, :4], atol=1e-3)


@pytest.mark.parametrize(("name", "elementwise"), [("yolov8-nc3", True), ("yolo26-nc3", False)])
def test_auto_chooses_detect_from_ultralytics_metadata(tmp_path: Path, name: str, elementwise: bool) -> None:
    """The raw head (`1 x 7 x 84`) and the end-to-end export (`1 x 84 x 6`) are both named
    `output0`: auto takes `detect` from their metadata_props. The end-to-end rows come in score
    order, which float16 reshuffles: element-wise they fail, while every detection is found."""
    src = ULTRA / f"{name}.onnx"
    assert metadata_task(onnx.load(str(src))) == ("detect", "metadata_props task=detect (ultralytics)")
    code, stdout, verify = _convert(src, tmp_path, "--task", "auto")
    task = verify["task"]
    assert (code, task["task"], task["chosen_by"], task["passed"]) == (
        0, "detect", "auto: metadata_props task=detect (ultralytics)", True)
    result = task["outputs"][0]
    assert (result["recall"], result["precision"], result["rows"]) == (1.0, 1.0, 1) and result["mean_iou"] > 0.9
    assert verify["outputs"][0]["passed"] is elementwise
    assert "task detect (auto: metadata_props task=detect (ultralytics)): PASSED; output0 PASS: recall 100%" in stdout


def test_without_metadata_auto_leaves_a_raw_head_alone_and_task_detect_reads_it(tmp_path: Path) -> None:
    model = onnx.load(str(ULTRA / "yolov8-nc3.onnx"))
    del model.metadata_props[:]
    src = tmp_path / "bare.onnx"
    onnx.save(model, str(src))
    assert choose_task("auto", {"output0": (1, 7, 84)}) == (Task.NONE, (), "auto: no output names a task")
    assert choose_task("detect", {"output0": (1, 7, 84)})[:2] == (Task.DETECT, ("output0",))
    code, _, verify = _convert(src, tmp_path, "--task", "detect")
    assert code == 0 and verify["task"]["chosen_by"] == "--task" and verify["task"]["outputs"][0]["recall"] == 1.0


def test_a_detector_with_nothing_over_the_cut_is_not_judged(tmp_path: Path) -> None:
    """The class biases 20 lower: no score reaches 0.25 on any input; the task says so and asks
    for images, and the element-wise rows decide the exit code."""
    model = onnx.load(str(ULTRA / "yolov8-nc3.onnx"))
    bias = next(t for t in model.graph.initializer if t.name == "model.22.cv3.0.2.bias")  # shared by the 3 levels
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) - 20.0, bias.name))
    src = tmp_path / "silent.onnx"
    onnx.save(model, str(src))
    code, stdout, verify = _convert(src, tmp_path, "--task", "auto")
    task = verify["task"]
    assert (task["task"], task["passed"], task["not_judged"]) == ("detect", False, NO_DETECTION)
    assert code == 0 and verify["passed"] and verify["outputs"][0]["passed"]  # element-wise decided
    assert f"not judged ({NO_DETECTION}); the element-wise verdict decides" in stdout


# -- hand-built layouts ----------------------------------------------------------------------------


def _dense_model(name: str, rows: int, features: int, outputs: dict[str, list[str]], seed: int) -> onnx.ModelProto:
    """`x` [1, rows, features] -> each output built from seeded dense heads (`outputs` maps an
    output to its columns' nodes, built below)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def head(tag: str, width: int, scale: float, sigmoid: bool = True) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal((features, width)) * scale).astype(np.float32),
                                             f"w_{tag}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w_{tag}"], [f"{tag}_lin"]))
        if not sigmoid:
            return f"{tag}_lin"
        nodes.append(helper.make_node("Sigmoid", [f"{tag}_lin"], [f"{tag}_sig"]))
        return f"{tag}_sig"

    def scaled(tag: str, value: str, factor: float) -> str:
        inits.append(numpy_helper.from_array(np.array(factor, np.float32), f"k_{tag}"))
        nodes.append(helper.make_node("Mul", [value, f"k_{tag}"], [f"{tag}_scaled"]))
        return f"{tag}_scaled"

    outs = []
    for out, parts in outputs.items():
        columns = []
        for part in parts:
            if part == "centres":  # cx, cy over a 64-pixel image; w, h up to 24
                columns += [scaled("c", head("c", 2, 1.0), 64.0), scaled("wh", head("wh", 2, 1.0), 24.0)]
            elif part == "corners":
                lo = scaled("lo", head("lo", 2, 1.0), 48.0)
                nodes.append(helper.make_node("Add", [lo, scaled("ext", head("ext", 2, 1.0), 16.0)], ["hi"]))
                columns += [lo, "hi"]
            elif part.startswith("probs"):  # probs:WIDTH, spread from ~0 to ~1
                columns.append(head(part.replace(":", ""), int(part.split(":")[1]), 3.0))
            elif part.startswith("logits"):
                columns.append(head("logits", int(part.split(":")[1]), 3.0, sigmoid=False))
            elif part == "unit_boxes":  # DETR's centre and size, in [0, 1]
                columns.append(head("unit", 4, 1.0))
            elif part == "class":  # a class index as float, the argmax of 3 class logits
                nodes.append(helper.make_node("ArgMax", [head("cls", 3, 1.0, sigmoid=False)], ["cls_idx"],
                                              axis=2, keepdims=1))
                nodes.append(helper.make_node("Cast", ["cls_idx"], ["cls_f"], to=TensorProto.FLOAT))
                columns.append("cls_f")
        nodes.append(helper.make_node("Concat", columns, [out], axis=2) if len(columns) > 1
                     else helper.make_node("Identity", columns, [out]))
        outs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, rows, None]))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, features])],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


#: layout -> (the model's outputs, the output named in the verdict, what auto finds without metadata)
HAND_BUILT = {
    Layout.YOLO_V5: ({"output0": ["centres", "probs:1", "probs:4"]}, "output0", Task.NONE),  # 1 x 200 x 9
    Layout.END_TO_END: ({"output0": ["corners", "probs:1", "class"]}, "output0", Task.NONE),  # 1 x 300 x 6
    Layout.DETR: ({"logits": ["logits:4"], "pred_boxes": ["unit_boxes"]}, "pred_boxes", Task.DETECT),
}
ROWS = {Layout.YOLO_V5: 200, Layout.END_TO_END: 300, Layout.DETR: 20}


@pytest.mark.parametrize("layout", list(HAND_BUILT), ids=lambda layout: layout.name)
def test_task_detect_accepts_each_layout(tmp_path: Path, layout: Layout) -> None:
    outputs, judged, auto = HAND_BUILT[layout]
    src = tmp_path / "det.onnx"
    onnx.save(_dense_model(layout.name, ROWS[layout], 8, outputs, seed=5), str(src))
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (1, ROWS[layout], 8)).astype(np.float32)}
    shapes = {n: v.shape for n, v in _run_model(src, feeds).items()}
    names = detection_outputs(shapes)
    assert names[0] == judged and layout_of(names, shapes).layout is layout
    assert choose_task("auto", shapes)[0] is auto
    code, _, verify = _convert(src, tmp_path, "--task", "detect")
    task = verify["task"]
    assert task["task"] == "detect" and task.get("not_judged") is None, task
    result = task["outputs"][0]
    assert result["output"] == judged and result["recall"] == 1.0 and result["precision"] == 1.0
    assert code == 0 and task["passed"]


def test_yolov5_scores_are_objectness_times_class_and_nms_is_per_class() -> None:
    """Two boxes overlapping at IoU 0.81: of one class, NMS (IoU 0.45) keeps the better; of two
    classes, both. The score is objectness times the class probability (0.9 x 0.5 = 0.45)."""
    rows = np.array([[[20, 20, 10, 10, 0.9, 0.5, 0.1],     # cx, cy, w, h, obj, class 0, class 1
                      [21, 20, 10, 10, 0.8, 0.9, 0.1],
                      [50, 50, 10, 10, 0.2, 0.9, 0.1]]], np.float32)  # 0.18: under the cut
    v5 = _layout(Layout.YOLO_V5)
    boxes, scores, classes, _ = decoded(v5, ("output0",), {"output0": rows}, 0.25)[0]
    assert scores.tolist() == pytest.approx([0.72]) and classes.tolist() == [0]
    np.testing.assert_allclose(boxes, [[16, 15, 26, 25]])
    rows[0, 0, 5:] = [0.1, 0.5]  # the first box now class 1
    _, scores, classes, _ = decoded(v5, ("output0",), {"output0": rows}, 0.25)[0]
    assert scores.tolist() == pytest.approx([0.72, 0.45]) and classes.tolist() == [0, 1]


def test_detr_reads_its_last_class_as_no_object() -> None:
    """A query whose softmax peaks at the last class ("no object") is no detection, however sure."""
    logits = np.array([[[0.0, 8.0, 0.0], [0.0, 0.0, 9.0]]], np.float32)
    boxes = np.array([[[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1]]], np.float32)
    run = {"logits": logits, "pred_boxes": boxes}
    found = decoded(_layout(Layout.DETR), ("pred_boxes", "logits"), run, 0.5)[0]
    assert found[2].tolist() == [1] and np.allclose(found[0], [[0.4, 0.4, 0.6, 0.6]])
    only_none = {"logits": logits[:, 1:], "pred_boxes": boxes[:, 1:]}
    pairs = {n: (v, v) for n, v in only_none.items()}
    verdict = judge_task(Task.DETECT, "--task", {"pred_boxes": pairs["pred_boxes"], "logits": pairs["logits"]},
                         dict.fromkeys(pairs, TOL), runs=([only_none], [only_none]))
    assert verdict is not None and not verdict.judged and not verdict.passed
    assert verdict.not_judged == ("no detection of pred_boxes reaches the score cut on these inputs; "
                                  "give images with --inputs")


def test_a_detection_whose_two_best_classes_are_near_tied_matches_either() -> None:
    """A raw v8 head's box whose classes 0 and 1 score within the tolerance (0.02) of each other:
    the candidate may pick either, as a classifier's near-tie row; apart by more, a flip fails."""
    def head(p0: float, p1: float) -> dict[str, np.ndarray]:
        anchors = np.array([[20, 20, 10, 10, p0, p1, 0.0]] + [[0, 0, 1, 1, 0, 0, 0]] * 9, np.float32)
        return {"output0": anchors.T[None].copy()}  # 1 x 7 x 10

    def verdict(ref: tuple[float, float], cand: tuple[float, float]) -> bool:
        r, c = head(*ref), head(*cand)
        v = judge_task(Task.DETECT, "--task", {"output0": (r["output0"], c["output0"])}, {"output0": TOL},
                       runs=([r], [c]))
        assert v is not None and v.judged
        return v.passed

    assert verdict((0.80, 0.79), (0.79, 0.80))
    assert not verdict((0.80, 0.70), (0.70, 0.80))

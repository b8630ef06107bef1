"""The `detect` task (issues 39, 50): a detector's outputs decoded to each image's detections,
and the reference's detections found again in the candidate's by class and IoU.

The layouts detectors ship are data, one row each of `LAYOUTS`, in the order they are tried:

- DETR-style `logits` + `pred_boxes` (Hugging Face): boxes as centre and size, the softmax over
  the classes less the last ("no object"), as `post_process_object_detection` reads it;
- torchvision-style `boxes`, `scores`, `labels` (corners; Faster R-CNN, SSD, RetinaNet);
- an end-to-end export `N x K x 6` (x1, y1, x2, y2, score, class: ultralytics' `nms=True` and
  YOLOv10/YOLO26 `end2end` exports), already NMS'd;
- ultralytics' raw YOLOv8/v11 head `N x (4 + C) x A` (cx, cy, w, h, then C class probabilities,
  the sigmoid already applied), the score a box's largest class probability;
- YOLOv5's raw head `N x A x (5 + C)` (cx, cy, w, h, objectness, C class probabilities), the
  score objectness times the class probability.

The raw heads are cut at ultralytics' `conf` and class-aware NMS as ultralytics applies them
(numpy, no torch). The first two rows are found by their output names (so `--task auto` may
choose them); the others by shape only: under `--task detect`, or where the model's own
metadata says it detects (ultralytics' `metadata_props` `task: detect`, `metadata_task`), never
from a bare `N x C x A` tensor under `auto`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from rlx_onnx_amp.reports.record import TaskResult
from rlx_onnx_amp.verification.sizes import metadata
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = [
    "DETECTION_THRESHOLD",
    "LAYOUTS",
    "MATCH_IOU",
    "DetectLayout",
    "Layout",
    "decoded",
    "detection_outputs",
    "judge_detection",
    "layout_of",
    "metadata_task",
]

#: `task.Task.DETECT.value` (task.py imports this module, so it is spelled out here).
DETECT = "detect"

Shapes = Mapping[str, tuple[int, ...]]
#: One image's boxes (xyxy), scores, classes, and each one's other class where its two best are
#: within the tolerance (-1 where not): the candidate may pick either.
Detections = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: A run decoded: boxes (N x K x 4, corners), scores, classes, the second class's score and class.
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: A detector's named outputs: boxes (last axis 4), their scores, their classes (lower-case parts).
_BOXES, _SCORES, _LABELS = ("box", "dets"), ("score",), ("label", "class")
#: The score cut of the named layouts: Hugging Face's `post_process_object_detection` default,
#: and the cut torchvision's detection demos draw at (its models keep boxes from 0.05 on).
DETECTION_THRESHOLD = 0.5
#: ultralytics' `predict` defaults: `conf` 0.25 (not `val`'s 0.001, which keeps every box of a
#: random-weight model and judges noise), `iou` 0.7, `max_det` 300.
ULTRALYTICS_CONF, ULTRALYTICS_IOU, MAX_DET = 0.25, 0.7, 300
#: YOLOv5's own `detect.py` NMS IoU (its `conf_thres` is 0.25 as well).
YOLOV5_IOU = 0.45
#: ultralytics' class offset (`max_wh`): boxes of two classes never overlap in one NMS pass.
_CLASS_OFFSET = 7680.0
#: Two boxes are one detection from this IoU on (the detection benchmarks' match).
MATCH_IOU = 0.5


class Layout(str, enum.Enum):
    DETR = "DETR logits + pred_boxes"
    TORCHVISION = "boxes, scores, labels"
    END_TO_END = "end-to-end N x K x 6"
    YOLO_V8 = "raw YOLOv8 head N x (4 + C) x A"
    YOLO_V5 = "raw YOLOv5 head N x A x (5 + C)"


Decode = Callable[[Sequence[str], Mapping[str, np.ndarray]], Decoded]


@dataclass(frozen=True)
class DetectLayout:
    """One way a detector gives its detections: `find` names its outputs among the reference's
    output shapes (() where they are not there); `decode` gives a run's boxes (corners, N x K x
    4), scores and classes (N x K), and the second-best class's score and class (-inf and -1
    where the layout gives one class a box); a detection counts from `threshold` on; `nms_iou`: class-aware
    NMS at that IoU, then the `MAX_DET` best (None: the model's output is final). `by_name`:
    found by output names, so `--task auto` may choose it without the model's metadata."""

    layout: Layout
    find: Callable[[Shapes], tuple[str, ...]]
    decode: Decode
    threshold: float
    nms_iou: float | None = None
    by_name: bool = False


def metadata_task(model: onnx.ModelProto) -> tuple[str, str] | None:
    """The task a model's own metadata names for `--task auto`, and where (the form of
    `directory.config_task`): ultralytics writes `task` into `metadata_props`; only `detect` is
    read (its `segment` and `pose` heads carry mask and keypoint columns the decoders here do
    not read)."""
    props = metadata(model)
    if props.get("task") == DETECT:
        return DETECT, f"metadata_props task={DETECT}" + (" (ultralytics)" if "ultralytics" in
                                                           str(props.get("author", "")).lower() else "")
    return None


def detection_outputs(outputs: Shapes, by_name: bool = False) -> tuple[str, ...]:
    """A detector's outputs by the first row of `LAYOUTS` that finds them (with `by_name`, only
    the rows found by their names): boxes, then the scores, logits or classes; a raw head or an
    end-to-end output alone; () for none."""
    for row in LAYOUTS:
        if row.by_name or not by_name:
            named = row.find(outputs)
            if named:
                return named
    return ()


def layout_of(names: Sequence[str], shapes: Shapes) -> DetectLayout:
    """The row of `LAYOUTS` that reads `names` (as `detection_outputs` found them) in outputs
    of these shapes; the torchvision-style row where none names them all."""
    for row in LAYOUTS:
        found = row.find(shapes)
        if found and found[0] == names[0] and set(found) == set(names):
            return row
    return next(row for row in LAYOUTS if row.layout is Layout.TORCHVISION)


def decoded(
    layout: DetectLayout, names: Sequence[str], run: Mapping[str, np.ndarray], floor: float, tie: float = 0.0
) -> list[Detections]:
    """Each image's detections in one run: those scoring at least `floor` (NaN scores none),
    after the layout's class-aware NMS; a detection whose second class scores within `tie` of
    its first has that class as its alternate (a near-tie, as a classifier's row)."""
    boxes, scores, classes, second, second_classes = layout.decode(names, run)
    scores = np.nan_to_num(scores, nan=-np.inf)
    alternates = np.where(scores - np.nan_to_num(second, nan=-np.inf) <= tie, second_classes, -1)
    images = []
    for b, s, c, a in zip(boxes, scores, classes, alternates):
        keep = np.flatnonzero(s >= floor)
        if layout.nms_iou is not None:
            keep = keep[_nms(b[keep], s[keep], c[keep], layout.nms_iou)][:MAX_DET]
        images.append((b[keep], s[keep], c[keep], a[keep]))
    return images


def judge_detection(
    names: Sequence[str], reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]],
    tol: Tolerance,
) -> TaskResult:
    """A detector's outputs (`detection_outputs`) on each input set, image by image: the
    reference's detections (score at least the layout's threshold) matched greedily, best score
    first, to the candidate's of the same class at IoU `MATCH_IOU` or more, whatever their order
    (where a detection's two best classes are within the tolerance, either class matches).
    A detection whose score is within the tolerance of the cut is set apart (it may fall on
    either side; the raw heads' NMS runs on what reaches the cut less the tolerance, which keeps
    every box above the cut as ultralytics would). Passes when every judged reference detection
    is found again and every judged candidate detection matches one; not judged where no
    reference detection is off the cut on any image: nothing to compare is no pass (the scores
    are probabilities: the tolerance's bound at 1 is their scale)."""
    layout = layout_of(names, {n: np.shape(v) for n, v in reference[0].items()}) if reference else LAYOUTS[1]
    cut, margin = layout.threshold, tol.bound(1.0)
    found = kept = matched_ref = matched_cand = ref_apart = apart = images = 0
    ious: list[float] = []
    for ref_run, cand_run in zip(reference, candidate):
        pairs_of_images = zip(decoded(layout, names, ref_run, cut - margin, margin),
                              decoded(layout, names, cand_run, cut - margin, margin))
        for ref, cand in pairs_of_images:
            images += 1
            ref_judged, cand_judged = np.abs(ref[1] - cut) > margin, np.abs(cand[1] - cut) > margin
            ref_apart += int((~ref_judged).sum())
            apart += int((~ref_judged).sum() + (~cand_judged).sum())
            pairs = _match(ref, cand)
            found += int(ref_judged.sum())
            kept += int(cand_judged.sum())
            matched_ref += sum(1 for i, _, _ in pairs if ref_judged[i])
            matched_cand += sum(1 for _, j, _ in pairs if cand_judged[j])
            ious.extend(iou for _, _, iou in pairs)
    recall = matched_ref / found if found else None
    precision = matched_cand / kept if kept else None
    not_judged = None
    if not found:
        not_judged = (f"every detection of {names[0]} is at the score cut" if ref_apart else
                      f"no detection of {names[0]} reaches the score cut on these inputs; give images with --inputs")
    return TaskResult(
        names[0], DETECT, images, apart, None, None, None,
        not_judged is None and recall == 1.0 and precision in (None, 1.0),
        recall=recall, precision=precision, mean_iou=float(np.mean(ious)) if ious else None, not_judged=not_judged,
    )


# -- the layouts: finding their outputs, decoding them ------------------------------------------


def _boxes_named(outputs: Shapes) -> str | None:
    return next((n for n, s in outputs.items() if any(w in n.lower() for w in _BOXES) and s and s[-1] == 4), None)


def _find_detr(outputs: Shapes) -> tuple[str, ...]:
    boxes = _boxes_named(outputs)
    if boxes is None:
        return ()
    lead = tuple(outputs[boxes][:-1])
    logits = next((n for n, s in outputs.items() if "logits" in n.lower() and tuple(s[:-1]) == lead and s[-1] > 1),
                  None)
    return (boxes, logits) if logits is not None else ()


def _find_torchvision(outputs: Shapes) -> tuple[str, ...]:
    boxes = _boxes_named(outputs)
    if boxes is None:
        return ()
    lead = tuple(outputs[boxes][:-1])
    return (boxes, *(n for n, s in outputs.items() if n != boxes and tuple(s) == lead))


def _find_end_to_end(outputs: Shapes) -> tuple[str, ...]:
    return next(((n,) for n, s in outputs.items() if len(s) == 3 and s[2] == 6), ())


def _find_raw(first_axis_smaller: bool, least: int) -> Callable[[Shapes], tuple[str, ...]]:
    """A 3-D output whose shorter axis (1 for YOLOv8's channels first, 2 for YOLOv5's) is at
    least `least` long and shorter than the anchors' axis."""
    def find(outputs: Shapes) -> tuple[str, ...]:
        for n, s in outputs.items():
            if len(s) == 3:
                channels, anchors = (s[1], s[2]) if first_axis_smaller else (s[2], s[1])
                if least <= channels < anchors:
                    return (n,)
        return ()
    return find


def _batched(value: np.ndarray, trailing: int) -> np.ndarray:
    """`value` as float64 with one leading axis of images (a value without one: one image)."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim > trailing:
        return a.reshape(-1, *a.shape[-trailing:])
    return a.reshape(1, *(1,) * (trailing - a.ndim), *a.shape)


def _centred(boxes: np.ndarray) -> np.ndarray:
    """(cx, cy, w, h) -> (x1, y1, x2, y2)."""
    half = boxes[..., 2:4] / 2
    return np.concatenate([boxes[..., :2] - half, boxes[..., :2] + half], axis=-1)


def _top2(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The best class's probability and index along the last axis, and the second's."""
    if probs.shape[-1] < 2:
        lone = np.zeros(probs.shape[:-1], dtype=np.int64)
        return probs[..., 0], lone, np.full(probs.shape[:-1], -np.inf), lone - 1
    order = np.argsort(-np.nan_to_num(probs, nan=-np.inf), axis=-1, kind="stable")[..., :2]
    top = np.take_along_axis(probs, order, axis=-1)
    return top[..., 0], order[..., 0], top[..., 1], order[..., 1]


def _one_class(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> Decoded:
    return boxes, scores, classes, np.full(scores.shape, -np.inf), np.full(scores.shape, -1, dtype=np.int64)


def _decode_detr(names: Sequence[str], run: Mapping[str, np.ndarray]) -> Decoded:
    boxes = _batched(run[names[0]], 2)
    logits = np.asarray(run[names[1]], dtype=np.float64).reshape(*boxes.shape[:2], -1)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = (probs / probs.sum(axis=-1, keepdims=True))[..., :-1]  # the last class is DETR's "no object"
    return (_centred(boxes), *_top2(probs))


def _decode_torchvision(names: Sequence[str], run: Mapping[str, np.ndarray]) -> Decoded:
    """Scores from an output named for them, else all 1; classes from one named for them, else
    all 0. Boxes as corners, unless named `pred_boxes` (Hugging Face's centre and size) or their
    third and fourth values are not past the first two."""
    boxes = _batched(run[names[0]], 2)
    lead = boxes.shape[:2]
    scores, classes = np.ones(lead), np.zeros(lead, dtype=np.int64)
    for name in names[1:]:
        value, lower = np.asarray(run[name]), name.lower()
        if any(w in lower for w in _SCORES) and value.size == scores.size:
            scores = value.astype(np.float64).reshape(lead)
        elif any(w in lower for w in _LABELS) and value.size == classes.size:
            classes = value.astype(np.int64).reshape(lead)
    if names[0].lower() == "pred_boxes" or ((boxes[..., 2] < boxes[..., 0]) | (boxes[..., 3] < boxes[..., 1])).any():
        boxes = _centred(boxes)
    return _one_class(boxes, scores, classes)


def _decode_end_to_end(names: Sequence[str], run: Mapping[str, np.ndarray]) -> Decoded:
    rows = _batched(run[names[0]], 2)
    return _one_class(rows[..., :4], rows[..., 4], np.nan_to_num(rows[..., 5], nan=-1).astype(np.int64))


def _decode_v8(names: Sequence[str], run: Mapping[str, np.ndarray]) -> Decoded:
    rows = np.swapaxes(_batched(run[names[0]], 2), 1, 2)  # N x A x (4 + C)
    return (_centred(rows[..., :4]), *_top2(rows[..., 4:]))


def _decode_v5(names: Sequence[str], run: Mapping[str, np.ndarray]) -> Decoded:
    rows = _batched(run[names[0]], 2)  # N x A x (5 + C)
    probs = rows[..., 5:] * rows[..., 4:5]  # YOLOv5's score: objectness times the class probability
    return (_centred(rows[..., :4]), *_top2(probs))


#: The layouts, in the order they are tried (a named boxes output first; an `N x K x 6` output
#: is read as end-to-end detections before a YOLOv5 head of one class).
LAYOUTS: tuple[DetectLayout, ...] = (
    DetectLayout(Layout.DETR, _find_detr, _decode_detr, DETECTION_THRESHOLD, by_name=True),
    DetectLayout(Layout.TORCHVISION, _find_torchvision, _decode_torchvision, DETECTION_THRESHOLD, by_name=True),
    DetectLayout(Layout.END_TO_END, _find_end_to_end, _decode_end_to_end, ULTRALYTICS_CONF),
    DetectLayout(Layout.YOLO_V8, _find_raw(True, 5), _decode_v8, ULTRALYTICS_CONF, ULTRALYTICS_IOU),
    DetectLayout(Layout.YOLO_V5, _find_raw(False, 6), _decode_v5, ULTRALYTICS_CONF, YOLOV5_IOU),
)


# -- NMS and matching ----------------------------------------------------------------------------


def _nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> np.ndarray:
    """Greedy class-aware NMS as ultralytics runs it (each class's boxes offset by
    `_CLASS_OFFSET`, one pass): the kept indices, best score first."""
    shifted = boxes + (classes.astype(np.float64) * _CLASS_OFFSET)[:, None]
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        order = rest[_ious(shifted[i], shifted[rest]) <= iou]
    return np.asarray(keep, dtype=np.int64)


def _ious(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box (corners) with each of `boxes`."""
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    union = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _match(ref: Detections, cand: Detections) -> list[tuple[int, int, float]]:
    """(reference index, candidate index, IoU) for each match, the reference's best scores first;
    a pair's classes agree, or one's is the other's near-tied alternate."""
    taken: set[int] = set()
    pairs = []
    for i in np.argsort(-ref[1], kind="stable"):
        best, best_iou = -1, MATCH_IOU
        same = (cand[2] == ref[2][i]) | (cand[3] == ref[2][i]) | ((ref[3][i] >= 0) & (cand[2] == ref[3][i]))
        for j in np.flatnonzero(same):
            iou = _iou(ref[0][i], cand[0][j])
            if j not in taken and iou >= best_iou:
                best, best_iou = int(j), iou
        if best >= 0:
            taken.add(best)
            pairs.append((int(i), best, best_iou))
    return pairs


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else float(np.allclose(a, b))

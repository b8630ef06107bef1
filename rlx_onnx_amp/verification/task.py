"""Verdicts on the task (issue 39): does the converted model still do its job? A classifier's
class per row (top-1 and top-5 agreement, near-ties set apart), an embedding's direction per row
(the lowest cosine), a detector's boxes (matched by class and IoU, not by their order), a
decoder's greedy tokens over several steps (`generate`), or the element-wise check on the
logits alone, judged on the outputs the task names; the element-wise figures stay as
diagnostics. `choose_task` picks the task from the model's interface where `--task auto`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import numpy as np

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.reports.record import OutputResult, TaskResult, TaskVerdict
from rlx_onnx_amp.verification.generate import Generator, Steps
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = ["TASKS", "Task", "choose_task", "judge_detection", "judge_generation", "judge_task"]


class Task(str, enum.Enum):
    AUTO = "auto"
    LOGITS = "logits"  # element-wise, on the logits outputs alone (a cache's drift is a diagnostic)
    CLASSIFY = "classify"  # logits or scores: the class per row
    EMBED = "embed"  # embeddings: the direction per row
    DETECT = "detect"  # boxes, scores and classes: detections matched by class and IoU
    GENERATE = "generate"  # a decoder step: greedy tokens over several steps
    NONE = "none"  # element-wise only


TASKS = tuple(t.value for t in Task)

#: Output names (lower case) that say what `--task auto` judges them as.
_NAMED = {
    Task.CLASSIFY: ("logits", "scores", "probabilities", "probs"),
    Task.EMBED: ("embedding", "embeds", "last_hidden_state", "pooler_output", "hidden_states"),
}
#: A detector's outputs: boxes (last axis 4), their scores, their classes (lower-case name parts).
_BOXES, _SCORES, _LABELS = ("box", "dets"), ("score",), ("label", "class")
#: A reference detection counts where its score reaches this (else its `_TOP_DETECTIONS` best
#: count: a random-weight detector scores nothing high).
DETECTION_THRESHOLD = 0.5
_TOP_DETECTIONS = 10
#: Two boxes are one detection from this IoU on (the detection benchmarks' match).
MATCH_IOU = 0.5


def choose_task(
    task: str,
    outputs: Mapping[str, tuple[int, ...]],
    generator: Generator | None = None,
    folder_task: tuple[str, str] | None = None,
) -> tuple[Task, tuple[str, ...], str]:
    """(the task, the outputs it judges, how it was chosen) for `--task`, the reference's output
    shapes and the decoder step the model is (`generate.find_generator`); `Task.NONE` with no
    output where nothing names a task. `auto` takes the task the export folder's config names
    (`folder_task`: the task, where it says so) where the model's interface allows it (a seq2seq
    folder's encoder is no decoder step), else looks for, in order: a decoder step with a cache,
    a detector's boxes, logits or scores, embeddings."""
    if task == Task.AUTO.value and folder_task is not None:
        try:
            named_task, named, _ = _from_interface(folder_task[0], outputs, generator)
        except InputError:
            pass  # this file of the folder cannot be judged so: its interface decides
        else:
            return named_task, named, f"auto: {folder_task[1]}"
    return _from_interface(task, outputs, generator)


def _from_interface(
    task: str, outputs: Mapping[str, tuple[int, ...]], generator: Generator | None
) -> tuple[Task, tuple[str, ...], str]:
    try:
        wanted = Task(task)
    except ValueError:
        raise InputError(f"--task: unknown task {task!r} (known: {', '.join(TASKS)})") from None
    auto = wanted is Task.AUTO
    if wanted is Task.NONE:
        return Task.NONE, (), "--task none"
    if wanted in (Task.AUTO, Task.GENERATE) and generator is not None:
        return Task.GENERATE, (generator.logits,), (
            f"auto: a decoder step ({generator.ids} in, {generator.logits} and a cache out)" if auto else "--task")
    if wanted is Task.GENERATE:
        raise InputError("--task generate: the model is no decoder step (input_ids in, logits and present.* out)")
    if wanted in (Task.AUTO, Task.DETECT):
        boxes = detection_outputs(outputs)
        if boxes:
            return Task.DETECT, boxes, f"auto: output {boxes[0]!r}" if auto else "--task"
        if not auto:
            raise InputError("--task detect: no boxes output (a name with 'box' and a last axis of 4)")
    if wanted is Task.LOGITS:
        named = tuple(n for n in outputs if "logits" in n.lower())
        if not named:
            raise InputError("--task logits: no output with 'logits' in its name")
        return Task.LOGITS, named, "--task"
    for kind in (Task.CLASSIFY, Task.EMBED):
        if wanted not in (Task.AUTO, kind):
            continue
        named = tuple(
            name for name, shape in outputs.items()
            if len(shape) >= 1 and shape[-1] > 1 and (wanted is kind or any(w in name.lower() for w in _NAMED[kind]))
        )
        if named:
            return kind, named, "--task" if wanted is kind else f"auto: output {named[0]!r}"
    if not auto:
        raise InputError(f"--task {task}: no output with a last axis longer than 1 to judge")
    return Task.NONE, (), "auto: no output names a task"


def detection_outputs(outputs: Mapping[str, tuple[int, ...]]) -> tuple[str, ...]:
    """A detector's outputs: its boxes (a name with 'box', last axis 4) first, then the scores
    or logits and the classes that go with them (the boxes' leading axes); () for no boxes."""
    boxes = next((n for n, s in outputs.items() if any(w in n.lower() for w in _BOXES) and s and s[-1] == 4), None)
    if boxes is None:
        return ()
    lead = outputs[boxes][:-1]
    rest = [n for n, s in outputs.items() if n != boxes and (tuple(s) == lead or tuple(s[:-1]) == lead)]
    return (boxes, *rest)


def judge_task(
    task: Task,
    chosen_by: str,
    pairs: Mapping[str, tuple[np.ndarray, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
    drifts: Mapping[str, OutputResult] | None = None,
) -> TaskVerdict | None:
    """The task verdict on the named outputs' (reference, candidate) values, or None for no task
    (`generate` and `detect` have their own: `judge_generation`, `judge_detection`). `logits`
    takes the element-wise verdict (`drifts`) of those outputs alone."""
    if task is Task.NONE or not pairs:
        return None
    if task is Task.LOGITS:
        assert drifts is not None
        results = tuple(
            TaskResult(n, task.value, int(np.prod(np.shape(r)[:-1]) or 1), 0, None, None, drifts[n].cosine,
                       drifts[n].passed)
            for n, (r, _) in pairs.items()
        )
    else:
        judge = _classify if task is Task.CLASSIFY else _embed
        results = tuple(judge(name, *pair, tolerances[name]) for name, pair in pairs.items())
    return TaskVerdict(task.value, chosen_by, all(r.passed for r in results), results)


def judge_generation(name: str, reference: Sequence[Steps], candidate: Sequence[Steps], tol: Tolerance) -> TaskResult:
    """The greedy tokens of a decoder (`generate.decode`), per prompt set: teacher-forced, the
    share of prompt-steps whose token (top-1) and top-5 agree, over those where the reference's
    top-2 margin is no near-tie (the tolerance's bound), and the lowest logit cosine; free-running,
    where each prompt's tokens first part. Passes when every step that is no near-tie agrees."""
    agree, top5, ties, cosines, parted = [], [], [], [], []
    steps = 0
    for ref, cand in zip(reference, candidate):
        steps = len(ref.tokens)
        first = np.full(len(ref.tokens[0]), steps)
        for t, (r, c, token) in enumerate(zip(ref.logits, cand.logits, ref.tokens)):
            tie = _near_ties(r, tol)
            chosen = np.argmax(c, axis=1)
            same = chosen == token
            first = np.where((first == steps) & ~same, t, first)
            agree.append(same[~tie])
            top5.append(_in_top(token, c)[~tie])
            ties.append(int(tie.sum()))
            cosines.append(_row_cosines(r, c))
        parted.append(first)
    judged, in_top5 = np.concatenate(agree), np.concatenate(top5)
    first_parted = np.concatenate(parted)
    all_cosines = np.concatenate(cosines)
    return TaskResult(
        name, Task.GENERATE.value, len(first_parted), sum(ties),
        float(judged.mean()) if judged.size else None,
        float(in_top5.mean()) if in_top5.size else None,
        float(all_cosines.min()) if all_cosines.size else None,
        bool(judged.all()),
        steps=steps,
        token_agreement=float(np.mean(first_parted / steps)) if steps else None,
        first_divergence=int(first_parted.min()) if first_parted.size and first_parted.min() < steps else None,
    )


def judge_detection(
    names: Sequence[str], reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]],
    tol: Tolerance,
) -> TaskResult:
    """A detector's outputs (`detection_outputs`: boxes, then scores, logits or classes) on each
    input set, image by image: the reference's detections (score at least
    `DETECTION_THRESHOLD`, else its `_TOP_DETECTIONS` best) matched greedily, best score first,
    to the candidate's of the same class at IoU `MATCH_IOU` or more, whatever their order. A
    detection whose score is within the tolerance of the cut is set apart (it may fall on either
    side). Passes when every judged reference detection is found again and every judged
    candidate detection matches one."""
    found = kept = matched_ref = matched_cand = apart = images = 0
    ious: list[float] = []
    for ref_run, cand_run in zip(reference, candidate):
        for ref, cand in zip(_detections(names, ref_run), _detections(names, cand_run)):
            images += 1
            cut = _cut(ref[1])
            margin = tol.bound(1.0)
            ref_in, cand_in = ref[1] >= cut - margin, cand[1] >= cut - margin
            ref_judged, cand_judged = np.abs(ref[1] - cut) > margin, np.abs(cand[1] - cut) > margin
            apart += int((ref_in & ~ref_judged).sum() + (cand_in & ~cand_judged).sum())
            pairs = _match(ref, cand, ref_in, cand_in)
            found += int((ref_in & ref_judged).sum())
            kept += int((cand_in & cand_judged).sum())
            matched_ref += sum(1 for i, _, _ in pairs if ref_judged[i])
            matched_cand += sum(1 for _, j, _ in pairs if cand_judged[j])
            ious.extend(iou for _, _, iou in pairs)
    recall = matched_ref / found if found else None
    precision = matched_cand / kept if kept else None
    return TaskResult(
        names[0], Task.DETECT.value, images, apart, None, None, None,
        (recall is None or recall == 1.0) and (precision is None or precision == 1.0),
        recall=recall, precision=precision, mean_iou=float(np.mean(ious)) if ious else None,
    )


_Detections = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (xyxy), scores, classes


def _detections(names: Sequence[str], run: Mapping[str, np.ndarray]) -> list[_Detections]:
    """Each image's detections in one run: boxes as corners, a score and a class each. Scores
    come from an output named for them, else from logits (the softmax's largest, its class), else
    are all 1; classes from an output named for them, else the logits', else all 0."""
    boxes = np.asarray(run[names[0]], dtype=np.float64)
    boxes = boxes.reshape(-1, *boxes.shape[-2:]) if boxes.ndim >= 2 else boxes.reshape(1, -1, 4)
    lead = boxes.shape[:2]
    scores, classes = np.ones(lead), np.zeros(lead, dtype=np.int64)
    for name in names[1:]:
        value = np.asarray(run[name])
        lower = name.lower()
        if "logits" in lower and value.size and value.size % (lead[0] * lead[1]) == 0:
            logits = value.astype(np.float64).reshape(*lead, -1)
            probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            scores, classes = probs.max(axis=-1), probs.argmax(axis=-1)
        elif any(w in lower for w in _SCORES) and value.size == lead[0] * lead[1]:
            scores = value.astype(np.float64).reshape(lead)
        elif any(w in lower for w in _LABELS) and value.size == lead[0] * lead[1]:
            classes = value.astype(np.int64).reshape(lead)
    corners = _corners(boxes, names[0])
    return [(corners[i], np.nan_to_num(scores[i], nan=-np.inf), classes[i]) for i in range(lead[0])]


def _corners(boxes: np.ndarray, name: str) -> np.ndarray:
    """Boxes as (x1, y1, x2, y2): Hugging Face's `pred_boxes` are (cx, cy, w, h), and so are
    boxes whose third and fourth values are not corners past the first two."""
    centred = name.lower() == "pred_boxes" or bool(
        ((boxes[..., 2] < boxes[..., 0]) | (boxes[..., 3] < boxes[..., 1])).any())
    if not centred:
        return boxes
    half = boxes[..., 2:] / 2
    return np.concatenate([boxes[..., :2] - half, boxes[..., :2] + half], axis=-1)


def _cut(scores: np.ndarray) -> float:
    """The score from which a reference detection counts."""
    finite = scores[np.isfinite(scores)]
    if finite.size == 0 or (finite >= DETECTION_THRESHOLD).any():
        return DETECTION_THRESHOLD
    return float(np.sort(finite)[-min(_TOP_DETECTIONS, finite.size)])


def _match(
    ref: _Detections, cand: _Detections, ref_in: np.ndarray, cand_in: np.ndarray
) -> list[tuple[int, int, float]]:
    """(reference index, candidate index, IoU) for each match, the reference's best scores first."""
    taken: set[int] = set()
    pairs = []
    for i in np.argsort(-ref[1], kind="stable"):
        if not ref_in[i]:
            continue
        best, best_iou = -1, MATCH_IOU
        for j in np.flatnonzero(cand_in & (cand[2] == ref[2][i])):
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


def _near_ties(rows: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Rows whose top-2 margin the tolerance cannot tell apart (bound at the row's largest |value|)."""
    if rows.shape[1] < 2:
        return np.zeros(len(rows), dtype=bool)
    top2 = np.sort(rows, axis=1)[:, -2:]
    scale = np.max(np.abs(np.where(np.isfinite(rows), rows, 0.0)), axis=1)
    return (top2[:, 1] - top2[:, 0]) <= np.array([tol.bound(float(s)) for s in scale])


def _row_cosines(r: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Each row's cosine (a non-finite candidate value reads as the worst, -1); rows of zeros
    left out."""
    finite = np.isfinite(c).all(axis=1)
    r0, c0 = np.where(np.isfinite(r), r, 0.0), np.where(np.isfinite(c), c, 0.0)
    norms = np.linalg.norm(r0, axis=1) * np.linalg.norm(c0, axis=1)
    cos = np.einsum("ij,ij->i", r0, c0) / np.where(norms > 0, norms, 1.0)
    cos = np.where(finite, cos, -1.0)
    return cos[(norms > 0) | ~finite]


def _in_top(tokens: np.ndarray, rows: np.ndarray, k: int = 5) -> np.ndarray:
    """Whether each row's token is among the row's `k` largest values (top-5 agreement)."""
    top = np.argsort(rows, axis=1)[:, -min(k, rows.shape[1]):]
    return np.asarray((top == np.asarray(tokens)[:, None]).any(axis=1))


def _as_rows(values: np.ndarray) -> np.ndarray:
    """`values` as float64 rows along their last axis (a scalar: one row of one)."""
    a = np.asarray(values, dtype=np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def _rows(values: np.ndarray) -> np.ndarray:
    """`_as_rows` with NaN read as -inf: no class for argmax or the top-5."""
    return np.nan_to_num(_as_rows(values), nan=-np.inf)


def _classify(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """Top-1 agreement on every row whose reference top-2 margin the tolerance can tell apart;
    the rows where it cannot (near-ties) are counted, not judged."""
    r, c = _rows(reference), _rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.CLASSIFY.value, len(r), 0, 0.0, 0.0, None, False)
    ties = _near_ties(r, tol)
    agree = np.argmax(r, axis=1) == np.argmax(c, axis=1)
    top5 = _in_top(np.argmax(r, axis=1), c)
    judged = ~ties
    top1 = float(np.mean(agree[judged])) if judged.any() else None
    top5_share = float(np.mean(top5[judged])) if judged.any() else None
    return TaskResult(name, Task.CLASSIFY.value, len(r), int(ties.sum()), top1, top5_share, None,
                      bool(agree[judged].all()))


def _embed(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """The lowest per-row cosine against the tolerance's min_cosine (one cosine over the whole
    tensor would hide a row that turned)."""
    r, c = _as_rows(reference), _as_rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.EMBED.value, len(r), 0, None, None, None, False)
    cosines = _row_cosines(r, c)  # rows of zeros are left out: counted apart, not judged
    lowest = float(cosines.min()) if cosines.size else None
    passed = lowest is None or lowest >= tol.min_cosine
    return TaskResult(name, Task.EMBED.value, len(r), len(r) - len(cosines), None, None, lowest, passed)

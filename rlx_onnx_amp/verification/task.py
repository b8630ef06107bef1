"""Verdicts on the task (issues 39, 49): does the converted model still do its job? Each task is
one row of `TASK_SPECS`: which outputs it reads from the model's interface, along which axis
its class, token or box lies, how it compares the reference's values with the candidate's, and
how it sums its figures up. A classifier's class per row (top-1 and top-5 agreement), a
segmenter's class per pixel (agreement and mean IoU over the classes), an embedding's direction
per row (the lowest cosine), a detector's boxes (matched by class and IoU, not by their order;
`verification.detect` decodes the layouts detectors ship), a decoder's greedy tokens over
several steps (`generate`), or the element-wise check on the logits alone; the element-wise
figures stay as diagnostics. `choose_task` picks the row from
the model's interface where `--task auto`, in the table's order, and says why.

A verdict that compared nothing (every row a near-tie, no detection off the score cut, no token
step) is `not_judged` and never passes: the element-wise verdict decides. A near-tie is a top-2
margin within `rtol_of_max` of the spread (max - min) of the output's own reference values, not
an absolute tolerance that every small logit falls under.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.names import TASK_NAMES
from rlx_onnx_amp.reports.record import OutputResult, TaskResult, TaskVerdict
from rlx_onnx_amp.verification.detect import DETECT, detection_outputs, judge_detection
from rlx_onnx_amp.verification.generate import Generator, Steps
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = [
    "TASKS",
    "TASK_SPECS",
    "Task",
    "TaskInputs",
    "TaskSpec",
    "choose_task",
    "detection_outputs",
    "judge_detection",
    "judge_generation",
    "judge_task",
]


class Task(str, enum.Enum):
    AUTO = "auto"
    GENERATE = "generate"  # a decoder step: greedy tokens over several steps
    DETECT = "detect"  # boxes, scores and classes: detections matched by class and IoU
    SEGMENT = "segment"  # N x C x H x W logits or masks: the class per pixel
    CLASSIFY = "classify"  # logits or scores: the class per row
    EMBED = "embed"  # embeddings: the direction per row
    LOGITS = "logits"  # element-wise, on the logits outputs alone (a cache's drift is a diagnostic)
    NONE = "none"  # element-wise only


TASKS = tuple(t.value for t in Task)
assert Task.DETECT.value == DETECT, "verification.detect spells the task's name out"
assert TASKS == TASK_NAMES, "names.TASK_NAMES (what --help offers) must be the tasks here"

Shapes = Mapping[str, tuple[int, ...]]
Runs = Sequence[Mapping[str, np.ndarray]]

#: Output names (lower case) that say what `--task auto` judges them as.
_CLASSIFY_NAMES = ("logits", "scores", "probabilities", "probs")
_EMBED_NAMES = ("embedding", "embeds", "last_hidden_state", "pooler_output", "hidden_states")
#: A segmenter's N x C x H x W output: a name holding one of these, or torchvision's `out`.
_SEGMENT_NAMES, _SEGMENT_EXACT = ("logits", "seg", "mask"), ("out",)
#: `segment` passes where at least this share of the judged pixels keeps its class and the mean
#: IoU over the classes the reference shows reaches `SEGMENT_MEAN_IOU` (docs/verification.md).
SEGMENT_AGREEMENT = 0.99
SEGMENT_MEAN_IOU = 0.95


@dataclass(frozen=True)
class TaskInputs:
    """What a task's comparison reads: the outputs it judges (`names`), each one's reference and
    candidate values over every input set (`pairs`), its tolerance, its element-wise result;
    `detect` reads each input set's runs, `generate` the greedy steps (reference, candidate)."""

    names: tuple[str, ...]
    pairs: Mapping[str, tuple[np.ndarray, np.ndarray]]
    tolerances: Mapping[str, Tolerance]
    drifts: Mapping[str, OutputResult]
    runs: tuple[Runs, Runs] | None = None
    steps: tuple[Sequence[Steps], Sequence[Steps]] | None = None


def _named_output(named: tuple[str, ...], outputs: Shapes, generator: Generator | None) -> str:
    return f"output {named[0]!r}"


@dataclass(frozen=True)
class TaskSpec:
    """One task verdict. `find(outputs, generator, by_name)` gives the outputs it judges (with
    `by_name`, for `--task auto`, only those whose names say so), () where the interface has
    none (then `--task NAME` is refused with `missing`); `axis` says where its class, token or
    box lies; `judge` compares; `describe` sums one result up in words (`TaskResult.summary`);
    `why` says what `auto` saw. `auto`: whether `--task auto` may choose it."""

    task: Task
    axis: str
    find: Callable[[Shapes, Generator | None, bool], tuple[str, ...]]
    judge: Callable[[TaskInputs], tuple[TaskResult, ...]]
    describe: Callable[[TaskResult], str]
    missing: str
    auto: bool = True
    why: Callable[[tuple[str, ...], Shapes, Generator | None], str] = _named_output


def choose_task(
    task: str,
    outputs: Shapes,
    generator: Generator | None = None,
    folder_task: tuple[str, str] | None = None,
) -> tuple[Task, tuple[str, ...], str]:
    """(the task, the outputs it judges, how it was chosen) for `--task`, the reference's output
    shapes and the decoder step the model is (`generate.find_generator`); `Task.NONE` with no
    output where nothing names a task. `auto` takes the task the export folder's config names
    (`folder_task`: the task, where it says so) where the model's interface allows it (a seq2seq
    folder's encoder is no decoder step), else the first row of `TASK_SPECS` that finds its
    outputs by their names and shapes: a decoder step with a cache, a detector's boxes, a
    segmenter's N x C x H x W logits, logits or scores, embeddings."""
    if task == Task.AUTO.value and folder_task is not None:
        try:
            named_task, named, _ = _from_interface(folder_task[0], outputs, generator)
        except InputError:
            pass  # this file of the folder cannot be judged so: its interface decides
        else:
            return named_task, named, f"auto: {folder_task[1]}"
    return _from_interface(task, outputs, generator)


def _from_interface(
    task: str, outputs: Shapes, generator: Generator | None
) -> tuple[Task, tuple[str, ...], str]:
    try:
        wanted = Task(task)
    except ValueError:
        raise InputError(f"--task: unknown task {task!r} (known: {', '.join(TASKS)})") from None
    if wanted is Task.NONE:
        return Task.NONE, (), "--task none"
    if wanted is Task.AUTO:
        for spec in TASK_SPECS.values():
            named = spec.find(outputs, generator, True) if spec.auto else ()
            if named:
                return spec.task, named, f"auto: {spec.why(named, outputs, generator)}"
        return Task.NONE, (), "auto: no output names a task"
    spec = TASK_SPECS[wanted]
    named = spec.find(outputs, generator, False)
    if not named:
        raise InputError(spec.missing)
    return wanted, named, "--task"


def judge_task(
    task: Task,
    chosen_by: str,
    pairs: Mapping[str, tuple[np.ndarray, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
    drifts: Mapping[str, OutputResult] | None = None,
    *,
    runs: tuple[Runs, Runs] | None = None,
    steps: tuple[Sequence[Steps], Sequence[Steps]] | None = None,
) -> TaskVerdict | None:
    """The task verdict on the named outputs (`pairs`: each one's reference and candidate values,
    in the order `choose_task` named them), or None for no task: the task's row of `TASK_SPECS`
    compares them (`detect` reads `runs`, each input set's outputs of the reference and the
    candidate; `generate` the greedy `steps`; `logits` the element-wise `drifts`). An output the
    task could not judge is judged element-wise; where it judged none, the verdict is
    `not_judged` and does not pass."""
    if task is Task.NONE or not pairs:
        return None
    spec = TASK_SPECS[task]
    known = drifts or {}
    inputs = TaskInputs(tuple(pairs), pairs, tolerances, known, runs, steps)
    results = tuple(dataclasses.replace(r, summary=spec.describe(r)) for r in spec.judge(inputs))
    reasons = [r.not_judged for r in results if r.not_judged is not None]
    if len(reasons) == len(results):
        return TaskVerdict(task.value, chosen_by, False, results, "; ".join(reasons))
    passed = all(
        r.passed if r.not_judged is None else (r.output in known and known[r.output].passed) for r in results
    )
    return TaskVerdict(task.value, chosen_by, passed, results)


def judge_generation(name: str, reference: Sequence[Steps], candidate: Sequence[Steps], tol: Tolerance) -> TaskResult:
    """The greedy tokens of a decoder (`generate.decode`), per prompt set: teacher-forced, the
    share of prompt-steps whose token (top-1) and top-5 agree, over those where the reference's
    top-2 margin is no near-tie (`_near_ties`, against the spread of that step's logits), and the
    lowest logit cosine; free-running, where each prompt's tokens first part. Passes when every
    step that is no near-tie agrees; not judged where no step is one."""
    agree, top5, ties, cosines, parted = [], [], [], [], []
    steps = 0
    for ref, cand in zip(reference, candidate):
        steps = len(ref.tokens)
        first = np.full(len(ref.tokens[0]), steps)
        for t, (r, c, token) in enumerate(zip(ref.logits, cand.logits, ref.tokens)):
            tie = _near_ties(r, tol, _spread(r))
            chosen = np.argmax(c, axis=1)
            same = chosen == token
            first = np.where((first == steps) & ~same, t, first)
            agree.append(same[~tie])
            top5.append(_in_top(token, c)[~tie])
            ties.append(int(tie.sum()))
            cosines.append(_row_cosines(r, c))
        parted.append(first)
    judged, in_top5, first_parted, all_cosines = (
        np.concatenate(a) if a else np.zeros(0) for a in (agree, top5, parted, cosines))  # no prompt set: no step
    not_judged = None
    if not judged.size:
        not_judged = f"every prompt-step of {name} is a near-tie" if sum(ties) else f"no token step of {name}"
    return TaskResult(
        name, Task.GENERATE.value, len(first_parted), sum(ties),
        float(judged.mean()) if judged.size else None,
        float(in_top5.mean()) if in_top5.size else None,
        float(all_cosines.min()) if all_cosines.size else None,
        bool(judged.all()),
        steps=steps,
        token_agreement=float(np.mean(first_parted / steps)) if steps else None,
        first_divergence=int(first_parted.min()) if first_parted.size and first_parted.min() < steps else None,
        not_judged=not_judged,
    )


def _spread(values: np.ndarray) -> float:
    """The output's own scale: max - min of its finite values (0 for none)."""
    finite = values[np.isfinite(values)]
    return float(finite.max() - finite.min()) if finite.size else 0.0


def _near_ties(rows: np.ndarray, tol: Tolerance, spread: float) -> np.ndarray:
    """Rows whose top-2 margin is within `rtol_of_max` of the output's `spread`: the candidate may
    put either class first. Relative to the output's own scale, not `atol`, under which every
    logit of a model whose logits are all small would be a tie. A margin that is no number
    (the top two -inf: NaN in the reference) is a tie."""
    if rows.shape[1] < 2:
        return np.zeros(len(rows), dtype=bool)
    top2 = np.partition(rows, -2, axis=1)[:, -2:]
    return ~(top2[:, 1] - top2[:, 0] > tol.rtol_of_max * spread)


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
    """Top-1 agreement on every row (the last axis: the classes) whose reference top-2 margin is
    no near-tie; the rows that are (`_near_ties`) are counted, not judged. Not judged where every
    row is one."""
    r, c = _rows(reference), _rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.CLASSIFY.value, len(r), 0, 0.0, 0.0, None, False)
    judged = ~_near_ties(r, tol, _spread(r))
    if not judged.any():
        return TaskResult(name, Task.CLASSIFY.value, len(r), len(r), None, None, None, False,
                          not_judged=f"every row of {name} is a near-tie")
    agree = np.argmax(r, axis=1) == np.argmax(c, axis=1)
    top5 = _in_top(np.argmax(r, axis=1), c)
    return TaskResult(name, Task.CLASSIFY.value, len(r), int((~judged).sum()), float(np.mean(agree[judged])),
                      float(np.mean(top5[judged])), None, bool(agree[judged].all()))


def _segment(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """The class per pixel of an N x C x H x W output (axis -3 the classes: the input sets are
    stacked in front): the share of the judged pixels whose argmax agrees, and the mean IoU of
    the candidate's class map with the reference's over the classes the reference shows there.
    Pixels whose reference top-2 margin is a near-tie are counted, not judged."""
    if np.ndim(reference) < 3 or np.shape(reference) != np.shape(candidate):
        return TaskResult(name, Task.SEGMENT.value, int(np.size(reference)), 0, 0.0, None, None, False)
    classes = int(np.shape(reference)[-3])
    r, c = _pixels(reference), _pixels(candidate)
    judged = ~_near_ties(r, tol, _spread(r))
    if not judged.any():
        return TaskResult(name, Task.SEGMENT.value, len(r), len(r), None, None, None, False, classes=classes,
                          not_judged=f"every pixel of {name} is a near-tie")
    ref_class, cand_class = np.argmax(r[judged], axis=1), np.argmax(c[judged], axis=1)
    same = ref_class == cand_class
    inter = np.bincount(ref_class[same], minlength=classes)
    union = np.bincount(ref_class, minlength=classes) + np.bincount(cand_class, minlength=classes) - inter
    present = np.unique(ref_class)
    agreement, mean_iou = float(same.mean()), float(np.mean(inter[present] / union[present]))
    return TaskResult(
        name, Task.SEGMENT.value, len(r), int((~judged).sum()), agreement, None, None,
        agreement >= SEGMENT_AGREEMENT and mean_iou >= SEGMENT_MEAN_IOU, mean_iou=mean_iou, classes=classes,
    )


def _pixels(values: np.ndarray) -> np.ndarray:
    """An N x C x H x W output (any axes in front) as one float64 row of C classes per pixel,
    NaN read as -inf."""
    a = np.moveaxis(np.asarray(values, dtype=np.float64), -3, -1)
    return np.nan_to_num(a.reshape(-1, a.shape[-1]), nan=-np.inf)


def _embed(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """The lowest per-row cosine against the tolerance's min_cosine (one cosine over the whole
    tensor would hide a row that turned). Rows of zeros are counted apart; not judged where
    every row is one."""
    r, c = _as_rows(reference), _as_rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.EMBED.value, len(r), 0, None, None, None, False)
    cosines = _row_cosines(r, c)
    if not cosines.size:
        return TaskResult(name, Task.EMBED.value, len(r), len(r), None, None, None, False,
                          not_judged=f"every row of {name} is zeros")
    lowest = float(cosines.min())
    return TaskResult(name, Task.EMBED.value, len(r), len(r) - len(cosines), None, None, lowest,
                      lowest >= tol.min_cosine)


# -- the table's rows: what each task reads, how it compares, how it says so -----------------


def _each(compare: Callable[[str, np.ndarray, np.ndarray, Tolerance], TaskResult], class_axis: int = -1) -> Callable[
        [TaskInputs], tuple[TaskResult, ...]]:
    """A comparison of one output's values, over every output the task judges; `class_axis`
    is where its classes or features lie (`_rows_over_sets`)."""
    return lambda inputs: tuple(
        compare(n, *_rows_over_sets(inputs, n, class_axis), inputs.tolerances[n]) for n in inputs.names)


def _rows_over_sets(inputs: TaskInputs, name: str, class_axis: int) -> tuple[np.ndarray, np.ndarray]:
    """An output's reference and candidate over every input set: stacked (`pairs`) where the
    sets' shapes agree; where they differ (sets drawn at two sizes), each set's rows (one per
    pixel, token or sample, its `class_axis` last) one after another, shaped so that the
    comparison finds the classes on the same axis (a pixel row as N x C x 1 x 1)."""
    if inputs.runs is None:
        return inputs.pairs[name]
    sets = [run[name] for runs in inputs.runs for run in runs]
    if len({np.shape(v) for v in sets}) <= 1 or any(np.ndim(v) < -class_axis for v in sets):
        return inputs.pairs[name]
    if len({np.shape(v)[class_axis] for v in sets}) != 1:
        return inputs.pairs[name]  # the classes differ between sets: nothing to line up
    classes, trailing = np.shape(sets[0])[class_axis], (1,) * (-class_axis - 1)

    def rows(runs: Runs) -> np.ndarray:
        each = [np.moveaxis(np.asarray(run[name]), class_axis, -1).reshape(-1, classes) for run in runs]
        return np.concatenate(each).reshape(-1, classes, *trailing)

    return rows(inputs.runs[0]), rows(inputs.runs[1])


def _generation(inputs: TaskInputs) -> tuple[TaskResult, ...]:
    assert inputs.steps is not None, "generate is judged on the greedy steps"
    name = inputs.names[0]
    return (judge_generation(name, *inputs.steps, inputs.tolerances[name]),)


def _detection(inputs: TaskInputs) -> tuple[TaskResult, ...]:
    assert inputs.runs is not None, "detect is judged on each input set's outputs"
    return (judge_detection(inputs.names, *inputs.runs, inputs.tolerances[inputs.names[0]]),)


def _logits(inputs: TaskInputs) -> tuple[TaskResult, ...]:
    """The element-wise verdict of the logits outputs alone."""
    return tuple(
        TaskResult(n, Task.LOGITS.value, int(np.prod(np.shape(r)[:-1]) or 1), 0, None, None, inputs.drifts[n].cosine,
                   inputs.drifts[n].passed)
        for n, (r, _) in inputs.pairs.items()
    )


def _named(words: Sequence[str], exact: Sequence[str] = ()) -> Callable[[str], bool]:
    return lambda name: any(w in name.lower() for w in words) or name.lower() in exact


def _rows_of(words: Sequence[str]) -> Callable[[Shapes, Generator | None, bool], tuple[str, ...]]:
    """Outputs with a last axis longer than 1 (the classes or features), named so for `auto`."""
    named = _named(words)
    return lambda outputs, _, by_name: tuple(
        n for n, s in outputs.items() if len(s) >= 1 and s[-1] > 1 and (not by_name or named(n)))


def _segment_outputs(outputs: Shapes, generator: Generator | None, by_name: bool) -> tuple[str, ...]:
    """N x C x H x W outputs with two classes or more; for `auto`, named like a segmenter's and
    with fewer classes than pixels (an image's C of 3 against H x W of 4,096 is a segmenter's
    shape too: the name decides). Channels last is not read so."""
    named = _named(_SEGMENT_NAMES, _SEGMENT_EXACT)
    return tuple(
        n for n, s in outputs.items()
        if len(s) == 4 and s[1] >= 2 and (not by_name or (named(n) and s[1] < s[2] * s[3]))
    )


def _why_segment(named: tuple[str, ...], outputs: Shapes, generator: Generator | None) -> str:
    _, c, h, w = outputs[named[0]]
    return f"output {named[0]!r} (N x C x H x W: {c} classes on axis 1 for each of {h * w} pixels)"


def _generate_outputs(outputs: Shapes, generator: Generator | None, by_name: bool) -> tuple[str, ...]:
    """The decoder step's logits. For `auto`, a step without a cache only where something says
    it is a decoder's (`Generator.sign`): a masked LM has the same `input_ids` -> `logits`
    [batch, seq, vocab] interface, and its logits are judged as a classifier's."""
    if generator is None or (by_name and generator.cacheless and generator.sign is None):
        return ()
    return (generator.logits,)


def _why_generate(named: tuple[str, ...], outputs: Shapes, generator: Generator | None) -> str:
    assert generator is not None
    if generator.cacheless:
        return (f"a decoder step without a cache ({generator.ids} in, {generator.logits} out, the whole sequence "
                f"fed again each step; a decoder's by {generator.sign})")
    return f"a decoder step ({generator.ids} in, {generator.logits} and a cache out)"


def _share(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def _cos(value: float | None) -> str:
    """Enough digits that a cosine just under 1 does not print as 1."""
    return "-" if value is None else "1" if value == 1.0 else f"{value:.7f}"


def _apart(count: int, what: str) -> str:
    return f" ({count} {what} set apart)" if count else ""


def _say_generate(r: TaskResult) -> str:
    parted = f"first parts at step {r.first_divergence}" if r.first_divergence is not None else "never parts"
    return (
        f"{r.rows} prompts x {r.steps} greedy steps, teacher-forced top-1 {_share(r.top1_agreement)}, "
        f"top-5 {_share(r.top5_agreement)}, lowest logit cosine {_cos(r.min_cosine)}; free-running "
        f"{parted} ({_share(r.token_agreement)} of the tokens before it){_apart(r.set_apart, 'near-tie steps')}"
    )


def _say_detect(r: TaskResult) -> str:
    iou = "-" if r.mean_iou is None else f"{r.mean_iou:.3f}"
    return (f"recall {_share(r.recall)}, precision {_share(r.precision)}, mean IoU {iou} over {r.rows} images"
            f"{_apart(r.set_apart, 'detections at the score cut')}")


def _say_segment(r: TaskResult) -> str:
    iou = "-" if r.mean_iou is None else f"{r.mean_iou:.3f}"
    return (f"{_share(r.top1_agreement, 2)} of {r.rows} pixels keep their class of {r.classes}, mean IoU {iou}"
            f"{_apart(r.set_apart, 'near-tie pixels')}")


def _say_classify(r: TaskResult) -> str:
    return (f"top-1 {_share(r.top1_agreement)}, top-5 {_share(r.top5_agreement)} of {r.rows} rows"
            f"{_apart(r.set_apart, 'near-ties')}")


def _say_embed(r: TaskResult) -> str:
    return f"lowest row cosine {_cos(r.min_cosine)} of {r.rows} rows{_apart(r.set_apart, 'zero rows')}"


def _say_logits(r: TaskResult) -> str:
    return f"element-wise (cosine {_cos(r.min_cosine)})"


#: The task verdicts, in the order `--task auto` tries them. A new task is one row here and its
#: comparison; `names.TASK_NAMES` offers it to the command line.
TASK_SPECS: Mapping[Task, TaskSpec] = {
    spec.task: spec
    for spec in (
        TaskSpec(
            Task.GENERATE, "the logits' last position, last axis: the vocabulary",
            _generate_outputs, _generation, _say_generate,
            "--task generate: the model is no decoder step (input_ids in; logits and present.* out, or logits "
            "[batch, seq, vocab] and no cache)",
            why=_why_generate,
        ),
        TaskSpec(
            Task.DETECT, "per image, the detections of one of detect.LAYOUTS (boxes + scores/labels or logits, "
            "N x K x 6, a raw YOLO head)",
            lambda outputs, _, by_name: detection_outputs(outputs, by_name), _detection, _say_detect,
            "--task detect: no detector's outputs (a name with 'box' and a last axis of 4, with scores, labels or "
            "logits; N x K x 6 end-to-end detections; a raw YOLO head N x (4 + C) x A or N x A x (5 + C))",
        ),
        TaskSpec(
            Task.SEGMENT, "axis 1 of N x C x H x W: the classes of each pixel",
            _segment_outputs, _each(_segment, class_axis=-3), _say_segment,
            "--task segment: no N x C x H x W output with two classes or more", why=_why_segment,
        ),
        TaskSpec(
            Task.CLASSIFY, "the last axis: the classes of each row",
            _rows_of(_CLASSIFY_NAMES), _each(_classify), _say_classify,
            "--task classify: no output with a last axis longer than 1 to judge",
        ),
        TaskSpec(
            Task.EMBED, "the last axis: the features of each row",
            _rows_of(_EMBED_NAMES), _each(_embed), _say_embed,
            "--task embed: no output with a last axis longer than 1 to judge",
        ),
        TaskSpec(
            Task.LOGITS, "every element",
            lambda outputs, _, __: tuple(n for n in outputs if "logits" in n.lower()), _logits, _say_logits,
            "--task logits: no output with 'logits' in its name", auto=False,
        ),
    )
}
assert (Task.AUTO.value, *(t.value for t in TASK_SPECS), Task.NONE.value) == TASK_NAMES

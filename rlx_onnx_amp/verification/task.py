"""Verdicts on the task (issue 39): does the converted model still do its job? A classifier's
class per row (top-1 and top-5 agreement, near-ties set apart), an embedding's direction per row
(the lowest cosine), judged on the outputs the task names; the element-wise figures stay as
diagnostics. `choose_task` picks the task from the output names where `--task auto`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import numpy as np

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.reports.record import TaskResult, TaskVerdict
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = ["TASKS", "Task", "choose_task", "judge_task"]


class Task(str, enum.Enum):
    AUTO = "auto"
    CLASSIFY = "classify"  # logits or scores: the class per row
    EMBED = "embed"  # embeddings: the direction per row
    NONE = "none"  # element-wise only


TASKS = tuple(t.value for t in Task)

#: Output names (lower case) that say what `--task auto` judges them as.
_NAMED = {
    Task.CLASSIFY: ("logits", "scores", "probabilities", "probs"),
    Task.EMBED: ("embedding", "embeds", "last_hidden_state", "pooler_output", "hidden_states"),
}


def choose_task(task: str, outputs: Mapping[str, tuple[int, ...]]) -> tuple[Task, tuple[str, ...], str]:
    """(the task, the outputs it judges, how it was chosen) for `--task` and the reference's
    output shapes; `Task.NONE` with no output where nothing names a task."""
    try:
        wanted = Task(task)
    except ValueError:
        raise InputError(f"--task: unknown task {task!r} (known: {', '.join(TASKS)})") from None
    if wanted is Task.NONE:
        return Task.NONE, (), "--task none"
    for kind in (Task.CLASSIFY, Task.EMBED):
        if wanted not in (Task.AUTO, kind):
            continue
        named = tuple(
            name for name, shape in outputs.items()
            if len(shape) >= 1 and shape[-1] > 1 and (wanted is kind or any(w in name.lower() for w in _NAMED[kind]))
        )
        if named:
            return kind, named, "--task" if wanted is kind else f"auto: output {named[0]!r}"
    if wanted is not Task.AUTO:
        raise InputError(f"--task {task}: no output with a last axis longer than 1 to judge")
    return Task.NONE, (), "auto: no output names a task"


def judge_task(
    task: Task,
    chosen_by: str,
    pairs: Mapping[str, tuple[np.ndarray, np.ndarray]],
    tolerances: Mapping[str, Tolerance],
) -> TaskVerdict | None:
    """The task verdict on the named outputs' (reference, candidate) values, or None for no task."""
    if task is Task.NONE or not pairs:
        return None
    judge = _classify if task is Task.CLASSIFY else _embed
    results = tuple(judge(name, *pair, tolerances[name]) for name, pair in pairs.items())
    return TaskVerdict(task.value, chosen_by, all(r.passed for r in results), results)


def _rows(values: np.ndarray) -> np.ndarray:
    a = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def _classify(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """Top-1 agreement on every row whose reference top-2 margin the tolerance can tell apart;
    the rows where it cannot (near-ties) are counted, not judged."""
    r, c = _rows(reference), _rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.CLASSIFY.value, len(r), 0, 0.0, 0.0, None, False)
    top2 = np.sort(r, axis=1)[:, -2:] if r.shape[1] > 1 else np.concatenate([r, r], axis=1)
    margin = top2[:, 1] - top2[:, 0]
    scale = np.max(np.abs(np.where(np.isfinite(r), r, 0.0)), axis=1)
    ties = margin <= np.array([tol.bound(float(s)) for s in scale])
    agree = np.argmax(r, axis=1) == np.argmax(c, axis=1)
    k = min(5, r.shape[1])
    top5 = np.array([np.argmax(r[i]) in np.argsort(c[i])[-k:] for i in range(len(r))])
    judged = ~ties
    top1 = float(np.mean(agree[judged])) if judged.any() else None
    top5_share = float(np.mean(top5[judged])) if judged.any() else None
    return TaskResult(name, Task.CLASSIFY.value, len(r), int(ties.sum()), top1, top5_share, None,
                      bool(agree[judged].all()))


def _embed(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> TaskResult:
    """The lowest per-row cosine against the tolerance's min_cosine (one cosine over the whole
    tensor would hide a row that turned)."""
    r, c = _rows(reference), _rows(candidate)
    if r.shape != c.shape:
        return TaskResult(name, Task.EMBED.value, len(r), 0, None, None, None, False)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
    live = norms > 0
    cosines = np.einsum("ij,ij->i", r[live], c[live]) / norms[live]
    lowest = float(cosines.min()) if cosines.size else None
    passed = lowest is None or lowest >= tol.min_cosine
    return TaskResult(name, Task.EMBED.value, len(r), int((~live).sum()), None, None, lowest, passed)


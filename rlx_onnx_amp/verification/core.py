"""Verification: one reference, run once on the verification's inputs, judges candidates.

`Verifier` holds a prepared reference (`reference.prepare_reference`: its outputs on every
input set, with the range screen when asked) and a scratch directory, and judges candidates
against it: each one's sessions (`compare.open_compared`, emulated where the provider cannot
run its precision), its outputs on the same inputs, and each output's drift against the
tolerance (`Judgement`); `localize` compares a judged candidate's intermediate tensors with the
reference's, which are run once however many candidates it localizes. `verify` (the verify
command, `--verify`), repair's evaluations and its final proof all go through it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rlx_onnx_amp.child import ChildCrashed, Pending, child_event, start_in_child
from rlx_onnx_amp.errors import InputError, ModelRunError
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.loading import load_model
from rlx_onnx_amp.reports.record import (
    Latency,
    Localized,
    OutputResult,
    TaskVerdict,
    TracePoint,
    Verification,
    WrittenRun,
)
from rlx_onnx_amp.tensors import tensor_nbytes
from rlx_onnx_amp.timing import TimedRun, WrittenAnswer, measure_latency, time_written_model
from rlx_onnx_amp.verification.compare import (
    Compared,
    Progress,
    Scratch,
    Session,
    VerifyOptions,
    emulated_model,
    emulated_without_loading,
    open_compared,
    run_each,
    session_thread_count,
    typed_feeds,
)
from rlx_onnx_amp.verification.detect import metadata_task
from rlx_onnx_amp.verification.generate import Generator, Steps, decode, find_generator
from rlx_onnx_amp.verification.inputs import save_inputs
from rlx_onnx_amp.verification.localize import localize, reference_values, shared_values
from rlx_onnx_amp.verification.metrics import compare_arrays
from rlx_onnx_amp.verification.options import PROVIDERS
from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable, prepare_reference
from rlx_onnx_amp.verification.sizes import SECOND_SIZE_WEIGHT_LIMIT, weight_bytes
from rlx_onnx_amp.verification.task import Task, choose_task, judge_task

__all__ = ["Judgement", "Verifier", "verify"]

logger = logging.getLogger(__name__)


@dataclass
class Judgement:
    """One candidate judged against the reference: what ran as it, and each output's drift,
    failing outputs first."""

    compared: Compared  # its session released
    drifts: list[OutputResult]
    task: TaskVerdict | None = None  # where a task judged something, it decides

    @property
    def passed(self) -> bool:
        if self.task is not None and self.task.judged:
            return self.task.passed
        return bool(self.drifts) and all(d.passed for d in self.drifts)

    @property
    def score(self) -> float:
        """The worst output's `OutputResult.score`: how far from passing (a score past the
        float range, None in the record, is the worst)."""
        return max((d.score if d.score is not None else math.inf for d in self.drifts), default=0.0)


class Verifier:
    """A reference run once, judging candidates within one scratch directory (removed on exit).

    `judge` runs a candidate (a model in memory, or a file) on the reference's input sets and
    measures its drift; `localize` names where a judged candidate's drift starts, against the
    reference's intermediate tensors, run once and kept for every candidate after; `verify`
    proves a written file and reports it. One onnxruntime session is held at a time."""

    def __init__(self, reference: Reference, options: VerifyOptions, scratch_prefix: str = "rlx-amp-verify-") -> None:
        self.reference = reference
        self.options = options
        self.scratch = Scratch(scratch_prefix)
        #: The reference's intermediates `localize` compared last: (their names, their files).
        self._intermediates: tuple[tuple[str, ...], dict[str, Path]] | None = None
        #: The task judged (`_task`), and for `generate` the decoder step and the reference's steps.
        self._chosen: tuple[Task, tuple[str, ...], str] | None = None
        self._generator: Generator | None = None
        self._ref_steps: list[Steps] | None = None
        self._generating: list[int] = []  # the input sets the reference generated from

    @classmethod
    def prepare(
        cls,
        path: str | os.PathLike[str],
        options: VerifyOptions,
        *,
        screen: bool = False,
        progress: Progress | None = None,
        scratch_prefix: str = "rlx-amp-verify-",
        held_out: bool = False,
    ) -> Verifier:
        """The verification of candidates against the model at `path`, its reference run made
        (`prepare_reference`); a reference that cannot run is its error (exit 2 or 3)."""
        try:
            reference = prepare_reference(path, options, screen=screen, progress=progress, held_out=held_out)
        except ReferenceUnavailable as e:
            raise e.error from None
        return cls(reference, options, scratch_prefix)

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.scratch.cleanup()

    def judge(
        self,
        model: onnx.ModelProto,
        path: Path | None = None,
        *,
        label: str = "candidate",
        progress: Progress | None = None,
        cannot_run: str | None = None,
        ran: bool = False,
        emulated: onnx.ModelProto | None = None,
    ) -> Judgement:
        """`model` (read from `path` when given, else saved to scratch) run on every input set,
        or its emulation (see `compare.open_compared`: `cannot_run`, `ran`, `emulated`), and each
        output judged against the reference's by the tolerance."""
        ref = self.reference
        task, named, chosen_by = self._task(progress)
        compared = open_compared(
            ref.model, ref.path.parent, model, path, ref.provider, self.options.emulate, self.scratch, label, progress,
            cannot_run, ran, emulated,
        )
        runs = run_each(compared, ref.samples, ref.output_names, progress, "running the candidate")
        cand_steps = None
        if task is Task.GENERATE:  # teacher-forced: fed the reference's tokens
            assert self._generator is not None and self._ref_steps is not None
            cand_steps = [steps for steps in _decode_sets(
                compared, self._generator, ref, runs, self.options.generate_steps, self._generating, progress,
                "generating (candidate)", self._ref_steps) if steps]
        compared.release()
        pairs = _paired(ref.runs, runs, ref.output_names)
        tolerances = {name: self.options.tolerance.for_output(name, compared.precision) for name in pairs}
        drifts = [compare_arrays(name, r, c, tolerances[name]) for name, (r, c) in pairs.items()]
        drifts.sort(key=lambda o: (o.passed, o.name))
        steps = (self._ref_steps, cand_steps) if self._ref_steps is not None and cand_steps is not None else None
        verdict = judge_task(task, chosen_by, {n: pairs[n] for n in named}, tolerances, {d.name: d for d in drifts},
                             runs=(ref.runs, runs), steps=steps)
        return Judgement(compared, drifts, verdict)

    def _task(self, progress: Progress | None) -> tuple[Task, tuple[str, ...], str]:
        """The task this verification judges (`task.choose_task`), chosen once; for `generate`,
        the reference's greedy steps run once here, for every candidate after. Where `auto`
        found a decoder step that cannot take a second step on its own feeds, the task is
        chosen again without it, and the reason is told."""
        if self._chosen is not None:
            return self._chosen
        ref = self.reference
        shapes = {n: np.shape(v) for n, v in ref.runs[0].items()} if ref.runs else {}
        self._generator = find_generator(ref.model, ref.path.name)
        # a folder's config names the task; else the model's own metadata may (ultralytics' task)
        named_by = self.options.folder_task or metadata_task(ref.model)
        chosen = choose_task(self.options.task, shapes, self._generator, named_by)
        if chosen[0] is Task.GENERATE:
            assert self._generator is not None
            session = Session(str(ref.path), ref.provider, str(ref.path))
            found = _decode_sets(session, self._generator, ref, ref.runs, self.options.generate_steps,
                                 range(len(ref.samples)), progress, "generating (reference)")
            self._generating = [k for k, steps in enumerate(found) if steps is not None]
            self._ref_steps = [steps for steps in found if steps is not None]
            if not self._ref_steps:
                if self.options.task != Task.AUTO.value:
                    raise ModelRunError(f"{ref.path}: --task generate: no input set can take a second greedy step")
                task, named, how = choose_task(self.options.task, shapes, None, named_by)
                chosen = (task, named, f"{how} (a decoder step, but the greedy loop's next step cannot run)")
        self._chosen = chosen
        return chosen

    def localize(
        self, judgement: Judgement, top: int, trace: list[TracePoint] | None = None
    ) -> list[Localized]:
        """The first `top` nodes where a judged candidate's drift starts (see `localize.localize`),
        on the first input set."""
        ref = self.reference
        names = tuple(shared_values(ref.model, judgement.compared.model))
        if self._intermediates is not None and self._intermediates[0] != names:
            for file in self._intermediates[1].values():  # another candidate's names: run again
                file.unlink()
            self._intermediates = None
        if self._intermediates is None:
            stored = reference_values(ref.model, ref.path.parent, ref.samples[0], ref.provider, self.scratch, names)
            self._intermediates = (names, stored)
        tol = self.options.tolerance.for_output("", judgement.compared.precision)
        feeds, stored = ref.samples[0], self._intermediates[1]
        return localize(ref.model, stored, judgement.compared, feeds, ref.provider, self.scratch, tol, top, trace)

    def verify(
        self,
        path: str | os.PathLike[str],
        model: onnx.ModelProto | None = None,
        *,
        label: str | None = None,
        outputs: OutputSet | None = None,
        progress: Progress | None = None,
    ) -> Verification:
        """The report on the candidate file at `path` (`model`: it loaded without its external
        data, when the caller has it), localized with `--localize`. `label` names it in the
        report (a staged model is verified before it is moved to its final path).
        `--save-inputs` is staged into `outputs` when given (the caller commits it); otherwise
        it is written when the verification ends."""
        ref, options = self.reference, self.options
        cand_path = Path(path)
        cand_label = label or str(cand_path)
        cand_model = model if model is not None else load_model(cand_path)
        _check_interfaces(ref.model, cand_model, ref.path, Path(cand_label))
        if options.save_inputs:
            self._save_inputs(options.save_inputs, cand_path, outputs)
        cand_ms, cand_error, judgement, written = _run_and_judge(self, cand_model, cand_path, cand_label, progress)
        localized = None
        trace: list[TracePoint] | None = None
        if options.localize:
            trace = []
            localized = tuple(self.localize(judgement, options.localize_top, trace))
        compared = judgement.compared
        tolerance = options.tolerance.resolved(compared.precision)
        latency = self._latency(cand_ms, cand_error) if options.latency_runs or cand_error else None
        return Verification(
            reference=str(ref.path),
            candidate=cand_label,
            provider=ref.provider,
            providers_used=tuple(ref.providers_used),
            emulated=compared.emulated,
            emulation_reason=compared.reason,
            candidate_loaded=compared.loaded,
            precision=compared.precision.value,
            criterion=tolerance.criterion,
            atol=tolerance.table("atol"),  # type: ignore[arg-type]
            rtol_of_max=tolerance.table("rtol_of_max"),  # type: ignore[arg-type]
            rtol=tolerance.table("rtol"),
            min_cosine=tolerance.table("min_cosine"),  # type: ignore[arg-type]
            seed=options.spec.seed,
            samples=len(ref.samples),
            inputs={k: list(v.shape) for k, v in ref.samples[0].items()},
            passed=judgement.passed and written.passed is not False,  # the written file's outputs fail too
            outputs=tuple(judgement.drifts),
            localized=localized,
            localize_trace=tuple(trace) if trace is not None else None,
            latency=latency,
            task=judgement.task,
            written=written,
            inputs_why=dict(ref.sizes.why) if ref.sizes is not None else None,
            inputs_second=_listed(ref.second_size()),
            inputs_from=ref.inputs_from,
        )

    def _latency(self, cand_ms: float | None, cand_error: str | None) -> Latency:
        """The reference's time per inference here beside the written file's: what the
        conversion buys (or costs) on this provider."""
        ref, target = self.reference, self.options.target
        runs = latency_runs(ref, self.options.latency_runs)
        notes = [cand_error] if cand_error else []
        ref_ms = None
        weights = weight_bytes(ref.model)
        if runs and target not in (None, ref.provider) and weights > SECOND_SIZE_WEIGHT_LIMIT:
            # a second session of the input's weights costs more than a time that concludes nothing
            notes.append(f"the input not timed: {ref.provider} stands in for the {target} target, and another "
                         f"session of its {weights / 2**30:.1f} GiB of weights is not worth a number with no "
                         "speed conclusion")
        elif runs:
            try:
                ref_ms = measure_latency(_timed_run(ref, ref.path, runs, str(ref.path), "the input"),
                                         typed_feeds(ref.model, ref.samples[0]))
            except ModelRunError as e:
                notes.append(str(e))
        return Latency(ref.provider, runs, ref_ms, cand_ms, "; ".join(notes) or None)

    def _save_inputs(self, target: str, cand_path: Path, outputs: OutputSet | None) -> None:
        samples = self.reference.samples
        if outputs is not None:
            save_inputs(outputs, target, samples)
            return
        paths = RunPaths()
        for path, role in ((self.reference.path, "reference model"), (cand_path, "candidate model")):
            paths.read(path, role)
        paths.write(target, "--save-inputs file")
        paths.check()
        with OutputSet(paths.protected()) as own:
            save_inputs(own, target, samples)
            own.commit()


#: The timed runs of each model's latency take at most about this many seconds: a model whose
#: inference takes longer is timed fewer times (at least once), the same number for both.
LATENCY_BUDGET_S = 2.0


def latency_runs(reference: Reference, asked: int) -> int:
    """How many warm runs time each model: `--latency-runs`, fewer where the reference's run per
    input set (`Reference.seconds_per_set`) says they would take past `LATENCY_BUDGET_S`."""
    seconds = reference.seconds_per_set
    if not asked or not seconds:
        return asked
    return max(1, min(asked, math.floor(LATENCY_BUDGET_S / seconds)))


#: Up to this many bytes of candidate weights, the written file's run in its child process
#: overlaps the emulated candidate's run in this one (two sessions held at once); above it, one
#: session at a time (docs/verification.md, "What runs").
OVERLAP_MAX_BYTES = 512 * 2**20


def _run_and_judge(
    verifier: Verifier, model: onnx.ModelProto, path: Path, label: str, progress: Progress | None
) -> tuple[float | None, str | None, Judgement, WrittenRun]:
    """The written file run (and timed) in a child process before any verdict (an onnxruntime
    crash there is this run's exit 3, not its end), and the candidate judged; the written file's
    own outputs on every input set are judged as well (`WrittenRun`). Where the judgement is an
    emulation that does not load the file in this process and the weights are small, the two run
    at the same time: onnxruntime's CPU session on an f16 graph is what grows fastest with a
    graph's size (docs/benchmarks.md); the child's timed runs wait until the judgement is done,
    so that they do not share the CPUs with it. Above `OVERLAP_MAX_BYTES`, one session at a time:
    the emulation's weights are rounded while the child runs (no session in this process), its
    session made once the child is done."""
    ref, options = verifier.reference, verifier.options
    sets = [typed_feeds(model, feeds) for feeds in ref.samples]
    args = (time_written_model, _timed_run(ref, path, latency_runs(ref, options.latency_runs), label), sets,
            ref.output_names)
    emulates = emulated_without_loading(model, ref.provider, options.emulate)
    overlap = emulates and sum(tensor_nbytes(t) for t in model.graph.initializer) <= OVERLAP_MAX_BYTES
    if not overlap:
        emulation = None
        if emulates:  # its weights rounded while the child runs (no session here: one at a time still)
            built = child_event()
            with start_in_child(*args, built) as pending:
                try:
                    emulation = emulated_model(ref.model, ref.path.parent, model, verifier.scratch, progress,
                                               cand_dir=path.parent)
                finally:
                    built.set()  # the child's timed runs, on CPUs this process no longer uses
                answer, crashed = _written_answer(pending, verifier, label)
        else:
            with start_in_child(*args) as pending:
                answer, crashed = _written_answer(pending, verifier, label)
        judged = verifier.judge(model, path, label=label, progress=progress, cannot_run=answer.error,
                                ran=answer.error is None, emulated=emulation)
        return answer.ms, answer.error, judged, _written_run(verifier, answer, crashed, judged)
    go = child_event()
    with start_in_child(*args, go) as pending:  # a stop (^C, SIGTERM) leaves it: the child is killed
        try:
            judgement = verifier.judge(model, path, label=label, progress=progress, ran=True)
        except Exception:  # the child's answer first: a file that cannot run is the error, not what followed
            go.set()
            _written_answer(pending, verifier, label)
            raise
        go.set()
        answer, crashed = _written_answer(pending, verifier, label)
    if answer.error is not None:  # it cannot run on the provider that stands in for the target
        judgement.compared.could_not_load(ref.provider, answer.error)
    return answer.ms, answer.error, judgement, _written_run(verifier, answer, crashed, judgement)


def _timed_run(ref: Reference, path: Path, runs: int, label: str, role: str = "the written file") -> TimedRun:
    """The model file at `path` timed on the reference's provider, with this process's intra-op
    threads (a --jobs worker's share of the CPUs, in a child process too)."""
    return TimedRun(str(path), ref.provider, PROVIDERS[ref.provider], runs, label, session_thread_count(), role)


def _written_answer(
    pending: Pending[WrittenAnswer], verifier: Verifier, label: str
) -> tuple[WrittenAnswer, str | None]:
    """The written file's run (`timing.time_written_model`): its outputs and milliseconds, or why
    it cannot run where it cannot (a stand-in provider's), and how onnxruntime died where it
    crashed. It cannot run on the provider it is meant for: ModelRunError, exit 3."""
    provider, target = verifier.reference.provider, verifier.options.target
    crashed = None
    try:
        answer = pending.result()
    except ChildCrashed as e:
        crashed = e.died_of
        answer = WrittenAnswer(None, None, f"{label}: onnxruntime crashed running it on {provider}: {e}")
    if answer.error is not None and (target is None or target == provider):
        raise ModelRunError(f"{answer.error}; a model that cannot run is never passed")
    if answer.error is not None:
        logger.info("%s; %s only stands in for the %s target here", answer.error, provider, target)
    return answer, crashed


def _written_run(verifier: Verifier, answer: WrittenAnswer, crashed: str | None, judgement: Judgement) -> WrittenRun:
    """The written file's outputs (`answer`) judged against the reference's by the tolerance the
    candidate was judged by, and by its task where one is judged (`generate`: the first step's
    greedy token per row, as `classify` judges it)."""
    ref, options = verifier.reference, verifier.options
    if answer.outputs is None:
        return WrittenRun(ref.provider, options.target, False, crashed, answer.error, (), None)
    pairs = _paired(ref.runs, answer.outputs, ref.output_names)
    precision = judgement.compared.precision
    tolerances = {name: options.tolerance.for_output(name, precision) for name in pairs}
    drifts = sorted((compare_arrays(name, r, c, tolerances[name]) for name, (r, c) in pairs.items()),
                    key=lambda o: (o.passed, o.name))
    verdict: TaskVerdict | None = None
    if verifier._chosen is not None:
        task, named, chosen_by = verifier._chosen
        # generate: the written file's first step only (its greedy loop is the emulation's to run)
        judged_as = Task.CLASSIFY if task is Task.GENERATE else task
        verdict = judge_task(judged_as, chosen_by, {n: pairs[n] for n in named}, tolerances,
                             {d.name: d for d in drifts}, runs=(ref.runs, answer.outputs))
    judged = verdict is not None and verdict.judged
    passed = verdict.passed if judged and verdict is not None else bool(drifts) and all(d.passed for d in drifts)
    return WrittenRun(ref.provider, options.target, True, None, None, tuple(drifts), passed, verdict)


def verify(
    reference: str | os.PathLike[str],
    candidate: str | os.PathLike[str],
    options: VerifyOptions | None = None,
    progress: Progress | None = None,
    *,
    candidate_label: str | None = None,
    outputs: OutputSet | None = None,
    prepared: Reference | None = None,
) -> Verification:
    """Compare `candidate` against `reference` on the same inputs (docs/verification.md).

    `candidate_label` names the candidate in the report (a staged model is verified before it
    is moved to its final path). `--save-inputs` is staged into `outputs` when given (the
    caller commits it); otherwise it is written when the verification ends. `prepared` is the
    reference's run already made (`prepare_reference`, with the range screen): it is not run
    again.
    """
    options = options or VerifyOptions()
    ref_path, cand_path = Path(reference), Path(candidate)
    cand_model = load_model(cand_path)
    if prepared is None:
        # The interfaces first, before anything runs.
        _check_interfaces(load_model(ref_path), cand_model, ref_path, Path(candidate_label or str(cand_path)))
        # One onnxruntime session at a time (the reference's outputs kept, its session
        # released, then the candidate's): verifying needs about one model's memory, not two.
        verifier = Verifier.prepare(ref_path, options, progress=progress)
    else:
        verifier = Verifier(prepared, options)
    with verifier:
        return verifier.verify(cand_path, cand_model, label=candidate_label, outputs=outputs, progress=progress)


def _decode_sets(
    runner: Session | Compared,
    gen: Generator,
    ref: Reference,
    firsts: Sequence[Mapping[str, np.ndarray]],
    steps: int,
    which: Sequence[int],
    progress: Progress | None,
    stage: str,
    forced: Sequence[Steps] | None = None,
) -> list[Steps | None]:
    """The greedy steps from the input sets `which` (`generate.decode`), whose first step's
    outputs are `firsts`: the reference's own tokens (None for a set whose next step cannot run:
    a merged decoder's cached branch fed several new tokens at once cannot always go on), or
    (`forced`, one per set of `which`) the reference's tokens fed in."""
    found: list[Steps | None] = []
    for done, k in enumerate(which):
        if progress is not None:
            progress(stage, done, len(which))
        tokens = forced[done].tokens if forced is not None else None
        try:
            found.append(decode(gen, lambda f: runner.run(f, ref.output_names), ref.samples[k], firsts[k], steps,
                                tokens))
        except ModelRunError as e:
            if forced is not None:
                raise  # the candidate cannot take a step the reference took
            logger.info("generate: input set %d: %s", k, e)
            found.append(None)
    if progress is not None:
        progress(stage, len(which), len(which))
    return found


def _listed(shapes: Mapping[str, tuple[int, ...]] | None) -> dict[str, list[int]] | None:
    return {k: list(v) for k, v in shapes.items()} if shapes is not None else None


def _paired(
    reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each output's reference and candidate values over every input set."""
    return {n: (_stacked([r[n] for r in reference]), _stacked([c[n] for c in candidate])) for n in names}


def _stacked(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """One array from an output's value in each input set: stacked when their shapes agree,
    else (data-dependent shapes) their values one after another."""
    if len(arrays) == 1:
        return np.asarray(arrays[0])
    if len({np.shape(a) for a in arrays}) == 1:
        return np.stack(arrays)
    return np.concatenate([np.ravel(a) for a in arrays])


def _check_interfaces(ref: onnx.ModelProto, cand: onnx.ModelProto, ref_path: Path, cand_path: Path) -> None:
    ref_in = {i.name for i in ref.graph.input} - {t.name for t in ref.graph.initializer}
    cand_in = {i.name for i in cand.graph.input} - {t.name for t in cand.graph.initializer}
    if ref_in != cand_in:
        raise InputError(f"{cand_path}: inputs {sorted(cand_in)} differ from {ref_path}'s {sorted(ref_in)}")
    ref_out = [o.name for o in ref.graph.output]
    if not ref_out:
        raise InputError(f"{ref_path}: the model has no outputs to compare")
    missing = set(ref_out) - {o.name for o in cand.graph.output}
    if missing:
        raise InputError(f"{cand_path}: lacks output(s) {', '.join(sorted(missing))} of {ref_path}")

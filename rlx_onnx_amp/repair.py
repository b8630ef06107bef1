"""Auto-repair: meet the drift tolerance with as much low-precision work as possible.

The search, each step deterministic and independent of node names. It only ever spends an
evaluation on nodes the converter can keep (`NodeIndex.keepable`: in low precision, and
not a Constant-like node, a Cast, control flow or an unknown op).

1. **Magnitude screen** (one f32 reference run, no candidate evaluation), over every tensor,
   If/Loop/Scan bodies included: one whose finite values pass the target type's largest finite value keeps its
   producer and its consumers in f32 (`overflow`: a consumer would cast it down to Inf); one
   whose non-zero values mostly flush to zero, or lie wholly below the smallest normal number
   and lose more than `SUBNORMAL_LOSS_ULPS` when rounded, keeps its producer and its consumers
   in f32 (`underflow`: a network whose late activations are all tiny is repaired as a region,
   not node by node), unless its loss cannot reach an output (`_absorbed`: it only feeds, through
   other such tensors, ops like Sigmoid whose in-range output ignores it); one with values that flush to zero
   and that feeds an input where zero is singular (a divisor, a square root, a logarithm) keeps
   its producer and that consumer in f32 (`underflow`).
2. **Localization**: while it fails, the first keepable node where drift jumps, NaN/Inf appears
   or a shape starts to differ (`--localize`) is kept in f32 (`drift`), unless its op only
   copies its inputs' values (`VALUE_EXACT_OPS`: a Reshape's drift is its rounded input, and
   keeping it alone would only move that rounding to its readers).
3. **Bisection** over what remains when localization names no new node: the keepable nodes in
   graph order (bodies of If/Loop/Scan included, by node path) are halved, keeping the half
   whose f32 restores the most accuracy, until one node is left; when both halves of a pool
   that passed fail, it stops (the culprits span both) and minimization takes over. The first
   time both halves of a whole pool fail, the whole pool is tried once (drift that many nodes
   add a little each).
4. **Minimality**: once a candidate passes, kept nodes are given back in chunks while the
   result still passes, as far as the budget allows: the screen's readers-only nodes first,
   then the Compute nodes, then the rest; a chunk that cannot go is halved.

Every evaluation counts against `budget`. The model written is the best candidate evaluated
(`best_key`): a passing one over a failing one; among passing ones the fewest kept nodes, then
the lowest score; among failing ones the lowest score.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from rlx_onnx_amp.api import load_model, resolve_policy, stage_conversion
from rlx_onnx_amp.cost import estimate_cost, no_gain
from rlx_onnx_amp.errors import ModelRunError
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import FLOAT_TYPES, LOW_PRECISIONS, PRECISIONS, Precision, PrecisionInfo
from rlx_onnx_amp.ranges import NumericFacts
from rlx_onnx_amp.reports.record import (
    Conversion,
    HeldOut,
    Localized,
    Repair,
    RepairBest,
    RepairKeep,
    RepairStep,
    Verification,
)
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model, why_not_keepable
from rlx_onnx_amp.taxonomy import OpKind, copies_values, kind_of
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource, external_locations, tensor_nbytes
from rlx_onnx_amp.types import all_tensors, model_types, names_read, scoped_graphs, subgraphs
from rlx_onnx_amp.verification.compare import Scratch, VerifyOptions
from rlx_onnx_amp.verification.core import Judgement, Verifier
from rlx_onnx_amp.verification.emulate import emulate
from rlx_onnx_amp.verification.localize import expose_outputs
from rlx_onnx_amp.verification.options import DEFAULT_BUDGET
from rlx_onnx_amp.verification.reference import Reference, choosing_sets, prepare_reference
from rlx_onnx_amp.verification.screen import expose_body_values

__all__ = ["DEFAULT_BUDGET", "Evaluation", "Screen", "best_key", "magnitude_screen", "repair_file"]

logger = logging.getLogger(__name__)

_FLOAT = onnx.TensorProto.FLOAT

#: The external data file of a candidate the search writes to its scratch directory.
_CANDIDATE_DATA = "candidate.data"
#: The data file of the reference's weights clamped for the magnitude screen, in the scratch.
_SCREEN_DATA = "rlx-amp-screen.data"

#: A tensor whose non-zero values flush to zero at least this often is an underflow region.
MOSTLY_FLUSHED = 0.5

#: Ops that map a tiny input to f(0) + O(x) with f(0) far from zero (Sigmoid gives 0.5): when
#: such a reader's reference output is one value repeated, the tiny input made no difference
#: even in f32, and flushing it to zero makes none either. A scaling op (Mul, Conv, a
#: normalization) is not one of them: it can lift a tiny input into range.
ABSORBS_TINY_INPUTS = frozenset({"Sigmoid", "HardSigmoid", "Softmax", "LogSoftmax", "Softplus", "Exp", "Cos", "Cosh"})

#: A tensor wholly below the smallest normal number is an underflow region only when rounding it
#: to the target type moves it by more than this many unit roundoffs (relative, in L2 norm):
#: values a little below the normal range keep most of their digits as subnormals, and keeping
#: them in f32 would cost Compute nodes for nothing (EfficientNet-B0's middle blocks).
SUBNORMAL_LOSS_ULPS = 16.0


@dataclass
class Screen:
    """What the magnitude screen keeps; `consumers_only`: the nodes kept only because they read
    a flagged tensor, whose own outputs are in range (a Sigmoid of a tiny value is 0.5 either
    way), which minimization tries to give back first."""

    keep: dict[str, str] = field(default_factory=dict)
    consumers_only: set[str] = field(default_factory=set)
    #: Producers of underflowing tensors whose loss cannot reach an output (`_absorbed`):
    #: localization sees their values move but repair does not spend evaluations on them.
    absorbed: set[str] = field(default_factory=set)


@dataclass
class Evaluation:
    """One candidate: the node paths it keeps in f32 (path -> reason) and how it did."""

    index: int
    stage: str
    keep: dict[str, str]
    passed: bool
    score: float

    def step(self, written: bool) -> RepairStep:
        return RepairStep(self.index, self.stage, len(self.keep), self.passed, self.score, written)


def best_key(e: Evaluation) -> tuple[int, int, float, int]:
    """Sort key of candidates, best first: passing ones by fewest kept nodes then score;
    failing ones by score; the earlier evaluation on a tie."""
    return (0, len(e.keep), e.score, e.index) if e.passed else (1, 0, e.score, e.index)


def magnitude_screen(
    model: onnx.ModelProto,
    candidate: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    precision: Precision,
    provider: str,
    tmp: Scratch,
    base_dir: Path | None = None,
) -> Screen:
    """Node path -> reason (`overflow`/`underflow`) from one f32 run of the reference, its
    weights and constants narrowed as `candidate` holds them (a -3.4e38 mask clamped to -65504
    is no overflow). Tensors inside If/Loop/Scan bodies are screened too: they are surfaced as
    extra outputs of their control-flow node (a Loop's or Scan's per iteration, stacked).
    `base_dir`: where the reference's external weights are; those it narrows go to `tmp`."""
    info = PRECISIONS[precision]
    model = _clamped(model, candidate, base_dir, tmp)
    types = model_types(model)
    exposed, surfaced = expose_body_values(model, types)
    main = types.get("", {})
    names = [o for n in model.graph.node for o in n.output if o and main.get(o) == onnx.TensorProto.FLOAT]
    try:
        session = tmp.session(
            expose_outputs(exposed, names + [out for out, _, _ in surfaced]), base_dir, provider, "reference"
        )
        values = session.run(feeds, names + [out for out, _, _ in surfaced])
    except ModelRunError as e:
        # A Loop whose body values change shape from one iteration to the next cannot stack
        # them: screen the main graph alone; localization and bisection reach the bodies.
        logger.info("screening bodies failed (%s); screening the main graph only", e)
        surfaced = []
        session = tmp.session(expose_outputs(model, names), base_dir, provider, "reference")
        values = session.run(feeds, names)
    del session
    screen = Screen()
    facts = NumericFacts(model, WeightSource(None))
    producers: set[str] = set()
    for scope, graph in scoped_graphs(model.graph):
        producer = {o: f"{scope}{i}" for i, n in enumerate(graph.node) for o in n.output}
        consumers: dict[str, list[tuple[int, int]]] = {}
        for i, node in enumerate(graph.node):
            for k, name in enumerate(node.input):
                consumers.setdefault(name, []).append((i, k))
        fetched = {n: values[n] for n in names} if scope == "" else {v: values[o] for o, s, v in surfaced if s == scope}
        flags = {}
        for name, value in fetched.items():
            flag = _magnitude_flag(np.asarray(value), info)
            if flag is not None:
                flags[name] = flag
        absorbed = _absorbed(graph, flags, fetched) if scope == "" else set()
        for name, (reason, singular_only) in flags.items():
            if name in absorbed:
                screen.absorbed.add(producer[name])
                continue
            # A reader whose every output is absorbed may read the flushed value.
            readers = [
                (i, k) for i, k in consumers.get(name, []) if not all(o in absorbed for o in graph.node[i].output if o)
            ]
            if singular_only:
                # A Pow's base is singular only under an exponent not known non-negative (x**2 is 0 at 0).
                readers = [(i, k) for i, k in readers if k in facts.singular_inputs(graph.node[i], scope)]
                if not readers:
                    continue
            screen.keep.setdefault(producer[name], reason)
            producers.add(producer[name])
            for i, _ in readers:
                screen.keep.setdefault(f"{scope}{i}", reason)
    screen.consumers_only = set(screen.keep) - producers
    return screen


def _clamped(
    model: onnx.ModelProto, candidate: onnx.ModelProto, base_dir: Path | None, tmp: Scratch
) -> onnx.ModelProto:
    """`model` with its weights and constants clamped to the range `candidate` holds them in
    (`emulate(computed=False)`): the clamped external weights go to a data file in the
    workspace of `base_dir`, where the rest is linked from, never into memory."""
    locations = external_locations(all_tensors(model))
    if not locations:
        return emulate(model, candidate, WeightSource(base_dir, "reference"), computed=False)[0]
    name = _SCREEN_DATA
    while name in locations:
        name = "_" + name
    sink = ExternalSink(tmp.workspace(base_dir) / name, name, scratch=True)
    try:
        return emulate(model, candidate, WeightSource(base_dir, "reference"), sink, computed=False)[0]
    finally:
        sink.close()


def _magnitude_flag(values: np.ndarray, info: PrecisionInfo) -> tuple[str, bool] | None:
    """(reason, whether only zero-singular readers are affected) for a tensor's reference
    values, or None when the low precision holds them."""
    v = np.abs(values.astype(np.float64, copy=False))
    finite = v[np.isfinite(v)]
    if not finite.size:
        return None
    if float(finite.max()) >= info.overflow_at:
        return "overflow", False
    nonzero = finite[finite != 0]
    if not nonzero.size:
        return None
    flushed = nonzero < info.smallest_subnormal / 2
    if float(np.mean(flushed)) >= MOSTLY_FLUSHED:
        return "underflow", False
    if float(nonzero.max()) < info.smallest_normal and _rounding_loss(nonzero, info) > SUBNORMAL_LOSS_ULPS:
        return "underflow", False
    return ("underflow", True) if flushed.any() else None


def _absorbed(
    graph: onnx.GraphProto, flags: Mapping[str, tuple[str, bool]], fetched: Mapping[str, np.ndarray]
) -> set[str]:
    """The underflowing tensors of `graph` whose loss cannot reach a model output: every reader
    either underflows too and is itself absorbed, or is an op in `ABSORBS_TINY_INPUTS` whose
    reference output is one value repeated (EfficientNet's late squeeze-excitation branch: so
    tiny that its Sigmoid gives exactly 0.5 even in f32). A Softmax whose output still varies
    (detector scores within 1e-8 of each other) is not absorbing: an NMS downstream ranks
    them. Walked backwards from the outputs; a tensor read by a node with a body, or by a
    reader whose output the screen did not see, is never absorbed."""
    needed = {o.name for o in graph.output}
    needed |= {name for node in graph.node for _, body in subgraphs(node) for name in names_read(body)}

    def absorbing(node: onnx.NodeProto, output: str) -> bool:
        if node.op_type not in ABSORBS_TINY_INPUTS or output not in fetched:
            return False
        values = np.asarray(fetched[output])
        return values.size > 0 and bool(np.all(values == values.flat[0]))

    for node in reversed(graph.node):
        matters = bool(list(subgraphs(node))) or any(
            (o in needed) if o in flags else not absorbing(node, o) for o in node.output if o
        )
        if matters:
            needed.update(node.input)
    return {
        name
        for name, (reason, singular_only) in flags.items()
        if reason == "underflow" and not singular_only and name not in needed
    }


def _rounding_loss(values: np.ndarray, info: PrecisionInfo) -> float:
    """How far rounding `values` (non-zero, finite) to the target type moves them, relative to
    their L2 norm, in units of the type's unit roundoff (half its machine epsilon)."""
    rounded = values.astype(info.np_dtype).astype(np.float64)
    loss = float(np.linalg.norm(rounded - values) / np.linalg.norm(values))
    return loss / info.unit_roundoff


class _Evaluator:
    """Converts the reference with a set of kept node paths and judges the candidate against the
    reference's one run (`Verifier.judge`).

    The reference is held as its graph: its external weights stay in their files, and each
    candidate's are streamed into a directory of the scratch (`_write`), judged from there, and
    removed when the next candidate is made or the search ends (`release`). A search then holds
    one session's memory at a time, as the plain command does, not the reference's weights and a
    candidate's beside it."""

    def __init__(self, verification: Verifier, policy: Policy, options: ConvertOptions) -> None:
        self.verification = verification
        self.policy = policy
        self.options = options
        path = verification.reference.path
        self.model = load_model(path)
        self.base_dir = path.parent
        self.source = WeightSource(path.parent, str(path))
        self.external = bool(external_locations(all_tensors(self.model)))
        self.evaluations = 0
        self.judgement: Judgement | None = None
        self.candidate: onnx.ModelProto | None = None
        self._files: Path | None = None  # the scratch directory of the candidate judged last

    def conversion_of(self, keep: Mapping[str, str]) -> Conversion:
        """What converting with `keep` does, without evaluating it (a dry run of the weights)."""
        work = onnx.ModelProto()
        work.CopyFrom(self.model)
        options = dataclasses.replace(_with_kept(self.options, keep), cost=False)
        return convert_model(work, self.policy, options, source=self.source, weights=False)

    def evaluate(self, keep: Mapping[str, str]) -> tuple[bool, float, Conversion]:
        """(passed, score, conversion); score: the worst output's `OutputResult.score`."""
        self.evaluations += 1
        self.release()  # the previous candidate, its files included, first
        # Not proven here: onnxruntime loads (or emulates) it next, and the model written is
        # staged and proven as any conversion is, its file run in a child process: where the
        # candidate is emulated anyway, it is not loaded in this process only to be dropped
        # (`ran`; an f16 LSTM crashes onnxruntime's CPU provider as it loads).
        candidate, conversion, path = self._write(keep)
        self.judgement, self.candidate = self.verification.judge(candidate, path, ran=True), candidate
        return self.judgement.passed, self.judgement.score, conversion

    def _write(self, keep: Mapping[str, str]) -> tuple[onnx.ModelProto, Conversion, Path]:
        """The candidate that keeps `keep` in f32, written to a fresh scratch directory with its
        weights (as one external data file beside it when the reference's are external)."""
        folder = self.verification.scratch.file("candidate")
        folder.mkdir()
        self._files = folder
        candidate = onnx.ModelProto()
        candidate.CopyFrom(self.model)
        sink = ExternalSink(folder / _CANDIDATE_DATA, _CANDIDATE_DATA, scratch=True) if self.external else WeightSink()
        try:
            conversion = convert_model(
                candidate, self.policy, _with_kept(self.options, keep), source=self.source, sink=sink,
                label=str(self.verification.reference.path),
            )
        finally:
            sink.close()
        path = folder / "candidate.onnx"
        path.write_bytes(candidate.SerializeToString())
        return candidate, conversion, path

    def release(self) -> None:
        """Forget the candidate judged last and remove its files."""
        self.judgement = self.candidate = None
        if self._files is not None:
            shutil.rmtree(self._files, ignore_errors=True)
            self._files = None

    def localize_first(self) -> list[Localized]:
        assert self.judgement is not None
        return self.verification.localize(self.judgement, 50)


class _Search:
    """The evaluations of one repair, within its budget; remembers the best."""

    def __init__(self, evaluator: _Evaluator, budget: int, progress: Callable[[str], None] | None) -> None:
        self.ev = evaluator
        self.budget = budget
        self.progress = progress
        self.history: list[Evaluation] = []
        self.report: Conversion | None = None  # of the last evaluation
        self.whole_pool_tried = False  # `bisect` tries a whole pool once

    @property
    def left(self) -> int:
        return self.budget - self.ev.evaluations

    @property
    def best(self) -> Evaluation:
        return min(self.history, key=best_key)

    def step(self, stage: str, keep: Mapping[str, str]) -> Evaluation:
        passed, score, self.report = self.ev.evaluate(keep)
        e = Evaluation(len(self.history), stage, dict(keep), passed, score)
        self.history.append(e)
        if self.progress:
            done = f"{self.ev.evaluations}/{self.budget}"  # k/N: how far into its budget
            self.progress(f"{done} {stage}: {len(keep)} kept, {'pass' if passed else 'fail'} (score {score:.3g})")
        return e

    def bisect(self, keep: dict[str, str], pool: list[str]) -> Evaluation | None:
        """Halve `pool` toward the one node whose f32 restores accuracy; the last evaluation.
        When neither half alone passes but the pool did (a half of the level above), the
        culprits span both halves: it stops there, and minimization goes on from that pass.
        The first time neither half of a whole pool passes, the whole pool is tried once: when
        it passes, the culprits span both halves, and minimization goes on from there (one
        node a round would never get there with many culprits)."""
        last = None
        pool_passed = False
        top = True
        while len(pool) > 1 and self.left >= 1:
            first, second = pool[: len(pool) // 2], pool[len(pool) // 2 :]
            a = last = self.step(f"bisect {len(first)} nodes", {**keep, **dict.fromkeys(first, "drift")})
            if a.passed or self.left < 1:
                pool, pool_passed, top = first, a.passed, False
                continue
            b = last = self.step(f"bisect {len(second)} nodes", {**keep, **dict.fromkeys(second, "drift")})
            if b.passed:
                pool, pool_passed, top = second, True, False
                continue
            if top and not self.whole_pool_tried and self.left >= 1:
                self.whole_pool_tried = True
                whole = self.step(f"bisect all {len(pool)} nodes", {**keep, **dict.fromkeys(pool, "drift")})
                if whole.passed:
                    return whole
                last = whole
            top = False
            if pool_passed:
                return last
            pool = first if a.score <= b.score else second
        if len(pool) == 1 and self.left >= 1:
            keep[pool[0]] = "drift"
            last = self.step("bisect result", keep)
        return last

    def minimize(
        self, start: Evaluation, consumers_only: set[str] | None = None, compute: set[str] | None = None
    ) -> str:
        """Give back kept nodes, in chunks, while the candidate still passes: the screen's
        consumers-only nodes first as one chunk, then the Compute nodes (where low precision
        pays most), then the others, halving a chunk that cannot go."""
        keep = dict(start.keep)
        first = sorted((p for p in keep if p in (consumers_only or set())), key=_path_key)
        heavy = sorted((p for p in keep if p not in first and p in (compute or set())), key=_path_key)
        rest = sorted((p for p in keep if p not in first and p not in heavy), key=_path_key)
        chunks = [c for c in (first, heavy, rest) if c]
        proven = 0  # kept nodes shown needed one by one
        while chunks and self.left >= 1:
            chunk = chunks.pop(0)
            trial = {p: r for p, r in keep.items() if p not in chunk}
            if self.step(f"minimize: give back {len(chunk)}", trial).passed:
                keep = trial
            elif len(chunk) > 1:
                chunks[:0] = [chunk[: len(chunk) // 2], chunk[len(chunk) // 2 :]]
            else:
                proven += 1
        if not chunks:
            return "checked"
        return f"partial ({proven} of {len(keep)} kept nodes shown needed)"


def _with_kept(options: ConvertOptions, keep: Mapping[str, str]) -> ConvertOptions:
    """The user's options plus the node paths repair keeps in f32."""
    return dataclasses.replace(
        options, keep_f32_paths={**options.keep_f32_paths, **{p: _keep_reason(r) for p, r in keep.items()}}
    )


def _keep_reason(reason: str) -> str:
    """What the report says of a node the search kept: `repair: drift`; `CAST_COST` says its own why."""
    return reason if reason == CAST_COST else f"repair: {reason}"


def repair_file(
    input_path: str | Path,
    output_path: str | Path,
    policy: Policy | str,
    *,
    options: ConvertOptions | None = None,
    verify_options: VerifyOptions | None = None,
    budget: int = DEFAULT_BUDGET,
    data_name: str | None = None,
    progress: Callable[[str], None] | None = None,
    outputs: OutputSet | None = None,
    paths: RunPaths | None = None,
) -> tuple[Conversion, Verification, Repair]:
    """Convert, verify, and keep nodes in f32 until the drift passes or the budget runs out.

    With `outputs` the model (and `--save-inputs`) are staged there for the caller to commit;
    otherwise they are written when the repair ends."""
    if budget < 1:
        raise ValueError("repair budget must be at least 1")
    src, dst = Path(input_path), Path(output_path)
    resolved = resolve_policy(policy)
    options = options or ConvertOptions()
    verify_options = verify_options or VerifyOptions()
    if verify_options.target is None:  # the written model is meant for the conversion's target
        verify_options = dataclasses.replace(verify_options, target=options.target.value)
    paths = paths if paths is not None else RunPaths()
    paths.read(src, "input model")
    paths.write(dst, "output model")
    paths.check()
    with contextlib.ExitStack() as stack:
        own = outputs is None
        staging = stack.enter_context(OutputSet()) if outputs is None else outputs
        result = _repair(src, dst, resolved, options, verify_options, budget, data_name, progress, staging, paths)
        if own:
            staging.commit()
    return result


@dataclass
class _Found:
    """What a search settled on: the candidate to write, how minimal it is, what it could keep."""

    chosen: Evaluation
    minimality: str
    keepable: dict[str, tuple[str, str]]
    stopped: str | None = None  # why `auto` stopped early (`Repair.stopped`)


def _repair(
    src: Path,
    dst: Path,
    resolved: Policy,
    options: ConvertOptions,
    verify_options: VerifyOptions,
    budget: int,
    data_name: str | None,
    progress: Callable[[str], None] | None,
    outputs: OutputSet,
    paths: RunPaths,
) -> tuple[Conversion, Verification, Repair]:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        # `auto` starts where the plain command ends: the range screen of the same reference run
        # keeps what the low type cannot hold (rule range-screen) before the first evaluation.
        # With several input sets, only the first half (`choosing_sets`) steers it, screen included.
        # A reference that cannot run raises `ReferenceUnavailable`: the convert command then writes
        # the policy's conversion unverified (exit 4), as the plain command does.
        prepared = prepare_reference(src, verify_options, screen=resolved.searches, held_out=resolved.searches)
        full = stack.enter_context(Verifier(prepared, verify_options, "rlx-amp-repair-"))
        reference = full.reference
        # The MACs are counted at the shapes the run uses.
        ranges = reference.value_ranges or options.value_ranges
        options = dataclasses.replace(
            options,
            shapes={**reference.shapes(), **options.shapes},
            value_ranges=ranges,
            value_shapes=reference.value_shapes,
        )
        choosing, confirming, held_out = full, full, None
        if resolved.searches and len(reference.samples) >= 2:
            # `auto` with several input sets: the first half steers the search, the rest confirm it.
            k = choosing_sets(len(reference.samples))
            choosing = stack.enter_context(Verifier(_sets(reference, slice(0, k)), verify_options, "rlx-amp-repair-"))
            confirming = stack.enter_context(
                Verifier(_sets(reference, slice(k, None)), verify_options, "rlx-amp-repair-")
            )
            held_out = (k, len(reference.samples) - k)
        ev = _Evaluator(choosing, resolved, options)
        search = _Search(ev, budget, progress)
        found = _search(ev, search, choosing)
        ev.release()  # the last candidate's files, before the chosen one is written
        chosen = found.chosen
        staged = stage_conversion(
            src, dst, outputs, paths, resolved, data_name=data_name, options=_with_kept(options, chosen.keep)
        )
        conversion = staged.conversion
        # The model written, proven against the same reference run (the held-out sets, if any).
        verified = confirming.verify(staged.path, label=str(dst), outputs=outputs)
        confirmed = None
        if held_out is not None:
            choosing_passed = choosing.judge(load_model(staged.path), staged.path, label=str(dst), ran=True).passed
            confirmed = HeldOut(held_out[0], held_out[1], choosing_passed)
    in_order = sorted(chosen.keep.items(), key=lambda kv: _path_key(kv[0]))
    kept = tuple(RepairKeep(path, *found.keepable[path], reason) for path, reason in in_order)
    compute_share, weight_share = _shares(ev.model, conversion)
    result = Repair(
        passed=verified.passed,
        evaluations=ev.evaluations,
        kept_f32=kept,
        compute_low_share=compute_share,
        weight_low_share=weight_share,
        best=RepairBest(chosen.index, chosen.stage, chosen.score, len(chosen.keep)) if search.history else None,
        minimality=found.minimality,
        history=tuple(e.step(written=e.index == chosen.index) for e in search.history),
        held_out=confirmed,
        budget=budget,
        seconds=round(time.monotonic() - started, 3),
        stopped=found.stopped,
    )
    if found.stopped:
        logger.info("auto: %s", found.stopped)
    return conversion, verified, result


def _sets(reference: Reference, which: slice) -> Reference:
    """The reference's run on some of its input sets."""
    return dataclasses.replace(reference, samples=reference.samples[which], runs=reference.runs[which])


def _search(ev: _Evaluator, search: _Search, verification: Verifier) -> _Found:
    """The search (module docstring): the policy's conversion, the magnitude screen, then
    localization and bisection until a candidate passes, then minimization; for `auto`, the
    low islands that run no compute kept f32 last (`cast_cost_keeps`). `auto` stops early where
    it cannot gain (`_stop_before`)."""
    stopped = _stop_before(ev)
    if stopped is not None:
        keepable = dict(ev.conversion_of({}).index.keepable)
        return _Found(Evaluation(0, "no gain", dict.fromkeys(keepable, "no gain"), True, 0.0), "not checked",
                      keepable, stopped)
    current = search.step("policy", {})
    assert search.report is not None and ev.judgement is not None and ev.candidate is not None
    keepable = dict(search.report.index.keepable)  # what the policy lowered and a keep can give back
    precision = ev.judgement.compared.precision
    screen = Screen()
    if not current.passed and precision is not Precision.F32 and search.left >= 1:
        # The candidate just evaluated is the policy's own conversion.
        reference = verification.reference
        screen = magnitude_screen(
            ev.model, ev.candidate, reference.samples[0], precision, reference.provider, verification.scratch,
            ev.base_dir,
        )
        screen.keep = {p: r for p, r in screen.keep.items() if p in keepable}
        if screen.keep:
            current = search.step("magnitude screen", screen.keep)
    # Until some candidate passes: a bisection can pass on a half and end on a failing node,
    # and starting over from there would only add nodes that do not help.
    while not search.best.passed and search.left >= 1:
        named = _first_keepable(ev, search, current, screen, keepable)
        if named is not None:
            current = search.step(f"localize {named.node}", {**current.keep, named.path: "drift"})
            continue
        remaining = sorted(set(keepable) - set(current.keep), key=_path_key)
        if not remaining:
            break
        last = search.bisect(dict(current.keep), remaining)
        if last is None:
            break
        current = last
    minimality = "not checked"
    if search.best.passed and search.left >= 1:
        compute = {p for p, (_, op) in keepable.items() if kind_of(*_split(op)) is OpKind.COMPUTE}
        minimality = search.minimize(search.best, screen.consumers_only, compute)
    chosen = search.best
    if ev.policy.searches and chosen.passed and search.left >= 1:
        islands = cast_cost_keeps(ev.model, ev.conversion_of(chosen.keep).index.decisions, keepable)
        if islands:
            trial = search.step(f"cast cost: {len(islands)} nodes", {**chosen.keep, **islands})
            chosen = trial if trial.passed else chosen
    return _Found(chosen, minimality, keepable)


def _stop_before(ev: _Evaluator) -> str | None:
    """Why `auto` need not search at all: the low compute it could add is none or negligible
    (`cost.no_gain`), counted at the reference run's shapes; it writes the model f32."""
    if not ev.policy.searches:
        return None
    return no_gain(estimate_cost(ev.model, ev.options.shapes, ev.options.value_shapes))


def _first_keepable(
    ev: _Evaluator, search: _Search, current: Evaluation, screen: Screen, keepable: Mapping[str, tuple[str, str]]
) -> Localized | None:
    """The first node localization names that a keep changes, and is worth keeping alone."""
    assert search.report is not None
    for found in ev.localize_first():
        if found.path in current.keep or found.path in screen.absorbed:
            continue
        why = why_not_keepable(search.report.index, found.path) if found.path not in keepable else None
        node = ev.model.graph.node[int(found.path)]
        if why is None and copies_values(node.domain, node.op_type):
            why = "its outputs only hold its inputs' values (VALUE_EXACT_OPS): kept alone it moves the rounding"
        if why is None:
            return found
        logger.info("localize names %s (%s), which no keep changes: %s", found.node, found.reason, why)
    return None


#: The reason `auto` gives a node it keeps in f32 for what its Casts cost.
CAST_COST = "cast-cost: a low-precision island that runs no compute saves less than its Casts cost"


def cast_cost_keeps(
    model: onnx.ModelProto, decisions: Mapping[str, str], keepable: Mapping[str, tuple[str, str]]
) -> dict[str, str]:
    """The main graph's low-precision islands (nodes in f16/bf16 joined by the values they share)
    that hold no Compute node: lowered, they only add Casts at their borders, each reading and
    writing the value, for elementwise work that was never the cost. Their keepable nodes, to
    keep in f32 (`CAST_COST`)."""
    low = {
        str(i): node
        for i, node in enumerate(model.graph.node)
        if decisions.get(str(i)) in ("f16", "bf16")
    }
    producer = {out: path for path, node in low.items() for out in node.output if out}
    parent = {path: path for path in low}

    def root(path: str) -> str:
        while parent[path] != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    for path, node in low.items():
        for name in node.input:
            if name in producer:
                parent[root(producer[name])] = root(path)
    islands: dict[str, list[str]] = {}
    for path in low:
        islands.setdefault(root(path), []).append(path)
    keeps: dict[str, str] = {}
    for members in islands.values():
        if any(kind_of(low[p].domain, low[p].op_type) is OpKind.COMPUTE for p in members):
            continue
        keeps.update({p: CAST_COST for p in members if p in keepable})
    return keeps


def _path_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in path.split("/") if p.isdigit())


def _shares(model: onnx.ModelProto, report: Conversion) -> tuple[float | None, float | None]:
    compute = [
        prec
        for op, counts in report.by_op.items()
        for prec, n in counts.items()
        for _ in range(n)
        if kind_of(*_split(op)) is OpKind.COMPUTE
    ]
    compute_share = sum(1 for p in compute if p in LOW_PRECISIONS) / len(compute) if compute else None
    float_bytes = sum(tensor_nbytes(t) for t in model.graph.initializer if t.data_type in FLOAT_TYPES)
    saved = report.initializer_bytes.before - report.initializer_bytes.after
    if not float_bytes:
        return compute_share, None
    return compute_share, min(2 * saved / float_bytes, 1.0)  # narrowing f32 to 16 bits saves half its bytes


def _split(op: str) -> tuple[str, str]:
    domain, _, name = op.rpartition(".")
    return domain, name

"""Auto-repair: meet the drift tolerance with as much low-precision work as possible.

The search, each step deterministic and independent of node names:

1. **Magnitude screen** (one f32 reference run, no candidate evaluation): every main-graph
   tensor whose finite values pass the target type's largest finite value keeps its producer
   and its consumers in f32 (`overflow`: a consumer would cast the f32 value down to inf); a
   tensor with non-zero values that flush to zero in the target type and that feeds an input
   where zero is singular (a divisor, a square root, a logarithm) keeps its producer and that
   consumer in f32 (`underflow`).
2. **Localization**: verify; while it fails, the first node where drift jumps or NaN/Inf
   appears (`--localize`) is kept in f32 (`drift`).
3. **Bisection** over what remains when localization names no new node: the low-precision
   nodes in graph order (bodies of If/Loop/Scan included, by node path) are halved, keeping
   the half whose f32 restores the most accuracy, until one node is left.

It stops when the tolerance is met or after `budget` candidate evaluations; the best model
seen is written either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from rlx_onnx_amp.api import convert, load_model, resolve_policy, stage_conversion
from rlx_onnx_amp.convert import ConvertOptions
from rlx_onnx_amp.errors import ModelRunError
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import FLOAT_TYPES, PRECISIONS, Precision
from rlx_onnx_amp.report import ConversionReport
from rlx_onnx_amp.taxonomy import OpKind, kind_of
from rlx_onnx_amp.tensors import tensor_nbytes
from rlx_onnx_amp.types import model_types
from rlx_onnx_amp.verify.core import (
    Scratch, VerifyOptions, VerifyReport, _emulated_model, _lowest_precision, _round_feeds, _Session, _stack, _tolerance,
    emulation_fallback, emulation_reason, resolve_provider, verify,
)
from rlx_onnx_amp.verify.emulate import emulate, low_precision_values
from rlx_onnx_amp.verify.inputs import load_inputs, synthesize
from rlx_onnx_amp.verify.localize import expose_outputs, localize
from rlx_onnx_amp.verify.metrics import compare_arrays

__all__ = ["DEFAULT_BUDGET", "RepairResult", "repair_file"]

logger = logging.getLogger(__name__)

DEFAULT_BUDGET = 24

#: Inputs at which a zero is singular: a value that flushes to zero there becomes Inf or NaN.
ZERO_SINGULAR_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Div": (1,),
    "Reciprocal": (0,),
    "Log": (0,),
    "Sqrt": (0,),
    "Pow": (0,),
}


@dataclass
class RepairResult:
    passed: bool
    evaluations: int
    kept: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> {node, op, reason}
    compute_low_share: float | None = None  # None: the model has no Compute nodes
    weight_low_share: float | None = None  # None: the model has no float weights
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "evaluations": self.evaluations,
            "kept_f32": [{"path": p, **v} for p, v in self.kept.items()],
            "compute_low_share": self.compute_low_share,
            "weight_low_share": self.weight_low_share,
            "history": self.history,
        }


def magnitude_screen(model: onnx.ModelProto, candidate: onnx.ModelProto, base_dir: Path, feeds: Mapping[str, np.ndarray],
                     precision: Precision, provider: str, tmp: Scratch) -> dict[str, str]:
    """Node path -> reason (`overflow`/`underflow`) from one f32 run of the reference, its
    weights and constants narrowed as `candidate` holds them (a -3.4e38 mask clamped to -65504
    is no overflow)."""
    info = PRECISIONS[precision]
    model, _ = emulate(model, candidate, computed=False)
    types = model_types(model)
    main = types.get("", {})
    names = [o for n in model.graph.node for o in n.output if o and main.get(o) == onnx.TensorProto.FLOAT]
    session = tmp.session(expose_outputs(model, names), base_dir, provider, "reference")
    values = session.run(feeds, names)
    producer = {o: str(i) for i, n in enumerate(model.graph.node) for o in n.output}
    consumers: dict[str, list[tuple[int, int]]] = {}
    for i, node in enumerate(model.graph.node):
        for k, name in enumerate(node.input):
            consumers.setdefault(name, []).append((i, k))
    keep: dict[str, str] = {}
    for name in names:
        v = np.asarray(values[name], dtype=np.float64)
        finite = v[np.isfinite(v)]
        if not finite.size:
            continue
        if float(np.max(np.abs(finite))) >= info.overflow_at:
            keep.setdefault(producer[name], "overflow")
            for i, _ in consumers.get(name, []):
                keep.setdefault(str(i), "overflow")
            continue
        nonzero = finite[finite != 0]
        if nonzero.size and float(np.min(np.abs(nonzero))) < info.smallest_subnormal / 2:
            singular = [i for i, k in consumers.get(name, []) if k in ZERO_SINGULAR_INPUTS.get(model.graph.node[i].op_type, ())]
            if singular:
                keep.setdefault(producer[name], "underflow")
                for i in singular:
                    keep.setdefault(str(i), "underflow")
    return keep


class _Evaluator:
    """Converts the reference with a set of kept node paths and measures the drift."""

    def __init__(self, ref_path: Path, policy: Policy, options: ConvertOptions, verify_options: VerifyOptions, tmp: Scratch) -> None:
        self.ref_path = ref_path
        self.policy = policy
        self.options = options
        self.verify_options = verify_options
        self.tmp = tmp
        self.model = load_model(ref_path, load_external_data=True)
        self.provider = resolve_provider(verify_options.provider)
        if verify_options.inputs:
            self.samples = [load_inputs(verify_options.inputs, self.model)]
        else:
            self.samples = [synthesize(self.model, verify_options.spec, k) for k in range(max(verify_options.spec.samples, 1))]
        ref_session = _Session(str(ref_path), self.provider, str(ref_path))
        self.reference = [ref_session.run(f) for f in self.samples]
        self.output_names = ref_session.output_names
        self.evaluations = 0

    def convert(self, keep: Mapping[str, str]) -> tuple[onnx.ModelProto, ConversionReport]:
        report = ConversionReport()
        return convert(self.model, self.policy, options=_with_kept(self.options, keep), report=report), report

    def evaluate(self, keep: Mapping[str, str]) -> tuple[bool, float, onnx.ModelProto, ConversionReport, list[Any]]:
        """(passed, score, candidate, report, drifts); score: the worst output's error over its bound."""
        self.evaluations += 1
        candidate, report = self.convert(keep)
        low = low_precision_values(candidate)
        precision = _lowest_precision(low)
        emulated = emulation_reason(self.verify_options.emulate, self.provider, precision) is not None
        session = None
        if not emulated:
            try:
                session = self.tmp.session(candidate, self.ref_path.parent, self.provider, "candidate")
            except ModelRunError as e:  # as in verify: a candidate the provider cannot load is emulated
                logger.info("%s: emulating", emulation_fallback(e, self.verify_options.emulate, self.provider, precision))
                emulated = True
        compared = _emulated_model(self.model, self.ref_path, candidate, self.tmp) if emulated else candidate
        feed_low = low if emulated else {}
        if session is None:
            session = self.tmp.session(compared, self.ref_path.parent, self.provider, "candidate")
        drifts, score = [], 0.0
        runs = [session.run(_round_feeds(f, feed_low) if feed_low else f, self.output_names) for f in self.samples]
        for name in self.output_names:
            ref = _stack([r[name] for r in self.reference])
            cand = _stack([c[name] for c in runs])
            tol = _tolerance(name, precision, self.verify_options)
            drift = compare_arrays(name, ref, cand, tol)
            drifts.append(drift)
            bound = tol.atol + tol.rtol * float(np.max(np.abs(ref[np.isfinite(ref)]))) if np.isfinite(ref).any() else tol.atol
            nonfinite = drift.nan_cand + drift.inf_cand - drift.nan_ref - drift.inf_ref
            cos_gap = 0.0 if drift.cosine is None else max(0.0, tol.min_cosine - drift.cosine) / max(1e-12, 1 - tol.min_cosine)
            score = max(score, drift.max_abs / max(bound, 1e-30), cos_gap, 1e6 * max(nonfinite, 0))
        passed = all(d.passed for d in drifts)
        self.candidate, self.precision, self.compared, self.feed_low = candidate, precision, compared, feed_low
        return passed, score, candidate, report, drifts

    def localize_first(self, precision: Precision) -> list[dict[str, Any]]:
        return localize(self.model, self.ref_path.parent, self.compared, self.ref_path.parent, self.samples[0], self.feed_low,
                        self.provider, self.tmp, _tolerance("", precision, self.verify_options), 50)


def _with_kept(options: ConvertOptions, keep: Mapping[str, str]) -> ConvertOptions:
    """The user's options plus the node paths repair keeps in f32."""
    return dataclasses.replace(options, keep_f32_paths={**options.keep_f32_paths, **{p: f"repair: {r}" for p, r in keep.items()}})


def _low_paths(report: ConversionReport) -> list[str]:
    return [p for p, prec in report.decisions.items() if prec in ("f16", "bf16")]


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
) -> tuple[ConversionReport, VerifyReport, RepairResult]:
    """Convert, verify, and keep nodes in f32 until the drift passes or the budget runs out.

    With `outputs` the model (and `--save-inputs`) are staged there for the caller to commit;
    otherwise they are written when the repair ends."""
    src, dst = Path(input_path), Path(output_path)
    resolved = resolve_policy(policy)
    options = options or ConvertOptions()
    verify_options = verify_options or VerifyOptions()
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


def _repair(src: Path, dst: Path, resolved: Policy, options: ConvertOptions, verify_options: VerifyOptions, budget: int,
            data_name: str | None, progress: Callable[[str], None] | None, outputs: OutputSet,
            paths: RunPaths) -> tuple[ConversionReport, VerifyReport, RepairResult]:
    with Scratch("rlx-amp-repair-") as tmp:
        ev = _Evaluator(src, resolved, options, verify_options, tmp)
        keep: dict[str, str] = {}
        history: list[dict[str, Any]] = []

        def step(stage: str, kept: Mapping[str, str]) -> tuple[bool, float, ConversionReport]:
            passed, score, _, report, _ = ev.evaluate(kept)
            history.append({"stage": stage, "kept": len(kept), "passed": passed, "score": score})
            if progress:
                progress(f"{stage}: {len(kept)} kept, {'pass' if passed else 'fail'} (score {score:.3g})")
            return passed, score, report

        passed, score, report = step("policy", keep)
        best = (score, dict(keep))
        policy_candidate, precision = ev.candidate, ev.precision  # the policy's own conversion, just evaluated
        if not passed and precision is not Precision.F32:
            screen = magnitude_screen(ev.model, policy_candidate, src.parent, ev.samples[0], precision, ev.provider, tmp)
            low_now = set(_low_paths(report))
            screen = {p: r for p, r in screen.items() if p in low_now}
            if screen:
                keep.update(screen)
                passed, score, report = step("magnitude screen", keep)
                best = min(best, (score, dict(keep)), key=lambda b: b[0])
        while not passed and ev.evaluations < budget:
            low_now = set(_low_paths(report))
            named = [d for d in ev.localize_first(precision) if d["path"] in low_now and d["path"] not in keep]
            if named:
                keep[named[0]["path"]] = "drift"
                passed, score, report = step(f"localize {named[0]['node']}", keep)
            else:
                remaining = sorted(low_now - set(keep), key=_path_key)
                if not remaining:
                    break
                passed, score, report, keep = _bisect(step, keep, remaining, budget - ev.evaluations)
            best = min(best, (score, dict(keep)), key=lambda b: b[0])
        final_keep = keep if passed else best[1]
        staged = stage_conversion(src, dst, outputs, paths, resolved, data_name=data_name, options=_with_kept(options, final_keep))
        conversion = staged.report
    verified = verify(src, staged.path, verify_options, candidate_label=str(dst), outputs=outputs)
    result = RepairResult(verified.passed, ev.evaluations, history=history)
    by_path = {k.path: k for k in conversion.kept_f32}
    for path, reason in final_keep.items():
        kept = by_path.get(path)
        result.kept[path] = {"node": kept.node if kept else path, "op": kept.op if kept else "?", "reason": reason}
    result.compute_low_share, result.weight_low_share = _shares(ev.model, conversion)
    conversion.verify = verified.to_json()
    conversion.repair = result.to_json()
    return conversion, verified, result


def _path_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in path.split("/") if p.isdigit())


def _bisect(step: Callable[[str, Mapping[str, str]], tuple[bool, float, ConversionReport]], keep: dict[str, str],
            candidates: list[str], budget: int) -> tuple[bool, float, ConversionReport, dict[str, str]]:
    """Halve the candidate nodes, keeping in f32 the half that lowers the score most, down to one
    node; then add that node for good."""
    passed, score, report = False, float("inf"), None
    pool = list(candidates)
    used = 0
    while len(pool) > 1 and used + 2 <= budget:
        half = len(pool) // 2
        first, second = pool[:half], pool[half:]
        p1, s1, r1 = step(f"bisect {len(first)} nodes", {**keep, **{p: "drift" for p in first}})
        if p1 and len(first) == 1:
            keep.update({p: "drift" for p in first})
            return p1, s1, r1, keep
        p2, s2, r2 = step(f"bisect {len(second)} nodes", {**keep, **{p: "drift" for p in second}})
        used += 2
        pool = first if s1 <= s2 else second
        passed, score, report = (p1, s1, r1) if s1 <= s2 else (p2, s2, r2)
    if len(pool) == 1:
        keep[pool[0]] = "drift"
        if used + 1 <= budget:
            passed, score, report = step("bisect result", keep)
    assert report is not None or not candidates or budget < 1
    return passed, score, report if report is not None else ConversionReport(), keep


def _shares(model: onnx.ModelProto, report: ConversionReport) -> tuple[float | None, float | None]:
    compute = [prec for op, counts in report.by_op.items() for prec, n in counts.items() for _ in range(n)
               if kind_of(*_split(op)) is OpKind.COMPUTE]
    compute_share = sum(1 for p in compute if p in ("f16", "bf16")) / len(compute) if compute else None
    float_bytes = sum(tensor_nbytes(t) for t in model.graph.initializer if t.data_type in FLOAT_TYPES)
    saved = report.initializer_bytes_before - report.initializer_bytes_after
    if not float_bytes:
        return compute_share, None
    return compute_share, min(2 * saved / float_bytes, 1.0)  # narrowing f32 to 16 bits saves half its bytes


def _split(op: str) -> tuple[str, str]:
    domain, _, name = op.rpartition(".")
    return domain, name


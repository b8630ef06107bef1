"""Drift metrics of one output, and the pass criterion (docs/verification.md, "Pass criterion"), judged
against the output's `tolerance.Tolerance`: `compare_arrays` measures into a working `_Drift`
and returns the frozen `reports.record.OutputResult` the reports hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_onnx_amp.reports.record import Distribution, Histogram, OutputResult, Required, Sample, Worst
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = ["CHECKS", "HISTOGRAM_BINS", "SAMPLE_SIZE", "compare_arrays"]

#: Bins of the |c - r| histogram, and elements sampled for the reference-candidate plot (plus
#: the `WORST_SHOWN` worst), in `OutputResult.distribution`.
HISTOGRAM_BINS = 40
SAMPLE_SIZE = 400
WORST_SHOWN = 10

#: The checks an output is judged by, in the order a report names them.
CHECKS = ("finite", "shape", "exact", "max-scaled", "element-wise", "cosine")


@dataclass
class _Drift:
    """One output's metrics while `compare_arrays` measures them."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    elements: int
    max_abs: float = 0.0
    max_rel: float = 0.0  # max |c - r| / max(|r|, atol): elements near zero are scaled by atol
    mean_abs: float = 0.0
    p99_abs: float = 0.0
    cosine: float | None = None
    snr_db: float | None = None
    mismatch_pct: float = 0.0  # elements over atol + rtol_of_max·|r| (rtol·|r| when rtol is set)
    nan_ref: int = 0
    nan_cand: int = 0
    inf_ref: int = 0
    inf_cand: int = 0
    new_nan: int = 0  # NaN in the candidate where the reference has none
    new_inf: int = 0
    worst: dict[str, Any] | None = None
    top1_agreement: float | None = None
    #: The one value every finite element of the reference holds, when it has more than one
    #: element: the output then shows little of the conversion (cosine is not checked, and
    #: max_abs is judged against atol alone), which the verdict says.
    constant_reference: float | None = None
    passed: bool = True
    failures: list[str] | None = None
    failed_checks: list[str] | None = None  # which of CHECKS decided a failure
    tolerance: Tolerance | None = None
    bound: float | None = None  # atol + rtol_of_max * max|reference|: what max_abs was judged against
    #: The smallest tolerance that would have passed, each alone: atol (rtol_of_max 0),
    #: rtol_of_max (atol 0), element-wise rtol (atol 0), min_cosine.
    required: dict[str, float | None] | None = None
    #: How far from passing: the worst of max_abs / bound, the element-wise excess and
    #: (1 - cosine) / (1 - min_cosine); at most 1 when those pass; 1e6 per new non-finite value;
    #: 1 + 1000 x the share of non-float values that differ; 1e9 for a shape that differs.
    #: Repair minimizes it.
    score: float = 0.0
    #: What the HTML report plots (`distribution`): the |c - r| histogram over log-spaced bins
    #: (`abs_error_histogram`: edges, counts, exact zeros) and a sample of elements
    #: (`sample`: flat indices, reference and candidate values, evenly spaced plus the worst).
    distribution: dict[str, Any] | None = None

    def record(self) -> OutputResult:
        """The frozen result; a metric that is not finite is None, as in the JSON."""
        tol = self.tolerance
        worst, required, dist = self.worst, self.required, self.distribution
        return OutputResult(
            name=self.name,
            dtype=self.dtype,
            shape=self.shape,
            elements=self.elements,
            max_abs=_finite_or_none(self.max_abs),
            max_rel=_finite_or_none(self.max_rel),
            mean_abs=_finite_or_none(self.mean_abs),
            p99_abs=_finite_or_none(self.p99_abs),
            cosine=_finite_or_none(self.cosine),
            snr_db=_finite_or_none(self.snr_db),
            mismatch_pct=_finite_or_none(self.mismatch_pct),
            nan_ref=self.nan_ref,
            nan_cand=self.nan_cand,
            inf_ref=self.inf_ref,
            inf_cand=self.inf_cand,
            new_nan=self.new_nan,
            new_inf=self.new_inf,
            worst=Worst(tuple(worst["index"]), worst["reference"], worst["candidate"]) if worst else None,
            top1_agreement=_finite_or_none(self.top1_agreement),
            constant_reference=_finite_or_none(self.constant_reference),
            passed=self.passed,
            failures=tuple(self.failures) if self.failures is not None else None,
            failed_checks=tuple(self.failed_checks) if self.failed_checks is not None else None,
            bound=_finite_or_none(self.bound),
            required=Required(**{k: _finite_or_none(v) for k, v in required.items()}) if required else None,  # type: ignore[arg-type]
            score=_finite_or_none(self.score),
            distribution=_distribution_record(dist) if dist is not None else None,
            atol=tol.atol if tol is not None else None,
            rtol_of_max=tol.rtol_of_max if tol is not None else None,
            rtol=tol.rtol if tol is not None else None,
            min_cosine=tol.min_cosine if tol is not None else None,
        )


def _distribution_record(dist: dict[str, Any]) -> Distribution:
    h = dist["abs_error_histogram"]

    def sample(d: dict[str, Any]) -> Sample:
        return Sample(tuple(d["index"]), tuple(d["reference"]), tuple(d["candidate"]))

    return Distribution(
        Histogram(tuple(h["edges"]), tuple(h["counts"]), h["zeros"]), sample(dist["sample"]), sample(dist["worst"])
    )


_NONFINITE = 1e6
_OTHER_FAILURE = 1e9
_DIFFER_WEIGHT = 1e3  # a non-float output whose values all differ scores 1001


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def compare_arrays(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> OutputResult:
    """Drift of `candidate` against `reference` (same shape), and whether it passes `tol`."""
    return _measure(name, reference, candidate, tol).record()


def _measure(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> _Drift:
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    drift = _Drift(name, str(ref.dtype), tuple(ref.shape), int(ref.size), tolerance=tol)
    if ref.shape != cand.shape:
        return _verdict(drift, [("shape", f"shape {cand.shape} != reference {ref.shape}")], _OTHER_FAILURE)
    if ref.dtype.kind not in "fc":
        differ = int(np.count_nonzero(ref != cand))
        drift.mismatch_pct = 100.0 * differ / max(ref.size, 1)
        if differ:  # graded, so a search still sees which candidate moves fewer of them
            score = 1.0 + _DIFFER_WEIGHT * differ / ref.size
            return _verdict(drift, [("exact", f"{differ} of {ref.size} non-float values differ")], score)
        return _verdict(drift, [], 0.0)
    r = ref.astype(np.float64).ravel()
    c = cand.astype(np.float64).ravel()
    drift.nan_ref, drift.nan_cand = int(np.isnan(r).sum()), int(np.isnan(c).sum())
    drift.inf_ref, drift.inf_cand = int(np.isinf(r).sum()), int(np.isinf(c).sum())
    drift.new_nan = int(np.count_nonzero(np.isnan(c) & ~np.isnan(r)))
    drift.new_inf = int(np.count_nonzero(np.isinf(c) & ~np.isinf(r)))
    failures: list[tuple[str, str]] = []
    new_nonfinite = drift.new_nan + drift.new_inf
    if new_nonfinite:
        failures.append(("finite", f"{drift.new_nan} new NaN and {drift.new_inf} new Inf"))
    score = _NONFINITE * new_nonfinite
    if r.size == 0:
        return _verdict(drift, failures, score)
    both = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[both], c[both]
    if rf.size:
        failures += _float_checks(drift, ref, r, c, rf, cf, both, tol)
        score = max(score, drift.score)
    elif not new_nonfinite and np.any(np.isfinite(r)):
        failures.append(("finite", "no finite values to compare"))
    finite_pattern_differs = int(np.count_nonzero(np.isfinite(r) != np.isfinite(c)))
    if finite_pattern_differs and not new_nonfinite:
        failures.append(("finite", f"{finite_pattern_differs} values finite in one output only"))
    if ref.ndim >= 1 and ref.shape[-1] > 1 and ref.size:
        r2 = np.nan_to_num(ref.astype(np.float64)).reshape(-1, ref.shape[-1])
        c2 = np.nan_to_num(cand.astype(np.float64)).reshape(-1, ref.shape[-1])
        drift.top1_agreement = float(np.mean(np.argmax(r2, axis=-1) == np.argmax(c2, axis=-1)))
    return _verdict(drift, failures, score)


def _float_checks(
    drift: _Drift,
    ref: np.ndarray,
    r: np.ndarray,
    c: np.ndarray,
    rf: np.ndarray,
    cf: np.ndarray,
    both: np.ndarray,
    tol: Tolerance,
) -> list[tuple[str, str]]:
    """Metrics over the positions finite in both, and the max-scaled, element-wise and cosine
    checks; sets drift.score to the worst of their ratios."""
    failures: list[tuple[str, str]] = []
    diff = np.abs(rf - cf)
    abs_ref = np.abs(rf)
    ref_scale = float(abs_ref.max())
    drift.max_abs = float(diff.max())
    drift.mean_abs = float(diff.mean())
    drift.p99_abs = float(np.percentile(diff, 99))
    drift.max_rel = float(np.max(diff / np.maximum(abs_ref, max(tol.atol, 1e-30))))
    elem_rtol = tol.rtol if tol.rtol is not None else tol.rtol_of_max
    drift.mismatch_pct = 100.0 * float(np.count_nonzero(diff > tol.atol + elem_rtol * abs_ref)) / r.size
    k = int(np.argmax(diff))
    flat_index = int(np.flatnonzero(both)[k])
    drift.worst = {
        "index": [int(i) for i in np.unravel_index(flat_index, ref.shape)] if ref.ndim else [],
        "reference": float(r[flat_index]),
        "candidate": float(c[flat_index]),
    }
    noise = float(np.sum((rf - cf) ** 2))
    power = float(np.sum(rf**2))
    drift.snr_db = _finite_or_none(10 * math.log10(power / noise)) if noise > 0 and power > 0 else None
    norm = float(np.linalg.norm(rf) * np.linalg.norm(cf))
    constant = float(np.ptp(rf)) == 0.0
    if constant and rf.size > 1:
        drift.constant_reference = float(rf[0])
    if norm > 0:
        drift.cosine = float(np.dot(rf, cf) / norm)
    elif not constant:
        drift.cosine = 0.0
    bound = tol.bound(ref_scale)
    drift.bound = bound
    score = drift.max_abs / bound if bound > 0 else (0.0 if drift.max_abs == 0 else _OTHER_FAILURE)
    if drift.max_abs > bound:
        failures.append(
            (
                "max-scaled",
                f"max_abs {drift.max_abs:.4g} > {bound:.4g} "
                f"(atol {tol.atol:g} + rtol_of_max {tol.rtol_of_max:g} * max|ref| {ref_scale:.4g})",
            )
        )
    nonzero = abs_ref > 0
    required_rtol = float(np.max(diff[nonzero] / abs_ref[nonzero])) if nonzero.any() else None
    if tol.rtol is not None:
        limit = tol.atol + tol.rtol * abs_ref
        exceeded = diff > limit
        positive = limit > 0
        ratios = np.divide(diff, limit, out=np.zeros_like(diff), where=positive)
        worst_excess = float(ratios.max()) if ratios.size else 0.0
        if np.any(exceeded & ~positive):  # a difference where the bound is exactly zero
            worst_excess = max(worst_excess, _OTHER_FAILURE)
        score = max(score, worst_excess)
        over = int(np.count_nonzero(exceeded))
        if over:
            failures.append(("element-wise", f"{over} elements over atol {tol.atol:g} + rtol {tol.rtol:g} * |ref|"))
    checks_cosine = not constant and rf.size > 1
    if checks_cosine:
        cosine = drift.cosine if drift.cosine is not None else 0.0
        gap = 1.0 - cosine
        score = max(
            score, gap / (1.0 - tol.min_cosine) if tol.min_cosine < 1 else (0.0 if gap <= 0 else _OTHER_FAILURE)
        )
        if cosine < tol.min_cosine:
            failures.append(("cosine", f"cosine {cosine:.7f} < {tol.min_cosine:g}"))
    drift.distribution = _distribution(diff, rf, cf, np.flatnonzero(both))
    drift.required = {
        "atol": drift.max_abs,
        "rtol_of_max": drift.max_abs / ref_scale if ref_scale > 0 else None,
        "rtol": required_rtol,
        "min_cosine": drift.cosine if checks_cosine else None,
    }
    drift.score = score
    return failures


def _short(values: np.ndarray) -> list[float]:
    """Floats at 6 significant digits: plots need no more, and the JSON report stays small."""
    return [float(f"{v:.6g}") for v in values.tolist()]


def _distribution(diff: np.ndarray, rf: np.ndarray, cf: np.ndarray, flat: np.ndarray) -> dict[str, Any]:
    positive = diff[diff > 0]
    histogram: dict[str, Any] = {"edges": [], "counts": [], "zeros": int(diff.size - positive.size)}
    if positive.size:
        lo, hi = float(np.log10(positive.min())), float(np.log10(positive.max()))
        edges = np.logspace(lo, hi if hi > lo else lo + 1, HISTOGRAM_BINS + 1)
        counts, _ = np.histogram(positive, edges)
        histogram.update(edges=_short(edges), counts=[int(n) for n in counts])
    picks = np.unique(np.linspace(0, diff.size - 1, min(SAMPLE_SIZE, diff.size)).astype(np.int64))
    # the largest few, largest first: a partition, not a sort of millions of logits
    shown = min(WORST_SHOWN, diff.size)
    largest = np.argpartition(diff, diff.size - shown)[diff.size - shown:] if shown else np.arange(0)
    worst = largest[np.argsort(diff[largest], kind="stable")][::-1]
    return {
        "abs_error_histogram": histogram,
        "sample": {
            "index": [int(i) for i in flat[picks]],
            "reference": _short(rf[picks]),
            "candidate": _short(cf[picks]),
        },
        "worst": {
            "index": [int(i) for i in flat[worst]],
            "reference": _short(rf[worst]),
            "candidate": _short(cf[worst]),
        },
    }


def _verdict(drift: _Drift, failures: list[tuple[str, str]], score: float) -> _Drift:
    drift.passed = not failures
    drift.failures = [text for _, text in failures] or None
    drift.failed_checks = sorted({check for check, _ in failures}, key=CHECKS.index) or None
    drift.score = max(score, drift.score)
    if failures and drift.score <= 1.0:
        drift.score = _OTHER_FAILURE
    return drift

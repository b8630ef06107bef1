"""Drift metrics of one output, and the pass criterion (design.md section 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Tolerance", "OutputDrift", "compare_arrays"]


@dataclass(frozen=True)
class Tolerance:
    """Pass criterion of one output: no new NaN/Inf, max_abs <= atol + rtol * max|ref|, and
    cosine >= min_cosine wherever the reference is not constant."""

    atol: float
    rtol: float
    min_cosine: float


@dataclass
class OutputDrift:
    name: str
    dtype: str
    shape: tuple[int, ...]
    elements: int
    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    p99_abs: float = 0.0
    cosine: float | None = None
    snr_db: float | None = None
    mismatch_pct: float = 0.0
    nan_ref: int = 0
    nan_cand: int = 0
    inf_ref: int = 0
    inf_cand: int = 0
    worst: dict[str, Any] | None = None
    top1_agreement: float | None = None
    passed: bool = True
    failures: list[str] | None = None
    tolerance: Tolerance | None = None
    bound: float | None = None  # atol + rtol * max|reference|: what max_abs was judged against
    #: How far from passing: the worst of max_abs / bound and (1 - cosine) / (1 - min_cosine);
    #: at most 1 when those pass; 1e6 per new non-finite value, 1e9 for another failure
    #: (shapes or non-float values that differ). Repair minimizes it.
    score: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "tolerance"}
        data["shape"] = list(self.shape)
        if self.tolerance is not None:
            data["atol"], data["rtol"], data["min_cosine"] = self.tolerance.atol, self.tolerance.rtol, self.tolerance.min_cosine
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compare_arrays(name: str, reference: np.ndarray, candidate: np.ndarray, tol: Tolerance) -> OutputDrift:
    """Drift of `candidate` against `reference` (same shape), and whether it passes `tol`."""
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    drift = OutputDrift(name, str(ref.dtype), tuple(ref.shape), int(ref.size), tolerance=tol)
    failures: list[str] = []
    if ref.shape != cand.shape:
        drift.passed, drift.failures, drift.score = False, [f"shape {cand.shape} != reference {ref.shape}"], _OTHER_FAILURE
        return drift
    if ref.dtype.kind not in "fc":
        differ = int(np.count_nonzero(ref != cand))
        drift.mismatch_pct = 100.0 * differ / max(ref.size, 1)
        if ref.ndim >= 1 and ref.size:
            drift.top1_agreement = None
        if differ:
            failures.append(f"{differ} of {ref.size} non-float values differ")
        drift.passed, drift.failures = not failures, failures or None
        drift.score = _OTHER_FAILURE if failures else 0.0
        return drift
    r = ref.astype(np.float64).ravel()
    c = cand.astype(np.float64).ravel()
    drift.nan_ref, drift.nan_cand = int(np.isnan(r).sum()), int(np.isnan(c).sum())
    drift.inf_ref, drift.inf_cand = int(np.isinf(r).sum()), int(np.isinf(c).sum())
    new_nan = int(np.count_nonzero(np.isnan(c) & ~np.isnan(r)))
    new_inf = int(np.count_nonzero(np.isinf(c) & ~np.isinf(r)))
    if new_nan or new_inf:
        failures.append(f"{new_nan} new NaN and {new_inf} new Inf")
    new_nonfinite = new_nan + new_inf
    if r.size == 0:
        drift.passed, drift.failures = not failures, failures or None
        drift.score = _NONFINITE * new_nonfinite
        return drift
    both = np.isfinite(r) & np.isfinite(c)
    rf, cf = r[both], c[both]
    diff = np.abs(rf - cf)
    ref_scale = float(np.max(np.abs(rf))) if rf.size else 0.0
    if diff.size:
        drift.max_abs = float(diff.max())
        drift.mean_abs = float(diff.mean())
        drift.p99_abs = float(np.percentile(diff, 99))
        drift.max_rel = float(np.max(diff / np.maximum(np.abs(rf), 1e-12)))
        bound_elem = tol.atol + tol.rtol * np.abs(rf)
        drift.mismatch_pct = 100.0 * float(np.count_nonzero(diff > bound_elem)) / r.size
        k = int(np.argmax(diff))
        flat_index = int(np.flatnonzero(both)[k])
        drift.worst = {"index": [int(i) for i in np.unravel_index(flat_index, ref.shape)] if ref.ndim else [],
                       "reference": float(r[flat_index]), "candidate": float(c[flat_index])}
        noise = float(np.sum((rf - cf) ** 2))
        signal = float(np.sum(rf**2))
        drift.snr_db = _finite_or_none(10 * math.log10(signal / noise)) if noise > 0 and signal > 0 else (None if signal == 0 else math.inf)
        if drift.snr_db == math.inf:
            drift.snr_db = None
        norm = float(np.linalg.norm(rf) * np.linalg.norm(cf))
        constant = float(np.ptp(rf)) == 0.0
        if norm > 0:
            drift.cosine = float(np.dot(rf, cf) / norm)
        elif not constant:
            drift.cosine = 0.0
        bound = tol.atol + tol.rtol * ref_scale
        drift.bound = bound
        drift.score = drift.max_abs / bound if bound > 0 else (0.0 if drift.max_abs == 0 else _OTHER_FAILURE)
        if not constant and rf.size > 1:
            cosine = drift.cosine if drift.cosine is not None else 0.0
            gap = 1.0 - cosine
            drift.score = max(drift.score, gap / (1.0 - tol.min_cosine) if tol.min_cosine < 1 else (0.0 if gap <= 0 else _OTHER_FAILURE))
        if drift.max_abs > bound:
            failures.append(f"max_abs {drift.max_abs:.4g} > {bound:.4g} (atol {tol.atol:g} + rtol {tol.rtol:g} * {ref_scale:.4g})")
        if not constant and rf.size > 1 and (drift.cosine is None or drift.cosine < tol.min_cosine):
            failures.append(f"cosine {drift.cosine if drift.cosine is not None else float('nan'):.6f} < {tol.min_cosine:g}")
    elif not new_nan and not new_inf and np.any(np.isfinite(r)):
        failures.append("no finite values to compare")
    finite_pattern_differs = int(np.count_nonzero(np.isfinite(r) != np.isfinite(c)))
    if finite_pattern_differs and not (new_nan or new_inf):
        failures.append(f"{finite_pattern_differs} values finite in one output only")
    if ref.ndim >= 1 and ref.shape[-1] > 1 and ref.size:
        r2 = np.nan_to_num(ref.astype(np.float64)).reshape(-1, ref.shape[-1])
        c2 = np.nan_to_num(cand.astype(np.float64)).reshape(-1, ref.shape[-1])
        drift.top1_agreement = float(np.mean(np.argmax(r2, axis=-1) == np.argmax(c2, axis=-1)))
    drift.passed, drift.failures = not failures, failures or None
    drift.score = max(drift.score, _NONFINITE * new_nonfinite)
    if failures and drift.score <= 1.0:
        drift.score = _OTHER_FAILURE
    return drift


_NONFINITE = 1e6
_OTHER_FAILURE = 1e9

"""Drift localization: compare every float tensor the two models share by name, and name the
first nodes where the drift jumps or NaN/Inf appears.

The converter keeps original value names (design rule 10), so the candidate's tensor `x` is the
reference's `x`, whatever precision it is held in. A node is reported when its output has NaN/Inf
that the reference lacks while its inputs have none, or when its output's relative error passes
the tolerance and is at least `JUMP` times the largest relative error of its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from rlx_onnx_amp.precision import FLOAT_TYPES
from rlx_onnx_amp.types import model_types
from rlx_onnx_amp.verify.metrics import Tolerance

if TYPE_CHECKING:
    from rlx_onnx_amp.verify.core import Scratch

__all__ = ["JUMP", "expose_outputs", "localize", "tensor_errors"]

JUMP = 10.0


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` with the main-graph values `names` added as graph outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return out


def _float_values(model: onnx.ModelProto) -> list[str]:
    types = model_types(model)
    main = types.get("", {})
    return [o for node in model.graph.node for o in node.output if o and main.get(o) in FLOAT_TYPES]


def tensor_errors(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float | int]:
    """Relative error (max_abs over max|reference|) and new non-finite counts of one tensor."""
    r = reference.astype(np.float64).ravel()
    c = candidate.astype(np.float64).ravel()
    new_nonfinite = int(np.count_nonzero(~np.isfinite(c) & np.isfinite(r)))
    both = np.isfinite(r) & np.isfinite(c)
    if not both.any():
        return {"rel_error": 0.0, "max_abs": 0.0, "new_nonfinite": new_nonfinite}
    diff = float(np.max(np.abs(r[both] - c[both])))
    scale = float(np.max(np.abs(r[both])))
    return {"rel_error": diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")), "max_abs": diff,
            "new_nonfinite": new_nonfinite}


def localize(
    ref_model: onnx.ModelProto, ref_dir: Path, cand_model: onnx.ModelProto, cand_dir: Path, feeds: Mapping[str, np.ndarray],
    feed_low: Mapping[str, int], provider: str, tmp: Scratch, tol: Tolerance, top: int,
) -> list[dict[str, Any]]:
    from rlx_onnx_amp.verify.core import _round_feeds

    ref_names = _float_values(ref_model)
    cand_names = set(o for node in cand_model.graph.node for o in node.output)
    shared = [n for n in ref_names if n in cand_names]
    ref_session = tmp.session(expose_outputs(ref_model, shared), ref_dir, provider, "reference")
    cand_session = tmp.session(expose_outputs(cand_model, shared), cand_dir, provider, "candidate")
    ref_values = ref_session.run(feeds, shared)
    cand_values = cand_session.run(_round_feeds(feeds, feed_low) if feed_low else feeds, shared)
    errors = {n: tensor_errors(ref_values[n], cand_values[n]) for n in shared}
    found: list[dict[str, Any]] = []
    for index, node in enumerate(ref_model.graph.node):
        outs = [o for o in node.output if o in errors]
        if not outs:
            continue
        ins = [errors[i] for i in node.input if i in errors]
        in_rel = max((e["rel_error"] for e in ins), default=0.0)
        in_nonfinite = sum(int(e["new_nonfinite"]) for e in ins)
        for out in outs:
            e = errors[out]
            nonfinite_appears = e["new_nonfinite"] > 0 and in_nonfinite == 0
            jump = e["rel_error"] > tol.rtol and e["rel_error"] >= JUMP * max(in_rel, 1e-6)
            if nonfinite_appears or jump:
                found.append({
                    "node": node.name or f"{node.op_type}@{index}", "op": node.op_type, "path": str(index), "tensor": out,
                    "reason": "NaN/Inf appears" if nonfinite_appears else "drift jumps",
                    "rel_error": e["rel_error"], "input_rel_error": in_rel, "max_abs": e["max_abs"],
                    "new_nonfinite": e["new_nonfinite"],
                })
                break
        if len(found) >= top:
            break
    return found

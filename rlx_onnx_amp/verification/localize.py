"""Drift localization: compare every float tensor the two models share by name, and name the
first nodes where the drift jumps or NaN/Inf appears.

The converter keeps original value names, so the candidate's tensor `x` is the reference's `x`,
whatever precision it is held in. A node is reported when its output has NaN/Inf that the
reference lacks while its inputs have none, or when its output's relative error passes the
tolerance and is at least `JUMP` times the largest relative error of its inputs. A tensor whose
shape differs between the two runs (data-dependent shapes: NonZero, TopK with a computed k,
NMS) is reported as such, with both shapes, and not compared element by element.

Reference values the candidate's precision cannot hold (past its largest finite value: a -1e9
mask clamped to -65504) are not compared where the candidate holds a finite value there: the
converter reports the clamping, and what it causes downstream shows in the tensors that follow.
Where the candidate holds Inf or NaN instead (an overflow), it counts as NaN/Inf appearing.
Constant-like nodes, whose values the converter narrows for their consumers and which no keep
can change, are never reported.

The reference's side is run once per verification (`reference_values`, on the first input set,
each tensor kept in a scratch file), and every candidate it localizes is compared against it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from rlx_onnx_amp.precision import FLOAT_TYPES, PRECISIONS, Precision
from rlx_onnx_amp.reports.record import Localized, TracePoint
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, SOURCE_VALUE_ATTRIBUTES, copies_values
from rlx_onnx_amp.types import model_types
from rlx_onnx_amp.verification.compare import Compared, Scratch
from rlx_onnx_amp.verification.tolerance import Tolerance

__all__ = ["JUMP", "expose_outputs", "localize", "reference_values", "shared_values", "tensor_errors"]

JUMP = 10.0


def expose_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` with the main-graph values `names` added as graph outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return out


def float_values(model: onnx.ModelProto) -> list[str]:
    """The main-graph values computed by nodes that hold floats (f32, f16, bf16)."""
    types = model_types(model)
    main = types.get("", {})
    return [o for node in model.graph.node for o in node.output if o and main.get(o) in FLOAT_TYPES]


def shared_values(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> list[str]:
    """The reference's float values (graph order) that the candidate computes under the same name."""
    computed = {o for node in candidate.graph.node for o in node.output}
    return [n for n in float_values(reference) if n in computed]


def reference_values(
    model: onnx.ModelProto,
    base_dir: Path | None,
    feeds: Mapping[str, np.ndarray],
    provider: str,
    tmp: Scratch,
    names: Sequence[str],
) -> dict[str, Path]:
    """The reference's values `names` on `feeds`, from one run with them exposed, each saved to a
    scratch file (read back mapped, one at a time, while it is compared). The session is
    released before any candidate's opens."""
    session = tmp.session(expose_outputs(model, names), base_dir, provider, "reference")
    values = session.run(feeds, names)
    del session
    stored: dict[str, Path] = {}
    for n in names:
        stored[n] = tmp.file("intermediate.npy")
        np.save(stored[n], np.asarray(values.pop(n)))
    del values
    return stored


def tensor_errors(reference: np.ndarray, candidate: np.ndarray, max_finite: float = np.inf) -> dict[str, Any]:
    """Relative error (max_abs over max|reference|) and new non-finite counts of one tensor,
    over the positions whose reference value the candidate's precision can hold; or, when the
    shapes differ, both shapes."""
    if np.shape(reference) != np.shape(candidate):
        return {
            "rel_error": 0.0,
            "max_abs": 0.0,
            "new_nonfinite": 0,
            "shapes": (list(np.shape(reference)), list(np.shape(candidate))),
        }
    r = np.asarray(reference).astype(np.float64).ravel()
    c = np.asarray(candidate).astype(np.float64).ravel()
    new_nonfinite = int(np.count_nonzero(~np.isfinite(c) & np.isfinite(r)))  # overflow shows here, past the range too
    both = np.isfinite(r) & np.isfinite(c) & (np.abs(r) <= max_finite)
    if not both.any():
        return {"rel_error": 0.0, "max_abs": 0.0, "new_nonfinite": new_nonfinite}
    diff = float(np.max(np.abs(r[both] - c[both])))
    scale = float(np.max(np.abs(r[both])))
    return {
        "rel_error": diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")),
        "max_abs": diff,
        "new_nonfinite": new_nonfinite,
    }


def localize(
    ref_model: onnx.ModelProto,
    stored: Mapping[str, Path],
    compared: Compared,
    feeds: Mapping[str, np.ndarray],
    provider: str,
    tmp: Scratch,
    tol: Tolerance,
    top: int,
    trace: list[TracePoint] | None = None,
) -> list[Localized]:
    """The first `top` nodes of the main graph, in graph order, where drift starts, from the
    candidate's run on `feeds` against the reference's values there (`reference_values` of
    `shared_values`). `trace`, if given, receives every compared tensor in graph order
    (`tensor`, `node`, `op`, `rel_error`, `new_nonfinite`; `shapes` where they differ): what the
    HTML report plots."""
    shared = list(stored)
    cand_session = tmp.session(expose_outputs(compared.model, shared), compared.base_dir, provider, "candidate")
    cand_values = cand_session.run(compared.rounded(feeds), shared)
    del cand_session
    max_finite = PRECISIONS[compared.precision].max_finite if compared.precision is not Precision.F32 else np.inf
    errors = {}
    for n in shared:
        errors[n] = tensor_errors(np.load(stored[n], mmap_mode="r"), cand_values.pop(n), max_finite)
    del cand_values
    if trace is not None:
        for index, node in enumerate(ref_model.graph.node):
            for out in node.output:
                if out in errors:
                    e = errors[out]
                    rel = e["rel_error"]
                    shapes = tuple(tuple(int(d) for d in s) for s in e["shapes"]) if "shapes" in e else None
                    trace.append(
                        TracePoint(
                            out, node.name or f"{node.op_type}@{index}", node.op_type,
                            float(rel) if np.isfinite(rel) else None, int(e["new_nonfinite"]), shapes,
                        )
                    )
    found: list[Localized] = []
    for index, node in enumerate(ref_model.graph.node):
        outs = [o for o in node.output if o in errors]
        if not outs or (node.op_type in SOURCE_VALUE_ATTRIBUTES and node.domain in DEFAULT_DOMAINS):
            continue
        ins = [errors[i] for i in node.input if i in errors]
        in_rel = max((e["rel_error"] for e in ins), default=0.0)
        in_nonfinite = sum(int(e["new_nonfinite"]) for e in ins)
        in_shapes_differ = any("shapes" in e for e in ins)
        for out in outs:
            e = errors[out]
            entry = functools.partial(
                Localized,
                node.name or f"{node.op_type}@{index}",
                node.op_type,
                str(index),
                out,
                float(e["rel_error"]),
                float(in_rel),
                float(e["max_abs"]),
                int(e["new_nonfinite"]),
            )
            if "shapes" in e:
                if not in_shapes_differ:
                    ref_shape, cand_shape = e["shapes"]
                    found.append(entry("shape differs", tuple(ref_shape), tuple(cand_shape)))
                    break
                continue
            nonfinite_appears = e["new_nonfinite"] > 0 and in_nonfinite == 0
            jump = e["rel_error"] > tol.rtol_of_max and e["rel_error"] >= JUMP * max(in_rel, 1e-6)
            if nonfinite_appears or jump:
                # A node that only copies values drifts because the candidate rounds its input.
                copies = copies_values(node.domain, node.op_type)
                reason = "NaN/Inf appears" if nonfinite_appears else "input rounded" if copies else "drift jumps"
                found.append(entry(reason))
                break
        if len(found) >= top:
            break
    return found

"""The proof that a converted model is sound: onnx's full checker passes on it, or (for an input
the checker refuses) onnxruntime loads the input and the output alike. The checker runs in this
process, as in every peer converter (onnx-ir's CheckerPass, Model-Optimizer's AutoCast).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import onnx
from onnx import ModelProto

from rlx_onnx_amp.errors import AmpError, InputError, first_line

__all__ = ["checker_failure", "onnxruntime_failure", "prove"]

logger = logging.getLogger(__name__)

_LIMIT = 1000  # characters of the checker's first line

#: A model in memory (a protobuf at most 2 GiB) or a model file.
_Checkable = ModelProto | str | os.PathLike[str]


def checker_failure(model: _Checkable, limit: int = _LIMIT) -> str | None:
    """The first line of what `onnx.checker.check_model(full_check=True)` says against a model
    file (or a model in memory), or None when it passes: how a failure is told to be the
    input's or ours."""
    try:
        onnx.checker.check_model(model if isinstance(model, ModelProto) else str(model), full_check=True)
    except Exception as e:
        return first_line(e, limit)
    return None


def onnxruntime_failure(
    model: _Checkable,
    limit: int = 400,
    provider: str = "CPUExecutionProvider",
    role: str | None = None,
    label: str | None = None,
) -> str | None:
    """Why onnxruntime's `provider` (with the CPU provider behind it) cannot load a model (`role`:
    what it is, `label`: its name for the user, e.g. its final path while it is staged; both for a
    supervisor's notes), or None when it loads."""
    from rlx_onnx_amp.sessions import OrtSession  # onnxruntime: only where the checker refuses a model

    source = model.SerializeToString() if isinstance(model, ModelProto) else str(model)
    label = label or ("a model in memory" if isinstance(model, ModelProto) else str(model))
    try:
        OrtSession(source, provider, label, role=role, prepacking=False)
    except AmpError as e:
        return first_line(e, limit)
    return None


def prove(
    output: _Checkable,
    source: _Checkable | Callable[[], _Checkable],
    target: str,
    source_label: str,
    label: str,
) -> str:
    """The proof that a converted model for `target` ("cuda", "cpu") is sound: onnx's full checker
    passes on it; or, for an input the checker refuses (onnxruntime's own ops in the default
    domain, as onnxruntime-genai's builder writes them), onnxruntime loads the input and the
    output alike. Anything else is bad input (InputError) or a bug of ours (AmpError).
    `source` may be a function that makes it, called only when the output fails the checker.
    Returns the proof the report names: "onnx.checker", or onnxruntime's with the checker's
    words on the input."""
    found = checker_failure(output)
    if found is None:
        return "onnx.checker"
    if callable(source):
        source = source()
    first = checker_failure(source)
    if first is None:  # the input was valid, so this is our bug: say so, with the checker's words
        raise AmpError(f"{label}: the converted model fails onnx.checker; nothing written ({found})")
    if onnxruntime_failure(source, role="the input", label=source_label) is not None:
        raise InputError(f"{source_label}: the input model fails onnx.checker ({first}); nothing written")
    import onnxruntime as ort

    # The output is meant for its target: a bf16 model for CUDA need not load on the CPU provider.
    wanted = "CUDAExecutionProvider" if target == "cuda" else "CPUExecutionProvider"
    provider = wanted if wanted in ort.get_available_providers() else "CPUExecutionProvider"
    output_not_loaded = onnxruntime_failure(output, provider=provider, role="the converted model", label=label)
    if output_not_loaded is not None and provider != wanted:
        raise InputError(
            f"{source_label}: the input model fails onnx.checker ({first}), and the converted model cannot be "
            f"loaded here to prove it instead: {wanted} is not available ({output_not_loaded}); nothing written"
        )
    if output_not_loaded is not None:
        raise AmpError(
            f"{label}: the input fails onnx.checker but loads in onnxruntime, and the converted model does not "
            f"({output_not_loaded}); nothing written"
        )
    proof = f"onnxruntime loads it (the input fails onnx.checker: {first})"
    logger.info("%s: %s", label, proof)
    return proof

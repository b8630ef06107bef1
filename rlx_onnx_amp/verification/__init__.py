"""Drift verification with onnxruntime: one reference run judging candidates (`Verifier`),
its sessions and emulation, metrics, tolerances, inputs and localization.

What parsing options needs (`VerifyOptions`, `InputSpec`, tolerances) loads with the package;
the verification itself (sessions, emulation, localization, the reference run) on first use of
its names (PEP 562), so that a conversion without verification does not import it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlx_onnx_amp.verification.inputs import InputSpec
from rlx_onnx_amp.verification.options import PROVIDERS, VerifyOptions, resolve_provider
from rlx_onnx_amp.verification.tolerance import Tolerance, Tolerances

if TYPE_CHECKING:
    from rlx_onnx_amp.verification.core import Judgement, Verifier, verify
    from rlx_onnx_amp.verification.metrics import compare_arrays
    from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable, prepare_reference

__all__ = [
    "PROVIDERS",
    "InputSpec",
    "Judgement",
    "Reference",
    "ReferenceUnavailable",
    "Tolerance",
    "Tolerances",
    "Verifier",
    "VerifyOptions",
    "compare_arrays",
    "prepare_reference",
    "resolve_provider",
    "verify",
]

#: The names loaded on first use, by the module that defines them.
_LAZY = {
    "Judgement": "core",
    "Verifier": "core",
    "verify": "core",
    "compare_arrays": "metrics",
    "Reference": "reference",
    "ReferenceUnavailable": "reference",
    "prepare_reference": "reference",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

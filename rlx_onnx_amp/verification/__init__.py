"""Drift verification with onnxruntime: the comparison core, metrics, inputs, emulation and
localization."""

from __future__ import annotations

from rlx_onnx_amp.verification.compare import PROVIDERS, VerifyOptions, resolve_provider
from rlx_onnx_amp.verification.core import VerifyReport, verify
from rlx_onnx_amp.verification.inputs import InputSpec
from rlx_onnx_amp.verification.metrics import OutputDrift, compare_arrays
from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable, prepare_reference
from rlx_onnx_amp.verification.tolerance import Tolerance, Tolerances

__all__ = [
    "PROVIDERS",
    "InputSpec",
    "OutputDrift",
    "Reference",
    "ReferenceUnavailable",
    "Tolerance",
    "Tolerances",
    "VerifyOptions",
    "VerifyReport",
    "compare_arrays",
    "prepare_reference",
    "resolve_provider",
    "verify",
]

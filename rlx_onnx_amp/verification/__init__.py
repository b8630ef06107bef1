"""Drift verification with onnxruntime: the comparison core, metrics, inputs, emulation and
localization."""

from __future__ import annotations

from rlx_onnx_amp.verification.compare import PROVIDERS, VerifyOptions, resolve_provider
from rlx_onnx_amp.verification.core import VerifyReport, verify
from rlx_onnx_amp.verification.inputs import InputSpec
from rlx_onnx_amp.verification.metrics import OutputDrift, Tolerance, compare_arrays

__all__ = [
    "PROVIDERS",
    "InputSpec",
    "OutputDrift",
    "Tolerance",
    "VerifyOptions",
    "VerifyReport",
    "compare_arrays",
    "resolve_provider",
    "verify",
]

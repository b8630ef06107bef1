"""Drift verification with onnxruntime: the comparison core, metrics, inputs, emulation and
localization."""

from __future__ import annotations

from rlx_onnx_amp.verify.compare import PROVIDERS, VerifyOptions, resolve_provider
from rlx_onnx_amp.verify.core import VerifyReport, verify
from rlx_onnx_amp.verify.inputs import InputSpec
from rlx_onnx_amp.verify.metrics import OutputDrift, Tolerance, compare_arrays

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

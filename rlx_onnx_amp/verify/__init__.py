"""Drift verification with onnxruntime: metrics, inputs, emulation, localization."""

from __future__ import annotations

from rlx_onnx_amp.verify.core import PROVIDERS, VerifyOptions, VerifyReport, resolve_provider, verify
from rlx_onnx_amp.verify.inputs import InputSpec
from rlx_onnx_amp.verify.metrics import OutputDrift, Tolerance, compare_arrays

__all__ = ["PROVIDERS", "InputSpec", "OutputDrift", "Tolerance", "VerifyOptions", "VerifyReport", "compare_arrays",
           "resolve_provider", "verify"]

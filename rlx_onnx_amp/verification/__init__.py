"""Drift verification with onnxruntime: one reference run judging candidates (`Verification`),
its sessions and emulation, metrics, tolerances, inputs and localization."""

from __future__ import annotations

from rlx_onnx_amp.verification.compare import PROVIDERS, VerifyOptions, resolve_provider
from rlx_onnx_amp.verification.core import Judgement, Verification, VerifyReport, verify
from rlx_onnx_amp.verification.inputs import InputSpec
from rlx_onnx_amp.verification.metrics import OutputDrift, compare_arrays
from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable, prepare_reference
from rlx_onnx_amp.verification.tolerance import Tolerance, Tolerances

__all__ = [
    "PROVIDERS",
    "InputSpec",
    "Judgement",
    "OutputDrift",
    "Reference",
    "ReferenceUnavailable",
    "Tolerance",
    "Tolerances",
    "Verification",
    "VerifyOptions",
    "VerifyReport",
    "compare_arrays",
    "prepare_reference",
    "resolve_provider",
    "verify",
]

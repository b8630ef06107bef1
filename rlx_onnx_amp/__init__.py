"""rlx-amp: rewrite ONNX models to mixed precision (float16 / bfloat16) and prove the result."""

from __future__ import annotations

from rlx_onnx_amp.api import convert, convert_file, load_model, make_options
from rlx_onnx_amp.convert import ConvertOptions
from rlx_onnx_amp.errors import AmpError, InputError, ModelRunError, PolicyError
from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.policy import POLICY_NAMES, Policy, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.report import ConversionReport
from rlx_onnx_amp.taxonomy import OpKind

__all__ = [
    "POLICY_NAMES",
    "AmpError",
    "ConversionReport",
    "ConvertOptions",
    "InputError",
    "ModelRunError",
    "OpKind",
    "Policy",
    "PolicyError",
    "Precision",
    "Target",
    "convert",
    "convert_file",
    "load_model",
    "make_options",
    "policy_from_name",
]

__version__ = "0.1.0"

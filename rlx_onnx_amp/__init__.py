"""rlx-amp: rewrite ONNX models to mixed precision (float16 / bfloat16) and prove the result.

The names below are imported on first use, so `import rlx_onnx_amp` (and the command line's
start) does not wait for onnx and onnxruntime until they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlx_onnx_amp.api import convert, convert_file, load_model, make_options
    from rlx_onnx_amp.convert import ConvertOptions
    from rlx_onnx_amp.errors import AmpError, InputError, ModelRunError, PolicyError
    from rlx_onnx_amp.kernels import Target
    from rlx_onnx_amp.policy import POLICY_NAMES, Policy, policy_from_name
    from rlx_onnx_amp.precision import Precision
    from rlx_onnx_amp.report import ConversionReport
    from rlx_onnx_amp.taxonomy import OpKind

_HOMES = {
    "convert": "api", "convert_file": "api", "load_model": "api", "make_options": "api",
    "ConvertOptions": "convert",
    "AmpError": "errors", "InputError": "errors", "ModelRunError": "errors", "PolicyError": "errors",
    "Target": "kernels",
    "POLICY_NAMES": "policy", "Policy": "policy", "policy_from_name": "policy",
    "Precision": "precision",
    "ConversionReport": "report",
    "OpKind": "taxonomy",
}

__all__ = sorted(_HOMES)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'rlx_onnx_amp' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlx_onnx_amp.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

"""rlx-amp: rewrite ONNX models to mixed precision (float16 / bfloat16) and prove the result.

The names below are imported on first use, so `import rlx_onnx_amp` (and the command line's
start) does not wait for onnx and onnxruntime until they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlx_onnx_amp.api import (
        convert as convert,
    )
    from rlx_onnx_amp.api import (
        convert_and_report as convert_and_report,
    )
    from rlx_onnx_amp.api import (
        convert_file as convert_file,
    )
    from rlx_onnx_amp.api import (
        load_model as load_model,
    )
    from rlx_onnx_amp.api import (
        make_options as make_options,
    )
    from rlx_onnx_amp.errors import (
        AmpError as AmpError,
    )
    from rlx_onnx_amp.errors import (
        InputError as InputError,
    )
    from rlx_onnx_amp.errors import (
        ModelRunError as ModelRunError,
    )
    from rlx_onnx_amp.errors import (
        PolicyError as PolicyError,
    )
    from rlx_onnx_amp.kernels import Target as Target
    from rlx_onnx_amp.pipeline import run as run
    from rlx_onnx_amp.policy import POLICY_NAMES as POLICY_NAMES
    from rlx_onnx_amp.policy import Policy as Policy
    from rlx_onnx_amp.policy import policy_from_name as policy_from_name
    from rlx_onnx_amp.precision import Precision as Precision
    from rlx_onnx_amp.reports.record import Conversion as Conversion
    from rlx_onnx_amp.reports.record import ModelResult as ModelResult
    from rlx_onnx_amp.rewrite import ConvertOptions as ConvertOptions
    from rlx_onnx_amp.taxonomy import OpKind as OpKind

_HOMES = {
    "convert": "api",
    "write_demo": "api",
    "verify": "verification",
    "VerifyOptions": "verification",
    "Verification": "reports.record",
    "convert_file": "api",
    "load_model": "api",
    "make_options": "api",
    "ConvertOptions": "rewrite",
    "AmpError": "errors",
    "InputError": "errors",
    "ModelRunError": "errors",
    "PolicyError": "errors",
    "Target": "kernels",
    "POLICY_NAMES": "policy",
    "Policy": "policy",
    "policy_from_name": "policy",
    "Precision": "precision",
    "Conversion": "reports.record",
    "ModelResult": "reports.record",
    "convert_and_report": "api",
    "run": "pipeline",
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

"""Numeric precisions the rewrite targets, as data.

Everything the converter and the verifier need to know about one precision lives in its
`PrecisionInfo` record: the ONNX element type, the numpy dtype used to narrow weights, the
finite range used for clamping, and the default drift tolerances. Adding a precision is one
more record.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

__all__ = [
    "F32",
    "FLOAT_TYPES",
    "LOW_PRECISIONS",
    "LOW_TYPES",
    "PRECISIONS",
    "TYPE_NAME",
    "TYPE_STR",
    "Precision",
    "PrecisionInfo",
    "is_float",
    "precision_of_elem_type",
]


class Precision(str, enum.Enum):
    """A floating-point precision a node can run at."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"

    @property
    def info(self) -> PrecisionInfo:
        return PRECISIONS[self]

    @property
    def elem_type(self) -> int:
        return PRECISIONS[self].elem_type


@dataclass(frozen=True)
class PrecisionInfo:
    """Facts about one precision."""

    precision: Precision
    elem_type: int  # onnx.TensorProto.DataType
    type_str: str  # as written in ONNX type constraints
    np_dtype: np.dtype
    max_finite: float
    overflow_at: float  # the smallest magnitude that rounds to Inf (max_finite plus half an ulp)
    smallest_subnormal: float
    smallest_normal: float  # below it values lose precision, and below half the smallest subnormal they flush to zero
    unit_roundoff: float  # half the machine epsilon: the largest relative error of rounding a normal number
    bits: np.dtype  # the unsigned integer type of the same width: its bit patterns
    magnitude_mask: int  # every bit but the sign: bits & mask == 0 exactly for +0 and -0
    # Default drift tolerances for a candidate computed at this precision (docs/verification.md, "Pass criterion").
    atol: float
    rtol_of_max: float  # times max|reference| (see verify.metrics)
    min_cosine: float
    aliases: tuple[str, ...] = ()  # other names a user may write for it (`--map`, policy files)

    @property
    def onnx_name(self) -> str:
        """Its name in ONNX type strings and onnxruntime's kernel registry: `float16`."""
        return self.type_str[len("tensor(") : -1]


PRECISIONS: Mapping[Precision, PrecisionInfo] = {
    Precision.F32: PrecisionInfo(
        Precision.F32,
        TensorProto.FLOAT,
        "tensor(float)",
        np.dtype(np.float32),
        float(np.finfo(np.float32).max),
        float(np.finfo(np.float32).max),
        float(np.finfo(np.float32).smallest_subnormal),
        float(np.finfo(np.float32).smallest_normal),
        float(np.finfo(np.float32).eps) / 2,
        np.dtype(np.uint32),
        0x7FFF_FFFF,
        atol=1e-4,
        rtol_of_max=1e-4,
        min_cosine=0.99999,
        aliases=("fp32", "float32", "float"),
    ),
    Precision.F16: PrecisionInfo(
        Precision.F16,
        TensorProto.FLOAT16,
        "tensor(float16)",
        np.dtype(np.float16),
        65504.0,
        65520.0,
        float(np.finfo(np.float16).smallest_subnormal),
        float(np.finfo(np.float16).smallest_normal),
        float(np.finfo(np.float16).eps) / 2,
        np.dtype(np.uint16),
        0x7FFF,
        atol=1e-2,
        rtol_of_max=1e-2,
        min_cosine=0.999,
        aliases=("fp16", "float16", "half"),
    ),
    Precision.BF16: PrecisionInfo(
        Precision.BF16,
        TensorProto.BFLOAT16,
        "tensor(bfloat16)",
        np.dtype(ml_dtypes.bfloat16),
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).max) + 2.0**119,  # half an ulp (2**120) past the largest finite
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal),
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_normal),
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2,
        np.dtype(np.uint16),
        0x7FFF,
        atol=5e-2,
        rtol_of_max=5e-2,
        min_cosine=0.995,
        aliases=("bfloat16",),
    ),
}

#: The precisions below f32, by name ("f16", "bf16"): what reports count as low.
LOW_PRECISIONS = frozenset(p.value for p in PRECISIONS if p is not Precision.F32)

#: Element types the converter may retype. Everything else (integers, bool, strings, double,
#: packed and fp8 types) is never touched.
FLOAT_TYPES = frozenset(info.elem_type for info in PRECISIONS.values())
#: The element types of the precisions below f32.
LOW_TYPES = frozenset(info.elem_type for p, info in PRECISIONS.items() if p is not Precision.F32)

_BY_ELEM_TYPE = {info.elem_type: p for p, info in PRECISIONS.items()}


def precision_of_elem_type(elem_type: int) -> Precision | None:
    """The precision of an ONNX element type, or None for a type we never retype."""
    return _BY_ELEM_TYPE.get(elem_type)


F32 = TensorProto.FLOAT
#: A precision's element type -> its name in ONNX type constraints ("tensor(float16)").
TYPE_STR = {info.elem_type: info.type_str for info in PRECISIONS.values()}
#: A precision's element type -> its TensorProto name ("FLOAT16").
TYPE_NAME = {info.elem_type: info.onnx_name for info in PRECISIONS.values()}


def is_float(elem: int | None) -> bool:
    return elem in FLOAT_TYPES

"""Reading a model file: every failure is one InputError naming the file, every tensor's data
checked against its type and dims, external data only inside the model's directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto

from rlx_onnx_amp.errors import InputError, first_line
from rlx_onnx_amp.tensors import WeightSink, WeightSource, check_inline_data, is_external, tensor_nbytes
from rlx_onnx_amp.types import NodeFields, all_tensors

__all__ = ["Loaded", "load_checked", "load_model"]


def load_model(path: str | os.PathLike[str], *, load_external_data: bool = False) -> ModelProto:
    """Load a model file; every failure is an InputError naming the file."""
    return load_checked(path, load_external_data).model


class Loaded(NamedTuple):
    """A model file read and checked (`load_checked`)."""

    model: ModelProto
    tensors: list[onnx.TensorProto]  # initializers and tensor attributes, bodies included (`all_tensors`)
    sizes: list[int]  # `tensor_nbytes` of each
    fields: NodeFields | None


def load_checked(path: str | os.PathLike[str], load_external_data: bool, read_fields: bool = False) -> Loaded:
    """The model and its tensors (initializers and tensor attributes, bodies included), every
    tensor's data checked against its type and dims, external data inside the model's directory,
    with their sizes; with `read_fields`, the main graph's nodes read once (`types.NodeFields`)
    for the conversion too, else None."""
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except OSError as e:
        raise InputError(f"{str(p)[:200]}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{p}: not a regular file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        reason = first_line(e, 1000) if str(e).strip() else "cannot parse"
        raise InputError(f"{p}: not a valid ONNX model ({type(e).__name__}: {reason})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise InputError(f"{p}: not a valid ONNX model (no graph)")
    if not model.opset_import:
        raise InputError(f"{p}: not a valid ONNX model (no opset_import)")
    source = WeightSource(p.parent, str(p))
    sink = WeightSink()
    fields = NodeFields.read(model.graph) if read_fields else None
    tensors = list(all_tensors(model, fields))
    sizes = []
    for tensor in tensors:
        if is_external(tensor):
            source.check(tensor)
            sizes.append(tensor_nbytes(tensor))
            if load_external_data:
                sink.copy_through(tensor, source)
        else:
            sizes.append(check_inline_data(tensor, str(p)))
    return Loaded(model, tensors, sizes, fields)

"""Inputs for a verification run: the user's files, or seeded synthesis from the model.

Synthesis rules (README "Verification inputs"):
- symbolic dimensions come from `--shape NAME:1x128`; otherwise the first axis gets 1 and every
  other symbolic axis gets `DEFAULT_DIM`;
- float inputs are uniform in [-1, 1], or in the `--input-range NAME:LO,HI`;
- integer inputs that index an embedding table (a Gather whose data is an initializer, reached
  through Cast/Reshape/Unsqueeze/...) get token ids below the table size; inputs whose name says
  "mask" get {0, 1}; integer scalars (sample rates, lengths) must come from --input-range or a
  file; other integer inputs get values in [0, 2);
- bool inputs are random {False, True}.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.errors import InputError

__all__ = ["DEFAULT_DIM", "InputSpec", "load_inputs", "parse_range", "parse_shape", "synthesize"]

DEFAULT_DIM = 8
DEFAULT_SEED = 0

# Ops that pass integer ids through unchanged in value, on the way to a Gather.
_ID_PASSTHROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Slice", "Transpose"})


@dataclass
class InputSpec:
    """What the user said about inputs."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    seed: int = DEFAULT_SEED
    samples: int = 1


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME:1x128` -> (NAME, (1, 128))."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
        raise InputError(f"--shape: expected NAME:1x128, got {text!r}")
    return name, tuple(int(d) for d in dims.split("x"))


def parse_range(text: str) -> tuple[str, tuple[float, float]]:
    """`NAME:LO,HI` -> (NAME, (LO, HI))."""
    name, sep, bounds = text.rpartition(":")
    try:
        lo, hi = (float(v) for v in bounds.split(","))
    except ValueError:
        raise InputError(f"--input-range: expected NAME:LO,HI, got {text!r}") from None
    if not sep or not name or not lo < hi:
        raise InputError(f"--input-range: expected NAME:LO,HI with LO < HI, got {text!r}")
    return name, (lo, hi)


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _vocab_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> size of the smallest embedding table its values index."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    sizes: dict[str, int] = {}
    for vi in _graph_inputs(model):
        frontier, seen = [vi.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in inits:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    dims = inits[node.input[0]].dims
                    size = int(dims[axis]) if dims else 0
                    if size:
                        sizes[vi.name] = min(sizes.get(vi.name, size), size)
                elif node.op_type in _ID_PASSTHROUGH and node.input and node.input[0] == name:
                    frontier.extend(node.output)
    return sizes


def _shape(vi: onnx.ValueInfoProto, spec: InputSpec) -> tuple[int, ...]:
    if vi.name in spec.shapes:
        return spec.shapes[vi.name]
    dims = []
    for axis, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        else:
            dims.append(1 if axis == 0 else DEFAULT_DIM)
    return tuple(dims)


def synthesize(model: onnx.ModelProto, spec: InputSpec, sample: int = 0) -> dict[str, np.ndarray]:
    """One seeded feed for every graph input of `model`."""
    rng = np.random.default_rng(spec.seed + sample)
    names = {vi.name for vi in _graph_inputs(model)}
    for option, given in (("--shape", spec.shapes), ("--input-range", spec.ranges)):
        unknown = sorted(set(given) - names)
        if unknown:
            raise InputError(f"{option}: the model has no input named {', '.join(map(repr, unknown))} (inputs: {', '.join(sorted(names))})")
    vocab = _vocab_sizes(model)
    feeds: dict[str, np.ndarray] = {}
    for vi in _graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input {vi.name!r} is not a tensor; give --inputs FILE")
        elem = vi.type.tensor_type.elem_type
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        shape = _shape(vi, spec)
        if vi.name in spec.ranges:
            lo, hi = spec.ranges[vi.name]
        elif elem in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
            lo, hi = -1.0, 1.0
        elif elem == TensorProto.BOOL:
            lo, hi = 0, 2
        elif vi.name in vocab:
            lo, hi = 0, vocab[vi.name]
        elif "mask" in vi.name.lower():
            lo, hi = 0, 2
        elif not shape:
            raise InputError(f"input {vi.name!r} is an integer scalar; give --input-range {vi.name}:LO,HI or --inputs FILE")
        else:
            lo, hi = 0, 2
        if np.issubdtype(dtype, np.floating) or elem == TensorProto.BFLOAT16:
            feeds[vi.name] = rng.uniform(lo, hi, shape).astype(np.float32).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[vi.name] = rng.integers(int(lo), max(int(hi), int(lo) + 1), shape).astype(dtype)
    return feeds


def load_inputs(path: str | Path, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Feeds from an .npz (name -> array) or a directory of ONNX `input_N.pb` tensors."""
    p = Path(path)
    names = [vi.name for vi in _graph_inputs(model)]
    if p.is_dir():
        files = sorted(p.glob("input_*.pb"), key=lambda f: int(re.sub(r"\D", "", f.stem) or 0))
        if not files:
            raise InputError(f"{p}: no input_N.pb files")
        feeds = {}
        for k, f in enumerate(files):
            tensor = TensorProto()
            try:
                tensor.ParseFromString(f.read_bytes())
            except Exception:  # noqa: BLE001 - protobuf raises several types
                raise InputError(f"{f}: not an ONNX TensorProto") from None
            name = tensor.name or (names[k] if k < len(names) else f"input_{k}")
            feeds[name] = numpy_helper.to_array(tensor)
    elif p.is_file():
        try:
            with np.load(p, allow_pickle=False) as data:
                feeds = {k: data[k] for k in data.files}
        except (OSError, ValueError) as e:
            raise InputError(f"{p}: not a readable .npz file ({e})") from None
    else:
        raise InputError(f"{p}: no such file or directory")
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"{p}: no value for input(s) {', '.join(missing)}")
    return {n: feeds[n] for n in names}


def save_inputs(path: str | Path, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Write the feeds used; with several samples, keys are `NAME` for the first and
    `NAME#k` for sample k."""
    arrays = {}
    for k, feeds in enumerate(samples):
        for name, value in feeds.items():
            arrays[name if k == 0 else f"{name}#{k}"] = value
    try:
        np.savez(path, **arrays)
    except OSError as e:
        raise InputError(f"{path}: cannot write inputs ({e.strerror})") from None

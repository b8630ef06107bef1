"""Inputs for a verification run: the user's files, or seeded synthesis from the model.

Synthesis rules (docs/verification.md, "Inputs"):
- symbolic dimensions come from `--shape NAME:1x128`; otherwise from the model and a size a user
  sends (`sizes.plan_sizes`: one size per axis name, metadata_props, the model's stride, batch 1,
  128 tokens, a 224 image side, a second of audio), with a second size for half the sets
  (`synthesized_sets`). A `dim_value` below 0 (Paddle writes -1) is symbolic,
  as onnxruntime reads it; a `dim_value` of 0 is a fixed, empty axis (onnxruntime runs such an
  input only on empty tensors), so nothing else fits it;
- no synthesized tensor may exceed `MAX_SYNTHESIZED_BYTES` (2 GiB, in the input's own type), checked
  for every input before any is allocated: a typo in `--shape` or a model declaring a huge fixed
  shape is an input error, not a MemoryError;
- float inputs are uniform in [-1, 1], or in the `--input-range NAME:LO,HI`;
- integer inputs that index an embedding table (a Gather whose data is an initializer, reached
  through Cast/Reshape/Unsqueeze/...) get token ids below the table size; those that index
  another tensor of fixed shape (Gather, GatherElements, ScatterElements, GatherND, ScatterND
  indices, through value-passing ops, at the planned shapes: `sizes.index_extents`) get values
  below its extent; a [batch, sequence] input whose name says "mask" is a tokenizer's padding
  mask (ones, the first quarter zeros in every other row, alternating from set to set), other
  inputs whose name says "mask" get {0, 1}; an integer scalar the graph
  compares with a constant (`Equal(sr, 16000)`) gets that constant, one named `sr` or
  `sample_rate` 16000; other
  integer scalars must come from --input-range or a file (with verification by default: written
  unverified, exit 4); other integer inputs get values in [0, 2);
- `--input-range NAME:LO,LO` (LO = HI) gives the constant LO;
- bool inputs are random {False, True}.

Range bounds must be finite, within float32's range and, for an integer input, within its type's.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import math
import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlx_onnx_amp.errors import AmpError, InputError, ModelRunError, first_line
from rlx_onnx_amp.files import OutputSet
from rlx_onnx_amp.precision import FLOAT_TYPES
from rlx_onnx_amp.types import DEFAULT_DIM, concrete_input_shape
from rlx_onnx_amp.verification.samples import Preprocess, is_samples, read_samples
from rlx_onnx_amp.verification.sizes import SizePlan, index_extents, plan_sizes

__all__ = [
    "DEFAULT_DIM",
    "MAX_SYNTHESIZED_BYTES",
    "GuessedAxesError",
    "InputSpec",
    "UnsynthesizableInput",
    "check_feeds",
    "load_inputs",
    "parse_range",
    "parse_shape",
    "sample_filler",
    "save_inputs",
    "synthesize",
    "synthesized_inputs_error",
]

DEFAULT_SEED = 0

#: The largest synthesized input tensor, in bytes of its own element type. Synthesis briefly holds
#: about three times this (numpy draws float64, then casts), and onnxruntime more to run it; far
#: beyond any real input (a 4K RGB f32 image is 100 MB), so past it the shape is a mistake.
MAX_SYNTHESIZED_BYTES = 2**31

_F32_MAX = float(np.finfo(np.float32).max)

#: An integer scalar input that holds a sample rate, and the rate it gets when the graph says none.
_SAMPLE_RATE = re.compile(r"^(sr|sample_?rate|sampling_?rate)$", re.I)
DEFAULT_SAMPLE_RATE = 16000

# Ops that pass integer ids through unchanged in value, on the way to a Gather.
_ID_PASSTHROUGH = frozenset(
    {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Slice", "Transpose"}
)


Shape = tuple[int, ...]


@dataclass
class InputSpec:
    """What the user said about inputs."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    seed: int = DEFAULT_SEED
    samples: int = 1
    #: How image, audio and text samples given as --inputs are made into inputs (`samples`).
    preprocess: Preprocess = field(default_factory=Preprocess)
    #: The most token positions a synthesized prompt may take, and where the model's count is
    #: written (its folder's config.json, `samples.folder_positions`, less the generate task's
    #: steps): guessed sequences, their past and second size stay within it.
    positions: tuple[int, str] | None = None


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME:1x128` -> (NAME, (1, 128)); each size at most 2**63-1, as ONNX stores it (the cost
    model's shape inference takes it, a larger one would fail in protobuf)."""
    name, sep, dims = text.rpartition(":")
    # 19 digits at most: int() of a longer string can raise (Python's 4300-digit limit)
    if not sep or not name or not re.fullmatch(r"\d{1,19}(x\d{1,19})*", dims):
        raise InputError(f"--shape: expected NAME:1x128, got {text!r}")
    shape = tuple(int(d) for d in dims.split("x"))
    if max(shape) >= 2**63:
        raise InputError(f"--shape: size {max(shape)} of {name!r} is over 2**63-1, got {text!r}")
    return name, shape


def parse_range(text: str) -> tuple[str, tuple[float, float]]:
    """`NAME:LO,HI` -> (NAME, (LO, HI))."""
    name, sep, bounds = text.rpartition(":")
    try:
        lo, hi = (float(v) for v in bounds.split(","))
    except ValueError:
        raise InputError(f"--input-range: expected NAME:LO,HI, got {text!r}") from None
    if not sep or not name or not lo <= hi:
        raise InputError(f"--input-range: expected NAME:LO,HI with LO <= HI (LO = HI: a constant), got {text!r}")
    # Float inputs are drawn as float32: a bound past its range would synthesize inf.
    if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > _F32_MAX:
        raise InputError(
            f"--input-range: bounds must be finite numbers within float32's range (about ±3.4e38), got {text!r}"
        )
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
                if (
                    node.op_type == "Gather"
                    and len(node.input) > 1
                    and node.input[1] == name
                    and node.input[0] in inits
                ):
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    dims = inits[node.input[0]].dims
                    # An axis past the table's rank is the model's error, which onnxruntime reports.
                    size = int(dims[axis]) if dims and -len(dims) <= axis < len(dims) else 0
                    if size:
                        sizes[vi.name] = min(sizes.get(vi.name, size), size)
                elif node.op_type in _ID_PASSTHROUGH and node.input and node.input[0] == name:
                    frontier.extend(node.output)
    return sizes


#: Comparisons whose other side, a constant, is the natural value of an integer scalar input.
_COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})


def _compared_constants(model: onnx.ModelProto) -> dict[str, float]:
    """Integer scalar graph input -> the constant the graph compares it with (`Equal(sr, 16000)`
    feeding an If: the value a trained voice model expects)."""
    graph = model.graph
    constants: dict[str, float] = {}
    for t in graph.initializer:
        if not t.dims and t.data_location != TensorProto.EXTERNAL:  # the model is loaded without its data
            constants[t.name] = float(onnx.numpy_helper.to_array(t))
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and not value.dims:
                constants[node.output[0]] = float(onnx.numpy_helper.to_array(value))
    found: dict[str, float] = {}
    inputs = {vi.name for vi in _graph_inputs(model)}
    for node in graph.node:
        if node.op_type in _COMPARISONS and len(node.input) == 2:
            a, b = node.input
            if a in inputs and b in constants:
                found.setdefault(a, constants[b])
            elif b in inputs and a in constants:
                found.setdefault(b, constants[a])
    return found


class UnsynthesizableInput(InputError):
    """No value can be synthesized for an input (an integer scalar the graph gives no hint of):
    with verification by default, the model is written unverified (exit 4) and this says how to
    give the value; with --verify it is an input error (exit 2)."""


class GuessedAxesError(InputError):
    """The reference cannot run on synthesized inputs whose symbolic axes were guessed: an
    input error (exit 2), since the user can give the sizes; where they are written down
    (an onnxruntime-genai folder's config) the caller may say so."""


def synthesized_inputs_error(
    error: ModelRunError, model: onnx.ModelProto, spec: InputSpec, tried: Sequence[SizePlan] = ()
) -> AmpError:
    """What to say when the reference cannot run on synthesized inputs: where some of their
    axes were guessed, the guess is the likely cause (an audio Conv wider than the chunk), and
    the user can give real sizes, so it is an input error (exit 2) that says how, with the sizes
    `tried`; otherwise the model itself cannot run, and the error stands."""
    plans = list(tried) or [plan_sizes(model, spec.shapes, positions=spec.positions)]
    guessed = plans[0].guessed
    if not guessed:
        return error
    shown = plans[0].shown({n: plans[0].shapes[n] for n in guessed})
    sides = ["x".join(map(str, p.shapes[guessed[0]])) for p in plans]
    others = sorted(set(sides[1:]) - {sides[0]}, key=sides.index)
    also = f"; {guessed[0]} also tried at {', '.join(others)}" if others else ""
    return GuessedAxesError(
        f"{error} on synthesized inputs whose symbolic axes were guessed ({shown}{also}); "
        "give their sizes with --shape NAME:1x128, or real inputs with --inputs FILE"
    )


def branch_conditions(model: onnx.ModelProto) -> list[str]:
    """Bool scalar graph inputs that an If reads as its condition (optimum's `use_cache_branch`):
    the synthesized input sets take both values, so both branches are verified."""
    inputs = {vi.name for vi in _graph_inputs(model) if vi.type.tensor_type.elem_type == TensorProto.BOOL}
    found = [n.input[0] for n in model.graph.node if n.op_type == "If" and n.input and n.input[0] in inputs]
    return sorted(set(found))


def synthesized_sets(
    model: onnx.ModelProto, spec: InputSpec, plan: SizePlan | None = None
) -> list[dict[str, np.ndarray]]:
    """The seeded input sets of a verification: `spec.samples` of them at the plan's sizes
    (`sizes.plan_sizes`), and as many again at its second size where it has one (`plan.grown`),
    with other values. At least two sets per size when an If's condition is a graph input, which
    then is False in the first set and True in the second (and alternates), so each branch runs.
    A decoder step with a key/value cache gets coherent inputs (`_cache_step`)."""
    plan = plan or plan_sizes(model, spec.shapes, positions=spec.positions)
    conditions = [c for c in branch_conditions(model) if c not in spec.ranges]
    count = max(spec.samples, 2 if conditions else 1)
    sizes = [plan.shapes] + ([{**plan.shapes, **plan.grown}] if plan.grown else [])
    sets = []
    for size, shapes in enumerate(sizes):
        # A merged decoder's cached branch (the condition True) takes one new token after its past,
        # as a generator feeds it: several new tokens at once are no step its cache can go on from.
        steps = {False: _cache_step(model, spec, shapes)}
        if conditions:
            steps[True] = _cache_step(model, spec, _one_new_token(model, spec, shapes))
        for k in range(count):
            cached = bool(conditions) and k % 2 == 1
            step_shapes, values = steps[cached]
            feeds = synthesize(model, spec, size * count + k, step_shapes)
            for name in conditions:
                feeds[name] = np.full(feeds[name].shape, cached, dtype=np.bool_)
            for name, value in values.items():
                feeds[name] = np.broadcast_to(value, feeds[name].shape).astype(feeds[name].dtype)
            sets.append(feeds)
    return sets


def _one_new_token(model: onnx.ModelProto, spec: InputSpec, shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    """`shapes` with `input_ids` one position long, for a decoder step that reads a past cache,
    where the ids' length is symbolic and the user gave no shape for it."""
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    ids = inputs.get("input_ids")
    if ids is None or "input_ids" in spec.shapes or not any(PAST_INPUT.match(n) for n in inputs):
        return dict(shapes)
    shape = shapes["input_ids"]
    dims = ids.type.tensor_type.shape.dim
    if len(shape) != 2 or (dims[1].HasField("dim_value") and dims[1].dim_value > 0):
        return dict(shapes)
    return {**shapes, "input_ids": (shape[0], 1)}


#: A key/value cache input of a generator's decoder step (optimum, onnxruntime-genai), and the
#: layer/part it holds (`generate.find_generator` pairs it with `present.<part>`).
PAST_INPUT = re.compile(r"^(?:past_key_values|past)\.(?P<part>.*)$")


def _cache_step(
    model: onnx.ModelProto, spec: InputSpec, planned: Mapping[str, Shape]
) -> tuple[dict[str, Shape], dict[str, np.ndarray]]:
    """For a decoder step that reads a past cache (`past_key_values.N.key`, P positions) and new
    `input_ids` (S positions): an `attention_mask` over all P + S positions, all ones (no padding),
    and `position_ids` P .. P + S - 1, where their axes are symbolic and the user gave neither
    (random ones point past the cache, which the model's Gather or attention refuses). The
    `planned` shapes with those, and the values to set."""
    inputs = {vi.name: vi for vi in _graph_inputs(model)}
    past = sorted(n for n in inputs if PAST_INPUT.match(n))
    if not past or "input_ids" not in inputs or "attention_mask" not in inputs:
        return dict(planned), {}
    past_shape, ids_shape = planned[past[0]], planned["input_ids"]
    if len(past_shape) < 3 or len(ids_shape) != 2:
        return dict(planned), {}
    batch, steps, cached = ids_shape[0], ids_shape[1], past_shape[-2]
    shapes: dict[str, tuple[int, ...]] = {}
    values: dict[str, np.ndarray] = {}
    for name, shape, value in (
        ("attention_mask", (batch, cached + steps), np.ones(1, np.int64)),
        ("position_ids", (batch, steps), np.arange(cached, cached + steps, dtype=np.int64)),
    ):
        vi = inputs.get(name)
        if vi is None or name in spec.shapes or not _symbolic(vi):
            continue
        shapes[name] = shape
        if name not in spec.ranges:
            values[name] = value
    return {**planned, **shapes}, values


def _symbolic(vi: onnx.ValueInfoProto) -> bool:
    """Whether some axis of an input is symbolic (a `dim_param`, or a negative `dim_value`)."""
    dims = vi.type.tensor_type.shape.dim
    return any(d.HasField("dim_param") or (d.HasField("dim_value") and d.dim_value < 0) or not (
        d.HasField("dim_param") or d.HasField("dim_value")) for d in dims)


def synthesize(
    model: onnx.ModelProto, spec: InputSpec, sample: int = 0, shapes: Mapping[str, Shape] | None = None
) -> dict[str, np.ndarray]:
    """One seeded feed for every graph input of `model`, at `shapes` (`sizes.plan_sizes`'
    by default)."""
    rng = np.random.default_rng(spec.seed + sample)
    names = {vi.name for vi in _graph_inputs(model)}
    for option, given in (("--shape", spec.shapes), ("--input-range", spec.ranges)):
        unknown = sorted(set(given) - names)
        if unknown:
            raise InputError(
                f"{option}: the model has no input named {', '.join(map(repr, unknown))} "
                f"(inputs: {', '.join(sorted(names))})"
            )
    shapes = shapes if shapes is not None else plan_sizes(model, spec.shapes, positions=spec.positions).shapes
    vocab = _vocab_sizes(model)
    bounds = index_extents(model, shapes)
    compared = _compared_constants(model)
    feeds: dict[str, np.ndarray] = {}
    for vi, dtype, shape in _checked_shapes(model, shapes):
        elem = vi.type.tensor_type.elem_type
        lo, hi = _value_range(vi, shape, spec, vocab, bounds, compared)
        if vi.name in spec.ranges:
            _check_range_fits(vi.name, dtype, lo, hi)
        if np.issubdtype(dtype, np.floating) or elem in FLOAT_TYPES:
            feeds[vi.name] = rng.uniform(lo, hi, shape).astype(np.float32).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[vi.name] = rng.integers(int(lo), max(int(hi), int(lo) + 1), shape).astype(dtype)
        if _padding_mask(vi.name, dtype, shape, spec):  # drawn first all the same: the others keep their values
            feeds[vi.name] = _padded_ones(shape, sample).astype(dtype)
    return feeds


def _padding_mask(name: str, dtype: np.dtype, shape: Shape, spec: InputSpec) -> bool:
    """An integer or bool [batch, sequence] input named as a mask (`attention_mask`), with no
    --input-range: a tokenizer's padding mask, not noise (a float mask may be additive)."""
    return dtype.kind in "iub" and "mask" in name.lower() and len(shape) == 2 and name not in spec.ranges


def _padded_ones(shape: Shape, sample: int) -> np.ndarray:
    """A tokenizer's mask over a padded batch: ones, and in every other row (alternating from set
    to set) the first quarter of the positions padding (zeros), as a batch of prompts is padded
    for generation (the last position a token); never a row without one."""
    mask = np.ones(shape, dtype=np.int64)
    mask[(np.arange(shape[0]) + sample) % 2 == 1, : shape[1] // 4] = 0
    return mask


def _value_range(
    vi: onnx.ValueInfoProto,
    shape: Shape,
    spec: InputSpec,
    vocab: Mapping[str, int],
    bounds: Mapping[str, int],
    compared: Mapping[str, float],
) -> tuple[float, float]:
    """The range an input's values are drawn from (the module docstring's rules, in order)."""
    elem = vi.type.tensor_type.elem_type
    if vi.name in spec.ranges:
        return spec.ranges[vi.name]
    if elem in FLOAT_TYPES or elem == TensorProto.DOUBLE:
        return -1.0, 1.0
    if elem == TensorProto.BOOL:
        return 0, 2
    if vi.name in vocab:
        return 0, vocab[vi.name]
    if vi.name in bounds:  # indices into another tensor: within its extent
        return 0, bounds[vi.name]
    if "mask" in vi.name.lower():
        return 0, 2
    if not shape and vi.name in compared:  # the value the graph compares it with
        return compared[vi.name], compared[vi.name]
    if not shape and _SAMPLE_RATE.search(vi.name):  # a voice model's rate: what most take
        return DEFAULT_SAMPLE_RATE, DEFAULT_SAMPLE_RATE
    if not shape:
        raise UnsynthesizableInput(
            f"input {vi.name!r} is an integer scalar the graph compares with no constant; "
            f"give --input-range {vi.name}:LO,HI or --inputs FILE"
        )
    return 0, 2


def _check_range_fits(name: str, dtype: np.dtype, lo: float, hi: float) -> None:
    """InputError for an --input-range whose values the input's type cannot hold: integers past
    its bounds (numpy would raise, or wrap them), floats past a float16's (they would be inf)."""
    if dtype.kind in "iu":
        # what synthesize draws: integers from int(lo) to max(int(hi), int(lo) + 1) - 1, as int64
        first, last = int(lo), max(int(hi), int(lo) + 1) - 1
        info, int64 = np.iinfo(dtype), np.iinfo(np.int64)
        if not max(info.min, int64.min) <= first <= last <= min(info.max, int64.max):
            raise InputError(
                f"--input-range {name}:{lo:g},{hi:g}: integers from {first} to {last} do not fit "
                f"the input's {dtype} ({info.min} to {info.max})"
            )
    elif dtype.kind == "f" or dtype.name.startswith(("bfloat", "float")):
        with np.errstate(over="ignore"):
            if not np.isfinite(np.array([lo, hi], np.float32).astype(dtype).astype(np.float32)).all():
                raise InputError(f"--input-range {name}:{lo:g},{hi:g}: the bounds overflow the input's {dtype}")


def _checked_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Shape]
) -> list[tuple[onnx.ValueInfoProto, np.dtype, Shape]]:
    """(input, dtype, shape) of every graph input to synthesize; InputError, before anything is
    allocated, for one that is no tensor or whose tensor would exceed `MAX_SYNTHESIZED_BYTES`."""
    planned = []
    for vi in _graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input {vi.name!r} is not a tensor; give --inputs FILE")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        shape = tuple(shapes[vi.name]) if vi.name in shapes else concrete_input_shape(vi)
        size = math.prod(shape) * dtype.itemsize  # Python ints: no overflow however large the shape
        if size > MAX_SYNTHESIZED_BYTES:
            raise InputError(
                f"input {vi.name!r}: a synthesized {'x'.join(map(str, shape))} {dtype} tensor would take "
                f"{_bytes(size)}, over the {_bytes(MAX_SYNTHESIZED_BYTES)} limit for synthesized inputs; "
                f"give smaller sizes with --shape {vi.name}:..., or real inputs with --inputs FILE"
            )
        planned.append((vi, dtype, shape))
    return planned


def _bytes(n: int) -> str:
    """2**31 -> '2 GiB'; 4e13 -> '36.4 TiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} EiB"


def load_inputs(
    path: str | Path, model: onnx.ModelProto, spec: InputSpec | None = None, folder: Path | None = None
) -> list[dict[str, np.ndarray]]:
    """Input sets from a file: an .npz of name -> array (with `NAME#k` keys for set k, as
    `--save-inputs` writes them), Polygraphy's JSON input file (a list of name -> array), a
    directory of .npz files (one set each, in name order: AutoCast's multi-batch calibration
    data), a directory of ONNX `input_N.pb` tensors (one set), or samples: images, wav audio,
    text and directories of them, made into inputs by the model's `folder`'s preprocessing
    (`samples.read_samples`; `SampleSets`, which say so), the inputs they leave synthesized."""
    p = Path(path)
    names = [vi.name for vi in _graph_inputs(model)]
    spec = spec or InputSpec()
    npz_dir = p.is_dir() and any(f.suffix.lower() == ".npz" and f.is_file() for f in p.iterdir())
    if not npz_dir and is_samples(p):
        return read_samples(p, model, spec.preprocess, folder, sample_filler(model, spec))
    if p.is_dir():
        npz = sorted((f for f in p.iterdir() if f.suffix.lower() == ".npz" and f.is_file()), key=_natural)
        sets = [_load_npz(f) for f in npz] if npz else [_load_pb_dir(p, names)]
    elif p.is_file() and p.suffix.lower() == ".json":
        sets = _load_polygraphy_json(p)
    elif p.is_file():
        sets = _split_samples(_load_npz(p))
    else:
        raise InputError(f"{p}: no such file or directory")
    for k, feeds in enumerate(sets):
        missing = [n for n in names if n not in feeds]
        if missing:
            where = f" (input set {k})" if len(sets) > 1 else ""
            raise InputError(f"{p}: no value for input(s) {', '.join(missing)}{where}")
    return [{n: feeds[n] for n in names} for feeds in sets]


def sample_filler(
    model: onnx.ModelProto, spec: InputSpec
) -> Callable[[Mapping[str, Shape], int], dict[str, np.ndarray]]:
    """What fills the inputs a sample leaves: set k synthesized as without samples (seed + k),
    at the sizes the sample's own inputs fix (one size per axis name), with no second size."""

    def fill(given: Mapping[str, Shape], k: int) -> dict[str, np.ndarray]:
        sized = dataclasses.replace(spec, shapes={**spec.shapes, **given}, seed=spec.seed + k, samples=1)
        return synthesized_sets(model, sized, plan_sizes(model, sized.shapes, grow=False, positions=spec.positions))[0]

    return fill


def _natural(f: Path) -> tuple[object, ...]:
    """batch_2.npz before batch_10.npz: digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", f.name))


def _load_pb_dir(p: Path, names: Sequence[str]) -> dict[str, np.ndarray]:
    files = sorted(p.glob("input_*.pb"), key=lambda f: int(re.sub(r"\D", "", f.stem) or 0))
    if not files:
        raise InputError(f"{p}: no .npz files and no input_N.pb files")
    feeds = {}
    for k, f in enumerate(files):
        tensor = TensorProto()
        try:
            tensor.ParseFromString(f.read_bytes())
            if tensor.data_location == TensorProto.EXTERNAL:
                raise ValueError("external data")
            array = numpy_helper.to_array(tensor)
        except Exception:
            raise InputError(f"{f}: not an ONNX TensorProto with inline data") from None
        feeds[tensor.name or (names[k] if k < len(names) else f"input_{k}")] = array
    return feeds


def _load_npz(p: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(p, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a single array, not an archive of named arrays")
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{p}: not a readable .npz file ({first_line(e)})") from None
    except AttributeError:  # np.load gave a plain array (an .npy file)
        raise InputError(f"{p}: not a readable .npz file (a single array, not an archive of named arrays)") from None


def _split_samples(arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """`NAME` is set 0, `NAME#k` set k (what save_inputs writes)."""
    sets: dict[int, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        name, sep, index = key.rpartition("#")
        if sep and index.isdigit() and name:
            sets.setdefault(int(index), {})[name] = value
        else:
            sets.setdefault(0, {})[key] = value
    return [sets[k] for k in sorted(sets)]


def _load_polygraphy_json(p: Path) -> list[dict[str, np.ndarray]]:
    """Polygraphy's `--save-inputs` JSON: a list of input sets, each name -> array, an array
    written as {"array": base64 of np.save's bytes, ...}."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{p}: not a readable JSON input file ({first_line(e)})") from None
    sets = data if isinstance(data, list) else [data]
    out = []
    for k, feeds in enumerate(sets):
        if not isinstance(feeds, dict):
            raise InputError(f"{p}: input set {k} is not a table of name -> array")
        out.append({name: _decode_array(p, name, value) for name, value in feeds.items()})
    return out


def _decode_array(p: Path, name: str, value: object) -> np.ndarray:
    if isinstance(value, dict) and isinstance(value.get("array"), str):
        text = value["array"]
        try:
            raw = base64.b64decode(text.encode(), validate=True)
        except (ValueError, binascii.Error):
            raw = text.encode("latin-1")  # Polygraphy's older files
        try:
            array = np.load(io.BytesIO(raw), allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise InputError(f"{p}: input {name!r} is not a readable array ({first_line(e)})") from None
        if isinstance(array, np.ndarray):
            return array
    if isinstance(value, list | int | float):
        return np.asarray(value)
    raise InputError(f"{p}: input {name!r} is not an encoded array")


def save_inputs(outputs: OutputSet, path: str | Path, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Stage the feeds used as an .npz at exactly `path`; with several samples, keys are `NAME`
    for the first and `NAME#k` for sample k."""
    arrays = {}
    for k, feeds in enumerate(samples):
        for name, value in feeds.items():
            arrays[name if k == 0 else f"{name}#{k}"] = value
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # a file object: numpy adds no ".npz" to the user's path
    outputs.write_bytes(path, buffer.getvalue())


def check_feeds(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]], source: str) -> None:
    """InputError, before anything runs, for a feed whose kind (float, integer, bool), rank or
    fixed dimensions do not fit the model's input; `source` says where the feeds came from."""
    for vi in _graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        try:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError):
            continue
        for feeds in samples:
            value = feeds.get(vi.name)
            if value is None:
                continue
            if not isinstance(value, np.ndarray) or _kind(value.dtype) not in ("bool", "integer", "float", "c"):
                raise InputError(
                    f"{source}: input {vi.name!r}: expected a numeric array, got {type(value).__name__} "
                    f"{getattr(value, 'dtype', '')}"
                )
            if _kind(value.dtype) != _kind(want):
                raise InputError(f"{source}: input {vi.name!r}: got {value.dtype} values, the model takes {want}")
            if tt.HasField("shape"):
                dims = tt.shape.dim
                if value.ndim != len(dims):
                    raise InputError(
                        f"{source}: input {vi.name!r}: got rank {value.ndim} {list(value.shape)}, "
                        f"the model takes rank {len(dims)}"
                    )
                for axis, (d, n) in enumerate(zip(dims, value.shape)):
                    # A negative dim_value (Paddle's -1) is symbolic, as onnxruntime reads it.
                    if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != n:
                        # 0 is no "unknown" to onnxruntime: it runs such an input only on empty tensors
                        empty = "; onnxruntime takes no other size there (a symbolic axis is a dim_param)"
                        raise InputError(
                            f"{source}: input {vi.name!r}: dimension {axis} is {n}, "
                            f"the model fixes it to {d.dim_value} "
                            f"(got shape {list(value.shape)}){empty if d.dim_value == 0 else ''}"
                        )


def _kind(dtype: np.dtype) -> str:
    if dtype == np.bool_:
        return "bool"
    if dtype.kind in "iu":
        return "integer"
    return "float" if dtype.kind == "f" or dtype.name.startswith(("bfloat", "float")) else dtype.kind

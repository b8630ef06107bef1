"""The sizes of synthesized inputs: one size per symbolic axis, from what the model says, else a
size a user sends (docs/verification.md, "Inputs").

An axis the model leaves symbolic (a `dim_param`, a negative or missing `dim_value`) is sized by
the first of these that says a size:
1. by `--shape` (or the folder's configs, which `batch.ConvertJob.in_folder` adds to the spec);
2. as every other axis in its group: the axes of one `dim_param` name across all inputs, and an
   RNN's initial state with its X (`_RNN_PARTNERS`); a group with a fixed axis takes its size;
3. by the model's `metadata_props` (ultralytics: `imgsz`, `batch`, `channels`);
4. by its kind (`AxisKind`: from the axis name, else from the input's rank, type and the axis'
   place), whose first size in `SIZES` is the default: batch 1, 3 channels, an image side 224,
   a sequence of 128 tokens (fewer where the folder's config.json holds fewer positions:
   a sequence, its past and their second size stay within `max_position_embeddings` or its
   kin, `samples.folder_positions`), one second of 16 kHz audio, 64 for any other axis. An image side is
   rounded up to a multiple of the model's stride (metadata `stride`, else the product of the
   Conv/Pool strides along its deepest path), which a detector's Concat of upsampled maps needs.

When the reference cannot run at those, attempt k takes each kind's k-th size (`SIZES`, the last
one once they run out): `attempts` says how many there are. The second size (`SizePlan.grown`)
doubles every axis sized by its kind's default, batch and channels excepted: the verdict then
holds at two lengths, so drift that grows with length or recurrence shows.

Integer inputs that index another tensor's axis (Gather, GatherElements, ScatterElements,
GatherND, ScatterND, reached through ops that pass values through: Cast, Slice, Split, a Gather of
the index tensor itself, ...) are drawn below that axis' size: `index_extents`.
"""

from __future__ import annotations

import ast
import enum
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from rlx_onnx_amp.precision import FLOAT_TYPES
from rlx_onnx_amp.tensors import tensor_nbytes
from rlx_onnx_amp.types import structure_copy

__all__ = ["SIZES", "AxisKind", "SizePlan", "index_extents", "model_stride", "plan_sizes", "weight_bytes"]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]


class AxisKind(enum.Enum):
    BATCH = "batch"
    CHANNELS = "channels"
    IMAGE = "image side"
    SEQUENCE = "sequence"
    AUDIO = "audio"
    OTHER = "axis"


#: Each kind's sizes: the default first, then those tried when the reference cannot run.
SIZES: Mapping[AxisKind, tuple[int, ...]] = {
    AxisKind.BATCH: (1,),
    AxisKind.CHANNELS: (3, 1, 4),
    AxisKind.IMAGE: (224, 320, 640, 128, 64, 32),
    # A sequence or unnamed axis that takes none of the smaller sizes may need more: a VAD's
    # audio chunk (silero: 192 to 640 samples) where nothing says it is audio.
    AxisKind.SEQUENCE: (128, 64, 32, 16, 8, 256, 512),
    AxisKind.AUDIO: (16000, 512, 1024, 8000),
    AxisKind.OTHER: (64, 32, 16, 8, 256, 512),
}
#: The kinds whose default size the second input sets double.
GROWN_KINDS = frozenset({AxisKind.IMAGE, AxisKind.SEQUENCE, AxisKind.AUDIO, AxisKind.OTHER})
#: Past this many bytes of weights a model's inputs take one size: each run at the second
#: (twice the tokens) costs more than the no-verify conversion itself (the 3.4 GB Llama-shaped
#: model: docs/benchmarks.md, "Inputs at sizes a user sends").
SECOND_SIZE_WEIGHT_LIMIT = 2**30

#: An axis name -> its kind; the first pattern that matches wins.
_NAMED_KINDS: tuple[tuple[re.Pattern[str], AxisKind], ...] = (
    (re.compile(r"node|edge|point|vert|box|object", re.I), AxisKind.OTHER),  # a graph's, not a batch
    (re.compile(r"batch|^bs$|^b$", re.I), AxisKind.BATCH),
    (re.compile(r"channel", re.I), AxisKind.CHANNELS),
    (re.compile(r"height|width|^h$|^w$|^im(a)?g", re.I), AxisKind.IMAGE),
    (re.compile(r"sample(?!_?rate)|audio|wav|chunk", re.I), AxisKind.AUDIO),
    (re.compile(r"seq|len|token|time|frame|step|past|total|position", re.I), AxisKind.SEQUENCE),
)
#: A rank-2 float input whose name says it holds a waveform.
_AUDIO_INPUT = re.compile(r"audio|wav|pcm|signal|speech|waveform|input_values|samples", re.I)
#: An integer input that gives a voice model its sample rate: its rank-2 float inputs are audio.
_RATE_INPUT = re.compile(r"^(?:sr|sample_?rate|sampling_?rate)$", re.I)
#: A recurrent state fed back by the caller (silero's `state` [2, batch, 128], `h`, `c`).
_STATE_INPUT = re.compile(r"state|hidden|^[hc]n?$|^[hc]0$", re.I)
_PAST_INPUT = re.compile(r"^(?:past_key_values|past)\.")

#: RNN op -> (state input index, its batch axis, X's batch axis) for layout 0; layout 1 swaps.
_RNN_STATES = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}

#: Ops whose outputs hold values of their input 0 (an index tensor on its way to a Gather).
_VALUE_PASSTHROUGH = frozenset(
    {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Slice", "Transpose",
     "Split", "Gather", "Tile", "Concat"}
)
#: Ops that read an input as indices into their data (input 0): op -> the index input.
_INDEXING = {"Gather": 1, "GatherElements": 1, "ScatterElements": 1, "ScatterND": 1, "GatherND": 1}
_SPATIAL = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool", "ConvInteger", "QLinearConv"})


@dataclass(frozen=True)
class SizePlan:
    """The shape each synthesized input takes, and why."""

    shapes: dict[str, Shape]
    #: Input -> where its sizes came from (`images`: "metadata imgsz").
    why: dict[str, str]
    #: The second size: the inputs whose shape it changes (empty: every set at `shapes`).
    grown: dict[str, Shape] = field(default_factory=dict)
    #: Inputs with an axis sized by its kind's default (a guess the user can correct).
    guessed: tuple[str, ...] = ()
    #: How many attempts there are (`plan_sizes`' `attempt`): more than 1 only with a guess.
    attempts: int = 1

    def shown(self, shapes: Mapping[str, Shape] | None = None) -> str:
        """`x 1x128, mask 1x128`: the inputs at `shapes` (the plan's own by default)."""
        return ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'}" for n, s in (shapes or self.shapes).items())


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]


def _fixed(d: onnx.TensorShapeProto.Dimension) -> bool:
    return d.HasField("dim_value") and d.dim_value > 0


def metadata(model: onnx.ModelProto) -> dict[str, object]:
    """The model's metadata_props, each value read as a Python literal where it is one
    (ultralytics writes `imgsz` as "[320, 320]" and `stride` as "32")."""
    found: dict[str, object] = {}
    for prop in model.metadata_props:
        try:
            found[prop.key] = ast.literal_eval(prop.value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            found[prop.key] = prop.value
    return found


def model_stride(model: onnx.ModelProto) -> int:
    """The model's stride: metadata `stride`, else the product of the Conv/Pool strides along
    its deepest path (an estimate; at most 64)."""
    meta = metadata(model).get("stride")
    if isinstance(meta, int) and meta > 0:
        return meta
    if isinstance(meta, list | tuple) and meta and all(isinstance(s, int) and s > 0 for s in meta):
        return max(meta)
    stride: dict[str, int] = {}
    for node in model.graph.node:  # nodes are in topological order (the checker requires it)
        into = max((stride.get(n, 1) for n in node.input if n), default=1)
        if node.op_type in _SPATIAL:
            steps = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
            into *= max(steps, default=1)
        for out in node.output:
            stride[out] = into
    return min(max(stride.values(), default=1), 64)


def _round_up(size: int, stride: int) -> int:
    return max(stride, -(-size // stride) * stride)


class _Groups:
    """Union-find over axes: an input's (name, axis) slots and `dim_param` names."""

    def __init__(self) -> None:
        self.parent: dict[object, object] = {}

    def find(self, key: object) -> object:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: object, b: object) -> None:
        self.parent[self.find(a)] = self.find(b)


def _positional(vi: onnx.ValueInfoProto, axis: int) -> AxisKind:
    """An unnamed axis' kind from its input's rank, type and its place."""
    dims = vi.type.tensor_type.shape.dim
    rank, is_float = len(dims), vi.type.tensor_type.elem_type in FLOAT_TYPES | {TensorProto.DOUBLE}
    if axis == 0:
        return AxisKind.BATCH
    if _PAST_INPUT.match(vi.name):
        return AxisKind.SEQUENCE if axis == rank - 2 else AxisKind.OTHER
    if is_float and rank == 4:
        last_is_channels = _fixed(dims[3]) and dims[3].dim_value in (1, 3, 4) and not _fixed(dims[1])
        if last_is_channels:  # NHWC
            return AxisKind.IMAGE if axis in (1, 2) else AxisKind.CHANNELS
        return AxisKind.CHANNELS if axis == 1 else AxisKind.IMAGE
    if is_float and rank == 2 and _AUDIO_INPUT.search(vi.name):
        return AxisKind.AUDIO
    if not is_float or (rank == 3 and axis == 1):
        return AxisKind.SEQUENCE
    return AxisKind.OTHER


def _named(dim_param: str) -> AxisKind | None:
    return next((kind for pattern, kind in _NAMED_KINDS if pattern.search(dim_param)), None)


def _rnn_partners(
    model: onnx.ModelProto, groups: _Groups, fixed: dict[object, tuple[int, str]], kinds: dict[object, AxisKind]
) -> None:
    """An RNN's initial states share X's batch axis; their direction and hidden axes are the
    op's `direction` and `hidden_size`; X's axes are its sequence and its batch (`kinds`)."""
    inputs = {vi.name for vi in _inputs(model)}
    for node in model.graph.node:
        states = _RNN_STATES.get(node.op_type)
        if states is None or not node.input or node.input[0] not in inputs:
            continue
        attrs = {a.name: a for a in node.attribute}
        layout = attrs["layout"].i if "layout" in attrs else 0
        directions = 2 if "direction" in attrs and attrs["direction"].s == b"bidirectional" else 1
        hidden = attrs["hidden_size"].i if "hidden_size" in attrs else 0
        x_batch, state_batch, state_dirs = (0, 0, 1) if layout else (1, 1, 0)
        kinds[(node.input[0], x_batch)] = AxisKind.BATCH
        kinds[(node.input[0], 1 - x_batch)] = AxisKind.SEQUENCE
        for index in states:
            if len(node.input) <= index or node.input[index] not in inputs:
                continue
            state = node.input[index]
            groups.union((state, state_batch), (node.input[0], x_batch))
            fixed[groups.find((state, state_dirs))] = (directions, f"the {node.op_type}'s direction")
            if hidden:
                fixed[groups.find((state, 2))] = (hidden, f"the {node.op_type}'s hidden_size")


def _voice_inputs(inputs: list[onnx.ValueInfoProto], groups: _Groups, kinds: dict[object, AxisKind]) -> None:
    """A voice model's inputs, whatever `If` or `Loop` branch reads them: where an integer input
    gives the sample rate (`sr`), every rank-2 float input is a batch of waveforms (audio, not a
    token sequence); a rank-3 float state whose first and last axes are fixed and whose middle
    one is not (silero's `state` [2, batch, 128]) shares the waveforms' batch."""
    def is_float(vi: onnx.ValueInfoProto) -> bool:
        return vi.type.tensor_type.elem_type in FLOAT_TYPES | {TensorProto.DOUBLE}

    waves = [vi for vi in inputs if is_float(vi) and len(vi.type.tensor_type.shape.dim) == 2]
    if any(_RATE_INPUT.search(vi.name) and not is_float(vi) for vi in inputs):
        for vi in waves:
            kinds[(vi.name, 0)], kinds[(vi.name, 1)] = AxisKind.BATCH, AxisKind.AUDIO
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        if is_float(vi) and len(dims) == 3 and _STATE_INPUT.search(vi.name) and _fixed(dims[0]) and _fixed(
                dims[2]) and not _fixed(dims[1]):
            kinds[(vi.name, 1)] = AxisKind.BATCH
            if waves:
                groups.union((vi.name, 1), (waves[0].name, 0))


def _metadata_sizes(model: onnx.ModelProto) -> dict[AxisKind, tuple[list[int], str]]:
    """Kind -> the sizes ultralytics' metadata gives it (image sides in order) and the key."""
    meta = metadata(model)
    sizes: dict[AxisKind, tuple[list[int], str]] = {}
    imgsz = meta.get("imgsz")
    if isinstance(imgsz, int):
        imgsz = [imgsz, imgsz]
    if isinstance(imgsz, list | tuple) and imgsz and all(isinstance(s, int) and s > 0 for s in imgsz):
        sizes[AxisKind.IMAGE] = (list(imgsz) * (2 if len(imgsz) == 1 else 1), "metadata imgsz")
    for key, kind in (("batch", AxisKind.BATCH), ("channels", AxisKind.CHANNELS)):
        value = meta.get(key)
        if isinstance(value, int) and value > 0:
            sizes[kind] = ([value], f"metadata {key}")
    return sizes


def weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the main graph's initializers (external data counted by their shapes)."""
    return sum(tensor_nbytes(t) for t in model.graph.initializer)


def plan_sizes(
    model: onnx.ModelProto,
    given: Mapping[str, Shape],
    attempt: int = 0,
    grow: bool = True,
    positions: tuple[int, str] | None = None,
) -> SizePlan:
    """The shape of every tensor input (module docstring); `given` are the shapes the user or
    the folder names (`InputSpec.shapes`), `attempt` which of `SIZES` the guessed axes take,
    `grow` whether a second size is drawn (not past `SECOND_SIZE_WEIGHT_LIMIT` of weights),
    `positions` the most token positions the model holds and where that is written
    (`InputSpec.positions`): a guessed sequence, with its past and at its second size, stays within."""
    weights = weight_bytes(model)
    heavy = grow and weights > SECOND_SIZE_WEIGHT_LIMIT
    planner = _Planner(model, given, attempt, grow and not heavy, positions)
    shapes: dict[str, Shape] = {}
    grown: dict[str, Shape] = {}
    why: dict[str, str] = {}
    guessed: list[str] = []
    for vi in planner.inputs:
        if vi.name in given:
            shapes[vi.name], why[vi.name] = tuple(given[vi.name]), "given"
            continue
        shape, second, reasons = [], [], []
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            size, size2, reason = (d.dim_value, d.dim_value, "") if _fixed(d) else planner.axis(vi, axis)
            shape.append(size)
            second.append(size2)
            if reason and reason not in reasons:
                reasons.append(reason)
            if reason.startswith("default") and vi.name not in guessed:
                guessed.append(vi.name)
        shapes[vi.name] = tuple(shape)
        why[vi.name] = ", ".join(reasons) if reasons else "fixed by the model"
        if second != shape:
            grown[vi.name] = tuple(second)
    attempts = max((len(SIZES[k]) for k in planner.kinds_used), default=1)
    if heavy:  # say why the verdict holds at one size only
        for name in guessed:
            why[name] += f", one size ({weights / 2**30:.1f} GiB of weights)"
    return SizePlan(shapes, why, grown, tuple(guessed), attempts)


class _Planner:
    """The axis groups of a model's inputs and what sizes them (`plan_sizes`)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        given: Mapping[str, Shape],
        attempt: int,
        grow: bool,
        positions: tuple[int, str] | None,
    ) -> None:
        self.inputs = _inputs(model)
        self.attempt, self.grow = attempt, grow
        self.sequences = SIZES[AxisKind.SEQUENCE]
        self.positions_why = ""
        if positions is not None:  # new tokens and past ones, each doubled at the second size
            limit, where = positions
            share = limit // ((2 if grow else 1) * (2 if any(_PAST_INPUT.match(vi.name) for vi in self.inputs) else 1))
            # the most that fits first, then the smaller sizes as they are
            self.sequences = tuple(sorted({min(s, max(share, 1)) for s in self.sequences}, reverse=True))
            self.positions_why = f" (within {where})"
        self.groups = _Groups()
        self.fixed: dict[object, tuple[int, str]] = {}  # group root -> size and why
        for vi in self.inputs:
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_param") and d.dim_param and not _fixed(d):
                    self.groups.union((vi.name, axis), ("dim", d.dim_param))
        self.kinds: dict[object, AxisKind] = {}  # an axis -> the kind an op that reads it says
        _rnn_partners(model, self.groups, self.fixed, self.kinds)
        _voice_inputs(self.inputs, self.groups, self.kinds)
        for vi in self.inputs:  # what is fixed or given decides its group, before any default
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                root = self.groups.find((vi.name, axis))
                if vi.name in given and axis < len(given[vi.name]):
                    self.fixed.setdefault(root, (given[vi.name][axis], f"as given for {vi.name}"))
                elif _fixed(d):
                    self.fixed.setdefault(root, (d.dim_value, f"as {vi.name}'s axis {axis}"))
        self.from_meta = _metadata_sizes(model)
        self.stride = model_stride(model)
        self.kinds_used: set[AxisKind] = set()
        self._sides: dict[object, int] = {}  # image group -> which side of metadata imgsz it takes

    def axis(self, vi: onnx.ValueInfoProto, axis: int) -> tuple[int, int, str]:
        """A symbolic axis' size, its size in the second sets, and why."""
        root = self.groups.find((vi.name, axis))
        if root in self.fixed:
            size, reason = self.fixed[root]
            return size, size, reason
        kind = _group_kind(self.groups, root, self.inputs, self.kinds)
        if kind in self.from_meta:
            sides, reason = self.from_meta[kind]
            which = self._sides.setdefault(root, min(len(self._sides), len(sides) - 1))
            return sides[which], sides[which], reason
        options = self.sequences if kind is AxisKind.SEQUENCE else SIZES[kind]
        size = options[min(self.attempt, len(options) - 1)]
        if kind is AxisKind.IMAGE and size >= self.stride:  # a smaller side is tried as it is: the
            size = _round_up(size, self.stride)  # stride is an estimate (a text recognizer's 32 high)
        self.kinds_used.add(kind)
        grown = size * 2 if self.grow and kind in GROWN_KINDS else size
        rounded = kind is AxisKind.IMAGE and self.stride > 1 and size % self.stride == 0
        stride = f", a multiple of stride {self.stride}" if rounded else ""
        within = self.positions_why if kind is AxisKind.SEQUENCE else ""
        return size, grown, f"default {kind.value} {size}{stride}{within}"


def _group_kind(
    groups: _Groups, root: object, vis: list[onnx.ValueInfoProto], kinds: Mapping[object, AxisKind]
) -> AxisKind:
    """A group's kind: what an op that reads one of its axes says, else the first of its names
    that says one, else its first axis' place."""
    members = [k for k in groups.parent if groups.find(k) == root]
    told = next((kinds[k] for k in members if k in kinds), None)
    if told is not None:
        return told
    for key in members:
        if isinstance(key, tuple) and key[0] == "dim":
            kind = _named(str(key[1]))
            if kind is not None:
                return kind
    by_name = {vi.name: vi for vi in vis}
    for vi in vis:  # in input order
        for key in members:
            if isinstance(key, tuple) and key[0] == vi.name:
                return _positional(by_name[vi.name], int(key[1]))
    return AxisKind.OTHER


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _reached(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> Iterator[tuple[onnx.NodeProto, str]]:
    """(indexing node, the value it reads as indices) for every indexing op the values of graph
    input `name` reach through ops that pass values through."""
    frontier, seen = [name], set()
    while frontier:
        value = frontier.pop()
        if value in seen:
            continue
        seen.add(value)
        for node in consumers.get(value, []):
            index = _INDEXING.get(node.op_type)
            if index is not None and len(node.input) > index and node.input[index] == value:
                yield node, value
            elif node.op_type in _VALUE_PASSTHROUGH and (node.input[0] == value or node.op_type == "Concat"):
                frontier.extend(node.output)


def index_extents(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> dict[str, int]:
    """Integer graph input -> the size of the axis its values index in another tensor (a Gather's
    data along its axis, a graph input at its planned shape, an initializer, or a value whose
    shape inference gives at those shapes), the smallest where several readers say."""
    graph = model.graph
    known: dict[str, Shape] = {t.name: tuple(t.dims) for t in graph.initializer}
    known.update(shapes)
    consumers = _consumers(model)
    inferred: dict[str, Shape] | None = None
    bounds: dict[str, int] = {}
    for vi in _inputs(model):
        if vi.type.tensor_type.elem_type in FLOAT_TYPES | {TensorProto.DOUBLE, TensorProto.BOOL}:
            continue
        for node, _ in _reached(vi.name, consumers):
            data = known.get(node.input[0])
            if data is None:
                if inferred is None:
                    inferred = _inferred_shapes(model, shapes)
                data = inferred.get(node.input[0])
            if not data:
                continue
            if node.op_type in ("GatherND", "ScatterND"):
                extent = min(data)  # the smallest axis an index tuple may address: safe for every one
            else:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                extent = data[axis] if -len(data) <= axis < len(data) else 0
            if extent > 0:
                bounds[vi.name] = min(bounds.get(vi.name, extent), extent)
    return bounds


def _inferred_shapes(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    """Every value's shape that onnx shape inference gives with the inputs at `shapes`."""
    stub = structure_copy(model)
    for vi in stub.graph.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.shape.Clear()
            for size in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = size
    try:
        done = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # an estimate: without it the indices keep their default range
        logger.info("shape inference for index ranges failed: %s", e)
        return {}
    found: dict[str, Shape] = {}
    for vi in (*done.graph.value_info, *done.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and dims and all(_fixed(d) for d in dims):
            found[vi.name] = tuple(d.dim_value for d in dims)
    return found

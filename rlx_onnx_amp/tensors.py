"""Reading, narrowing and writing weight tensors, inline or as external data.

Weights are read one tensor at a time (`WeightSource`) and written one tensor at a time
(`WeightSink`), so a model stored with external data converts in memory bounded by its largest
tensor. Both the in-memory and the streaming path narrow through `narrow()`, so they give the
same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
from array import array
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.files import external_data_path
from rlx_onnx_amp.precision import Precision

__all__ = [
    "SMALL_TENSOR_ELEMENTS",
    "ClampStats",
    "ExternalSink",
    "NarrowBatch",
    "WeightSink",
    "WeightSource",
    "check_inline_data",
    "external_locations",
    "narrow",
    "tensor_nbytes",
]

logger = logging.getLogger(__name__)

# Align tensors in the external data file like onnx's own writer does for large tensors.
_ALIGN = 4096

# Streaming narrows large external tensors this many elements at a time, so memory stays
# bounded by a chunk rather than by the largest tensor.
CHUNK_ELEMENTS = 1 << 22


@dataclass
class ClampStats:
    """What narrowing did to one tensor's values."""

    clamped: int = 0  # finite values past the target's range, set to its largest finite value
    worst: float = 0.0  # the value of largest magnitude that was clamped
    flushed: int = 0  # non-zero values that became zero

    def to_json(self) -> dict[str, float | int]:
        return {"clamped": self.clamped, "worst": self.worst, "flushed_to_zero": self.flushed}

    def add(self, other: ClampStats) -> None:
        self.clamped += other.clamped
        self.flushed += other.flushed
        if abs(other.worst) > abs(self.worst):
            self.worst = other.worst


def narrow(array: np.ndarray, precision: Precision) -> tuple[np.ndarray, ClampStats]:
    """Convert a float array to `precision`, clamping finite values to its range."""
    info = precision.info
    if array.dtype == info.np_dtype:
        return array, ClampStats()
    src = array.astype(np.float32, copy=False)
    if not src.size:
        return src.astype(info.np_dtype), ClampStats()
    out, (stats,) = _narrow_segments(src, precision, None)
    return out, stats


def _narrow_segments(
    src: np.ndarray, precision: Precision, starts: np.ndarray | None
) -> tuple[np.ndarray, list[ClampStats]]:
    """Narrow a non-empty float32 array; one ClampStats per segment of its flattened values
    (`starts`: the first index of each non-empty segment; None: one segment)."""
    info = precision.info
    flat = src.reshape(-1)
    bounds = [0, flat.size] if starts is None else [*starts.tolist(), flat.size]
    stats = [ClampStats() for _ in bounds[:-1]]
    # Fast path: two reductions prove the common case (all finite, all in range); NaN or Inf
    # make them non-finite and take the exact path.
    lo, hi = float(src.min()), float(src.max())
    if not (np.isfinite(lo) and np.isfinite(hi) and -info.max_finite <= lo and hi <= info.max_finite):
        finite_over = np.abs(src) > info.max_finite
        finite_over &= np.isfinite(src)
        if finite_over.any():
            over_flat = finite_over.reshape(-1)
            counts = (
                [int(np.count_nonzero(over_flat))] if starts is None else np.add.reduceat(over_flat, starts).tolist()
            )
            for k, count in enumerate(counts):
                if count:
                    segment = flat[bounds[k] : bounds[k + 1]]
                    over = segment[over_flat[bounds[k] : bounds[k + 1]]]
                    stats[k].clamped, stats[k].worst = int(count), float(over[np.argmax(np.abs(over))])
            src = np.where(finite_over, np.copysign(np.float32(info.max_finite), src), src)  # Inf stays Inf
            flat = src.reshape(-1)
    out = src.astype(info.np_dtype)
    # Values that became zero: narrowing keeps zeros and NaN, so the non-zero counts differ
    # exactly by the flushed values. (Counted on the bit patterns without the sign bit: numpy
    # counts float16 slowly, and -0 is a zero either way.)
    out_nonzero = out.reshape(-1).view(info.bits) & info.magnitude_mask
    if starts is None:
        stats[0].flushed = int(np.count_nonzero(flat)) - int(np.count_nonzero(out_nonzero))
    else:
        flushed = (flat != 0) & (out_nonzero == 0)
        if flushed.any():
            for k, count in enumerate(np.add.reduceat(flushed, starts).tolist()):
                stats[k].flushed = int(count)
    return out, stats


#: Float tensors up to this many elements are narrowed together by `NarrowBatch`. At 16 bits
#: they stay under `ExternalSink`'s inline threshold, so the batch stores what `store` would.
SMALL_TENSOR_ELEMENTS = 256


class NarrowBatch:
    """Small inline float32 tensors narrowed to one precision in a single numpy pass.

    A large graph holds tens of thousands of tiny weights (biases, scales, Constant scalars);
    narrowing each alone costs a dozen numpy calls, most of the conversion time for such a
    graph. `add` takes a tensor (or the float values a new tensor should hold) and `run`
    writes every one in place, inline, with the same bytes and per-tensor statistics that
    `narrow` gives.
    """

    def __init__(self, precision: Precision) -> None:
        self.precision = precision
        self._parts: list[bytes] = []
        self._tensors: list[TensorProto] = []
        self._keys: list[str] = []

    def __len__(self) -> int:
        return len(self._tensors)

    def add(self, tensor: TensorProto, key: str) -> bool:
        """Queue an inline float32 tensor of at most SMALL_TENSOR_ELEMENTS values; False (and
        nothing queued) for any other tensor."""
        if tensor.data_type != TensorProto.FLOAT or tensor.data_location == TensorProto.EXTERNAL:
            return False
        raw = tensor.raw_data
        count = 1
        for d in tensor.dims:
            count *= d
        if not 0 < count <= SMALL_TENSOR_ELEMENTS or len(raw) != 4 * count:
            return False
        self._parts.append(raw)
        self._tensors.append(tensor)
        self._keys.append(key)
        return True

    def add_values(self, tensor: TensorProto, values: list[float], key: str) -> None:
        """Queue a tensor (its dims already set) that is to hold `values`."""
        if not values:
            raise ValueError("NarrowBatch.add_values: no values")
        self._parts.append(array("f", values).tobytes())  # the float32 bytes numpy gives, in half its time
        self._tensors.append(tensor)
        self._keys.append(key)

    def run(self) -> list[tuple[str, ClampStats]]:
        """Narrow and store every queued tensor; (key, stats) for each, in the order added."""
        if not self._tensors:
            return []
        lengths = [len(p) // 4 for p in self._parts]
        src = np.frombuffer(b"".join(self._parts), dtype=np.float32)
        starts = np.cumsum([0, *lengths[:-1]], dtype=np.int64)
        out, stats = _narrow_segments(src, self.precision, starts)
        data, itemsize, elem_type = out.tobytes(), out.dtype.itemsize, self.precision.elem_type
        position = 0
        for tensor, length in zip(self._tensors, lengths):
            tensor.data_type = elem_type
            tensor.raw_data = data[position : position + length * itemsize]
            position += length * itemsize
        result = list(zip(self._keys, stats))
        self._parts, self._tensors, self._keys = [], [], []
        return result


def _external_info(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL


def external_locations(tensors: Iterable[TensorProto]) -> set[str]:
    """The external data files (`location` entries) the tensors read."""
    return {e.value for t in tensors if is_external(t) for e in t.external_data if e.key == "location"}


class WeightSource:
    """Reads tensors of one model, inline or from external data files in its directory.

    External data is read only from inside the model's directory (`files.external_data_path`),
    and each tensor's offset and length are checked against its file before any read.
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None, model_name: str = "model") -> None:
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.model_name = model_name
        self._paths: dict[str, tuple[Path, int]] = {}  # location -> (checked path, size)

    def _file(self, tensor: TensorProto) -> tuple[Path, int]:
        location = _external_info(tensor).get("location", "")
        if location not in self._paths:
            if self.base_dir is None:
                raise InputError(
                    f"{self.model_name}: tensor {tensor.name!r} has external data but no base directory was given"
                )
            path = external_data_path(self.base_dir, location, tensor.name, self.model_name)
            self._paths[location] = (path, path.stat().st_size)
        return self._paths[location]

    def external_path(self, tensor: TensorProto) -> Path:
        return self._file(tensor)[0]

    def span(self, tensor: TensorProto) -> tuple[Path, int, int]:
        """(file, offset, length) of an external tensor, checked against the file."""
        path, size = self._file(tensor)
        info = _external_info(tensor)
        where = f"{self.model_name}: tensor {tensor.name!r}: external data {info.get('location')!r}"
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise InputError(f"{where}: offset and length must be integers") from None
        expected = stored_nbytes(tensor)
        if length is None:
            if expected is None:
                raise InputError(f"{where}: no length given for a tensor whose size its type does not tell")
            length = expected
        if offset < 0 or length < 0:
            raise InputError(f"{where}: negative offset or length")
        if expected is not None and length != expected:
            raise InputError(
                f"{where}: length {length} does not match the tensor's dims {list(tensor.dims)} ({expected} bytes)"
            )
        if offset + length > size:
            raise InputError(
                f"{where} is too short for the tensor (needs bytes {offset}..{offset + length}, file has {size})"
            )
        return path, offset, length

    def check(self, tensor: TensorProto) -> None:
        """Raise InputError when a tensor's external data is outside the model's directory,
        missing or short."""
        if is_external(tensor):
            self.span(tensor)

    def read(self, tensor: TensorProto) -> np.ndarray:
        if not is_external(tensor):
            if tensor.data_type == TensorProto.FLOAT and tensor.raw_data:  # the common case, 4x faster than to_array
                return np.frombuffer(tensor.raw_data, dtype=np.float32).reshape(tuple(tensor.dims))
            return numpy_helper.to_array(tensor)
        path, offset, _ = self.span(tensor)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims, dtype=np.int64))
        array = np.fromfile(path, dtype=dtype, count=count, offset=offset)
        return array.reshape(tuple(tensor.dims))

    def max_finite_abs(self, tensor: TensorProto) -> float:
        """The largest finite magnitude of a float32 tensor (0.0: none), read in chunks of
        `CHUNK_ELEMENTS`: a scan of every weight costs one chunk of memory, not one tensor."""
        if not is_external(tensor):
            return _max_finite_abs(self.read(tensor).reshape(-1))
        path, offset, _ = self.span(tensor)
        count = int(np.prod(tensor.dims, dtype=np.int64))
        best = 0.0
        for first in range(0, count, CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, count - first)
            chunk = np.fromfile(path, dtype=np.float32, count=n, offset=offset + first * 4)
            best = max(best, _max_finite_abs(chunk))
        return best

    def read_bytes(self, tensor: TensorProto) -> bytes:
        path, offset, length = self.span(tensor)
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)


def _max_finite_abs(values: np.ndarray) -> float:
    """The largest finite magnitude of float32 values: one pass of abs and max per chunk, and
    only a chunk holding Inf or NaN (whose max is not finite) is filtered."""
    result = 0.0
    flat = values.reshape(-1)
    for first in range(0, flat.size, CHUNK_ELEMENTS):
        chunk = np.abs(flat[first : first + CHUNK_ELEMENTS], dtype=np.float32)
        top = float(chunk.max(initial=0.0))
        if not math.isfinite(top):
            finite = chunk[np.isfinite(chunk)]
            top = float(finite.max(initial=0.0))
        result = max(result, top)
    return result


#: Bits per element of the packed sub-byte types.
_PACKED_BITS: dict[int, int] = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _name in ("INT2", "UINT2"):
    if hasattr(TensorProto, _name):
        _PACKED_BITS[getattr(TensorProto, _name)] = 2
#: Types whose storage size is not simply elements x item size (or that numpy lacks).
_UNSIZED = {TensorProto.STRING, TensorProto.UNDEFINED} | {
    getattr(TensorProto, n) for n in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, n)
}


def stored_nbytes(tensor: TensorProto) -> int | None:
    """Bytes a tensor's raw data must have for its type and dims; None when the type does not tell."""
    return _stored_nbytes(tensor.data_type, math.prod(tensor.dims))


def _stored_nbytes(data_type: int, count: int) -> int | None:
    """Bytes the raw data of `count` elements of `data_type` must have; None when the type does not tell."""
    if data_type in _UNSIZED:
        return None
    bits = _PACKED_BITS.get(data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    itemsize = _itemsize(data_type)
    return None if itemsize is None else count * itemsize


# The repeated field that holds an inline tensor's values when it has no raw data, and how many
# values per element it holds there (complex: 2; packed 4-bit: 1/2, as (count + 1) // 2).
_TYPED_FIELD: dict[int, tuple[str, int]] = {
    TensorProto.FLOAT: ("float_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1),
    TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    TensorProto.STRING: ("string_data", 1),
    **{
        t: ("int32_data", 1)
        for t in (
            TensorProto.INT32,
            TensorProto.INT16,
            TensorProto.INT8,
            TensorProto.UINT8,
            TensorProto.UINT16,
            TensorProto.BOOL,
            TensorProto.FLOAT16,
            TensorProto.BFLOAT16,
            TensorProto.FLOAT8E4M3FN,
            TensorProto.FLOAT8E4M3FNUZ,
            TensorProto.FLOAT8E5M2,
            TensorProto.FLOAT8E5M2FNUZ,
        )
    },
}


def check_inline_data(tensor: TensorProto, model_name: str) -> int:
    """Raise InputError when an inline tensor's data does not match its type and dims; else
    return its `tensor_nbytes`, from the fields the check read (the load checks every tensor
    of a large graph: each field is read once)."""
    dims = tensor.dims
    if dims and min(dims) < 0:
        raise InputError(f"{model_name}: tensor {tensor.name!r} has negative dims {list(dims)}")
    data_type, count = tensor.data_type, math.prod(dims)
    itemsize = _itemsize(data_type)
    raw = len(tensor.raw_data)  # each read of the field copies the bytes: once
    nbytes = count * itemsize if itemsize is not None else raw
    if raw or tensor.HasField("raw_data"):
        expected = _stored_nbytes(data_type, count)
        if expected is not None and raw != expected:
            raise InputError(
                f"{model_name}: tensor {tensor.name!r} holds {raw} bytes of data, its type and dims "
                f"{list(tensor.dims)} need {expected}"
            )
        return nbytes
    if data_type not in _TYPED_FIELD:  # packed and exotic types: onnx's own checks decide
        return nbytes
    field_name, per = _TYPED_FIELD[data_type]
    have = len(getattr(tensor, field_name))
    if have != count * per:
        raise InputError(
            f"{model_name}: tensor {tensor.name!r} holds {have} values, its dims {list(tensor.dims)} need {count * per}"
        )
    return nbytes


def tensor_nbytes(tensor: TensorProto) -> int:
    """Bytes of a tensor's data from its type and dims (its raw bytes for a type numpy lacks)."""
    itemsize = _itemsize(tensor.data_type)
    return math.prod(tensor.dims) * itemsize if itemsize is not None else len(tensor.raw_data)


@functools.cache
def _itemsize(data_type: int) -> int | None:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, TypeError):
        return None


def set_array(tensor: TensorProto, array: np.ndarray, elem_type: int) -> None:
    """Replace a tensor's data (inline) with `array`, stored as `elem_type`."""
    tensor.ClearField("float_data")
    tensor.ClearField("int32_data")
    tensor.ClearField("external_data")
    tensor.data_location = TensorProto.DEFAULT
    tensor.data_type = elem_type
    tensor.raw_data = np.ascontiguousarray(array).tobytes()


class WeightSink:
    """Where narrowed (or copied) tensors go. The default keeps them inline."""

    def store(self, tensor: TensorProto, array: np.ndarray, elem_type: int) -> None:
        set_array(tensor, array, elem_type)

    def stores_inline(self, nbytes: int) -> bool:
        """Whether `store` keeps a tensor of `nbytes` inline."""
        return True

    def store_narrowed(self, tensor: TensorProto, source: WeightSource, precision: Precision) -> tuple[ClampStats, int]:
        """Narrow `tensor` (read from `source`) to `precision` and store it; (stats, bytes written)."""
        low, stats = narrow(source.read(tensor), precision)
        self.store(tensor, low, precision.elem_type)
        return stats, low.nbytes

    def copy_through(self, tensor: TensorProto, source: WeightSource) -> None:
        """An unconverted tensor: bring its data into the output unchanged."""
        if is_external(tensor):
            data = source.read_bytes(tensor)
            tensor.ClearField("external_data")
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = data

    def close(self) -> None:
        """Flush what the sink holds."""


class ExternalSink(WeightSink):
    """Appends tensors of at least `threshold` bytes to one external data file.

    It hashes what it writes (`digest`), so the file can be named after its content, and
    remembers the tensors it pointed at the file, so `relocate` can rename it in them. A
    `scratch` sink (a verification's rounded weights, read once and removed) neither hashes nor
    syncs what it writes.
    """

    def __init__(self, path: Path, location: str, threshold: int = 1024, scratch: bool = False) -> None:
        self.path = path
        self.location = location
        self.threshold = threshold
        self.scratch = scratch
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._offset = 0
        self._hash = hashlib.sha256()
        self._pointed: list[TensorProto] = []

    @property
    def bytes_written(self) -> int:
        return self._offset

    def digest(self) -> str:
        if self.scratch:
            raise RuntimeError("a scratch sink does not hash what it writes")
        return self._hash.hexdigest()

    def relocate(self, location: str) -> None:
        """Point every tensor stored so far at `location` instead."""
        self.location = location
        for tensor in self._pointed:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location

    def _write(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        if not self.scratch:
            self._hash.update(data)

    def _align(self) -> None:
        pad = (-self._offset) % _ALIGN
        if pad:
            self._write(b"\0" * pad)
            self._offset += pad

    def _point(self, tensor: TensorProto, offset: int, length: int) -> None:
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.ClearField("external_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self._pointed.append(tensor)

    def _append(self, tensor: TensorProto, data: bytes | memoryview) -> None:
        self._align()
        self._write(data)
        self._point(tensor, self._offset, len(data))
        self._offset += len(data)

    def _copy_external(self, tensor: TensorProto, source: WeightSource) -> None:
        """Copy an external tensor's bytes in chunks (integer tensors pass through unchanged)."""
        path, offset, length = source.span(tensor)
        self._align()
        start = self._offset
        with open(path, "rb") as f:
            f.seek(offset)
            remaining = length
            while remaining:
                block = f.read(min(remaining, CHUNK_ELEMENTS * 4))
                if not block:
                    raise InputError(f"{source.model_name}: external data for tensor {tensor.name!r} ends early")
                self._write(block)
                remaining -= len(block)
        self._offset += length
        self._point(tensor, start, length)

    def stores_inline(self, nbytes: int) -> bool:
        return nbytes < self.threshold

    def store(self, tensor: TensorProto, array: np.ndarray, elem_type: int) -> None:
        data = np.ascontiguousarray(array)
        if data.nbytes < self.threshold:
            set_array(tensor, data, elem_type)
            return
        tensor.data_type = elem_type
        self._append(tensor, data.reshape(-1).view(np.uint8).data)

    def store_narrowed(self, tensor: TensorProto, source: WeightSource, precision: Precision) -> tuple[ClampStats, int]:
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if not is_external(tensor) or count <= CHUNK_ELEMENTS:
            return super().store_narrowed(tensor, source, precision)
        path, base, _ = source.span(tensor)
        src_dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        stats, written = ClampStats(), 0
        self._align()
        start = self._offset

        def read(first: int) -> np.ndarray:
            n = min(CHUNK_ELEMENTS, count - first)
            return np.fromfile(path, dtype=src_dtype, count=n, offset=base + first * src_dtype.itemsize)

        # Read the next chunk while this one is narrowed and written (numpy and file I/O
        # release the GIL), so reading overlaps the work on two cores.
        with ThreadPoolExecutor(max_workers=1) as reader:
            pending = reader.submit(read, 0)
            for first in range(0, count, CHUNK_ELEMENTS):
                chunk = pending.result()
                if first + CHUNK_ELEMENTS < count:
                    pending = reader.submit(read, first + CHUNK_ELEMENTS)
                low, chunk_stats = narrow(chunk, precision)
                stats.add(chunk_stats)
                self._write(low.view(np.uint8).data)
                written += low.nbytes
        self._offset += written
        self._point(tensor, start, written)
        tensor.data_type = precision.elem_type
        return stats, written

    def copy_through(self, tensor: TensorProto, source: WeightSource) -> None:
        if is_external(tensor):
            self._copy_external(tensor, source)
        elif tensor_nbytes(tensor) >= self.threshold and tensor.HasField("raw_data"):
            self._append(tensor, tensor.raw_data)

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            if not self.scratch:
                os.fsync(self._file.fileno())
            self._file.close()

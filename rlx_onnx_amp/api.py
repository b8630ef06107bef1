"""The public entry points: `convert` (in memory) and `convert_file` (streaming, atomic)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto

from rlx_onnx_amp.convert import ConvertOptions, convert_model
from rlx_onnx_amp.errors import AmpError, InputError
from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.policy import Policy, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.report import ConversionReport
from rlx_onnx_amp.taxonomy import OpKind
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource, external_locations, is_external, tensor_nbytes
from rlx_onnx_amp.types import all_tensors

__all__ = ["convert", "convert_file", "load_model", "make_options", "resolve_policy"]

logger = logging.getLogger(__name__)

# Past this many weight bytes the output goes to external data even if the input had none:
# a protobuf cannot hold 2 GiB.
EXTERNAL_THRESHOLD = 1_800_000_000


def resolve_policy(policy: Policy | str, kind_map: Mapping[OpKind, Precision] | None = None) -> Policy:
    return policy if isinstance(policy, Policy) else policy_from_name(policy, kind_map)


def make_options(
    keep_io_types: bool = True,
    keep_f32_ops: Iterable[str] = (),
    keep_f32_nodes: Iterable[str] = (),
    keep_f32_paths: Mapping[str, str] | None = None,
    target: Target | str = Target.CUDA,
) -> ConvertOptions:
    import re

    patterns = tuple(keep_f32_nodes)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise InputError(f"--keep-f32-node: invalid regular expression {p!r} ({e})") from None
    try:
        target = Target(target)
    except ValueError:
        raise InputError(f"unknown target {target!r} (known: {', '.join(t.value for t in Target)})") from None
    return ConvertOptions(keep_io_types, frozenset(keep_f32_ops), patterns, dict(keep_f32_paths or {}), target)


def load_model(path: str | os.PathLike[str], *, load_external_data: bool = False) -> ModelProto:
    """Load a model file; every failure is an InputError naming the file."""
    return _load(path, load_external_data)[0]


def _load(path: str | os.PathLike[str], load_external_data: bool) -> tuple[ModelProto, list[onnx.TensorProto]]:
    """The model and its tensors (initializers and tensor attributes, bodies included)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise InputError(f"{p}: not a valid ONNX model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cannot parse'})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise InputError(f"{p}: not a valid ONNX model (no graph)")
    if not model.opset_import:
        raise InputError(f"{p}: not a valid ONNX model (no opset_import)")
    source = WeightSource(p.parent, str(p))
    sink = WeightSink()
    tensors = list(all_tensors(model))
    for tensor in tensors:
        if is_external(tensor):
            source.check(tensor)
            if load_external_data:
                sink.copy_through(tensor, source)
    return model, tensors


def convert(
    model: ModelProto | str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: Mapping[OpKind, Precision] | None = None,
    report: ConversionReport | None = None,
    options: ConvertOptions | None = None,
    **option_kwargs: object,
) -> ModelProto:
    """Return a mixed-precision copy of `model` (a ModelProto or a path); the input is never
    modified. Pass `report=ConversionReport()` to receive the conversion report.

    `option_kwargs` are those of `make_options`: keep_io_types, keep_f32_ops, keep_f32_nodes,
    keep_f32_paths, target (the execution provider the model is meant for: "cuda" or "cpu").
    """
    resolved = resolve_policy(policy, kind_map)
    opts = options or make_options(**option_kwargs)  # type: ignore[arg-type]
    if isinstance(model, ModelProto):
        work = ModelProto()
        work.CopyFrom(model)
        name = model.graph.name or "model"
        source = WeightSource(None, name)
    else:
        work = load_model(model, load_external_data=True)
        name = str(model)
        source = WeightSource(Path(model).parent, name)
    report = report if report is not None else ConversionReport()
    report.model = report.model or name
    convert_model(work, resolved, opts, source=source, sink=WeightSink(), report=report)
    return work


def convert_file(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: Mapping[OpKind, Precision] | None = None,
    options: ConvertOptions | None = None,
    data_name: str | None = None,
    check: bool = True,
    report: ConversionReport | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ConversionReport:
    """Convert a model file to `output_path`, streaming weights stored as external data.

    The output appears only when it is complete and passes the checker: it is written to
    temporary files beside `output_path` and renamed into place. `progress(done, total)` is
    called with weight bytes as tensors are written.
    """
    src, dst = Path(input_path), Path(output_path)
    resolved = resolve_policy(policy, kind_map)
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        raise InputError(f"{dst}: output is the input model; choose another path")
    model, tensors = _load(src, False)
    out_dir = dst.parent if str(dst.parent) else Path(".")
    if not out_dir.is_dir():
        raise InputError(f"{dst}: output directory {out_dir} does not exist")
    if not os.access(out_dir, os.W_OK):
        raise InputError(f"{dst}: output directory {out_dir} is not writable")
    if dst.is_dir():
        raise InputError(f"{dst}: output path is a directory")
    input_data_files = {(src.parent / loc).resolve() for loc in external_locations(tensors)}
    external = bool(input_data_files) or sum(tensor_nbytes(t) for t in tensors) > EXTERNAL_THRESHOLD
    data_file = data_name or (dst.name + ".data")
    if external and (dst.parent / data_file).resolve() in input_data_files:
        raise InputError(f"{dst}: output data file {data_file} would overwrite the input's external data")
    report = report if report is not None else ConversionReport()
    report.model, report.output = str(src), str(dst)
    tmp_files: list[Path] = []
    try:
        fd, tmp_model = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
        tmp_files.append(Path(tmp_model))
        sink: WeightSink
        if external:
            fd, tmp_data = tempfile.mkstemp(prefix=f".{data_file}.", suffix=".tmp", dir=out_dir)
            os.close(fd)
            tmp_files.append(Path(tmp_data))
            sink = ExternalSink(Path(tmp_data), data_file)
        else:
            sink = WeightSink()
        total, done = sum(tensor_nbytes(t) for t in model.graph.initializer), 0

        def step(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            if progress is not None:
                progress(done, total)

        try:
            convert_model(model, resolved, options or ConvertOptions(), source=WeightSource(src.parent, str(src)), sink=sink,
                          report=report, progress=step)
        finally:
            sink.close()
        try:
            # Tensors already point at the sink's data file: serialize directly (onnx.save
            # would walk every tensor again looking for external data to write).
            Path(tmp_model).write_bytes(model.SerializeToString())
        except (OSError, ValueError) as e:
            raise InputError(f"{dst}: cannot write output ({e})") from None
        # The checker parses the written file again: free this copy of the graph first, so
        # the two are never in memory together (a tensor reference keeps the whole model alive).
        del model, tensors
        if external:
            final_data = dst.parent / data_file
            os.replace(tmp_files[1], final_data)
            tmp_files.pop()
            if check:
                _check(tmp_model, src, dst, final_data)
        elif check:
            _check(tmp_model, src, dst, None)
        os.replace(tmp_model, dst)
        tmp_files.clear()
    except OSError as e:
        raise InputError(f"{dst}: cannot write output ({e.strerror or e})") from None
    finally:
        for f in tmp_files:
            f.unlink(missing_ok=True)
    logger.info("wrote %s", dst)
    return report


_CHECK_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)


def _check(tmp_model: str, src: Path, dst: Path, data_file: Path | None) -> None:
    try:
        onnx.checker.check_model(tmp_model, full_check=True)
    except _CHECK_ERRORS as e:
        if data_file is not None:
            data_file.unlink(missing_ok=True)
        try:
            onnx.checker.check_model(str(src), full_check=True)
        except _CHECK_ERRORS as input_error:
            first = str(input_error).strip().splitlines()[0]
            raise InputError(f"{src}: the input model fails onnx.checker ({first}); nothing written") from None
        # The input was valid, so this is our bug: say so, with the checker's words.
        raise AmpError(f"{dst}: the converted model fails onnx.checker; nothing written ({e})") from None

"""The public entry points: `convert` (in memory) and `convert_file` (streaming, atomic)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import ModelProto

from rlx_onnx_amp.errors import AmpError, InputError, first_line
from rlx_onnx_amp.files import OutputSet, RunPaths, check_data_name, check_writable, content_data_name
from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.loading import load_checked, load_model
from rlx_onnx_amp.policy import Policy, kind_map_from, policy_from_name
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.proof import checker_failure, prove
from rlx_onnx_amp.ranges import ValueRange
from rlx_onnx_amp.reports.record import ByteCounts, Conversion
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model, rewrite_model
from rlx_onnx_amp.rewrite.convert import gc_paused
from rlx_onnx_amp.taxonomy import OpKind
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource, is_external

__all__ = [
    "StagedModel",
    "checker_failure",
    "convert",
    "convert_and_report",
    "convert_file",
    "load_model",
    "make_options",
    "options_from",
    "plan_model_reads",
    "resolve_policy",
    "screened_options",
    "stage_conversion",
    "write_demo",
]

logger = logging.getLogger(__name__)

# Past this many weight bytes the output goes to external data even if the input had none:
# a protobuf cannot hold 2 GiB.
EXTERNAL_THRESHOLD = 1_800_000_000
#: What one protobuf can hold, and so what onnx's checker and onnxruntime read from memory.
PROTOBUF_LIMIT = 2**31


#: A custom policy's kind map: kinds and precisions as enums or as the CLI spells them.
KindMap = Mapping[OpKind, Precision] | Mapping[str, str]


def resolve_policy(policy: Policy | str, kind_map: KindMap | None = None) -> Policy:
    """A policy by name (with `kind_map` for "custom"); `kind_map` may use strings
    ({"compute": "f16"}), checked as `--map` is: a bad kind or precision is a PolicyError."""
    if isinstance(policy, Policy):
        return policy
    return policy_from_name(policy, kind_map_from(kind_map) if kind_map is not None else None)


def options_from(options: ConvertOptions | None, option_kwargs: Mapping[str, Any]) -> ConvertOptions:
    """The options of a call that takes `options=` or `make_options`'s keywords, not both."""
    if options is not None and option_kwargs:
        raise TypeError("give options= or option keywords, not both")
    return options or make_options(**option_kwargs)


def make_options(
    keep_io_types: bool = True,
    keep_f32_ops: Iterable[str] = (),
    keep_f32_nodes: Iterable[str] = (),
    keep_f32_paths: Mapping[str, str] | None = None,
    target: Target | str = Target.CUDA,
    shapes: Mapping[str, Sequence[int]] | None = None,
    cost: bool = True,
    check_contracts: bool = False,
    value_ranges: Mapping[str, ValueRange] | None = None,
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
    return ConvertOptions(
        keep_io_types,
        frozenset(keep_f32_ops),
        patterns,
        dict(keep_f32_paths or {}),
        target,
        {name: tuple(dims) for name, dims in (shapes or {}).items()},
        cost,
        check_contracts,
        dict(value_ranges or {}),
    )


def write_demo(path: str | os.PathLike[str]) -> Path:
    """Write the bundled demo model (a transformer block with a -1e9 attention mask) to `path`,
    whole or not at all; the same model as `rlx-amp demo`."""
    from importlib import resources

    paths = RunPaths()
    paths.write(path, "demo model")
    paths.check()
    data = resources.files("rlx_onnx_amp.data").joinpath("demo_transformer.onnx").read_bytes()
    with OutputSet() as outputs:
        outputs.write_bytes(path, data)
        outputs.commit()
    return Path(path)


def plan_model_reads(paths: RunPaths, path: str | os.PathLike[str], role: str) -> None:
    """Add a model file and the external data files it reads to a run's plan."""
    paths.read(path, role)
    if not os.path.isfile(path):
        return  # loading it later says what is wrong
    _plan_external_reads(paths, Path(path), load_checked(path, False).tensors, role)


def _file_bytes(model_path: Path, tensors: Iterable[onnx.TensorProto]) -> int:
    """A model file's bytes and those of the external data files it reads."""
    source = WeightSource(model_path.parent, str(model_path))
    files = {source.external_path(t) for t in tensors if is_external(t)}
    return model_path.stat().st_size + sum(Path(f).stat().st_size for f in files)


def _plan_external_reads(paths: RunPaths, model_path: Path, tensors: Iterable[onnx.TensorProto], role: str) -> None:
    source = WeightSource(model_path.parent, str(model_path))
    for tensor in tensors:
        if is_external(tensor):
            paths.read(source.external_path(tensor), f"{role}'s external data")


def convert(
    model: ModelProto | str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: KindMap | None = None,
    options: ConvertOptions | None = None,
    check: bool = True,
    screen: bool = True,
    **option_kwargs: object,
) -> ModelProto:
    """Return a mixed-precision copy of `model` (a ModelProto or a path); the input is never
    modified. `convert_and_report` returns what the conversion did beside it."""
    return convert_and_report(
        model, policy, kind_map=kind_map, options=options, check=check, screen=screen, **option_kwargs
    )[0]


def convert_and_report(
    model: ModelProto | str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: KindMap | None = None,
    options: ConvertOptions | None = None,
    check: bool = True,
    screen: bool = True,
    **option_kwargs: object,
) -> tuple[ModelProto, Conversion]:
    """A mixed-precision copy of `model` (a ModelProto or a path), the input never modified,
    and the record of what the conversion did (`reports.record.Conversion`).

    With `check` (the default) the result is proven as the CLI proves what it writes (`prove`:
    onnx's full checker, or onnxruntime for an input the checker refuses): an input the
    converter cannot make sound raises InputError with the CLI's message, never returns a
    broken model. A result past 2 GiB (weights inline) cannot be checked in memory: use
    `convert_file`.

    With `screen` (the default, as the command's) the model runs once in onnxruntime on the
    inputs the command draws, and values that leave the low precision's range stay f32 (rule
    range-screen; `screened_options`); `screen=False` is the rewrite alone.

    `option_kwargs` are those of `make_options`: keep_io_types, keep_f32_ops, keep_f32_nodes,
    keep_f32_paths, target (the execution provider the model is meant for: "cuda" or "cpu"),
    shapes (concrete input shapes for the cost model, name -> dims), cost (False: no cost model),
    value_ranges (value key, `ranges.scoped_name` -> `ranges.ValueRange` from a reference run:
    rule range-screen).
    """
    resolved = resolve_policy(policy, kind_map)
    opts = options_from(options, option_kwargs)
    if isinstance(model, ModelProto):
        work = ModelProto()
        work.CopyFrom(model)
        name = model.graph.name or "model"
        source = WeightSource(None, name)
        if screen and not opts.value_ranges:
            with tempfile.TemporaryDirectory(prefix="rlx-amp-screen-") as tmp:  # onnxruntime reads a file
                saved = Path(tmp) / "model.onnx"
                onnx.save(work, saved, save_as_external_data=work.ByteSize() >= PROTOBUF_LIMIT)
                opts = screened_options(saved, opts, label=name)
    else:
        opts = screened_options(model, opts) if screen else opts
        work = load_model(model, load_external_data=True)
        name = str(model)
        source = WeightSource(Path(model).parent, name)
    record = convert_model(work, resolved, opts, source=source, sink=WeightSink(), label=name)
    proof = None
    if check and work.ByteSize() < PROTOBUF_LIMIT:
        proof = prove(work, model, record.target, name, name)  # a path: checked, and loaded, from its file
    elif check:
        logger.info("%s: %d bytes in memory, past what the checker reads: not checked", name, work.ByteSize())
    return work, dataclasses.replace(record, model=name, proof=proof)


def convert_file(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: KindMap | None = None,
    options: ConvertOptions | None = None,
    data_name: str | None = None,
    check: bool = True,
    progress: Callable[[int, int], None] | None = None,
    screen: bool = True,
    **option_kwargs: Any,
) -> Conversion:
    """Convert a model file to `output_path`, streaming weights stored as external data.

    The output appears only when it is complete and passes the checker, and replaces an
    earlier file at `output_path` (with its data file) in one step; see `rlx_onnx_amp.files`.
    `progress(done, total)` is called with weight bytes as tensors are written. The option
    keywords are those of `convert` (keep_io_types, keep_f32_ops, keep_f32_nodes,
    keep_f32_paths, target, shapes); `screen` is `convert`'s. The command's whole pipeline
    (verification, repair, the gate) is `rlx_onnx_amp.run`.
    """
    opts = options_from(options, option_kwargs)
    opts = screened_options(input_path, opts) if screen else opts
    paths = RunPaths()
    with OutputSet() as outputs:
        staged = stage_conversion(
            input_path,
            output_path,
            outputs,
            paths,
            policy,
            kind_map=kind_map,
            options=opts,
            data_name=data_name,
            check=check,
            progress=progress,
        )
        outputs.commit()
    return staged.conversion


def screened_options(
    model: str | os.PathLike[str], options: ConvertOptions, label: str | None = None
) -> ConvertOptions:
    """`options` with the range screen's ranges (and the shapes the MACs count at) from one
    onnxruntime run of `model` on the inputs the command draws by default, as every door of
    the pipeline screens (`pipeline.JobSettings.screen`); unchanged where they hold ranges
    already. A model that cannot run on those inputs is converted unscreened, with a warning,
    as the command and the onnx-ir pass do."""
    if options.value_ranges:
        return options
    # The verification's modules (onnxruntime), here: `screen=False` does not load them.
    from rlx_onnx_amp.verification import VerifyOptions
    from rlx_onnx_amp.verification.reference import ReferenceUnavailable, prepare_reference

    try:
        reference = prepare_reference(model, VerifyOptions(target=options.target.value), screen=True)
    except ReferenceUnavailable as e:
        logger.warning("%s: not range-screened: %s", label or model, first_line(e.error))
        return options
    except AmpError as e:  # inputs the command cannot draw for it (a string input): not screened either
        logger.warning("%s: not range-screened: %s", label or model, first_line(e))
        return options
    return reference.conversion_options(options)


@dataclass
class StagedModel:
    """A converted model written to its staging directory, not yet in place."""

    path: Path  # where it can be read now (its data file beside it); commit moves it into place
    conversion: Conversion


@gc_paused()  # what it builds is freed by reference counting; a collection would walk it all
def stage_conversion(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    outputs: OutputSet,
    paths: RunPaths,
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: KindMap | None = None,
    options: ConvertOptions | None = None,
    data_name: str | None = None,
    check: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> StagedModel:
    """Convert a model file into `outputs`' staging area; `commit` puts it at `output_path`.

    The input model and its data files join `paths` as reads, the output and its data file as
    writes, and `paths.check()` runs before the conversion starts.
    """
    src, dst = Path(input_path), Path(output_path)
    resolved = resolve_policy(policy, kind_map)
    if data_name is not None:
        check_data_name(data_name)
    paths.read(src, "input model")
    paths.write(dst, "output model")
    if data_name is not None:
        paths.write(dst.parent / data_name, "output data file")
    check_writable(dst, "output model")
    model, tensors, sizes, fields = load_checked(src, False, read_fields=True)
    _plan_external_reads(paths, src, tensors, "input model")
    bytes_before = _file_bytes(src, tensors)
    paths.check()
    source = WeightSource(src.parent, str(src))
    outputs.protect(paths.protected())
    external = any(is_external(t) for t in tensors) or sum(sizes) > EXTERNAL_THRESHOLD
    staged_model = outputs.stage(dst, OutputSet.MODEL)
    stage = staged_model.parent
    sink: WeightSink = ExternalSink(stage / ".data.partial", data_name or ".data.partial") if external else WeightSink()
    total, done = sum(sizes[: len(model.graph.initializer)]), 0  # all_tensors yields these first

    def step(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(done, total)

    try:
        with contextlib.ExitStack() as rewriting:
            try:
                rewritten = rewriting.enter_context(
                    rewrite_model(
                        model, resolved, options or ConvertOptions(), source=source, sink=sink,
                        progress=step, fields=fields, label=str(src),
                    )
                )
                del fields  # the plan holds them while it needs them
            finally:
                sink.close()
            data_names, bytes_after = _write_staged(model, sink, staged_model, outputs, dst, data_name)
            del sink
            record = rewritten.finish()
        # The rewrite is over: the model, its fields and the plan are freed before the checker
        # parses the written file, so the peak holds one of them, not both.
        del model, tensors, sizes, rewritten
        proof = None
        if check:
            proof = prove(staged_model, src, record.target, str(src), str(dst))
    except OSError as e:
        raise InputError(f"{dst}: cannot write output ({e.strerror or e})") from None
    outputs.model_uses(dst, data_names)
    record = dataclasses.replace(
        record,
        model=str(src),
        output=str(dst),
        data_files=tuple(data_names),
        proof=proof,
        file_bytes=ByteCounts(bytes_before, bytes_after),
    )
    if logger.isEnabledFor(logging.INFO):
        for kept in record.kept_f32:
            logger.info("kept f32: %s (%s, path %s): %s", kept.node, kept.op, kept.path, kept.reason)
        logger.info("%d Casts inserted, %d nodes kept f32", record.casts_inserted, len(record.kept_f32))
    logger.info("converted %s (staged as %s)", dst, staged_model)
    return StagedModel(staged_model, record)


def _write_staged(
    model: ModelProto,
    sink: WeightSink,
    staged_model: Path,
    outputs: OutputSet,
    dst: Path,
    data_name: str | None,
) -> tuple[list[str], int]:
    """Write the converted model (and its data file, staged beside it); the data files' names,
    and the bytes written, data files included."""
    data_names: list[str] = []
    written = 0
    if isinstance(sink, ExternalSink) and sink.bytes_written:
        name = data_name or content_data_name(dst.name, sink.digest())
        sink.relocate(name)
        staged_data = outputs.stage(dst.parent / name, OutputSet.DATA)
        os.replace(sink.path, staged_data)
        written += staged_data.stat().st_size
        data_names.append(name)
    elif isinstance(sink, ExternalSink):
        sink.path.unlink()
    # Tensors already point at the data file: serialize directly (onnx.save would walk
    # every tensor again looking for external data to write).
    try:
        serialized = model.SerializeToString()
    except ValueError as e:
        raise InputError(f"{dst}: cannot write output ({e})") from None
    with open(staged_model, "wb") as f:
        f.write(serialized)
        f.flush()
        os.fsync(f.fileno())
    return data_names, written + len(serialized)

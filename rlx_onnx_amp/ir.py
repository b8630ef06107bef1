"""rlx-amp as an onnx-ir pass: `MixedPrecisionPass` (`pip install 'rlx-onnx-amp[ir]'`).

    import onnx
import onnx_ir as ir
    from rlx_onnx_amp.ir import MixedPrecisionPass

    model = ir.load("model.onnx")
    result = ir.passes.PassManager([MixedPrecisionPass(policy="always-f16")])(model)
    ir.save(result.model, "model.f16.onnx", external_data="model.f16.onnx.data")

The pass rewrites the model with rlx-amp's own converter (`rewrite.convert_model`), so each
node gets the precision, and the graph the Casts, that the command line gives the same model
under the same options. It serializes the model's graph (`ir.to_proto`: external weights stay
references, nothing is read), converts that, and moves the converted graph into the caller's
`ir.Model` (the same `Model` and `Graph` objects; nodes and values are new).

Weights stored as external data are read a chunk at a time from the directory onnx-ir loaded
them from, and the narrowed weights go to one scratch file; each comes back as an
`ir.LazyTensor` that reads its bytes from that file only when asked (`ir.save` writes them one
by one), so no step holds all the weights at once. The scratch file is removed when the last
tensor reading it is gone. Weights in memory (a torch.onnx export) stay in memory.

The pass runs the stages of the command's pipeline (`rlx_onnx_amp.pipeline`), from settings
checked as every door checks them (`JobSettings.checked`): the input's reference run on the
verification's inputs (the model saved once to a temporary directory, since onnxruntime reads
files) with its range screen, on by default as the command's (`screen=False`: the literal
policy, no run); the rewrite; the proof; and with `verify=True` the verdict against that same
reference run, before the converted model replaces the caller's graph: drift past the
tolerances raises `onnx_ir.passes.PostconditionError`, the model left as it was. A reference
that cannot run (guessed axes) is logged, and the model converted unscreened, as the command
writes it unverified.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import onnx_ir as ir
    from onnx_ir import passes as ir_passes
except ImportError as e:  # the extra is not installed
    raise ImportError(
        f"rlx_onnx_amp.ir needs onnx-ir ({e}): pip install 'rlx-onnx-amp[ir]'", name=e.name, path=e.path
    ) from e

from rlx_onnx_amp.api import (
    EXTERNAL_THRESHOLD,
    PROTOBUF_LIMIT,
    KindMap,
    checker_failure,
    load_model,
    options_from,
    prove,
    resolve_policy,
)
from rlx_onnx_amp.errors import AmpError, InputError
from rlx_onnx_amp.pipeline import JobSettings, LogReporter, reference_run, with_reference
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.record import Conversion, ModelResult
from rlx_onnx_amp.rewrite import ConvertOptions, convert_model
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource

__all__ = ["MixedPrecisionPass"]

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from rlx_onnx_amp.verification.reference import Reference



class MixedPrecisionPass(ir_passes.InPlacePass):
    """Rewrite an `onnx_ir.Model` to mixed precision under `policy`, in place.

    The keywords are `rlx_onnx_amp.convert`'s: `policy` (a name or a `Policy`), `kind_map`
    (for "custom"), `options` or the option keywords of `make_options` (keep_io_types,
    keep_f32_ops, keep_f32_nodes, keep_f32_paths, target, shapes, cost, value_ranges), and
    `check` (prove the result with onnx's checker, as the CLI does). Bad options fail here,
    when the pass is made. `result` after a call is that call's `ModelResult` (its conversion
    and, with `verify=True`, its verification), each call replacing the last's.

    requires: every value of the model (subgraphs included) has a known type; run
    `onnx_ir.passes.common.ShapeInferencePass` first on a model that lacks them.
    ensures: every value's type is known and every Cast's `to` is its output's type.

    `verify=True` (with `verify_options`, a `rlx_onnx_amp.VerifyOptions`) runs the converted
    model against the input with onnxruntime before the caller's model is changed, and raises
    `PostconditionError` when an output drifts past its tolerance. onnxruntime reads files: the
    input is saved to a temporary directory for that, and the converted model too unless it has
    external weights (then the file beside them in the scratch directory serves). `scratch_dir`
    is where the narrowed weights of a model with external data wait for `ir.save` (default:
    the system's temporary directory).
    """

    def __init__(
        self,
        policy: Policy | str = "auto-mixed",
        *,
        kind_map: KindMap | None = None,
        options: ConvertOptions | None = None,
        check: bool = True,
        verify: bool = False,
        verify_options: Any = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        screen: bool = True,
        **option_kwargs: Any,
    ) -> None:
        super().__init__()
        self.policy = resolve_policy(policy, kind_map)
        self.options = options_from(options, option_kwargs)
        self.check = check
        self.verify = verify
        self.screen = screen
        # Checked as every door checks its settings (`pipeline.JobSettings.checked`); the
        # reference runs for the range screen even without verify, as the command's does.
        self.settings = JobSettings.checked(
            self.policy,
            self.options,
            verify_options if verify or screen else None,
            verify=True if verify else (None if screen else False),  # a screen alone: a reference that cannot run warns
            spelling={"auto": "policy 'auto'", "no_verify": "verify=False"},
            screen=screen,
        )
        if self.policy.searches and not verify:
            raise InputError("policy 'auto' searches by verifying its candidates: give verify=True")
        self.verify_options = self.settings.verify_options
        self.scratch_dir = scratch_dir
        self.result: ModelResult | None = None

    # ---- the contract ----------------------------------------------------------------------

    def requires(self, model: ir.Model) -> None:
        unknown = _untyped(model)
        if unknown:
            raise ir_passes.PreconditionError(
                f"{len(unknown)} values have no known type (first: {', '.join(unknown[:5])}); "
                "run onnx_ir.passes.common.ShapeInferencePass first"
            )
        _weights_dir(model)  # external data from one directory, or a PreconditionError

    def ensures(self, model: ir.Model) -> None:
        unknown = _untyped(model)
        if unknown:
            raise ir_passes.PostconditionError(
                f"{len(unknown)} values have no known type after the pass (first: {', '.join(unknown[:5])})"
            )
        wrong = [
            f"{node.name or node.op_type} (to={ir.DataType(node.attributes.get_int('to', 0)).name}, "
            f"output {out.name}: {out.dtype.name if out.dtype is not None else '?'})"
            for node in ir.traversal.RecursiveGraphIterator(model.graph)
            if node.op_type == "Cast" and node.domain in ("", "ai.onnx")
            for out in node.outputs[:1]
            if out.dtype is not None and int(out.dtype) != node.attributes.get_int("to", 0)
        ]
        if wrong:
            raise ir_passes.PostconditionError(f"Casts whose output is not of their `to` type: {'; '.join(wrong[:5])}")

    # ---- the rewrite -----------------------------------------------------------------------

    def call(self, model: ir.Model) -> ir_passes.PassResult:
        self.result = None
        if self.policy.searches:
            return self._search(model)
        return self._rewrite(model, model.graph.name or "model")

    def _search(self, model: ir.Model) -> ir_passes.PassResult:
        """`auto`: the command line's search (`repair.repair_file`) on the model saved to a
        temporary directory; the caller's model takes the result only when it passes."""
        from rlx_onnx_amp.repair import repair_file

        with tempfile.TemporaryDirectory(prefix="rlx-amp-ir-auto-", dir=self.scratch_dir) as tmp:
            ref, out = Path(tmp) / "reference.onnx", Path(tmp) / "auto.onnx"
            ir.save(model, ref, external_data="reference.onnx.data")
            conversion, verified, repaired = repair_file(
                ref, out, self.policy, options=self.options, verify_options=self.verify_options
            )
            converted = ir.from_proto(load_model(out, load_external_data=True))
        self.result = ModelResult(conversion, verified, repaired)
        if not verified.passed:
            raise ir_passes.PostconditionError(
                f"policy auto found no candidate within the tolerances ({verified.criterion}); "
                "the model is left unchanged"
            )
        _adopt(model, converted)
        return ir_passes.PassResult(model, modified=conversion.changed)

    def _rewrite(self, model: ir.Model, name: str) -> ir_passes.PassResult:
        """The pipeline's stages on the model in memory: the reference's run on the
        verification's inputs (saved once to a temporary directory: onnxruntime reads files),
        range-screened unless `screen=False`; the rewrite; the proof; with `verify`, the
        verdict against that same reference run."""
        if not (self.screen or self.verify):
            return self._convert(model, name, None)
        with tempfile.TemporaryDirectory(prefix="rlx-amp-ir-reference-", dir=self.scratch_dir) as tmp:
            saved = Path(tmp) / "reference.onnx"
            ir.save(model, saved, external_data="reference.onnx.data")
            reference, why = reference_run(saved, self.settings, LogReporter(name))
            if reference is None:
                logger.warning("%s: not screened, not verified: %s", name, why)
            return self._convert(model, name, reference)

    def _convert(self, model: ir.Model, name: str, reference: Reference | None) -> ir_passes.PassResult:
        base_dir = _weights_dir(model)
        # External weights stay references (a weight an earlier run left in its scratch file
        # too); weights in memory are copied once.
        undo = _replace_tensors(model.graph, lambda t: t.stored if isinstance(t, _ScratchTensor) else None)
        try:
            proto = ir.to_proto(model)
        finally:
            for put_back in undo:
                put_back()
        source = WeightSource(base_dir, name)
        scratch = None
        if base_dir is not None or sum(_nbytes(t) for t in _tensors(model.graph)) > EXTERNAL_THRESHOLD:
            scratch = _Scratch(self.scratch_dir)
        sink = WeightSink() if scratch is None else ExternalSink(scratch.path, scratch.location, scratch=True)
        options = with_reference(self.options, reference)
        try:
            conversion = dataclasses.replace(
                convert_model(proto, self.policy, options, source=source, sink=sink, label=name), model=name
            )
        finally:
            sink.close()
        self.result = ModelResult(conversion)
        if not conversion.changed:
            return ir_passes.PassResult(model, modified=False)
        # With external weights, the converted model as a file beside them in the scratch
        # directory, written once for the checker and onnxruntime (each reads external data
        # only beside a model file); the weights are not copied again.
        written = scratch.dir / "converted.onnx" if scratch is not None and (self.check or self.verify) else None
        try:
            if written is not None:
                written.write_bytes(proto.SerializeToString())
            if self.check:
                proof = self._prove(proto, model, name, conversion.target, written)
                conversion = dataclasses.replace(conversion, proof=proof)
                self.result = ModelResult(conversion)
            converted = ir.from_proto(proto)
            del proto
            if scratch is not None:
                _read_lazily(converted.graph, scratch)
            if self.verify and reference is not None:
                self._verify(converted, written, conversion, reference)
        finally:
            if written is not None:
                written.unlink(missing_ok=True)
        _adopt(model, converted)
        return ir_passes.PassResult(model, modified=True)

    def _prove(self, proto: Any, model: ir.Model, name: str, target: str, written: Path | None) -> str | None:
        """What the CLI proves of what it writes (`api.prove`): onnx's full checker passes (or,
        for an input the checker refuses, onnxruntime loads input and output alike). `written`:
        the converted model's file beside its external weights."""
        if written is not None:
            found = checker_failure(written)
            if found is not None:  # the input's weights are elsewhere: the checker cannot tell whose fault
                raise AmpError(f"{name}: the converted model fails onnx.checker ({found}); check=False skips")
            return "onnx.checker"
        if proto.ByteSize() < PROTOBUF_LIMIT:  # the input, serialized again only if the output fails
            return prove(proto, lambda: ir.to_proto(model), target, name, name)
        return None

    def _verify(self, converted: ir.Model, written: Path | None, conversion: Conversion, reference: Reference) -> None:
        """The converted model against the reference's run (onnxruntime reads files: the
        converted model is saved beside the reference unless it is `written` already)."""
        from rlx_onnx_amp.verification import verify

        cand = written
        if cand is None:
            cand = reference.path.parent / "candidate.onnx"
            ir.save(converted, cand, external_data="candidate.onnx.data")
        result = verify(reference.path, cand, self.verify_options, prepared=reference)
        self.result = ModelResult(conversion, result)
        if not result.passed:
            failing = [o.name for o in result.outputs if not o.passed]
            raise ir_passes.PostconditionError(
                f"the converted model drifts past the tolerances ({result.criterion}) on "
                f"{', '.join(failing)}; the model is left unchanged"
            )


# ---- helpers -----------------------------------------------------------------------------


class _Scratch:
    """A temporary directory holding one data file, removed when this object is collected
    (each lazy tensor reading the file keeps it alive) or at exit."""

    location = "weights.data"

    def __init__(self, parent: str | os.PathLike[str] | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rlx-amp-ir-", dir=parent))
        self.path = self.dir / self.location
        weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """A graph and every subgraph inside it."""
    yield graph
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield attr.as_graph()
            elif attr.type == ir.AttributeType.GRAPHS:
                yield from attr.as_graphs()


def _tensors(graph: ir.Graph) -> Iterator[ir.TensorProtocol]:
    """Every initializer's and tensor attribute's tensor, subgraphs included."""
    for g in _graphs(graph):
        for value in g.initializers.values():
            if value.const_value is not None:
                yield value.const_value
        for node in g:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    yield attr.as_tensor()


def _nbytes(tensor: ir.TensorProtocol) -> int:
    try:
        return int(tensor.nbytes)
    except Exception:  # a type whose size its shape does not tell (strings)
        return 0


def _weights_dir(model: ir.Model) -> Path | None:
    """The one directory the model's external data is read from (None: it has none)."""
    dirs = {
        Path(t.base_dir if isinstance(t, ir.ExternalTensor) else t.stored.base_dir)
        for t in _tensors(model.graph)
        if isinstance(t, ir.ExternalTensor | _ScratchTensor)
    }
    if len(dirs) > 1:
        raise ir_passes.PreconditionError(
            f"external data from {len(dirs)} directories ({', '.join(sorted(map(str, dirs))[:3])}): "
            "the pass reads it from one; save the model (ir.save) and load it again"
        )
    return next(iter(dirs), None)


def _untyped(model: ir.Model) -> list[str]:
    """The names of values (graph inputs, initializers, node outputs) without a known type."""
    missing = []
    for g in _graphs(model.graph):
        values = [*g.inputs, *g.initializers.values(), *(out for node in g for out in node.outputs if out.name)]
        missing += [v.name or "?" for v in values if v.type is None]
    return list(dict.fromkeys(missing))


def _replace_tensors(
    graph: ir.Graph, replace: Callable[[ir.TensorProtocol], ir.TensorProtocol | None]
) -> list[Callable[[], None]]:
    """Put `replace(tensor)` in place of each initializer's and tensor attribute's tensor for
    which it is not None; returns what puts each one back."""
    undo: list[Callable[[], None]] = []
    for g in _graphs(graph):
        for value in g.initializers.values():
            old = value.const_value
            new = replace(old) if old is not None else None
            if new is not None:
                value.const_value = new
                undo.append(functools.partial(setattr, value, "const_value", old))
        for node in g:
            for key, attr in list(node.attributes.items()):
                new = replace(attr.as_tensor()) if attr.type == ir.AttributeType.TENSOR else None
                if new is not None:
                    node.attributes[key] = ir.AttrTensor(key, new, doc_string=attr.doc_string)
                    undo.append(functools.partial(node.attributes.__setitem__, key, attr))
    return undo


class _ScratchTensor(ir.LazyTensor):
    """A weight in a scratch file, read from it only when asked: each read maps the file
    afresh and the mapping closes once its bytes are copied out, so nothing stays resident.
    `stored` is the reference to it (never read itself); the scratch lives as long as this."""

    def __init__(self, stored: ir.ExternalTensor, scratch: _Scratch) -> None:
        self.stored, self.scratch = stored, scratch
        super().__init__(self._read, dtype=stored.dtype, shape=stored.shape, name=stored.name,
                         doc_string=stored.doc_string)

    def _read(self) -> ir.TensorProtocol:
        s = self.stored
        return ir.ExternalTensor(s.location, s.offset, s.length, s.dtype, shape=s.shape, name=s.name,
                                 base_dir=s.base_dir)


def _read_lazily(graph: ir.Graph, scratch: _Scratch) -> None:
    """Make every tensor the converter left in the scratch file a `_ScratchTensor`."""

    def lazy(tensor: ir.TensorProtocol) -> ir.TensorProtocol | None:
        if not isinstance(tensor, ir.ExternalTensor):
            return None
        tensor.base_dir = scratch.dir
        return _ScratchTensor(tensor, scratch)

    _replace_tensors(graph, lazy)


def _adopt(model: ir.Model, converted: ir.Model) -> None:
    """Move the converted graph's contents into `model`'s own graph (same Model and Graph
    objects, as an in-place pass must return)."""
    graph, new = model.graph, converted.graph
    graph.remove(list(graph), safe=False)
    graph.initializers.clear()
    graph.inputs.clear()
    graph.outputs.clear()
    nodes = list(new)
    new.remove(nodes, safe=False)
    inputs, outputs, initializers = list(new.inputs), list(new.outputs), list(new.initializers.values())
    new.inputs.clear()
    new.outputs.clear()
    new.initializers.clear()
    graph.inputs.extend(inputs)
    graph.outputs.extend(outputs)
    for value in initializers:
        graph.register_initializer(value)
    graph.extend(nodes)
    graph.opset_imports.clear()
    graph.opset_imports.update(new.opset_imports)
    graph.metadata_props.clear()
    graph.metadata_props.update(new.metadata_props)
    model.ir_version = converted.ir_version
    model.functions.clear()
    model.functions.update(converted.functions)

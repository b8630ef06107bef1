"""Sweep 3 of the rewrite: the model rewritten, each consumer reading each input at its type."""

from __future__ import annotations

import functools
import logging

import onnx
from onnx import ModelProto, NodeProto, helper

from rlx_onnx_amp.errors import first_line
from rlx_onnx_amp.passes import Pass, PassResult
from rlx_onnx_amp.precision import F32, FLOAT_TYPES, LOW_TYPES, is_float, precision_of_elem_type
from rlx_onnx_amp.ranges import scoped_name
from rlx_onnx_amp.rewrite.context import default_opset_for
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Plan, Scope, Stage
from rlx_onnx_amp.rewrite.weights import Retyper
from rlx_onnx_amp.taxonomy import DEFAULT_DOMAINS, TYPE_ATTRIBUTES, TYPED_TENSOR_ATTRIBUTES
from rlx_onnx_amp.tensors import is_external
from rlx_onnx_amp.types import all_tensors, attribute_output_type, names_read, subgraphs

__all__ = ["EmitPass"]

logger = logging.getLogger(__name__)

#: Ops (besides sources) whose attributes carry a type or a tensor that follows the node's precision.
_ATTRIBUTE_RETYPED_OPS = frozenset(TYPED_TENSOR_ATTRIBUTES) | frozenset(TYPE_ATTRIBUTES)
#: Integer types whose every value f32 holds exactly (16 bits at most), so that a Cast of one to
#: f32 read back low is one rounding either way: Cast(int8 -> f32) -> Cast(f32 -> f16) is
#: Cast(int8 -> f16), a quantized weight's dequantization made low at its source (rule one-cast-per-value).
_EXACT_IN_F32 = frozenset(
    {
        onnx.TensorProto.BOOL, onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
    }
)  # fmt: skip


class EmitPass(Pass[Plan]):
    """Sweep 3: the model rewritten: Casts inserted, values, attributes and weights retyped.

    Requires stored types. Ensures a model onnx's full checker accepts (when its weights are
    inline) and non-float values and weights at their old types (the pipeline's own promise,
    idempotence, is checked where the pipeline runs: `convert.check_idempotent`). `modified` is
    the report's `changed`, or weights moved into the sink's file."""

    name, needs_stage, gives_stage = "emit", Stage.STORED, Stage.EMITTED

    def __init__(self, conversion: Conversion) -> None:
        self.cx = conversion
        self.fixed: dict[str, int] = {}
        self.values = Retyper(conversion)

    def requires(self, plan: Plan) -> None:
        self.fixed = _fixed_types(plan.model)

    def call(self, plan: Plan) -> PassResult:
        assert plan.main is not None
        return PassResult(modified=self.emit_model(plan.main))

    def ensures(self, plan: Plan) -> None:
        model = plan.model
        after = _fixed_types(model)
        moved = {name: (elem, after[name]) for name, elem in self.fixed.items() if after.get(name, elem) != elem}
        if moved:
            self.fail(f"non-f32 values retyped: {moved}")
        if not any(is_external(t) for t in all_tensors(model)):
            try:
                onnx.checker.check_model(model, full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
                self.fail(f"the result fails onnx's checker: {first_line(e)}")

    def emit_model(self, main: Scope) -> bool:
        """Sweep 3 over the whole model; whether the model's protobuf changed."""
        self.emit_scope(main)
        if self.cx.casts_inserted:
            self._ensure_default_opset()
        return self.cx.changed or self.cx.relocated

    def resolve(self, scope: Scope, name: str, want: int | None, position: int) -> str:
        """The name under which `name` is available at type `want` in `scope`; a Cast it needs
        is appended to the scope's graph with sort key `position` (see emit_scope)."""
        owner = scope if name in scope.defined else scope.owner(name)
        if owner is None:
            return name
        actual = owner.rename.get(name, name) if owner.rename else name
        have = owner.storage.get(name)
        if have is None:
            have = owner.orig.get(name)
        if want is None or have == want or have not in FLOAT_TYPES or want not in FLOAT_TYPES:
            return actual
        key = (name, want)
        if key in scope.cast_cache:
            return scope.cast_cache[key]
        producer = owner.producer.get(name)
        if producer is not None and producer.op == "Cast" and producer.inputs and have == F32:
            inner = producer.inputs[0]
            inner_type = owner.storage_type(inner)
            if inner_type == want:
                # Cast(low -> f32) read back at low: the chain adds nothing (rule one-cast-per-value).
                owner.folded.add(name)  # the Cast may be left without readers (rule idle-cast)
                result = self.resolve(scope, inner, want, position)
                scope.cast_cache[key] = result
                return result
            if inner_type in _EXACT_IN_F32:  # the low Cast reads the integer itself
                owner.folded.add(name)
                name, actual = inner, owner.rename.get(inner, inner) if owner.rename else inner
        precision = precision_of_elem_type(want)
        assert precision is not None
        if producer is None and have == F32 and self.cx.numeric.past_range(scoped_name(owner.path, name), precision):
            # An f32 weight past the low range, read low here (a mask sentinel: rule weight-range
            # keeps other readers f32): a Cast would make Inf of it, a narrowed copy clamps it.
            copy = self._narrowed_copy(owner, name, want)
            if copy is not None:
                scope.cast_cache[key] = copy
                return copy
        cast_out = self.cx.fresh(f"{name}__{precision.value}")
        self._add_cast(scope, actual, cast_out, self.cx.fresh(f"{cast_out}__cast"), want, position)
        scope.cast_cache[key] = cast_out
        _declare(scope, cast_out, want)
        return cast_out

    def _narrowed_copy(self, owner: Scope, name: str, want: int) -> str | None:
        """A copy of initializer `name` in `owner`'s graph that the store step narrows to `want`
        (clamped and counted, as any narrowed weight); None where there is no such initializer
        or IR < 4 would need it declared as a graph input too."""
        if self.cx.model.ir_version < 4:
            return None
        init = next((t for t in owner.graph.initializer if t.name == name), None)
        if init is None:
            return None
        copy = owner.graph.initializer.add()
        copy.CopyFrom(init)
        precision = precision_of_elem_type(want)
        assert precision is not None
        copy.name = self.cx.fresh(f"{name}__{precision.value}")
        owner.defined.add(copy.name)
        owner.orig[copy.name], owner.storage[copy.name] = F32, want
        self.cx.edits += 1
        return copy.name

    def _add_cast(self, scope: Scope, src: str, dst: str, name: str, to: int, position: int) -> None:
        """Append Cast(src) -> dst to the scope's graph; emit_scope sorts it into place."""
        node = scope.graph.node.add()
        node.CopyFrom(_cast_template(to))  # a copy is cheaper than building the node field by field
        node.input[0], node.output[0], node.name = src, dst, name
        scope.positions.append(position)
        self.cx.casts_inserted += 1

    def emit_scope(self, scope: Scope) -> None:
        """Rewire every node's inputs to the types it reads them at, inserting Casts.

        Casts are appended to the graph as they are made, each with a sort key (`_slot`): a
        Cast node i reads sorts just before it, a Cast back to a graph output it computes just
        after. One stable sort of the node list by these keys then puts them in place (upb
        sorts the pointers; rebuilding the list would copy every node).
        """
        is_main = scope.parent is None
        count = len(scope.decisions)
        scope.positions = list(range(_slot(0, _NODE), _slot(count, _NODE), _SLOTS))  # _slot(i, _NODE) of every i
        back = self._rename_low_outputs(scope)
        if is_main:
            self.values.output_types = {name: want for name, (_, want) in back.items()}
        orig_type = scope.orig.get if is_main else scope.orig_type
        idle: list[NodeProto] = []  # Casts to their input's own type, removed after the sort
        children, rename, resolve = scope.children, scope.rename, self.resolve
        defined, storage, orig = scope.defined, scope.storage, scope.orig
        for i, d in enumerate(scope.decisions):
            if children and i in children:
                for child in children[i]:
                    self.emit_scope(child)
            # Point the node's inputs at the names holding them at the types it reads them at.
            # The common case is decided here without a call: a value of this scope, not
            # renamed, read at the type it has.
            input_types = d.input_types
            for k, name in enumerate(d.inputs):
                if not name:
                    continue
                want = input_types[k] if k in input_types else orig_type(name)
                if (
                    name in defined
                    and name not in rename
                    and (want is None or want == (storage.get(name) or orig.get(name)))
                ):
                    continue
                resolved = resolve(scope, name, want, _slot(i, _READ))
                if resolved != name:
                    d.node.input[k] = resolved
                    self.cx.edits += 1
            if rename and not rename.keys().isdisjoint(d.outputs):
                self._rename_outputs(scope, i, d, back)
            if d.precision is not None and (d.source or d.op in _ATTRIBUTE_RETYPED_OPS):
                self.values.retype_attributes(d)
            if d.op == "Cast" and not d.domain and len(d.inputs) == 1 and d.inputs[0]:
                self.cx.casts_removed += _drop_idle_cast(scope, d, idle)
        if not is_main:
            self._resolve_body_outputs(scope, count)
        _sort_nodes(scope, count)
        if scope.folded:
            unread = _unread_casts(scope)
            self.cx.casts_removed += len(unread)
            idle += unread
        if idle:
            _remove_nodes(scope, idle)
        self.values.retype_declarations(scope)
        self.values.convert_initializers(scope)
        self.values.run_batches()

    def _rename_low_outputs(self, scope: Scope) -> dict[str, tuple[str, int]]:
        """Graph outputs computed low are renamed at their producer; the Cast back takes the
        original name (rule names-kept) and goes right after the producer: a consumer of the
        output may follow it. In a body too, whose outputs keep their types: an If branch's
        output often has the name of the If's own output (optimum's merged decoders), and a
        low value under that name would contradict the outer f32 one. Output name -> (its low
        name, the type it goes back to)."""
        back: dict[str, tuple[str, int]] = {}
        is_main = scope.parent is None
        body_types = _body_output_types(scope) if is_main and not self.cx.options.keep_io_types else {}
        for out in scope.graph.output:
            if is_main:
                want = out.type.tensor_type.elem_type if self.cx.options.keep_io_types else body_types.get(out.name)
            else:
                want = scope.orig_type(out.name)
            have = scope.storage_type(out.name)
            if want and is_float(have) and have != want and out.name in scope.producer:
                precision = precision_of_elem_type(have or 0)
                low_name = self.cx.fresh(f"{out.name}__{precision.value if precision else 'low'}")
                scope.rename[out.name] = low_name
                scope.cast_cache[(out.name, want)] = out.name
                back[out.name] = (low_name, want)
                _declare(scope, low_name, have or 0)
        return back

    def _rename_outputs(self, scope: Scope, i: int, d: NodeDecision, back: dict[str, tuple[str, int]]) -> None:
        """Node i's renamed outputs, and the Cast back to a graph output it computes low."""
        rename = scope.rename
        for k, name in enumerate(d.outputs):
            if name in rename:
                d.node.output[k] = rename[name]
                self.cx.edits += 1
                if name in back:
                    low_name, want = back[name]
                    self._add_cast(scope, low_name, name, self.cx.fresh(f"{name}__cast"), want, _slot(i, _BACK))

    def _resolve_body_outputs(self, scope: Scope, count: int) -> None:
        """Body outputs keep their types; they may be renamed."""
        for out in scope.graph.output:
            want = scope.orig_type(out.name)
            resolved = self.resolve(scope, out.name, want, _slot(count, _READ))  # after every node
            if resolved != out.name:
                out.name = resolved
                self.cx.edits += 1
                if not out.type.HasField("tensor_type") and want is not None:
                    out.type.tensor_type.elem_type = want

    def _ensure_default_opset(self) -> None:
        """Inserted Casts live in the default domain; a model that imports only another domain
        (ai.onnx.ml) gets the default-domain opset released with it."""
        if any(o.domain in DEFAULT_DOMAINS for o in self.cx.model.opset_import):
            return
        version = default_opset_for(self.cx.model, self.cx.opsets.get("ai.onnx.ml"))
        self.cx.model.opset_import.append(helper.make_opsetid("", version))
        logger.info("added an import of the default domain at opset %d for the inserted Casts", version)


def _drop_idle_cast(scope: Scope, d: NodeDecision, idle: list[NodeProto]) -> bool:
    """Rule idle-cast: an existing Cast whose input now has the type it casts to (an auto-mixed
    output converted again under always-f16) does nothing. Its readers read its input instead
    and it joins `idle`, to be removed; one that gives a graph output becomes an Identity, so
    the output keeps its name. Whether it was dropped."""
    to = attribute_output_type(d.node, "Cast")
    source = d.inputs[0]
    if to is None or not is_float(to) or scope.storage_type(source) != to:
        return False
    out = d.outputs[0] if d.outputs else ""
    if not out:
        return False
    if any(o.name == out for o in scope.graph.output):
        d.node.op_type = "Identity"
        del d.node.attribute[:]
    else:
        scope.rename[out] = d.node.input[0]  # already rewired to the name its input has here
        idle.append(d.node)
    return True


def _unread_casts(scope: Scope) -> list[NodeProto]:
    """Rule idle-cast: the Casts whose every reader now reads past them (a folded chain)."""
    graph = scope.graph
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        for _, body in subgraphs(node):
            read |= names_read(body)
    unread = []
    for name in scope.folded - read:
        d = scope.producer.get(name)
        if d is not None and d.op == "Cast":
            unread.append(d.node)
    return unread


def _declare(scope: Scope, name: str, elem: int) -> None:
    """Declare the type of a new value (its shape is left to inference)."""
    vi = scope.graph.value_info.add()
    vi.name = name
    vi.type.tensor_type.elem_type = elem


def _body_output_types(main: Scope) -> dict[str, int]:
    """Without keep_io_types, the low type a main-graph output made by If/Loop/Scan takes:
    the one its bodies compute it in (the node's interface stays f32, rule control-flow),
    where every body agrees on one low type. A body whose output is a constant (optimum's
    merged decoder gives the encoder cache a placeholder Constant in its with-past branch)
    agrees with any: else that cache would be f32 out of the merged decoder and f16 out of the
    plain one, and a generator feeds one back as the other."""
    outputs = {o.name for o in main.graph.output}
    found: dict[str, int] = {}
    for i, d in enumerate(main.decisions):
        bodies = main.children.get(i)
        if not bodies or d.code != "control-flow" or d.domain not in DEFAULT_DOMAINS:
            continue
        skip = 1 if d.op == "Loop" else 0  # a Loop body's first output is its condition
        for k, name in enumerate(d.outputs):
            if name not in outputs or main.storage_type(name) != F32:
                continue
            types = set()
            for body in bodies:
                inner = body.graph.output[k + skip].name if k + skip < len(body.graph.output) else None
                producer = body.producer.get(inner) if inner else None
                if producer is None or not producer.source:
                    types.add(body.storage_type(inner) if inner else None)
            if len(types) == 1 and (low := types.pop()) in LOW_TYPES:
                found[name] = low
    return found


def _sort_nodes(scope: Scope, count: int) -> None:
    """Put the appended Casts in place by their sort keys (see emit_scope)."""
    if len(scope.positions) > count:
        keys = iter(scope.positions)
        scope.graph.node.sort(key=lambda _: next(keys))  # list.sort computes each key once, in list order
        if next(keys, None) is not None:
            raise AssertionError("emit_scope: node sort keys out of step with the node list")


def _remove_nodes(scope: Scope, nodes: list[NodeProto]) -> None:
    """Delete `nodes` from the scope's graph, and the declarations of the values they made."""
    graph = scope.graph
    gone = {id(n) for n in nodes}
    outputs = {o for n in nodes for o in n.output}
    for i in reversed([i for i, n in enumerate(graph.node) if id(n) in gone]):
        del graph.node[i]
    for i in reversed([i for i, vi in enumerate(graph.value_info) if vi.name in outputs]):
        del graph.value_info[i]


def _fixed_types(model: ModelProto) -> dict[str, int]:
    """The element types of every weight and graph input/output that is not f32, by name."""
    fixed = {t.name: t.data_type for t in all_tensors(model) if t.name and t.data_type != F32}
    for vi in (*model.graph.input, *model.graph.output):
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if elem and elem != F32:
            fixed[vi.name] = elem
    return fixed


#: Where an inserted Cast sorts relative to node i (emit_scope): the Casts it reads, the node,
#: the Cast back to a graph output it computes; `_SLOTS` keys per node.
_READ, _NODE, _BACK = 0, 1, 2
_SLOTS = 3


def _slot(i: int, where: int) -> int:
    return _SLOTS * i + where


@functools.cache
def _cast_template(to: int) -> NodeProto:
    """A Cast to `to` whose input, output and name are placeholders to overwrite."""
    node = NodeProto(op_type="Cast", name="_", input=["_"], output=["_"])
    attr = node.attribute.add()
    attr.name, attr.type, attr.i = "to", onnx.AttributeProto.INT, to
    return node

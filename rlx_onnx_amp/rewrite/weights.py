"""The emit pass's writes of values: attributes, Constant values, weights and declarations retyped."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper

from rlx_onnx_amp.precision import F32, Precision, is_float, precision_of_elem_type
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Scope
from rlx_onnx_amp.taxonomy import SOURCE_VALUE_ATTRIBUTES, TYPE_ATTRIBUTES, TYPED_TENSOR_ATTRIBUTES
from rlx_onnx_amp.tensors import SMALL_TENSOR_ELEMENTS, NarrowBatch, is_external, narrow, tensor_nbytes

__all__ = ["Retyper"]


class Retyper:
    """Writes the emit pass's new types into values: the tensors of attributes and Constant-like
    nodes, the type attributes, the declared value types and the initializers (narrowed through
    the conversion's weight sink). Small tensors are narrowed together at the end of each scope
    (one numpy pass per precision, `NarrowBatch`)."""

    def __init__(self, conversion: Conversion) -> None:
        self.cx = conversion
        #: Main-graph outputs cast back to another type (without keep_io_types: their declared type).
        self.output_types: dict[str, int] = {}
        self.batching = conversion.sink.stores_inline(2 * SMALL_TENSOR_ELEMENTS)  # narrowed tensors are 16-bit
        self._batches: dict[Precision, NarrowBatch] = {}

    def retype_attributes(self, d: NodeDecision) -> None:
        node = d.node
        elem = d.precision.elem_type if d.precision else F32
        if d.source:
            attr_name = SOURCE_VALUE_ATTRIBUTES[node.op_type]
            self._retype_source(node, attr_name, d.precision)
            return
        for attr in node.attribute:
            if attr.name in TYPED_TENSOR_ATTRIBUTES.get(node.op_type, ()) and attr.t.data_type == F32 and d.precision:
                self._narrow_tensor(attr.t, d.precision, f"{d.label}.{attr.name}")
                self.cx.edits += 1
        type_attr = TYPE_ATTRIBUTES.get(node.op_type)
        if type_attr and 0 in d.output_types:
            attrs = {a.name: a for a in node.attribute}
            if type_attr not in attrs:
                node.attribute.append(helper.make_attribute(type_attr, elem))
                self.cx.edits += 1
            elif attrs[type_attr].i != elem:
                attrs[type_attr].i = elem
                self.cx.edits += 1

    def _retype_source(self, node: NodeProto, attr_name: str, precision: Precision | None) -> None:
        assert precision is not None
        self.cx.edits += 1  # an f32 value (the store pass lowers no other) becomes low
        output = node.output[0]  # the tensor's name and label: read once
        attributes = node.attribute
        attrs = {a.name: a for a in attributes}
        value = attrs.get(attr_name)
        if value is not None and value.type == onnx.AttributeProto.TENSOR:
            self._narrow_tensor(value.t, precision, output)
            return
        # value_float(s) or a ConstantOfShape without value (0.0): becomes a typed tensor.
        if "value_float" in attrs:
            values, dims = [attrs["value_float"].f], []
        elif "value_floats" in attrs:
            values, dims = list(attrs["value_floats"].floats), [len(attrs["value_floats"].floats)]
        else:
            values, dims = [0.0], [1]
        replaced = [attrs[a] for a in ("value_float", "value_floats", attr_name) if a in attrs]
        if len(replaced) == len(attributes) == 1:
            # The node's one attribute (a Constant's): rewritten where it stands, which is where
            # removing it and adding the tensor would leave the tensor, with fewer upb calls.
            attr = replaced[0]
            attr.Clear()
        else:
            for old in replaced:
                attributes.remove(old)
            attr = attributes.add()  # built in place: make_attribute's checks cost more than the value
        attr.name, attr.type = attr_name, onnx.AttributeProto.TENSOR
        attr.t.name = output
        if dims:
            attr.t.dims.extend(dims)
        if self.batching and 0 < len(values) <= SMALL_TENSOR_ELEMENTS:
            self._batch(precision).add_values(attr.t, values, output)
            return
        self._store_low(attr.t, np.array(values, dtype=np.float32).reshape(dims), precision, output)

    def _store_low(self, tensor: TensorProto, values: np.ndarray, precision: Precision, label: str) -> None:
        """Narrow `values` to `precision` (clamped and counted) and store them as `tensor`'s data."""
        low, stats = narrow(values, precision)
        self.cx.record_clamp(label, stats)
        self.cx.sink.store(tensor, low, precision.elem_type)

    def _batch(self, precision: Precision) -> NarrowBatch:
        batch = self._batches.get(precision)
        if batch is None:
            batch = self._batches[precision] = NarrowBatch(precision)
        return batch

    def _narrow_tensor(self, tensor: TensorProto, precision: Precision, label: str) -> None:
        """Narrow a tensor attribute in place: small ones join a batch (see `NarrowBatch`)."""
        if self.batching and self._batch(precision).add(tensor, label):
            return
        self._store_low(tensor, self.cx.source.read(tensor), precision, label)

    def run_batches(self) -> None:
        for batch in self._batches.values():
            for label, stats in batch.run():
                self.cx.record_clamp(label, stats)

    def retype_declarations(self, scope: Scope) -> None:
        graph = scope.graph
        storage = scope.storage
        for vi in graph.value_info:
            elem = storage.get(vi.name)
            if elem and vi.type.HasField("tensor_type"):
                self._retype(vi, elem)
        if scope.parent is None and not self.cx.options.keep_io_types:
            for vi in (*graph.input, *graph.output):
                elem = self.output_types.get(vi.name) or scope.storage_type(vi.name)
                if elem and vi.type.HasField("tensor_type") and is_float(elem):
                    self._retype(vi, elem)
        # IR < 4: initializers are also graph inputs; their declaration follows the weight.
        inits = {t.name for t in graph.initializer}
        for vi in graph.input:
            if vi.name in inits and vi.name in storage:
                self._retype(vi, storage[vi.name])

    def _retype(self, vi: onnx.ValueInfoProto, elem: int) -> None:
        tensor_type = vi.type.tensor_type
        if tensor_type.elem_type != elem:
            tensor_type.elem_type = elem
            self.cx.edits += 1

    def convert_initializers(self, scope: Scope) -> None:
        for init in scope.graph.initializer:
            before = tensor_nbytes(init)
            self.cx.initializer_bytes_before += before
            target = scope.storage.get(init.name)
            # The precision it is narrowed to (storage types are float types), or None.
            precision = precision_of_elem_type(target) if target is not None and target != init.data_type else None
            if precision is not None:
                self.cx.edits += 1
            # What it will take narrowed, from its size as f32 (a batch writes it later).
            narrowed = before if precision is None else before // 4 * precision.info.np_dtype.itemsize
            if not self.cx.weights:
                if precision is not None:
                    init.data_type = precision.elem_type  # for the cost model only: a dry run's data stays as it was
                self.cx.initializer_bytes_after += narrowed
                continue
            if precision is None:
                moved = is_external(init)
                self.cx.sink.copy_through(init, self.cx.source)
                self.cx.relocated = self.cx.relocated or moved or is_external(init)
                self.cx.initializer_bytes_after += before
            elif self.batching and self._batch(precision).add(init, init.name):
                self.cx.initializer_bytes_after += narrowed
            else:
                stats, written = self.cx.sink.store_narrowed(init, self.cx.source, precision)
                self.cx.record_clamp(init.name, stats)
                self.cx.initializer_bytes_after += written
            if self.cx.progress is not None:
                self.cx.progress(before)


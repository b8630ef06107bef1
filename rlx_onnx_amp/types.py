"""Element types of every value of a model, without serializing its weights.

onnx's shape inference runs on a copy of the model's structure in which large initializers
carry only their type and dims, so a multi-GB model costs no more than its graph. Values it
cannot type (contrib ops) are typed later by the converter from the op schemas.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx
import onnx.shape_inference
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

__all__ = ["NON_TENSOR", "ScopeTypes", "all_graphs", "all_tensors", "infer_types", "subgraphs"]

logger = logging.getLogger(__name__)

# Initializers up to this many elements keep their data in the structure copy, so shape
# inference can still read shapes and axes from them.
_KEEP_DATA_ELEMENTS = 1 << 16

#: The "element type" recorded for sequence, optional and map values: never retyped.
NON_TENSOR = -1

#: Element types of the values of each graph scope, keyed by scope path.
ScopeTypes = dict[str, dict[str, int]]


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, GraphProto]]:
    """The graphs held in a node's attributes, with a stable key for each."""
    found: list[tuple[str, GraphProto]] = []
    if not node.attribute:
        return found
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == AttributeProto.GRAPHS:
            found.extend((f"{attr.name}[{k}]", g) for k, g in enumerate(attr.graphs))
    return found


def all_graphs(graph: GraphProto) -> list[GraphProto]:
    """`graph` and every body nested in it, outer graphs first."""
    found = [graph]
    for node in graph.node:
        for _, sub in subgraphs(node):
            found.extend(all_graphs(sub))
    return found


def all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every initializer and tensor attribute (Constant values) of a model, bodies included."""
    for graph in all_graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    yield attr.t


def _structure_copy(model: ModelProto) -> ModelProto:
    stub = ModelProto()
    stub.ir_version = model.ir_version
    stub.opset_import.extend(model.opset_import)
    stub.functions.extend(model.functions)
    graph, src = stub.graph, model.graph
    graph.name = src.name
    graph.node.extend(src.node)
    graph.input.extend(src.input)
    graph.output.extend(src.output)
    graph.value_info.extend(src.value_info)
    for init in src.initializer:
        small = 1
        for d in init.dims:
            small *= d
        if small <= _KEEP_DATA_ELEMENTS and init.data_location != TensorProto.EXTERNAL:
            graph.initializer.append(init)
        else:
            graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims)
    return stub


def _collect(graph: GraphProto, path: str, out: ScopeTypes) -> None:
    types: dict[str, int] = {}
    for init in graph.initializer:
        types[init.name] = init.data_type
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
        elif vi.type.WhichOneof("value") in ("sequence_type", "optional_type", "map_type"):
            types[vi.name] = NON_TENSOR
    out[path] = types
    for i, node in enumerate(graph.node):
        for key, sub in subgraphs(node):
            _collect(sub, f"{path}{i}/{key}/", out)


def infer_types(model: ModelProto) -> ScopeTypes:
    """Element types of the values of every scope."""
    stub = _structure_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=False)
    except Exception as e:  # noqa: BLE001 - inference is a help, not a requirement
        logger.info("onnx shape inference failed (%s); typing from schemas alone", e)
        inferred = stub
    out: ScopeTypes = {}
    _collect(inferred.graph, "", out)
    return out

"""A seeded mutation fuzzer for the `rlx-amp` command line.

Two parts:

* a mutation library: `make_mutant(seed, index)` takes a base model (a fixture of
  fixtures/make_fixtures.py, or a small onnx/backend/test/data/light model) and applies one or
  two seeded mutations (changed op types, dropped nodes, renamed inputs, changed dtypes and
  attributes, truncated raw data, huge or negative dims, bogus external-data entries, changed
  opsets, duplicated nodes, cleared outputs); everything follows from (seed, index);
* a driver, `python3 -m tools.fuzz_mutants --seed S --count N --workdir DIR --jsonl OUT`, that
  writes each mutant to DIR/k/in/, runs the CLI in-process on it
  (`rlx-amp DIR/k/in/in.onnx --policy P -o DIR/k/out/out.onnx -q [--verify --provider cpu]`)
  and writes one JSON line per mutant: the exit code, stderr, whether the input files are
  untouched, stray files, and for exit 0 whether the output (and, then, the input) passes
  `onnx.checker.check_model(full_check=True)` and loads in onnxruntime. `--summary` prints a
  table of the run; `check_records` lists the records that break the contract (see
  tests/test_fuzz.py, which runs a few hundred mutants; `make fuzz` runs thousands).

Reproduce one mutant: `python3 -m tools.fuzz_mutants --seed S --index K --workdir /tmp/fz --keep`
(its files stay in /tmp/fz/K; the record is printed).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import hashlib
import io
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto
from onnx import helper as h

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The exit codes `rlx-amp` documents (4, written unverified, only without --verify; 141 is a
#: closed stdout, which the fuzzer never causes); 70 is an internal error.
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4}
EXIT_UNVERIFIED = 4
EXIT_INTERNAL = 70

POLICIES: tuple[tuple[str, ...], ...] = (
    ("--policy", "always-f16"),
    ("--policy", "auto-mixed"),
    ("--policy", "auto-mixed-bf16", "--target", "cpu"),
)

IN_NAME, OUT_NAME = "in.onnx", "out.onnx"
DATA_NAME = IN_NAME + ".data"

# ---------------------------------------------------------------------------------------------
# Base models


@dataclass
class Base:
    name: str
    model: onnx.ModelProto
    external: bool = False  # written with external data (size_threshold 1024)


_BASES: list[Base] | None = None

LIGHT_MODELS = ("light_squeezenet", "light_shufflenet")  # small ones: the others fold to 100+ MB of weights in onnxruntime


def bases() -> list[Base]:
    """Every base model, built once per process in a fixed order."""
    global _BASES
    if _BASES is None:
        from fixtures import make_fixtures as mf

        out: list[Base] = []
        for name, build in {**mf.HEALTHY, **mf.BROKEN_IN_F16}.items():
            out.append(Base(name, build().model, external=name == "mlp_external"))
        out.append(Base("transformer_block_external", mf.transformer_block().model, external=True))
        try:
            import onnx.backend.test

            light = Path(onnx.backend.test.__file__).parent / "data" / "light"
            for name in LIGHT_MODELS:
                if (light / f"{name}.onnx").is_file():
                    out.append(Base(name, onnx.load(str(light / f"{name}.onnx"))))
        except ImportError:  # pragma: no cover
            pass
        _BASES = out
    return _BASES


# ---------------------------------------------------------------------------------------------
# Mutations

REAL_OPS = ("Relu", "Tanh", "Sigmoid", "Identity", "MatMul", "Add", "Mul", "Sub", "Div", "Softmax", "LayerNormalization",
            "Conv", "Gemm", "Cast", "Reshape", "Transpose", "Concat", "Shape", "Gather", "Where", "Erf", "Exp", "Pow",
            "ReduceSum", "ReduceMean", "Resize", "Loop", "If", "Constant", "ConstantOfShape", "QuantizeLinear",
            "DequantizeLinear", "Split", "Unsqueeze", "Squeeze", "Flatten", "MaxPool", "BatchNormalization", "Einsum",
            "Range", "TopK", "NonZero", "Sqrt", "CumSum", "Clip", "Attention", "SkipLayerNormalization", "FastGelu")
BOGUS_OPS = ("NotAnOp", "", "matmul", "Relu ", "Conv2D", "FusedFoo", "\u00e9", "Op" * 200)
DTYPES = [v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED] + [0, 99, -1, 10**6]
FLOATISH = [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE]
DIMS = (10**12, -1, -5, 0, 2**62, 1, 3, 7)
OPSETS = (1, 6, 7, 9, 11, 12, 13, 15, 17, 18, 19, 20, 21, 22, 23, 24, 30, 999, 0, -1)


class Skip(Exception):
    """This mutation has nothing to act on in this model: the caller draws another."""


@dataclass
class Mutant:
    seed: int
    index: int
    base: str
    external: bool
    model: onnx.ModelProto
    mutations: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    #: Applied to the written input directory (external-data mutations): fn(in_dir, case_dir) -> None
    file_ops: list[Callable[[Path, Path], None]] = field(default_factory=list)
    #: The input reads (or tries to read) data outside its directory: a zero exit is a failure.
    escapes: bool = False

    @property
    def description(self) -> str:
        return "; ".join(self.mutations)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _graphs(g)


def _pick(rng: np.random.Generator, seq: Any) -> Any:
    seq = list(seq)
    if not seq:
        raise Skip
    return seq[int(rng.integers(len(seq)))]


def _pick_graph(rng: np.random.Generator, model: onnx.ModelProto) -> tuple[onnx.GraphProto, str]:
    graphs = [g for g in _graphs(model.graph) if g.node]
    g = graphs[0] if len(graphs) == 1 or rng.random() < 0.7 else _pick(rng, graphs[1:])
    return g, "" if g is model.graph else f" in {g.name or 'subgraph'}"


def _pick_node(rng: np.random.Generator, model: onnx.ModelProto, pred: Callable[[onnx.NodeProto], bool] = lambda n: True
               ) -> tuple[onnx.GraphProto, int, str]:
    graphs = [g for g in _graphs(model.graph) if any(pred(n) for n in g.node)]
    if not graphs:
        raise Skip
    g = graphs[0] if graphs[0] is model.graph and (len(graphs) == 1 or rng.random() < 0.7) else _pick(rng, graphs)
    i = _pick(rng, [k for k, n in enumerate(g.node) if pred(n)])
    return g, i, "" if g is model.graph else f" in {g.name or 'subgraph'}"


def _names(model: onnx.ModelProto) -> list[str]:
    names: list[str] = []
    for g in _graphs(model.graph):
        names += [i.name for i in g.input] + [t.name for t in g.initializer] + [o for n in g.node for o in n.output if o]
    return sorted(set(names))


def _mut_op_type(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    g, i, where = _pick_node(rng, m)
    node = g.node[i]
    old = node.op_type
    node.op_type = _pick(rng, BOGUS_OPS) if rng.random() < 0.3 else _pick(rng, [o for o in REAL_OPS if o != old])
    if rng.random() < 0.15:
        node.domain = _pick(rng, ["", "com.microsoft", "ai.onnx", "bogus.domain"])
        return f"op type of node {i} ({old}){where} -> {node.op_type!r} domain {node.domain!r}"
    return f"op type of node {i} ({old}){where} -> {node.op_type!r}"


def _mut_drop_node(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    g, i, where = _pick_node(rng, m)
    op = g.node[i].op_type
    del g.node[i]
    return f"drop node {i} ({op}){where}"


def _mut_rename_input(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    g, i, where = _pick_node(rng, m, lambda n: len(n.input) > 0)
    node = g.node[i]
    j = int(rng.integers(len(node.input)))
    old = node.input[j]
    r = rng.random()
    new = "ghost_value" if r < 0.4 else ("" if r < 0.55 else _pick(rng, _names(m)))
    node.input[j] = new
    return f"rename input {j} of node {i} ({node.op_type}){where}: {old!r} -> {new!r}"


def _mut_rename_output(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    r = rng.random()
    if r < 0.2:  # a graph input or output by its value info
        g = m.graph
        vis = list(g.input) + list(g.output)
        vi = _pick(rng, vis)
        old = vi.name
        vi.name = "ghost_io" if rng.random() < 0.5 else _pick(rng, _names(m))
        return f"rename graph value {old!r} -> {vi.name!r}"
    g, i, where = _pick_node(rng, m, lambda n: len(n.output) > 0)
    node = g.node[i]
    j = int(rng.integers(len(node.output)))
    old = node.output[j]
    new = "ghost_out" if r < 0.6 else ("" if r < 0.7 else _pick(rng, _names(m)))
    node.output[j] = new
    return f"rename output {j} of node {i} ({node.op_type}){where}: {old!r} -> {new!r}"


def _mut_dtype(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    new = int(_pick(rng, FLOATISH)) if rng.random() < 0.4 else int(_pick(rng, DTYPES))
    r = rng.random()
    if r < 0.35:
        inits = [t for g in _graphs(m.graph) for t in g.initializer]
        t = _pick(rng, inits)
        old = t.data_type
        t.data_type = new
        return f"initializer {t.name!r} data_type {old} -> {new}"
    if r < 0.65:
        vis = [vi for vi in list(m.graph.input) + list(m.graph.output) if vi.type.HasField("tensor_type")]
        vi = _pick(rng, vis)
        old = vi.type.tensor_type.elem_type
        vi.type.tensor_type.elem_type = new
        return f"elem_type of graph value {vi.name!r} {old} -> {new}"
    if r < 0.8:
        vis = [vi for g in _graphs(m.graph) for vi in g.value_info] or [vi for g in _graphs(m.graph) for vi in g.output]
        vi = _pick(rng, vis)
        old = vi.type.tensor_type.elem_type
        vi.type.tensor_type.elem_type = new
        return f"elem_type of value_info {vi.name!r} {old} -> {new}"
    g, i, where = _pick_node(rng, m, lambda n: n.op_type == "Cast")
    node = g.node[i]
    attr = next(a for a in node.attribute if a.name == "to")
    old = attr.i
    attr.i = new
    return f"Cast node {i} ({node.name}){where} to {old} -> {new}"


def _attribute_of_wrong_type(name: str, rng: np.random.Generator) -> AttributeProto:
    value = _pick(rng, [1.5, "bogus", [1, 2, 3], [0.5], ["a", "b"], 7,
                        onnx.numpy_helper.from_array(np.zeros(2, np.float32), "t"),
                        h.make_graph([], "empty_graph", [], [])])
    return h.make_attribute(name, value)


def _mut_attribute(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    r = rng.random()
    if r < 0.12:  # add a bogus attribute to any node
        g, i, where = _pick_node(rng, m)
        node = g.node[i]
        node.attribute.append(_attribute_of_wrong_type("fuzz_attr", rng))
        return f"add attribute fuzz_attr to node {i} ({node.op_type}){where}"
    g, i, where = _pick_node(rng, m, lambda n: len(n.attribute) > 0)
    node = g.node[i]
    k = int(rng.integers(len(node.attribute)))
    a = node.attribute[k]
    label = f"attribute {a.name!r} of node {i} ({node.op_type}){where}"
    if r < 0.3:
        del node.attribute[k]
        return f"remove {label}"
    if r < 0.45:
        node.attribute[k].CopyFrom(_attribute_of_wrong_type(a.name, rng))
        return f"{label} -> wrong type {AttributeProto.AttributeType.Name(node.attribute[k].type)}"
    if r < 0.52:  # the declared type disagrees with the field that holds the value
        old = a.type
        a.type = int(_pick(rng, [t for t in AttributeProto.AttributeType.values() if t != old]))
        return f"{label} type tag {old} -> {a.type} (value left in place)"
    if a.type == AttributeProto.INT:
        old = a.i
        a.i = int(_pick(rng, [-3, -1, 0, 1, 2, 5, 7, 16, 10**9, 2**62, -(2**63)]))
        return f"{label} {old} -> {a.i}"
    if a.type == AttributeProto.INTS:
        vals = list(a.ints)
        choice = rng.random()
        if choice < 0.3:
            vals = vals[:-1]
        elif choice < 0.6:
            vals = [*vals, int(_pick(rng, [0, 1, -1, 9]))]
        else:
            vals = [int(v) for v in rng.permutation(vals)] if vals else [5]
            if vals:
                vals[int(rng.integers(len(vals)))] = int(_pick(rng, [-7, 9, 10**12]))
        del a.ints[:]
        a.ints.extend(vals)
        return f"{label} -> {vals}"
    if a.type == AttributeProto.FLOAT:
        old = a.f
        a.f = float(_pick(rng, [float("nan"), float("inf"), -1.0, 0.0, 1e30, -1e-45]))
        return f"{label} {old} -> {a.f}"
    if a.type == AttributeProto.STRING:
        a.s = _pick(rng, [b"bogus", b"", b"\xff\xfe", b"linear"])
        return f"{label} -> {a.s!r}"
    if a.type == AttributeProto.TENSOR:
        t = a.t
        choice = rng.random()
        if choice < 0.4:
            old = t.data_type
            t.data_type = int(_pick(rng, DTYPES))
            return f"{label} tensor data_type {old} -> {t.data_type}"
        if choice < 0.7 and t.raw_data:
            t.raw_data = t.raw_data[: int(rng.integers(len(t.raw_data)))]
            return f"{label} tensor raw_data truncated to {len(t.raw_data)}"
        del t.dims[:]
        t.dims.extend([int(_pick(rng, DIMS))])
        return f"{label} tensor dims -> {list(t.dims)}"
    if a.type == AttributeProto.GRAPH:
        sub = a.g
        choice = rng.random()
        if choice < 0.4 and sub.node:
            j = int(rng.integers(len(sub.node)))
            op = sub.node[j].op_type
            del sub.node[j]
            return f"{label}: drop body node {j} ({op})"
        if choice < 0.7:
            del sub.output[:]
            return f"{label}: clear body outputs"
        del sub.input[:]
        return f"{label}: clear body inputs"
    del node.attribute[k]
    return f"remove {label}"


def _raw_tensors(m: onnx.ModelProto) -> list[TensorProto]:
    tensors = [t for g in _graphs(m.graph) for t in g.initializer]
    return tensors


def _ensure_raw(t: TensorProto) -> None:
    if t.raw_data or t.data_location == TensorProto.EXTERNAL:
        return
    try:
        array = onnx.numpy_helper.to_array(t)
    except Exception:
        return
    fresh = onnx.numpy_helper.from_array(array, t.name)
    t.CopyFrom(fresh)


def _mut_raw_data(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    t = _pick(rng, [t for t in _raw_tensors(m) if t.data_location != TensorProto.EXTERNAL])
    _ensure_raw(t)
    n = len(t.raw_data)
    r = rng.random()
    if r < 0.45 and n:
        cut = int(rng.integers(n))
        t.raw_data = t.raw_data[:cut]
        return f"truncate raw_data of {t.name!r} {n} -> {cut} bytes"
    if r < 0.8:
        extra = int(_pick(rng, [1, 2, 3, 4, 64, 4097]))
        t.raw_data = t.raw_data + bytes(extra)
        return f"extend raw_data of {t.name!r} by {extra} bytes"
    # both raw_data and a typed field
    t.float_data.extend([1.0, 2.0])
    return f"initializer {t.name!r} with raw_data and float_data"


def _mut_dims(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    r = rng.random()
    if r < 0.75:
        t = _pick(rng, _raw_tensors(m))
        old = list(t.dims)
        choice = rng.random()
        if choice < 0.4 and old:
            new = list(old)
            new[int(rng.integers(len(new)))] = int(_pick(rng, DIMS))
        elif choice < 0.6:
            new = [*old, int(_pick(rng, DIMS))]
        elif choice < 0.8:
            new = old[:-1]
        else:
            new = [int(_pick(rng, DIMS))] * int(rng.integers(1, 4))
        del t.dims[:]
        t.dims.extend(new)
        return f"initializer {t.name!r} dims {old} -> {new}"
    vis = [vi for vi in list(m.graph.input) + list(m.graph.output) if vi.type.HasField("tensor_type")]
    vi = _pick(rng, vis)
    shape = vi.type.tensor_type.shape
    if shape.dim and rng.random() < 0.7:
        d = shape.dim[int(rng.integers(len(shape.dim)))]
        d.dim_value = int(_pick(rng, DIMS))
        return f"graph value {vi.name!r} dim -> {d.dim_value}"
    shape.dim.add().dim_value = int(_pick(rng, DIMS))
    return f"graph value {vi.name!r} extra dim"


def _mut_opset(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    r = rng.random()
    if r < 0.6:
        op = next((o for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
        if op is None:
            raise Skip
        old = op.version
        op.version = int(_pick(rng, OPSETS))
        return f"default opset {old} -> {op.version}"
    if r < 0.7:
        old = m.ir_version
        m.ir_version = int(_pick(rng, [0, 1, 3, 4, 7, 8, 9, 11, 12, 99]))
        return f"ir_version {old} -> {m.ir_version}"
    if r < 0.85:
        k = int(rng.integers(len(m.opset_import)))
        dom = m.opset_import[k].domain
        del m.opset_import[k]
        return f"remove opset import {dom!r}"
    m.opset_import.add(domain=_pick(rng, ["", "com.microsoft", "bogus.domain"]), version=int(_pick(rng, OPSETS)))
    return "add a second opset import"


def _mut_duplicate_node(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    g, i, where = _pick_node(rng, m)
    dup = onnx.NodeProto()
    dup.CopyFrom(g.node[i])
    if rng.random() < 0.5:  # a valid twin: fresh output names
        del dup.output[:]
        dup.output.extend([f"{o}_fuzz_twin" if o else "" for o in g.node[i].output])
        dup.name = (dup.name or "node") + "_fuzz_twin"
        how = "with fresh outputs"
    else:
        how = "with the same outputs"
    pos = i + 1 if rng.random() < 0.7 else 0
    g.node.insert(pos, dup)
    return f"duplicate node {i} ({dup.op_type}){where} {how} at {pos}"


def _mut_clear_outputs(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    r = rng.random()
    if r < 0.6 or len(m.graph.output) < 2:
        del m.graph.output[:]
        return "clear graph outputs"
    k = int(rng.integers(len(m.graph.output)))
    name = m.graph.output[k].name
    del m.graph.output[k]
    return f"remove graph output {name!r}"


def _mut_swap_nodes(rng: np.random.Generator, m: onnx.ModelProto) -> str:
    g, i, where = _pick_node(rng, m)
    j = int(rng.integers(len(g.node)))
    if i == j:
        raise Skip
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(g.node[i])
    b.CopyFrom(g.node[j])
    g.node[i].CopyFrom(b)
    g.node[j].CopyFrom(a)
    return f"swap nodes {i} and {j}{where} (topological order)"


GRAPH_MUTATIONS: dict[str, Callable[[np.random.Generator, onnx.ModelProto], str]] = {
    "op_type": _mut_op_type,
    "drop_node": _mut_drop_node,
    "rename_input": _mut_rename_input,
    "rename_output": _mut_rename_output,
    "dtype": _mut_dtype,
    "attribute": _mut_attribute,
    "raw_data": _mut_raw_data,
    "dims": _mut_dims,
    "opset": _mut_opset,
    "duplicate_node": _mut_duplicate_node,
    "clear_outputs": _mut_clear_outputs,
    "swap_nodes": _mut_swap_nodes,
}

# ---- external data: applied to the written files --------------------------------------------


def _external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    return [t for g in _graphs(model.graph) for t in g.initializer if t.data_location == TensorProto.EXTERNAL]


def _set_entry(t: TensorProto, key: str, value: str | None) -> None:
    entries = [(e.key, e.value) for e in t.external_data if e.key != key]
    if value is not None:
        entries.append((key, value))
    del t.external_data[:]
    for k, v in entries:
        t.external_data.add(key=k, value=v)


def _entry(t: TensorProto, key: str) -> str | None:
    return next((e.value for e in t.external_data if e.key == key), None)


def _rewrite(in_dir: Path, edit: Callable[[onnx.ModelProto, list[TensorProto]], None]) -> None:
    path = in_dir / IN_NAME
    model = onnx.load(str(path), load_external_data=False)
    tensors = _external_tensors(model)
    edit(model, tensors)
    path.write_bytes(model.SerializeToString())


EXTERNAL_KINDS = ("dotdot", "absolute", "symlink_out", "symlink_in", "no_location", "no_entries", "offset_past_end",
                  "length_too_big", "bad_offset", "bad_length", "missing_file", "location_dir", "truncate_file",
                  "location_is_model", "duplicate_key", "empty_location", "misaligned_offset")


def _external_mutation(rng: np.random.Generator, mutant: Mutant) -> str:
    """Queue a file operation on the written input; return its description."""
    kind = _pick(rng, EXTERNAL_KINDS)
    pick = int(rng.integers(1 << 30))
    all_tensors = rng.random() < 0.3
    bad_offset = _pick(rng, ["abc", "-5", "1.5", "", "0x10", " 12", "9" * 30])
    bad_length = _pick(rng, ["abc", "-1", "2.0", "", "9" * 30])
    location_dir = _pick(rng, [".", "subdir"])
    keep_share = float(rng.random())
    detail = {"bad_offset": repr(bad_offset), "bad_length": repr(bad_length), "location_dir": repr(location_dir),
              "truncate_file": f"to {keep_share:.2f} of its size"}.get(kind)

    def targets(tensors: list[TensorProto]) -> list[TensorProto]:
        if not tensors:
            return []
        return tensors if all_tensors else [tensors[pick % len(tensors)]]

    def op(in_dir: Path, case_dir: Path) -> None:
        data = in_dir / DATA_NAME
        size = data.stat().st_size if data.is_file() else 0

        def edit(model: onnx.ModelProto, tensors: list[TensorProto]) -> None:
            for t in targets(tensors):
                if kind == "dotdot":
                    _set_entry(t, "location", "../" + DATA_NAME)
                elif kind == "absolute":
                    _set_entry(t, "location", str((case_dir / "abs" / DATA_NAME).resolve()))
                elif kind in ("symlink_out", "symlink_in"):
                    _set_entry(t, "location", "link.data")
                elif kind == "no_location":
                    _set_entry(t, "location", None)
                elif kind == "no_entries":
                    del t.external_data[:]
                elif kind == "offset_past_end":
                    _set_entry(t, "offset", str(size + 4096))
                elif kind == "length_too_big":
                    _set_entry(t, "length", str(size * 2 + 7))
                elif kind == "bad_offset":
                    _set_entry(t, "offset", bad_offset)
                elif kind == "bad_length":
                    _set_entry(t, "length", bad_length)
                elif kind == "missing_file":
                    _set_entry(t, "location", "no_such_file.data")
                elif kind == "location_dir":
                    _set_entry(t, "location", location_dir)
                elif kind == "location_is_model":
                    _set_entry(t, "location", IN_NAME)
                elif kind == "duplicate_key":
                    t.external_data.add(key="offset", value="8")
                elif kind == "empty_location":
                    _set_entry(t, "location", "")
                elif kind == "misaligned_offset":
                    off = int(_entry(t, "offset") or 0)
                    _set_entry(t, "offset", str(off + 1))

        if kind in ("dotdot", "absolute", "symlink_out"):
            target_dir = case_dir if kind == "dotdot" else case_dir / ("abs" if kind == "absolute" else "outside")
            target_dir.mkdir(exist_ok=True)
            shutil.copyfile(data, target_dir / DATA_NAME)
        if kind == "symlink_out":
            os.symlink(os.path.join("..", "outside", DATA_NAME), in_dir / "link.data")
        if kind == "symlink_in":
            os.symlink(DATA_NAME, in_dir / "link.data")
        if kind == "location_dir":
            (in_dir / "subdir").mkdir(exist_ok=True)
        if kind == "truncate_file":
            with open(data, "r+b") as f:
                f.truncate(int(size * keep_share))
            return
        _rewrite(in_dir, edit)

    mutant.file_ops.append(op)
    mutant.escapes = mutant.escapes or kind in ("dotdot", "absolute", "symlink_out")
    return (f"external data: {kind}" + (f" {detail}" if detail else "")
            + (" (every tensor)" if all_tensors and kind != "truncate_file" else ""))


MUTATION_KINDS = (*GRAPH_MUTATIONS, "external", "external")  # external data weighs double


def make_mutant(seed: int, index: int) -> Mutant:
    """The mutant number `index` of `seed`: deterministic."""
    rng = np.random.default_rng([seed, index])
    all_bases = bases()
    kind = _pick(rng, MUTATION_KINDS)
    candidates = [b for b in all_bases if b.external] if kind == "external" else all_bases
    base = _pick(rng, candidates)
    model = onnx.ModelProto()
    model.CopyFrom(base.model)
    mutant = Mutant(seed, index, base.name, base.external, model)
    count = 1 if rng.random() < 0.8 else 2
    kinds = [kind] + [(_pick(rng, MUTATION_KINDS) if base.external else _pick(rng, GRAPH_MUTATIONS)) for _ in range(count - 1)]
    for k in kinds:
        for _attempt in range(20):
            try:
                if k == "external":
                    desc = _external_mutation(rng, mutant)
                else:
                    trial = onnx.ModelProto()
                    trial.CopyFrom(mutant.model)
                    desc = GRAPH_MUTATIONS[k](rng, trial)
                    mutant.model = trial
                break
            except Skip:
                k = _pick(rng, GRAPH_MUTATIONS)
        else:
            continue
        mutant.kinds.append(k)
        mutant.mutations.append(desc)
    return mutant


def write_mutant(mutant: Mutant, case_dir: Path) -> Path:
    in_dir = case_dir / "in"
    in_dir.mkdir(parents=True)
    path = in_dir / IN_NAME
    if mutant.external:
        model = onnx.ModelProto()
        model.CopyFrom(mutant.model)
        # Tensors whose mutated dims or types make them unsaveable stay inline.
        onnx.external_data_helper.convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location=DATA_NAME, size_threshold=1024)
        onnx.external_data_helper.write_external_data_tensors(model, str(in_dir))
        path.write_bytes(model.SerializeToString())
    else:
        path.write_bytes(mutant.model.SerializeToString())
    for op in mutant.file_ops:
        op(in_dir, case_dir)
    return path


# ---------------------------------------------------------------------------------------------
# Checks


def file_digests(root: Path, skip: Path | None = None) -> dict[str, str]:
    """relative path -> sha256 (or 'symlink:TARGET', 'dir') of every entry under root."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dp = Path(dirpath)
        if skip is not None and (dp == skip or skip in dp.parents):
            dirnames[:] = []
            continue
        for name in filenames + [d for d in dirnames if (dp / d).is_symlink()]:
            p = dp / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "symlink:" + os.readlink(p)
            else:
                try:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError as e:
                    out[rel] = f"unreadable:{e.errno}"
        for d in dirnames:
            if not (dp / d).is_symlink() and (skip is None or dp / d != skip):
                out.setdefault(str((dp / d).relative_to(root)) + "/", "dir")
    return out


def _data_locations(path: Path) -> set[str]:
    """The external data files a written model names (plain names in its directory only)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return set()
    names = {e.value for t in _all_model_tensors(model) if t.data_location == TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    return {n for n in names if n and "/" not in n and "\\" not in n and n not in (".", "..")}


def _all_model_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    for g in _graphs(model.graph):
        yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t


def model_valid(path: Path) -> tuple[bool, bool, str]:
    """(passes onnx.checker full check, loads in onnxruntime CPU, first error line)."""
    import onnxruntime as ort

    checker_ok, ort_ok, error = True, True, ""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # the checker raises several types
        checker_ok, error = False, f"checker: {type(e).__name__}: {_first_line(str(e))}"
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        ort_ok = False
        error = error or f"onnxruntime: {type(e).__name__}: {_first_line(str(e))}"
    return checker_ok, ort_ok, error


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


# ---------------------------------------------------------------------------------------------
# Driver


class _Capture(io.StringIO):
    """One stream object for the whole run (logging handlers keep a reference to it)."""

    def isatty(self) -> bool:
        return False

    def take(self) -> str:
        text = self.getvalue()
        self.seek(0)
        self.truncate(0)
        return text


def run_cli(args: list[str], err: _Capture, out: _Capture) -> tuple[int, str, str, bool]:
    """Run `rlx-amp ARGS` in this process: (exit code, stderr, stdout, uncaught exception)."""
    from rlx_onnx_amp.cli import main

    err.take()
    out.take()
    code, uncaught = 0, False
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        main.main(args=args, prog_name="rlx-amp", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # an exception that escapes the CLI is what we look for
        traceback.print_exc(file=err)
        code, uncaught = EXIT_INTERNAL, True
    finally:
        sys.stdout, sys.stderr = saved
    return code, err.take(), out.take(), uncaught


def run_mutant(seed: int, index: int, workdir: Path, verify_share: float, err: _Capture, out: _Capture,
               check_inputs: bool = False) -> dict[str, Any]:
    mutant = make_mutant(seed, index)
    policy = POLICIES[index % len(POLICIES)]
    do_verify = np.random.default_rng([seed, index, 1]).random() < verify_share
    case_dir = workdir / str(index)
    if case_dir.exists():
        shutil.rmtree(case_dir)
    record: dict[str, Any] = {
        "seed": seed, "index": index, "base": mutant.base, "mutation": mutant.description, "kinds": mutant.kinds,
        "policy": " ".join(policy[1:]), "verify": do_verify, "escapes": mutant.escapes,
    }
    try:
        in_path = write_mutant(mutant, case_dir)
    except Exception as e:  # a mutant that cannot be written is the fuzzer's problem, not the CLI's
        record.update(exit=None, skipped=f"cannot write mutant: {type(e).__name__}: {_first_line(str(e))}")
        return record
    out_dir = case_dir / "out"
    out_dir.mkdir()
    before = file_digests(case_dir, skip=out_dir)
    args = [str(in_path), *policy, "-o", str(out_dir / OUT_NAME), "-q"]
    if do_verify:
        args += ["--verify", "--provider", "cpu"]
    record["args"] = args
    cwd = os.getcwd()
    os.chdir(case_dir)  # a relative stray file lands in the case directory, where it is seen
    started = time.perf_counter()
    try:
        code, stderr, stdout, uncaught = run_cli(args, err, out)
    finally:
        os.chdir(cwd)
    record["seconds"] = round(time.perf_counter() - started, 3)
    after = file_digests(case_dir, skip=out_dir)
    outputs = sorted(os.listdir(out_dir))
    allowed = {OUT_NAME} | (_data_locations(out_dir / OUT_NAME) if OUT_NAME in outputs else set())
    record.update(
        exit=code, uncaught=uncaught, stderr=stderr[-4000:], stdout_len=len(stdout),
        traceback="Traceback" in stderr,
        inputs_intact=all(after.get(k) == v for k, v in before.items()),
        changed_inputs=sorted(k for k, v in before.items() if after.get(k) != v),
        stray_files=sorted(set(after) - set(before)) + [f"out/{n}" for n in outputs if n not in allowed],
        out_files=outputs,
    )
    written = code in (0, 1, EXIT_UNVERIFIED)  # the exits that write the model
    if check_inputs or (written and not (out_dir / OUT_NAME).is_file()):
        checker_ok, ort_ok, problem = model_valid(in_path)
        record.update(in_checker=checker_ok, in_ort=ort_ok, in_error=problem, inputs_checked=True)
    if written:
        if (out_dir / OUT_NAME).is_file():
            checker_ok, ort_ok, problem = model_valid(out_dir / OUT_NAME)
            record.update(out_checker=checker_ok, out_ort=ort_ok, out_error=problem)
            if not (checker_ok and ort_ok) and "in_checker" not in record:
                checker_ok, ort_ok, problem = model_valid(in_path)
                record.update(in_checker=checker_ok, in_ort=ort_ok, in_error=problem)
        else:
            record.update(out_checker=False, out_ort=False, out_error=f"exit {code} but no output file")
    return record


def check_record(r: dict[str, Any]) -> list[str]:
    """What is wrong with one record, by the contract: empty when nothing is."""
    if r.get("skipped"):
        return []
    problems = []
    code = r["exit"]
    if code == EXIT_INTERNAL:
        problems.append("exit 70 (internal error)" + (" from an uncaught exception" if r.get("uncaught") else ""))
    elif code not in DOCUMENTED_EXIT_CODES:
        problems.append(f"undocumented exit code {code}")
    elif code == EXIT_UNVERIFIED and r.get("verify"):
        problems.append("exit 4 with --verify (a reference that cannot run is an error then)")
    if r.get("traceback") and code != EXIT_INTERNAL:
        problems.append("traceback on stderr")
    lines = [ln for ln in r.get("stderr", "").splitlines() if ln.strip()]
    if code in (2, 3) and (len(lines) != 1 or not lines[0].startswith("rlx-amp: error:")):
        problems.append(f"stderr is not one 'rlx-amp: error:' line ({len(lines)} lines)")
    unverified = [ln for ln in lines if "written, not verified" in ln]
    if code == EXIT_UNVERIFIED and (len(unverified) != 1 or not r.get("out_files")):
        problems.append("exit 4 without its one 'written, not verified' line and the model written")
    if code == 2 and r.get("out_files"):
        problems.append(f"exit 2 but wrote {r['out_files']}")
    if not r.get("inputs_intact", True):
        problems.append(f"input files changed: {r.get('changed_inputs')}")
    if r.get("stray_files"):
        problems.append(f"stray files: {r['stray_files']}")
    if code == 0 and r.get("escapes"):
        problems.append("exit 0 on a model whose external data lies outside its directory")
    written = code in (0, 1, EXIT_UNVERIFIED)
    if written and not (r.get("out_checker") and r.get("out_ort")) and r.get("in_checker") and r.get("in_ort"):
        problems.append(f"valid input, invalid exit-{code} output ({r.get('out_error')})")
    return problems


def first_error_line(r: dict[str, Any], generic: bool = False) -> str:
    """The error line, or for a traceback its last frame and exception line; for an exit 0
    with an invalid output, the output's error. `generic`: with the case directory as K."""
    line = _error_line(r)
    if generic:
        line = line.replace(f"/{r['index']}/", "/K/")
    return line


def _error_line(r: dict[str, Any]) -> str:
    if r.get("exit") == 0 and r.get("out_error"):
        return "output: " + r["out_error"]
    lines = [ln for ln in r.get("stderr", "").splitlines() if ln.strip()]
    if r.get("traceback"):
        frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
        ours = [f for f in frames if "rlx_onnx_amp" in f]
        frame = (ours or frames or ["?"])[-1]
        frame = frame.replace(str(ROOT) + os.sep, "")
        exc = next((ln for ln in reversed(lines) if not ln.startswith(" ") and not ln.startswith("rlx-amp: internal")
                    and not ln.startswith("Traceback")), "")
        return f"{frame} | {exc[:200]}"
    return lines[0][:300] if lines else ""


def reproduce_command(r: dict[str, Any]) -> str:
    return f"python3 -m tools.fuzz_mutants --seed {r['seed']} --index {r['index']} --workdir /tmp/fuzz_repro --keep" + (
        " --verify-share 1" if r.get("verify") else "")


def describe_failure(r: dict[str, Any], problems: list[str]) -> str:
    return (f"seed {r['seed']} index {r['index']} [{r['base']}; {r['mutation']}; {r.get('policy')}"
            f"{'; --verify' if r.get('verify') else ''}] exit {r.get('exit')}: {'; '.join(problems)}\n"
            f"    stderr: {first_error_line(r)}\n    repro: {reproduce_command(r)}")


def summarize(records: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    ran = [r for r in records if not r.get("skipped")]
    print(f"\n{len(records)} mutants ({len(records) - len(ran)} skipped), "
          f"{sum(r.get('seconds', 0) for r in ran):.1f} s in the CLI", file=out)
    codes = collections.Counter(r["exit"] for r in ran)
    print("\nexit code  mutants", file=out)
    for code, n in sorted(codes.items(), key=lambda kv: (kv[0] is None, kv[0])):
        print(f"{code!s:>9}  {n:7d}", file=out)
    by_kind: dict[str, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
    failures: collections.Counter[str] = collections.Counter()
    for r in ran:
        kind = r["kinds"][0] if r["kinds"] else "none"
        by_kind[kind][r["exit"]] += 1
        if check_record(r):
            failures[kind] += 1
    shown = sorted(c for c in codes if c is not None)
    header = "kind            " + "".join(f"{'exit ' + str(c):>9}" for c in shown) + "  failures"
    print("\n" + header, file=out)
    for kind in sorted(by_kind):
        print(f"{kind:16}" + "".join(f"{by_kind[kind].get(c, 0):9d}" for c in shown) + f"  {failures[kind]:8d}", file=out)
    valid_in = [r for r in ran if r.get("exit") == 0 and r.get("out_checker") and r.get("out_ort")]
    print(f"\nexit 0 with an output that passes onnx.checker (full) and loads in onnxruntime: {len(valid_in)}", file=out)
    checked = [r for r in ran if "in_checker" in r and "in_ort" in r]
    if any(r.get("inputs_checked") for r in ran):
        valid = [r for r in checked if r["in_checker"] and r["in_ort"]]
        print(f"inputs that pass onnx.checker (full) and load in onnxruntime: {len(valid)} of {len(ran)} "
              f"(exit codes: {dict(sorted(collections.Counter(r['exit'] for r in valid).items()))})", file=out)
        refused = collections.Counter((r["kinds"][0], first_error_line(r, generic=True)[:140]) for r in valid if r["exit"] == 2)
        if refused:
            print("valid inputs refused with exit 2:", file=out)
            for (kind, line), n in refused.most_common():
                print(f"  {n:4d} x {kind}: {line}", file=out)
    bad = [(r, p) for r in ran if (p := check_record(r))]
    print(f"failures: {len(bad)}", file=out)
    classes: dict[tuple[str, Any, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r, p in bad:
        line = first_error_line(r, generic=True)
        classes[(r["kinds"][0] if r["kinds"] else "none", r["exit"], p[0].split(" (")[0].split(":")[0], line)].append(r)
    for (kind, code, problem, line), rs in sorted(classes.items(), key=lambda kv: -len(kv[1])):
        input_states = {f"{r.get('in_checker')}/{r.get('in_ort')}" for r in rs}
        print(f"  {len(rs):4d} x {kind} exit {code}: {problem} [input checker/ort: {', '.join(sorted(input_states))}]\n"
              f"         {line}\n         e.g. {reproduce_command(rs[0])}", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tools.fuzz_mutants", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="First mutant index.")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--index", type=int, action="append", help="Run only this mutant (repeatable).")
    p.add_argument("--workdir", required=True)
    p.add_argument("--jsonl", help="Append one JSON line per mutant here (default: WORKDIR/records.jsonl).")
    p.add_argument("--verify-share", type=float, default=0.1, help="Share of mutants converted with --verify.")
    p.add_argument("--keep", action="store_true", help="Keep each mutant's directory (default: removed after it ran).")
    p.add_argument("--summary", action="store_true", help="Print a summary table at the end.")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="Per-mutant limit in seconds, a hang guard: past it, dump every stack and exit 1.")
    p.add_argument("--strict", action="store_true", help="Exit 1 when a mutant breaks the contract.")
    p.add_argument("--describe", action="store_true", help="Only print the mutants (no CLI runs).")
    p.add_argument("--check-inputs", action="store_true",
                   help="Check every input with onnx.checker and onnxruntime (by default only where the contract needs it).")
    a = p.parse_args(argv)

    indices = a.index if a.index else list(range(a.start, a.start + a.count))
    if a.describe:
        for k in indices:
            m = make_mutant(a.seed, k)
            print(f"{k}: {m.base}: {m.description}")
        return 0
    workdir = Path(a.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl = Path(a.jsonl) if a.jsonl else workdir / "records.jsonl"
    assert sys.__stderr__ is not None  # the process's own stderr: the run captures sys.stderr
    faulthandler.enable(file=sys.__stderr__)
    err, out = _Capture(), _Capture()
    records = []
    with open(jsonl, "a", encoding="utf-8") as sink:
        for k in indices:
            print(f"[fuzz] seed {a.seed} index {k}", file=sys.__stderr__, flush=True)
            faulthandler.dump_traceback_later(a.timeout, exit=True, file=sys.__stderr__)
            try:
                record = run_mutant(a.seed, k, workdir, a.verify_share, err, out, check_inputs=a.check_inputs)
            finally:
                faulthandler.cancel_dump_traceback_later()
            records.append(record)
            sink.write(json.dumps(record, default=str) + "\n")
            sink.flush()
            if a.index:
                print(json.dumps(record, indent=2, default=str))
                problems = check_record(record)
                print("OK" if not problems else describe_failure(record, problems))
            if not a.keep:
                shutil.rmtree(workdir / str(k), ignore_errors=True)
    if a.summary:
        summarize(records)
    return 1 if a.strict and any(check_record(r) for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())

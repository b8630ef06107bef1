"""Which onnxruntime kernels exist for an op in f16/bf16, per target execution provider.

An ONNX schema may admit bfloat16 where onnxruntime has no kernel for it: a bf16 `Add` passes
`onnx.checker` and then fails to load with NOT_IMPLEMENTED. The converter therefore asks, for
the provider the model is meant for, whether a kernel takes the node's low-precision type
variables, and keeps the node in f32 when none does.

Where the tables come from (never a hand list):
- CPU: the installed onnxruntime's own kernel registry (`get_all_opkernel_def`).
- CUDA: the installed registry when it lists CUDA kernels (onnxruntime-gpu); otherwise a
  snapshot of onnxruntime's generated kernel table (`docs/OperatorKernels.md`), shipped in
  `data/onnxruntime_cuda_kernels.json` with the commit it was read at.

How onnxruntime places a node (and so what "loads" means here):
- A node goes to the target provider when that provider has a kernel for its op, version and
  types; otherwise it falls back to the CPU provider.
- On the CPU provider, a float16 node without an f16 kernel still loads: onnxruntime inserts
  Casts and runs it in f32. There is no such fallback for bfloat16, nor for an op whose
  output type an attribute gives (HannWindow's `output_datatype`): those need a real kernel.
- On CUDA, a low-precision node whose op has a CUDA kernel in f32 only is kept in f32, so it
  stays on the GPU instead of falling back to the CPU.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

from rlx_onnx_amp.precision import PRECISIONS, Precision

__all__ = ["Kernel", "KernelTable", "Target", "kernel_block", "kernel_table"]

logger = logging.getLogger(__name__)

_OPEN = 2**31 - 1  # onnxruntime's "no upper bound" for a kernel's version range
#: The element types the kernel table records: ours, and double (which no policy produces).
_FLOAT_NAMES = frozenset(info.onnx_name for info in PRECISIONS.values()) | {"double"}


class Target(enum.Enum):
    """The execution provider a converted model is meant to load on."""

    CPU = "cpu"
    CUDA = "cuda"

    @property
    def provider(self) -> str:
        return _PROVIDERS[self]


_PROVIDERS = {Target.CPU: "CPUExecutionProvider", Target.CUDA: "CUDAExecutionProvider"}


@dataclass(frozen=True)
class Kernel:
    """One registered kernel: the op versions it serves and, per type variable, the float
    element types it takes (`float`, `float16`, `bfloat16`, `double`)."""

    since: int
    until: int
    types: Mapping[str, frozenset[str]]

    def serves(self, version: int) -> bool:
        return self.since <= version <= self.until

    def takes(self, variables: Iterable[str], type_name: str, others: Iterable[tuple[str, str]] = ()) -> bool:
        """Whether it takes `variables` at `type_name` while the float variables `others` keep
        their types (variable, type name): kernels are registered per combination (OneHot
        has a bf16 `values` kernel only for integer `indices`). A variable the kernel does not
        constrain takes any type."""
        types = self.types
        return all(type_name in types[v] for v in variables if v in types) and all(
            name in types[v] for v, name in others if v in types
        )


@dataclass(frozen=True)
class KernelTable:
    provider: str
    source: str  # where the table was read, for the report and the logs
    kernels: Mapping[tuple[str, str], tuple[Kernel, ...]]

    def serving(self, domain: str, op: str, version: int) -> tuple[Kernel, ...]:
        return tuple(k for k in self.kernels.get((domain, op), ()) if k.serves(version))


def _float_names(type_strs: Iterable[str]) -> frozenset[str]:
    names = (t[len("tensor(") : -1] for t in type_strs if t.startswith("tensor("))
    return frozenset(n for n in names if n in _FLOAT_NAMES)


def _from_registry(provider: str) -> KernelTable | None:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: dict[tuple[str, str], list[Kernel]] = {}
    for k in ort_c.get_all_opkernel_def():
        if k.provider != provider:
            continue
        since, until = k.version_range
        types = {var: _float_names(strs) for var, strs in k.type_constraints.items()}
        table.setdefault((k.domain, k.op_name), []).append(Kernel(since, until, types))
    if not table:
        return None
    import onnxruntime

    return KernelTable(
        provider, f"onnxruntime {onnxruntime.__version__} kernel registry", {key: tuple(v) for key, v in table.items()}
    )


def _from_snapshot(provider: str) -> KernelTable:
    data = json.loads(resources.files("rlx_onnx_amp.data").joinpath("onnxruntime_cuda_kernels.json").read_text())
    assert data["provider"] == provider
    table: dict[tuple[str, str], list[Kernel]] = {}
    for row in data["kernels"]:
        until = _OPEN if row["until"] is None else row["until"]
        types = {var: frozenset(names) & _FLOAT_NAMES for var, names in row["types"].items()}
        table.setdefault((row["domain"], row["op"]), []).append(Kernel(row["since"], until, types))
    src = data["source"]
    return KernelTable(
        provider, f"{src['repo']} {src['path']} at {src['commit'][:12]}", {key: tuple(v) for key, v in table.items()}
    )


@functools.cache
def kernel_table(target: Target) -> KernelTable:
    """The kernel table for `target`: the installed registry if it has that provider's
    kernels, else (CUDA only) the shipped snapshot."""
    live = _from_registry(target.provider)
    if live is not None:
        return live
    if target is Target.CPU:  # pragma: no cover - every onnxruntime build has CPU kernels
        raise RuntimeError("onnxruntime lists no CPU kernels")
    table = _from_snapshot(target.provider)
    logger.debug("kernel table for %s: %s", target.provider, table.source)
    return table


def _takes(
    table: KernelTable,
    domain: str,
    op: str,
    version: int,
    variables: tuple[str, ...],
    precision: Precision,
    others: tuple[tuple[str, str], ...],
) -> bool | None:
    """Whether a kernel of `table` takes `variables` in `precision` beside `others`; None: no kernel at all."""
    serving = table.serving(domain, op, version)
    if not serving:
        return None
    return any(k.takes(variables, precision.info.onnx_name, others) for k in serving)


@functools.lru_cache(maxsize=4096)
def kernel_block(
    target: Target,
    precision: Precision,
    domain: str,
    op: str,
    version: int,
    variables: tuple[str, ...],
    others: tuple[tuple[str, str], ...] = (),
    typed_by_attribute: bool = False,
) -> str | None:
    """Why a node (`op` of `domain`, schema `version`) whose type `variables` would run in
    `precision`, its other float variables keeping their types (`others`: variable, ONNX type
    name), cannot on `target`; None when it can. `typed_by_attribute`: an attribute gives its
    output type (HannWindow's `output_datatype`), which onnxruntime's f16 fallback cannot
    retype, so where the op has CPU kernels one must take the low type."""
    label = f"{op}-{version}"
    if target is Target.CUDA:
        on_target = _takes(kernel_table(Target.CUDA), domain, op, version, variables, precision, others)
        if on_target is True:
            return None
        if on_target is False:
            return f"kernel: no {precision.value} {label} kernel on CUDAExecutionProvider"
    # The node runs on the CPU provider.
    if precision is Precision.F16 and not typed_by_attribute:
        return None  # onnxruntime casts f16 nodes without an f16 CPU kernel to f32 itself
    on_cpu = _takes(kernel_table(Target.CPU), domain, op, version, variables, precision, others)
    if on_cpu or (on_cpu is None and precision is Precision.F16):
        return None  # (no CPU kernel at all: a function, such as Bernoulli, that onnxruntime expands)
    where = "CPUExecutionProvider" if target is Target.CPU else "CUDAExecutionProvider or its CPU fallback"
    return f"kernel: no {precision.value} {label} kernel on {where}"

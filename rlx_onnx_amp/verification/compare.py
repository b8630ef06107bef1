"""Sessions and what a candidate is compared as, for the verification (`core.Verifier`).

Sessions on a reference and on a candidate, or on the candidate's emulation when the provider
cannot run its precision faithfully (`open_compared`); feeds rounded as the candidate holds
them; one run per input set (`run_each`). Nothing here writes outside a private scratch
directory (`Scratch`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from rlx_onnx_amp.errors import InputError, ModelRunError
from rlx_onnx_amp.files import ScratchDir
from rlx_onnx_amp.precision import PRECISIONS, Precision, precision_of_elem_type
from rlx_onnx_amp.sessions import OrtSession, providers_for
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource, external_locations, is_external, narrow
from rlx_onnx_amp.types import all_tensors
from rlx_onnx_amp.verification.emulate import emulate, low_precision_values
from rlx_onnx_amp.verification.options import (
    PROVIDERS,
    VerifyOptions,
    resolve_provider,
    session_thread_count,
    session_threads,
)

__all__ = [
    "PROVIDERS",
    "Compared",
    "Progress",
    "Scratch",
    "Session",
    "VerifyOptions",
    "emulated_model",
    "emulated_without_loading",
    "emulation_reason",
    "open_compared",
    "resolve_provider",
    "run_each",
    "session_threads",
    "typed_feeds",
]

logger = logging.getLogger(__name__)

_F32 = onnx.TensorProto.FLOAT


class Session:
    """An onnxruntime session on a model file (`sessions.OrtSession`), its feeds given the model's
    input types. `external` maps external data locations the model reads to files elsewhere:
    onnxruntime gets their contents from memory (mapped, not copied), since it reads external
    data files only from the model's own directory. `role` says what the model is to this run
    ("the input", "a candidate"), for a supervisor's notes."""

    def __init__(
        self, model: str, provider: str, label: str, external: Mapping[str, Path] | None = None,
        role: str | None = None,
    ) -> None:
        buffers = {location: _map_file(path) for location, path in (external or {}).items()}
        try:
            # Prepacking copies every MatMul weight into the CPU kernels' layout when the session is
            # created (5.7 s of a 3.4 GB model's 5.7 s start-up); a verification runs each model on a
            # few input sets only, where unpacked weights, read from the mapped file, cost far less.
            self.ort = OrtSession(
                model, PROVIDERS[provider], label, role=role, shown=provider, threads=session_thread_count(),
                prepacking=False, external=buffers,
            )
        finally:
            del buffers
        self.session = self.ort.session  # onnxruntime's own, for what it tells (its providers, its options)
        self.label = label
        self.inputs = {i.name: i.type for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        typed = {k: _as_input_type(v, self.inputs.get(k, "")) for k, v in feeds.items() if k in self.inputs}
        names = list(names or self.output_names)
        return dict(zip(names, self.ort.run(names, typed)))


def _cannot_fall_back(provider: str) -> bool:
    """Whether a session on `provider` runs on it or not at all (no provider behind it to fall
    back to, which `sessions.OrtSession` refuses)."""
    return len(providers_for(PROVIDERS[provider])) == 1


def typed_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feeds` in the types of `model`'s float inputs (an f16 input takes f16 values), for a
    session opened where the model's input types are not known (`timing.measure_latency`)."""
    wanted = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    by_elem = {info.elem_type: info.type_str for info in PRECISIONS.values()}
    return {k: _as_input_type(v, by_elem.get(wanted.get(k, 0), "")) for k, v in feeds.items()}


def _map_file(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


#: onnxruntime's input type string -> the numpy dtype a feed needs (f16 inputs kept as f16).
_FEED_DTYPES = {info.type_str: info.np_dtype for info in PRECISIONS.values() if info.np_dtype.kind == "f"}


def _as_input_type(value: np.ndarray, ort_type: str) -> np.ndarray:
    dtype = _FEED_DTYPES.get(ort_type)
    if dtype is not None and dtype != np.float32 and value.dtype != dtype:
        return value.astype(dtype)
    if ort_type == "tensor(float)" and value.dtype != np.float32 and value.dtype.kind == "f":
        return value.astype(np.float32)
    return value


def _lowest_precision(low: Mapping[str, int]) -> Precision:
    kinds = {precision_of_elem_type(t) for t in low.values()}
    if Precision.BF16 in kinds:
        return Precision.BF16
    if Precision.F16 in kinds:
        return Precision.F16
    return Precision.F32


#: progress(stage, done, total) for long steps: "rounding weights", "running".
Progress = Callable[[str, int, int], None]


def emulation_reason(emulate: bool | None, provider: str, precision: Precision) -> str | None:
    """Why a candidate that loads is verified by emulation; None when it runs as it is."""
    if precision is Precision.F32 or emulate is False:
        return None
    if emulate:
        return "asked with --emulate"
    return "the CPU provider computes most f16 ops in f32 and has no bf16 arithmetic" if provider == "cpu" else None


def emulated_without_loading(cand_model: onnx.ModelProto, provider: str, emulate_option: bool | None) -> bool:
    """Whether `open_compared` on a file that already ran (`ran`) emulates it without loading it:
    its judgement holds no session on the file itself."""
    reason = emulation_reason(emulate_option, provider, _lowest_precision(low_precision_values(cand_model)))
    return reason is not None and _cannot_fall_back(provider)


def _emulation_fallback(error: ModelRunError, emulate: bool | None, provider: str, precision: Precision) -> str:
    """Why a candidate the provider cannot load is verified by emulation instead; re-raises
    `error` when emulation is switched off or the candidate holds nothing in low precision."""
    if emulate is False or precision is Precision.F32:
        raise error
    return f"{provider} cannot run the candidate: {error}"


def _round_feeds(feeds: Mapping[str, np.ndarray], low: Mapping[str, int]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in feeds.items():
        precision = precision_of_elem_type(low.get(name, _F32))
        if precision is not None and precision is not Precision.F32 and value.dtype.kind == "f":
            value = narrow(value, precision)[0].astype(np.float32)
        out[name] = value
    return out


class Scratch(ScratchDir):
    """A private temporary directory (under TMPDIR) for the models a verification derives
    (emulated candidates, models with exposed intermediates) and their rounded weights. Nothing
    goes into the user's directories; everything is removed on exit, which the CLI reaches on
    errors, Ctrl-C and SIGTERM alike."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self._count = 0
        self._workspaces: dict[str, Path] = {}

    def __enter__(self) -> Scratch:
        return self

    def file(self, name: str) -> Path:
        """A fresh path in the scratch directory."""
        self._count += 1
        return self.dir / f"{self._count}-{name}"

    def workspace(self, base_dir: Path | None) -> Path:
        """The scratch subdirectory for models derived from the model in `base_dir`."""
        key = str(Path(base_dir).resolve()) if base_dir is not None else ""
        if key not in self._workspaces:
            self._workspaces[key] = self.dir / f"ws{len(self._workspaces)}"
            self._workspaces[key].mkdir()
        return self._workspaces[key]

    def session(self, model: onnx.ModelProto, base_dir: Path | None, provider: str, label: str) -> Session:
        """A session on `model`, saved in the workspace of `base_dir`, the directory of the model
        it derives from. onnxruntime reads external data only from a model's own directory:
        the data files in `base_dir` (checked to lie inside it) are hard-linked into the
        workspace, or, where a link cannot be made (another file system), handed over mapped
        from memory. Links cost no copy and no memory; a mapped file counts in the resident
        set while onnxruntime copies it."""
        ws = self.workspace(base_dir)
        path = ws / f"{self.file('model.onnx').name}"
        try:
            onnx.save(model, str(path))
        except OSError as e:
            raise InputError(
                f"{self.dir}: cannot write a temporary model ({e.strerror}); set TMPDIR to a directory with space"
            ) from None
        files: dict[str, Path] = {}
        source = WeightSource(base_dir, label)
        unlinked = False
        for tensor in all_tensors(model):
            if not is_external(tensor):
                continue
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if location in files:
                continue
            own = ws / location
            if not own.is_file():
                original = source.external_path(tensor)
                try:
                    own.parent.mkdir(parents=True, exist_ok=True)
                    os.link(original, own)
                except OSError:
                    unlinked = True
                    files[location] = original
                    continue
            files[location] = own
        # onnxruntime takes either every external file from memory or none.
        return Session(str(path), provider, label, files if unlinked else None)


_EMULATED_DATA = "rlx-amp-emulated.data"


def emulated_model(
    ref_model: onnx.ModelProto,
    ref_dir: Path | None,
    cand_model: onnx.ModelProto,
    scratch: Scratch,
    progress: Progress | None = None,
    label: str = "reference",
    cand_dir: Path | None = None,
) -> onnx.ModelProto:
    """The reference with every value the candidate holds in low precision rounded to it;
    rounded external weights go to `scratch`, the rest still reads the reference's data.
    With `cand_dir` (where the candidate's data is), or when its weights are all inline, low
    weights are the candidate's own."""
    source = WeightSource(ref_dir, label)
    sink: WeightSink = WeightSink()
    locations = external_locations(all_tensors(ref_model))
    if locations:  # rounded weights go to the scratch directory, the rest stays where it is
        name = _EMULATED_DATA
        while name in locations:
            name = "_" + name
        sink = ExternalSink(scratch.workspace(ref_dir) / name, name, scratch=True)
    try:
        step = (lambda done, total: progress("rounding weights", done, total)) if progress is not None else None
        # The candidate's own low weights: from its directory, or inline (repair's candidates).
        readable = cand_dir is not None or not external_locations(all_tensors(cand_model))
        candidate = WeightSource(cand_dir, "candidate") if readable else None
        model, rounded = emulate(ref_model, cand_model, source, sink, progress=step, candidate_source=candidate)
    finally:
        sink.close()
    logger.info("emulated candidate: %d values rounded", rounded)
    return model


@dataclass
class Compared:
    """What a reference is compared against: the candidate itself, or its emulation."""

    model: onnx.ModelProto  # the model the session runs (the emulated one when emulated)
    base_dir: Path | None  # where that model's external data is read from
    session: Session | None  # None once released (`release`)
    precision: Precision  # the lowest precision the candidate holds
    low: Mapping[str, int]  # value -> low element type in the candidate
    emulated: bool
    reason: str | None  # why it is emulated
    loaded: bool  # whether the candidate itself loaded on the provider

    def could_not_load(self, provider: str, error: str) -> None:
        """The candidate file, emulated without being loaded here, could not run on `provider` in
        the child that ran it: described as `open_compared` would with that error."""
        self.loaded = False
        self.reason = _emulation_fallback(ModelRunError(error), True, provider, self.precision)

    @property
    def feed_low(self) -> Mapping[str, int]:
        """Inputs the session must get rounded: an emulated candidate takes f32 feeds."""
        return self.low if self.emulated else {}

    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
        if self.session is None:
            raise RuntimeError("Compared.run after release()")
        return self.session.run(self.rounded(feeds) if self.emulated else feeds, names)

    def rounded(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`feeds` as a session on `model` must get them: rounded where an emulated candidate holds
        its inputs in low precision, else as they are."""
        return _round_feeds(feeds, self.feed_low)

    def release(self) -> None:
        """Free the onnxruntime session (its weights): what was compared stays described."""
        self.session = None


def open_compared(
    ref_model: onnx.ModelProto,
    ref_dir: Path | None,
    cand_model: onnx.ModelProto,
    cand_path: Path | None,
    provider: str,
    emulate_option: bool | None,
    scratch: Scratch,
    label: str,
    progress: Progress | None = None,
    cannot_run: str | None = None,
    ran: bool = False,
    emulated: onnx.ModelProto | None = None,
) -> Compared:
    """A session on the candidate (loaded from `cand_path` when given, else from scratch), or on
    its emulation when the provider cannot run it faithfully (see `emulation_reason`).
    `cannot_run`: why the candidate file is known not to run here (it crashed onnxruntime in a
    child process): it is not loaded in this one. `ran`: the file at `cand_path` already ran on
    `provider` (in a child process): where it is emulated anyway, it is not loaded again only to
    prove that it loads (onnxruntime's CPU session on an f16 graph grows faster than the graph:
    about 30 s for a 20,000-node chain). `emulated`: the emulation, where the caller built it
    already (`emulated_model`, while the written file ran in its child)."""
    low = low_precision_values(cand_model)
    precision = _lowest_precision(low)
    session: Session | None = None
    loaded = False
    try:
        if cannot_run is not None:
            raise ModelRunError(cannot_run)
        reason = emulation_reason(emulate_option, provider, precision)
        if reason is not None and ran and cand_path is not None and _cannot_fall_back(provider):
            pass  # emulated: the file that ran already is not loaded again only to be dropped
        elif cand_path is not None:
            session = Session(str(cand_path), provider, label, role="a candidate")
        else:
            session = scratch.session(cand_model, ref_dir, provider, label)
        loaded = True
    except ModelRunError as e:
        reason = _emulation_fallback(e, emulate_option, provider, precision)
    if reason is None:
        assert session is not None
        base = cand_path.parent if cand_path is not None else ref_dir
        return Compared(cand_model, base, session, precision, low, False, None, loaded)
    session = None  # free it first, so at most two sessions are held
    cand_dir = cand_path.parent if cand_path is not None else None
    model = emulated or emulated_model(ref_model, ref_dir, cand_model, scratch, progress, cand_dir=cand_dir)
    return Compared(
        model,
        ref_dir,
        scratch.session(model, ref_dir, provider, f"emulated {label}"),
        precision,
        low,
        True,
        reason,
        loaded,
    )


class Runner(Protocol):
    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]: ...


def run_each(
    runner: Runner,
    samples: Sequence[Mapping[str, np.ndarray]],
    names: Sequence[str],
    progress: Progress | None = None,
    stage: str = "running",
) -> list[dict[str, np.ndarray]]:
    """`names` from one session (`Session` or `Compared`) for every input set: the reference
    and the candidate run one after the other, never both held at once."""
    runs = []
    for k, feeds in enumerate(samples):
        if progress is not None and k == 0:
            progress(stage, 0, len(samples))
        runs.append({n: np.asarray(v) for n, v in runner.run(feeds, names).items()})
        if progress is not None:
            progress(stage, k + 1, len(samples))  # after the set ran, so the bar ends at 100%
    return runs

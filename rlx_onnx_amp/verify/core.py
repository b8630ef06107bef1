"""Verification: run a reference and a candidate on the same inputs and measure the drift."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from rlx_onnx_amp.api import load_model
from rlx_onnx_amp.errors import InputError, ModelRunError
from rlx_onnx_amp.files import OutputSet, RunPaths, ScratchDir
from rlx_onnx_amp.precision import PRECISIONS, Precision, precision_of_elem_type
from rlx_onnx_amp.tensors import ExternalSink, WeightSink, WeightSource, external_locations, is_external, narrow
from rlx_onnx_amp.types import all_tensors
from rlx_onnx_amp.verify.emulate import emulate, low_precision_values
from rlx_onnx_amp.verify.inputs import InputSpec, check_feeds, load_inputs, save_inputs, synthesize
from rlx_onnx_amp.verify.metrics import OutputDrift, Tolerance, compare_arrays

__all__ = ["PROVIDERS", "VerifyOptions", "VerifyReport", "resolve_provider", "verify"]

logger = logging.getLogger(__name__)

PROVIDERS: Mapping[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
_AUTO_ORDER = ("cuda", "coreml", "cpu")
_F32 = onnx.TensorProto.FLOAT


@dataclass
class VerifyOptions:
    provider: str = "auto"
    emulate: bool | None = None  # None: when the provider cannot run low precision faithfully
    inputs: str | None = None
    spec: InputSpec = field(default_factory=InputSpec)
    atol: dict[str, float] = field(default_factory=dict)  # "" is the default for every output
    rtol: dict[str, float] = field(default_factory=dict)
    min_cosine: dict[str, float] = field(default_factory=dict)
    localize: bool = False
    localize_top: int = 10
    save_inputs: str | None = None


@dataclass
class VerifyReport:
    reference: str
    candidate: str
    provider: str
    providers_used: list[str]
    emulated: bool
    emulation_reason: str | None
    candidate_loaded: bool
    precision: str
    atol: dict[str, float]
    rtol: dict[str, float]
    min_cosine: dict[str, float]
    seed: int
    samples: int
    inputs: dict[str, list[int]]
    outputs: list[OutputDrift]
    localized: list[dict[str, Any]] | None = None

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "provider": self.provider,
            "providers_used": self.providers_used,
            "emulated": self.emulated,
            "emulation_reason": self.emulation_reason,
            "candidate_loaded": self.candidate_loaded,
            "precision": self.precision,
            "criterion": "no new NaN/Inf; max_abs <= atol + rtol * max(|reference|); cosine >= min_cosine where the reference is not constant",
            "atol": self.atol,
            "rtol": self.rtol,
            "min_cosine": self.min_cosine,
            "seed": self.seed,
            "samples": self.samples,
            "inputs": self.inputs,
            "passed": self.passed,
            "outputs": [o.to_json() for o in self.outputs],
            "localized": self.localized,
        }


def resolve_provider(name: str) -> str:
    """The short name of the provider to use; an unavailable one is an error, never a fallback."""
    available = ort.get_available_providers()
    if name == "auto":
        return next(p for p in _AUTO_ORDER if PROVIDERS[p] in available)
    if name not in PROVIDERS:
        raise InputError(f"--provider: unknown provider {name!r} (known: auto, {', '.join(PROVIDERS)})")
    if PROVIDERS[name] not in available:
        raise InputError(f"--provider {name}: onnxruntime here has no {PROVIDERS[name]} (available: {', '.join(available)})")
    return name


class _Session:
    """An onnxruntime session on a model file. `external` maps external data locations the model
    reads to files elsewhere: onnxruntime gets their contents from memory (mapped, not copied),
    since it reads external data files only from the model's own directory."""

    def __init__(self, model: str, provider: str, label: str, external: Mapping[str, Path] | None = None) -> None:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        providers = [PROVIDERS[provider]] + (["CPUExecutionProvider"] if provider != "cpu" else [])
        buffers = [_map_file(path) for path in (external or {}).values()]
        if buffers:
            opts.add_external_initializers_from_files_in_memory(list(external or {}), buffers, [len(b) for b in buffers])
        try:
            self.session = ort.InferenceSession(model, opts, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several types
            raise ModelRunError(f"{label}: onnxruntime cannot load it on {provider} ({_first_line(e)})") from None
        finally:
            del buffers
        used = self.session.get_providers()
        if used[0] != PROVIDERS[provider]:
            raise InputError(f"{label}: onnxruntime fell back to {used[0]} instead of {PROVIDERS[provider]}")
        self.label = label
        self.inputs = {i.name: i.type for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        typed = {k: _as_input_type(v, self.inputs.get(k, "")) for k, v in feeds.items() if k in self.inputs}
        names = list(names or self.output_names)
        try:
            values = self.session.run(names, typed)
        except Exception as e:  # noqa: BLE001
            raise ModelRunError(f"{self.label}: onnxruntime cannot run it ({_first_line(e)})") from None
        return dict(zip(names, values))


def _map_file(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:400] if text else type(e).__name__


def _as_input_type(value: np.ndarray, ort_type: str) -> np.ndarray:
    if ort_type == "tensor(float16)" and value.dtype != np.float16:
        return value.astype(np.float16)
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


def _tolerance(name: str, precision: Precision, options: VerifyOptions) -> Tolerance:
    info = PRECISIONS[precision]
    return Tolerance(
        options.atol.get(name, options.atol.get("", info.atol)),
        options.rtol.get(name, options.rtol.get("", info.rtol)),
        options.min_cosine.get(name, options.min_cosine.get("", info.min_cosine)),
    )


#: progress(stage, done, total) for long steps: "rounding weights", "running".
Progress = Callable[[str, int, int], None]


def emulation_reason(emulate: bool | None, provider: str, precision: Precision) -> str | None:
    """Why a candidate that loads is verified by emulation; None when it runs as it is."""
    if precision is Precision.F32 or emulate is False:
        return None
    if emulate:
        return "asked with --emulate"
    return "the CPU provider computes most f16 ops in f32 and has no bf16 arithmetic" if provider == "cpu" else None


def emulation_fallback(error: ModelRunError, emulate: bool | None, provider: str, precision: Precision) -> str:
    """Why a candidate the provider cannot load is verified by emulation instead; re-raises
    `error` when emulation is switched off or the candidate holds nothing in low precision."""
    if emulate is False or precision is Precision.F32:
        raise error
    return f"{provider} cannot run the candidate: {error}"


def verify(reference: str | os.PathLike[str], candidate: str | os.PathLike[str], options: VerifyOptions | None = None,
           progress: Progress | None = None, *, candidate_label: str | None = None,
           outputs: OutputSet | None = None) -> VerifyReport:
    """Compare `candidate` against `reference` on the same inputs (see README, Verification).

    `candidate_label` names the candidate in the report (a staged model is verified before it
    is moved to its final path). `--save-inputs` is staged into `outputs` when given (the
    caller commits it); otherwise it is written when the verification ends.
    """
    options = options or VerifyOptions()
    ref_path, cand_path = Path(reference), Path(candidate)
    cand_label = candidate_label or str(cand_path)
    provider = resolve_provider(options.provider)
    ref_model = load_model(ref_path)
    cand_model = load_model(cand_path)
    _check_interfaces(ref_model, cand_model, ref_path, Path(cand_label))

    if options.inputs:
        samples = [load_inputs(options.inputs, ref_model)]
    else:
        samples = [synthesize(ref_model, options.spec, k) for k in range(max(options.spec.samples, 1))]
    check_feeds(ref_model, samples, f"--inputs {options.inputs}" if options.inputs else "synthesized inputs (--shape)")
    if options.save_inputs:
        if outputs is None:
            paths = RunPaths()
            for path, role in ((ref_path, "reference model"), (cand_path, "candidate model")):
                paths.read(path, role)
            paths.write(options.save_inputs, "--save-inputs file")
            paths.check()
            with OutputSet(paths.protected()) as own:
                save_inputs(own, options.save_inputs, samples)
                own.commit()
        else:
            save_inputs(outputs, options.save_inputs, samples)

    low = low_precision_values(cand_model)
    precision = _lowest_precision(low)
    ref_session = _Session(str(ref_path), provider, str(ref_path))

    emulated, candidate_loaded = False, False
    cand_session: _Session | None = None
    try:
        cand_session = _Session(str(cand_path), provider, cand_label)
        candidate_loaded = True
        reason = emulation_reason(options.emulate, provider, precision)
    except ModelRunError as e:
        reason = emulation_fallback(e, options.emulate, provider, precision)
    with Scratch("rlx-amp-verify-") as tmp:
        if reason is not None:
            emulated = True
            cand_session = None  # it loaded; free it so only two sessions are ever held
            compared_model, compared_dir = _emulated_model(ref_model, ref_path, cand_model, tmp, progress), ref_path.parent
            cand_session = tmp.session(compared_model, compared_dir, provider, f"emulated {cand_label}")
            feed_low: Mapping[str, int] = low
        else:
            assert cand_session is not None
            compared_model, compared_dir, feed_low = cand_model, cand_path.parent, {}
        results = _run_all(ref_session, cand_session, samples, feed_low, options, progress)
        localized = None
        if options.localize:
            from rlx_onnx_amp.verify.localize import localize

            localized = localize(
                ref_model, ref_path.parent, compared_model, compared_dir, samples[0], feed_low, provider, tmp,
                _tolerance("", precision, options), options.localize_top,
            )

    outputs = []
    for name, (ref_values, cand_values) in results.items():
        drift = compare_arrays(name, ref_values, cand_values, _tolerance(name, precision, options))
        outputs.append(drift)
    outputs.sort(key=lambda o: (o.passed, o.name))
    info = PRECISIONS[precision]
    return VerifyReport(
        reference=str(ref_path), candidate=cand_label, provider=provider,
        providers_used=ref_session.session.get_providers(), emulated=emulated, emulation_reason=reason if emulated else None,
        candidate_loaded=candidate_loaded, precision=precision.value,
        atol={"": options.atol.get("", info.atol), **{k: v for k, v in options.atol.items() if k}},
        rtol={"": options.rtol.get("", info.rtol), **{k: v for k, v in options.rtol.items() if k}},
        min_cosine={"": options.min_cosine.get("", info.min_cosine), **{k: v for k, v in options.min_cosine.items() if k}},
        seed=options.spec.seed, samples=len(samples),
        inputs={k: list(v.shape) for k, v in samples[0].items()}, outputs=outputs, localized=localized,
    )


def _check_interfaces(ref: onnx.ModelProto, cand: onnx.ModelProto, ref_path: Path, cand_path: Path) -> None:
    ref_in = {i.name for i in ref.graph.input} - {t.name for t in ref.graph.initializer}
    cand_in = {i.name for i in cand.graph.input} - {t.name for t in cand.graph.initializer}
    if ref_in != cand_in:
        raise InputError(f"{cand_path}: inputs {sorted(cand_in)} differ from {ref_path}'s {sorted(ref_in)}")
    ref_out = [o.name for o in ref.graph.output]
    if not ref_out:
        raise InputError(f"{ref_path}: the model has no outputs to compare")
    missing = set(ref_out) - {o.name for o in cand.graph.output}
    if missing:
        raise InputError(f"{cand_path}: lacks output(s) {', '.join(sorted(missing))} of {ref_path}")


def _round_feeds(feeds: Mapping[str, np.ndarray], low: Mapping[str, int]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in feeds.items():
        precision = precision_of_elem_type(low.get(name, _F32))
        if precision is not None and precision is not Precision.F32 and value.dtype.kind == "f":
            value = narrow(value, precision)[0].astype(np.float32)
        out[name] = value
    return out


def _run_all(ref: _Session, cand: _Session, samples: list[dict[str, np.ndarray]], low: Mapping[str, int],
             options: VerifyOptions, progress: Progress | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    names = ref.output_names
    collected: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {n: ([], []) for n in names}
    for k, feeds in enumerate(samples):
        if progress is not None and k == 0:
            progress("running", 0, len(samples))
        r = ref.run(feeds)
        c = cand.run(_round_feeds(feeds, low) if low else feeds, names)
        for n in names:
            collected[n][0].append(np.asarray(r[n]))
            collected[n][1].append(np.asarray(c[n]))
        if progress is not None:
            progress("running", k + 1, len(samples))  # after the set ran, so the bar ends at 100%
    return {n: (_stack(a), _stack(b)) for n, (a, b) in collected.items()}


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.stack(arrays)


class Scratch(ScratchDir):
    """A private temporary directory (under TMPDIR) for the models a verification derives
    (emulated candidates, models with exposed intermediates) and their rounded weights. Nothing
    goes into the user's directories; everything is removed on exit, which the CLI reaches on
    errors, Ctrl-C and SIGTERM alike."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self._count = 0

    def __enter__(self) -> Scratch:
        return self

    def file(self, name: str) -> Path:
        """A fresh path in the scratch directory."""
        self._count += 1
        return self.dir / f"{self._count}-{name}"

    def session(self, model: onnx.ModelProto, base_dir: Path | None, provider: str, label: str) -> _Session:
        """A session on `model`, saved here; external data it reads is either in this
        directory (written by a sink here) or in `base_dir`, the directory of the model it
        derives from, whose files are checked to lie inside it and handed over from memory."""
        path = self.file("model.onnx")
        try:
            onnx.save(model, str(path))
        except OSError as e:
            raise InputError(f"{self.dir}: cannot write a temporary model ({e.strerror}); set TMPDIR to a directory with space") from None
        external: dict[str, Path] = {}
        source = WeightSource(base_dir, label)
        for tensor in all_tensors(model):
            if not is_external(tensor):
                continue
            # onnxruntime takes either every external file from memory or none.
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            if location not in external:
                own = self.dir / location
                external[location] = own if own.is_file() else source.external_path(tensor)
        return _Session(str(path), provider, label, external)


_EMULATED_DATA = "rlx-amp-emulated.data"


def _emulated_model(ref_model: onnx.ModelProto, ref_path: Path, cand_model: onnx.ModelProto, scratch: Scratch,
                    progress: Progress | None = None) -> onnx.ModelProto:
    source = WeightSource(ref_path.parent, str(ref_path))
    sink: WeightSink = WeightSink()
    locations = external_locations(all_tensors(ref_model))
    if locations:  # rounded weights go to the scratch directory, the rest stays where it is
        name = _EMULATED_DATA
        while name in locations:
            name = "_" + name
        sink = ExternalSink(scratch.dir / name, name)
    try:
        step = (lambda done, total: progress("rounding weights", done, total)) if progress is not None else None
        model, rounded = emulate(ref_model, cand_model, source, sink, progress=step)
    finally:
        sink.close()
    logger.info("emulated candidate: %d values rounded", rounded)
    return model

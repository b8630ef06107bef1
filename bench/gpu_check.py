"""What a GPU machine tells us about rlx-amp: do converted models load and run on the CUDA
provider, how fast are they against the f32 original, and does the emulated verdict (what
`rlx-amp --verify` predicts on a CPU-only machine) agree with the real one.

    python3 bench/gpu_check.py [--provider cuda|cpu] [--target cuda|cpu] [--out bench/out/gpu_check.json]
                               [--models conv_net,transformer_block,demo,bert,...] [--repeats 20]
                               [--warmup 5] [--skip-pytest] [--quick]

Install on the GPU machine first (from the repository root; the script installs nothing).
onnxruntime and onnxruntime-gpu install into the same `onnxruntime` package, so only the GPU
build may be there: the `gpu` extra brings it, and the `test` extra (which brings the CPU build)
is left out:

    pip install -e ".[gpu,export]" pytest
    pip install "onnxruntime-gpu[cuda,cudnn]"      # the CUDA/cuDNN libraries as wheels, if needed
    python3 bench/gpu_check.py

(`[export]` brings torch, transformers and onnxscript for the exported models; without it, or
with --quick, only the fixture models are checked. `[cuda,cudnn]` installs the CUDA and cuDNN
libraries that onnxruntime-gpu was built against as pip wheels, which the script preloads with
`onnxruntime.preload_dlls()`; drop it where the machine has them already. Where the CPU build
is there already (`pip install -e ".[test]"`), `pip uninstall -y onnxruntime onnxruntime-gpu`
first, then the lines above.)

What it does, in order; every step is recorded in the JSON, a failure as a row, never a traceback:

1. `--provider cuda` (the default) stops with exit 2 unless onnxruntime here has the
   CUDAExecutionProvider and a session on a one-node model really gets it (no silent fallback to
   the CPU). It then runs `python3 -m pytest -q -m cuda` (the tests marked cuda) and records the
   pass / fail / skip counts (not with --skip-pytest, nor with --provider cpu).
2. Models, written into a temporary work directory: the fixture CNN (`conv_net`, batch fixed at
   1), the fixture transformer block (`transformer_block`, d=32, seq 8), the demo transformer
   (`demo`, fixtures/models/demo_transformer.onnx, d=64, seq 16) and, unless --quick and when torch
   and transformers import, exports of real architectures with random weights: the tiny ones of
   fixtures/export_transformers.py (`bert`, `gpt2`, `llama_gqa`, `vit`, `whisper_encoder`; hidden
   size 32-64, seq 8), built from its MODELS specs, and `bert_base` (transformers' default
   BertConfig: hidden 768, 12 layers, seq 128, 110M parameters), each exported with the dynamo
   exporter with a symbolic batch axis (if that fails for a tiny one: the module's own
   `export_model`, whose batch is fixed at 2). On a GPU the tiny models' timings measure
   per-node launch overhead and Cast cost, not arithmetic: a speed-up below 1 there says the
   Casts cost more than the narrower maths saves. `bert_base` is the one sized for the maths.
3. Every model under every preset policy of rlx_onnx_amp.policy.POLICY_NAMES except always-f32
   and custom (always-f16, auto-mixed-conservative, auto-mixed, auto-mixed-bf16) is converted
   with `rlx_onnx_amp.convert_file(..., target=PROVIDER)` (`--target cuda` in CUDA mode, `cpu`
   in CPU mode; --target overrides it: `--provider cpu --target cuda` shows which models
   converted for CUDA the CPU provider cannot load, each such row a load error).
4. Timing, per model, batch and policy: onnxruntime sessions on the f32 original and on the
   converted model, on the provider (CUDA, with the CPU provider behind it for the nodes
   onnxruntime itself puts there), default session options. Inputs come from
   `rlx_onnx_amp.verification.inputs.synthesize` (seed 0) with the batch axis made concrete
   through `InputSpec(shapes=...)`: batch 1 and 16 where the batch axis is symbolic; a model whose
   batch axis is fixed runs at that size only, and its rows say so. Inputs are bound once with
   onnxruntime's IO binding as OrtValues on the provider's device (`cuda`: copied to GPU memory
   before the clock starts; `cpu`: host memory), outputs bound to the same device, so no copy
   between host and device is timed. Each session runs once untimed (a failure there is the
   row's load/run error), then --warmup untimed runs; then --repeats timed runs of
   `run_with_iobinding` for each of the two, taken in turns (f32 then converted, the order
   reversed every repeat, so a drifting clock or load moves both alike), each between
   `synchronize_inputs()` and `synchronize_outputs()` (perf_counter). The row gets each median in
   milliseconds; speed-up = median f32 / median converted. The f32 original runs with the CUDA
   provider's default options, which the JSON records (`cuda_provider_options`): where
   `use_tf32` is 1, its MatMuls and Convs use TF32 tensor cores on an Ampere or later GPU, so
   the baseline is onnxruntime's default f32, not IEEE f32 throughout.
5. Placement, per model and policy: one profiled run (onnxruntime's `enable_profiling`) of the
   f32 and the converted model at the first batch size counts the nodes each provider ran. In
   CUDA mode a converted model that runs more nodes on the CPU than its original gets a note
   (a low-precision node without a CUDA kernel, which the kernel table should have kept f32).
6. Drift, per model, batch and policy, with the same inputs: `rlx_onnx_amp.verify(original,
   converted, VerifyOptions(provider=PROVIDER, emulate=False))` is the real verdict (the converted
   model as it is, on the provider, against the f32 original on the same provider) and
   `VerifyOptions(provider="cpu", emulate=True)` the emulated prediction (the f32 graph with
   every value the candidate holds low rounded to its precision, on the CPU); both judge by
   rlx-amp's default criterion for the candidate's lowest precision. Per output: max_abs,
   cosine and pass/fail of each, and whether they agree. The real verdict's reference is the f32
   original on the GPU (TF32 where `use_tf32` is on), the emulated one's on the CPU. In CPU mode "real" is the CPU provider
   running the converted model as it is: the point of CPU mode is that the script runs end to
   end without a GPU.
7. One table (model, policy, batch, loads, ms f32, ms converted, speed-up, real verdict,
   emulated verdict, agree), then notes and errors; --out gets every row (conversion summary,
   timings, placement, both drift reports per output, notes, errors) and the environment
   (onnxruntime version, device, providers and the CUDA provider's options, GPU name from
   `nvidia-smi --query-gpu=name --format=csv,noheader`, python, platform,
   package versions, `git rev-parse --short HEAD` and whether the tree has changes).

Exit code: 0 when every converted model loads and runs, the f32 original runs, and the emulated
verdict agrees with the real one for every output of every row, and the `-m cuda` tests (when
run) did not fail; 1 otherwise; 2 for bad usage or a CUDA provider that is missing or falls back.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the fixtures package

from fixtures import export_transformers  # noqa: E402
from fixtures.make_fixtures import HEALTHY  # noqa: E402
from rlx_onnx_amp import POLICY_NAMES, VerifyOptions, convert_file, verify  # noqa: E402
from rlx_onnx_amp.errors import first_line  # noqa: E402
from rlx_onnx_amp.reports.record import Verification  # noqa: E402
from rlx_onnx_amp.types import concrete_input_shape  # noqa: E402
from rlx_onnx_amp.verification import PROVIDERS, InputSpec  # noqa: E402
from rlx_onnx_amp.verification.inputs import synthesize  # noqa: E402

POLICIES: tuple[str, ...] = tuple(p for p in POLICY_NAMES if p not in ("always-f32", "custom", "auto"))
BATCHES: tuple[int, ...] = (1, 16)
DEMO_PATH = REPO / "fixtures" / "models" / "demo_transformer.onnx"
FIXTURE_MODELS: tuple[str, ...] = ("conv_net", "transformer_block", "demo")
BERT_BASE_SEQ = 128
EXPORT_MODELS: tuple[str, ...] = (*export_transformers.MODELS, "bert_base")
PYTEST_TIMEOUT_S = 600
_NP_TYPES: Mapping[str, Any] = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


# --------------------------------------------------------------------------------------------
# Models
@dataclass
class Model:
    """A model under test, written into the work directory (or why it could not be)."""

    name: str
    source: str  # "fixture" or "export"
    path: Path | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def write_fixture(name: str, work: Path) -> Model:
    path = work / f"{name}.onnx"
    if name == "demo":
        shutil.copyfile(DEMO_PATH, path)
    else:
        onnx.save(HEALTHY[name]().model, str(path))
    return Model(name, "fixture", path)


def exports_available() -> str | None:
    """None when torch and transformers import; else why not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return f"torch/transformers do not import ({first_line(e)}); pip install -e '.[export]'"
    return None


def _quiet_exporter() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    for name in ("torch.onnx", "onnxscript", "onnx_ir", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _bert_base() -> object:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig())  # BERT-base: hidden 768, 12 layers, 12 heads, vocabulary 30522


def _bert_base_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(export_transformers.SEED)
    ids = rng.integers(0, 30522, size=(2, BERT_BASE_SEQ), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, -16:] = 0  # right padding on the second row
    return {"input_ids": ids, "attention_mask": mask}


#: Models sized for timing, exported like export_transformers.MODELS.
SIZED_MODELS: dict[str, export_transformers.ModelSpec] = {
    "bert_base": export_transformers.ModelSpec(_bert_base, _bert_base_inputs, ("last_hidden_state", "pooler_output")),
}


def export_dynamic_batch(spec: export_transformers.ModelSpec, path: Path) -> None:
    """`spec` (its module, built after the seed is set, its example inputs and output names)
    exported with the dynamo exporter, axis 0 of every input symbolic."""
    import torch

    torch.manual_seed(export_transformers.SEED)
    module = spec.build()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{spec.build.__name__} built a {type(module).__name__}, not a torch module")
    module.eval()
    inputs = spec.inputs()
    batch = torch.export.Dim("batch", min=1, max=1024)
    kwargs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (), str(path), kwargs=kwargs, dynamic_shapes={k: {0: batch} for k in inputs}, dynamo=True,
            external_data=True, input_names=list(inputs), output_names=list(spec.outputs), optimize=True,
        )


def write_export(name: str, work: Path) -> Model:
    """A model of export_transformers.MODELS or SIZED_MODELS exported with a symbolic batch axis;
    for the former, if that fails, the module's own export_model (batch fixed at 2)."""
    model = Model(name, "export")
    why = exports_available()
    if why is not None:
        model.error = why
        return model
    _quiet_exporter()
    path = work / name / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = SIZED_MODELS.get(name) or export_transformers.MODELS[name]
    try:
        export_dynamic_batch(spec, path)
        model.path = path
        return model
    except Exception as e:
        failure = f"export with a symbolic batch axis failed: {type(e).__name__}: {first_line(e, 300)}"
    if name in SIZED_MODELS:
        model.error = failure
        return model
    model.notes.append(f"{failure}; exported by export_transformers.export_model instead")
    try:
        model.path, _ = export_transformers.export_model(name, path.parent / "fixed")
    except Exception as e:
        model.error = f"export failed: {type(e).__name__}: {first_line(e, 300)}"
    return model


def prepare_model(name: str, work: Path) -> Model:
    try:
        return write_fixture(name, work) if name in FIXTURE_MODELS else write_export(name, work)
    except Exception as e:
        source = "fixture" if name in FIXTURE_MODELS else "export"
        return Model(name, source, error=f"{type(e).__name__}: {first_line(e, 400)}")


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]


def fixed_batch(model: onnx.ModelProto) -> int | None:
    """The batch size when axis 0 of every input is a fixed dimension; None when any is symbolic."""
    firsts = [vi.type.tensor_type.shape.dim[0] for vi in graph_inputs(model) if vi.type.tensor_type.shape.dim]
    if any(not (d.HasField("dim_value") and d.dim_value > 0) for d in firsts):
        return None
    return firsts[0].dim_value if firsts else 1


def batch_plan(model: onnx.ModelProto) -> tuple[list[int], str | None]:
    """The batch sizes to run, and the note a fixed batch axis puts on its rows."""
    fixed = fixed_batch(model)
    if fixed is None:
        return list(BATCHES), None
    skipped = [b for b in BATCHES if b != fixed]
    return [fixed], f"batch axis fixed at {fixed}: batch {' and '.join(map(str, skipped))} skipped"


def input_shapes(model: onnx.ModelProto, batch: int) -> dict[str, tuple[int, ...]]:
    """Every input's concrete shape (rlx-amp's defaults for symbolic axes), axis 0 = batch where symbolic."""
    shapes = {}
    for vi in graph_inputs(model):
        shape = list(concrete_input_shape(vi))
        dims = vi.type.tensor_type.shape.dim
        if dims and not (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
            shape[0] = batch
        shapes[vi.name] = tuple(shape)
    return shapes


# --------------------------------------------------------------------------------------------
# onnxruntime: sessions, timing, placement
def open_session(path: Path, provider: str, profile_prefix: Path | None = None) -> ort.InferenceSession:
    """A session on `provider` (the CPU provider behind CUDA); a fallback to the CPU is an error."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(profile_prefix)
    wanted = PROVIDERS[provider]
    providers = [wanted] + (["CPUExecutionProvider"] if provider != "cpu" else [])
    session = ort.InferenceSession(str(path), opts, providers=providers)
    if session.get_providers()[0] != wanted:
        raise RuntimeError(f"onnxruntime fell back to {session.get_providers()[0]} instead of {wanted}")
    return session


def as_input_type(value: np.ndarray, ort_type: str) -> np.ndarray:
    dtype = _NP_TYPES.get(ort_type)
    return np.ascontiguousarray(value if dtype is None else value.astype(dtype))


def bind(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], device: str) -> tuple[Any, list[Any]]:
    """IO binding with every input an OrtValue on `device` and every output allocated there.
    Returns the binding and the OrtValues it reads (kept alive while it is used)."""
    binding = session.io_binding()
    values = []
    for arg in session.get_inputs():
        value = ort.OrtValue.ortvalue_from_numpy(as_input_type(feeds[arg.name], arg.type), device, 0)
        binding.bind_ortvalue_input(arg.name, value)
        values.append(value)
    for arg in session.get_outputs():
        binding.bind_output(arg.name, device, 0)
    return binding, values


@dataclass
class Bound:
    """A session with its IO binding and the input OrtValues the binding reads."""

    session: ort.InferenceSession
    binding: Any
    values: list[Any]

    def run(self) -> float:
        """Seconds of one inference, inputs and outputs synchronized around it."""
        self.binding.synchronize_inputs()
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()
        return time.perf_counter() - start


@dataclass
class Loaded:
    """A model bound for timing: `bound` once it loaded and ran once; else where it failed."""

    bound: Bound | None = None
    loaded: bool = False
    error: str | None = None


def load_bound(path: Path, provider: str, feeds: Mapping[str, np.ndarray]) -> Loaded:
    try:
        session = open_session(path, provider)
    except Exception as e:
        return Loaded(error=f"load: {first_line(e, 400)}")
    try:
        bound = Bound(session, *bind(session, feeds, provider))
        bound.run()
    except Exception as e:
        return Loaded(loaded=True, error=f"run: {first_line(e, 400)}")
    return Loaded(bound, True)


def paired_ms(bounds: Sequence[Bound], warmup: int, repeats: int) -> list[float]:
    """Median ms of each bound session, timed in turns (the order reversed every repeat) so that
    a drifting clock or load moves them alike."""
    for bound in bounds:
        for _ in range(warmup):
            bound.run()
    times: list[list[float]] = [[] for _ in bounds]
    for k in range(repeats):
        order = range(len(bounds)) if k % 2 == 0 else reversed(range(len(bounds)))
        for i in order:
            times[i].append(bounds[i].run())
    return [statistics.median(t) * 1e3 for t in times]


def placement(path: Path, provider: str, feeds: Mapping[str, np.ndarray], work: Path) -> dict[str, dict[str, int]]:
    """Nodes run by each provider in one profiled run: {provider: {op: count}}."""
    session = open_session(path, provider, profile_prefix=work / "profile")
    typed = {a.name: as_input_type(feeds[a.name], a.type) for a in session.get_inputs()}
    session.run(None, typed)
    profile = Path(session.end_profiling())
    try:
        events = json.loads(profile.read_text())
    finally:
        profile.unlink(missing_ok=True)
    seen: dict[str, Counter[str]] = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time") and "provider" in args:
            seen.setdefault(args["provider"], Counter())[args.get("op_name", "?")] += 1
    return {p: dict(sorted(c.items())) for p, c in sorted(seen.items())}


def more_on_cpu(original: Mapping[str, Mapping[str, int]], converted: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Op types the converted model runs on the CPU provider more often than the original does."""
    before, after = original.get("CPUExecutionProvider", {}), converted.get("CPUExecutionProvider", {})
    return {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}


# --------------------------------------------------------------------------------------------
# Drift
def _finite(x: float | None) -> float | None:
    """JSON has no NaN or Infinity: those become null."""
    return x if x is None or np.isfinite(x) else None


def drift_summary(report: Verification) -> dict[str, Any]:
    return {
        "passed": report.passed,
        "precision": report.precision,
        "emulated": report.emulated,
        "candidate_loaded": report.candidate_loaded,
        "providers_used": report.providers_used,
        "outputs": [
            {
                "name": o.name,
                "passed": o.passed,
                "max_abs": _finite(o.max_abs),
                "cosine": _finite(o.cosine),
                "bound": _finite(o.bound),
                "failed_checks": o.failed_checks,
            }
            for o in report.outputs
        ],
    }


def run_verify(original: Path, converted: Path, options: VerifyOptions) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return drift_summary(verify(original, converted, options)), None
    except Exception as e:
        return None, f"{type(e).__name__}: {first_line(e, 400)}"


def agreement(real: Mapping[str, Any], emulated: Mapping[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Per output: the real and the emulated verdict and whether they agree; and whether all do."""
    predicted = {o["name"]: o["passed"] for o in emulated["outputs"]}
    rows = [{"name": o["name"], "real": o["passed"], "emulated": predicted.get(o["name"]),
             "agree": o["passed"] == predicted.get(o["name"])} for o in real["outputs"]]
    same_names = {o["name"] for o in real["outputs"]} == set(predicted)
    return rows, bool(rows) and same_names and all(r["agree"] for r in rows)


# --------------------------------------------------------------------------------------------
# Rows
@dataclass
class Settings:
    provider: str
    target: str  # what the models are converted for (--target of rlx-amp)
    warmup: int
    repeats: int
    work: Path


def convert_one(model: Model, policy: str, settings: Settings) -> tuple[Path | None, dict[str, Any]]:
    """Convert `model` under `policy` for the provider; (path, summary) or (None, {"error": ...})."""
    assert model.path is not None
    out = model.path.parent / f"{model.name}.{policy}.onnx"
    start = time.perf_counter()
    try:
        report = convert_file(model.path, out, policy, target=settings.target)
    except Exception as e:
        return None, {"error": f"{type(e).__name__}: {first_line(e, 400)}"}
    return out, {
        "seconds": round(time.perf_counter() - start, 3),
        "nodes": dict(report.nodes.by_precision),
        "casts_inserted": report.casts_inserted,
        "kept_f32": len(report.kept_f32),
        "target": settings.target,
    }


def new_row(model: Model, policy: str, batch: int | None, notes: Iterable[str]) -> dict[str, Any]:
    return {"model": model.name, "source": model.source, "policy": policy, "batch": batch, "notes": list(notes),
            "errors": [], "converted": False, "loaded": False, "ran": False, "ms_f32": None, "ms_converted": None,
            "speedup": None, "real": None, "emulated": None, "outputs_agree": [], "agree": None, "ok": False}


@dataclass
class Case:
    """One batch size of a model: its input shapes, feeds and the bound f32 original."""

    batch: int
    shapes: dict[str, tuple[int, ...]]
    feeds: dict[str, np.ndarray]
    f32: Loaded
    f32_placement: dict[str, dict[str, int]] | None = None  # the first case's; None if profiling failed


def fill_timing(row: dict[str, Any], case: Case, converted: Loaded, settings: Settings) -> None:
    """Load state and median ms of the f32 original and the converted model, timed in turns."""
    row["loaded"], row["ran"] = converted.loaded, converted.bound is not None
    for label, loaded in (("f32 original", case.f32), ("converted", converted)):
        if loaded.error:
            row["errors"].append(f"{label}: {loaded.error}")
    timed = [(key, x.bound) for key, x in (("ms_f32", case.f32), ("ms_converted", converted)) if x.bound is not None]
    try:
        medians = paired_ms([b for _, b in timed], settings.warmup, settings.repeats)
    except Exception as e:
        row["errors"].append(f"timing: {first_line(e, 400)}")
        row["ran"] = False
        return
    for (key, _), ms in zip(timed, medians):
        row[key] = ms
    if row["ms_f32"] and row["ms_converted"]:
        row["speedup"] = row["ms_f32"] / row["ms_converted"]


def fill_drift(row: dict[str, Any], original: Path, converted: Path, shapes: dict[str, tuple[int, ...]],
               provider: str) -> None:
    spec = InputSpec(shapes=dict(shapes))
    # The model is meant for its conversion's target: where that is not the provider at hand,
    # a candidate the provider cannot run is verified emulated there (and says so).
    target = (row.get("conversion") or {}).get("target") or provider
    real, real_error = run_verify(original, converted, VerifyOptions(provider=provider, emulate=False, spec=spec,
                                                                     target=target))
    emulated, emu_error = run_verify(original, converted, VerifyOptions(provider="cpu", emulate=True, spec=spec,
                                                                        target=target))
    row["real"], row["emulated"] = real, emulated
    if real_error:
        row["errors"].append(f"real verify: {real_error}")
    if emu_error:
        row["errors"].append(f"emulated verify: {emu_error}")
    if real is not None and emulated is not None:
        row["outputs_agree"], row["agree"] = agreement(real, emulated)


def placement_note(case: Case, converted: Path, settings: Settings) -> tuple[dict[str, Any], str | None]:
    """Placement of the original (`case.f32_placement`) and the converted model; a note when the
    converted one runs more nodes on the CPU than the original in a CUDA session."""
    try:
        after = placement(converted, settings.provider, case.feeds, settings.work)
    except Exception as e:
        return {"error": first_line(e, 400)}, None
    before = case.f32_placement
    if before is None:
        return {"converted": after}, None
    extra = more_on_cpu(before, after) if settings.provider != "cpu" else {}
    note = None
    if extra:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(extra.items()))
        note = f"runs more nodes on the CPU provider than the f32 original: {ops}"
    return {"f32": before, "converted": after, "more_on_cpu": extra}, note


def check_policy(model: Model, policy: str, cases: Sequence[Case], settings: Settings,
                 notes: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of one model under one policy: convert once, then time and verify each batch size."""
    assert model.path is not None
    converted, summary = convert_one(model, policy, settings)
    rows = []
    for k, case in enumerate(cases):
        row = new_row(model, policy, case.batch, notes)
        row["shapes"] = {n: list(s) for n, s in case.shapes.items()}
        row["conversion"] = summary
        rows.append(row)
        if converted is None:
            row["errors"].append(f"conversion: {summary['error']}")
            continue
        row["converted"] = True
        fill_timing(row, case, load_bound(converted, settings.provider, case.feeds), settings)
        if k == 0 and row["loaded"]:
            row["placement"], note = placement_note(case, converted, settings)
            if note:
                row["notes"].append(note)
        fill_drift(row, model.path, converted, case.shapes, settings.provider)
    for row in rows:
        row["ok"] = bool(row["ran"] and row["ms_f32"] is not None and row["agree"] is True)
    return rows


def make_cases(model: Model, settings: Settings) -> tuple[list[Case], str | None]:
    """One case per batch size to run, the f32 original bound for each; and the fixed-batch note."""
    assert model.path is not None
    proto = onnx.load(str(model.path), load_external_data=False)
    batches, fixed_note = batch_plan(proto)
    cases = []
    for batch in batches:
        shapes = input_shapes(proto, batch)
        feeds = synthesize(proto, InputSpec(shapes=shapes))
        cases.append(Case(batch, shapes, feeds, load_bound(model.path, settings.provider, feeds)))
    if cases[0].f32.bound is not None:
        with contextlib.suppress(Exception):
            cases[0].f32_placement = placement(model.path, settings.provider, cases[0].feeds, settings.work)
    return cases, fixed_note


def check_model(model: Model, settings: Settings) -> list[dict[str, Any]]:
    """Every row of one model; a model that cannot be written, read or fed gets one error row per policy."""
    if model.error is not None or model.path is None:
        return [failed_row(model, p, model.error or "no model written") for p in POLICIES]
    try:
        cases, fixed_note = make_cases(model, settings)
    except Exception as e:
        return [failed_row(model, p, f"inputs: {type(e).__name__}: {first_line(e, 400)}") for p in POLICIES]
    notes = [*model.notes, *([fixed_note] if fixed_note else [])]
    rows = []
    for policy in POLICIES:
        print(f"... {model.name} {policy}", file=sys.stderr, flush=True)
        try:
            rows += check_policy(model, policy, cases, settings, notes)
        except Exception as e:  # a bug here must not hide the other models' rows
            rows.append(failed_row(model, policy, f"gpu_check: {type(e).__name__}: {e}",
                                   traceback.format_exc(limit=-3)))
    return rows


def failed_row(model: Model, policy: str, error: str, detail: str | None = None) -> dict[str, Any]:
    row = new_row(model, policy, None, model.notes)
    row["errors"].append(error)
    if detail:
        row["traceback"] = detail
    return row


# --------------------------------------------------------------------------------------------
# pytest, environment, CUDA probe
def run_pytest() -> dict[str, Any]:
    """`python3 -m pytest -q -m cuda` in the repository: its exit code and summary counts."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=PYTEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"command": "python3 -m pytest -q -m cuda", "rc": None, "counts": {},
                "error": f"timed out after {PYTEST_TIMEOUT_S}s"}
    lines = proc.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
                                                      summary)}
    return {"command": "python3 -m pytest -q -m cuda", "rc": proc.returncode, "counts": counts, "summary": summary,
            "seconds": round(time.perf_counter() - start, 1), "tail": "\n".join(lines[-30:]) + proc.stderr[-2000:]}


def pytest_failed(result: Mapping[str, Any] | None) -> bool:
    """rc 0 passes, 5 means no test is marked cuda; anything else failed."""
    return result is not None and result.get("rc") not in (0, 5)


def _command(cmd: Sequence[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def environment(provider: str, cuda_options: Mapping[str, str]) -> dict[str, Any]:
    versions = {name: getattr(sys.modules[name], "__version__", None)
                for name in ("onnx", "numpy", "torch", "transformers", "onnxscript") if name in sys.modules}
    status = _command(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "provider": provider,
        "onnxruntime": ort.__version__,
        "onnxruntime_device": ort.get_device(),
        "onnxruntime_providers": ort.get_available_providers(),
        "cuda_provider_options": dict(cuda_options) or None,  # use_tf32 among them
        "gpu": _command(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "commit": _command(["git", "rev-parse", "--short", "HEAD"]),
        "tree_changed": bool(status) if status is not None else None,
        "versions": versions,
    }


def _one_node_model(path: Path) -> None:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))


def probe_cuda(work: Path) -> tuple[str | None, dict[str, str]]:
    """(None, the CUDA provider's options) when a CUDA session really runs on the CUDA provider;
    else (why not, {})."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (providers: "
                f"{', '.join(ort.get_available_providers())}); install onnxruntime-gpu as this script's "
                "docstring says, or run with --provider cpu"), {}
    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):
            ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels, where they are installed
    probe = work / "probe.onnx"
    _one_node_model(probe)
    try:
        session = open_session(probe, "cuda")
        session.run(None, {"x": np.ones(2, np.float32)})
    except Exception as e:
        return (f"the CUDA provider does not work here ({first_line(e, 400)}); are the CUDA and cuDNN "
                "libraries onnxruntime-gpu was built against installed?"), {}
    return None, dict(session.get_provider_options().get("CUDAExecutionProvider", {}))


# --------------------------------------------------------------------------------------------
# Output
def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _verdict(drift: Mapping[str, Any] | None) -> str:
    if drift is None:
        return "error"
    return "pass" if drift["passed"] else "FAIL"


def _loads(row: Mapping[str, Any]) -> str:
    if not row["converted"]:
        return "no conv"
    if not row["loaded"]:
        return "NO"
    return "yes" if row["ran"] else "no run"


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ["model", "policy", "batch", "loads", "ms f32", "ms converted", "speed-up", "real", "emulated", "agree"]
    lines = [header]
    for r in rows:
        agree = "-" if r["agree"] is None else ("yes" if r["agree"] else "NO")
        lines.append([r["model"], r["policy"], "-" if r["batch"] is None else str(r["batch"]), _loads(r),
                      _ms(r["ms_f32"]), _ms(r["ms_converted"]), "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                      _verdict(r["real"]) if r["converted"] else "-", _verdict(r["emulated"]) if r["converted"] else "-",
                      agree])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def notes_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Notes and errors: a note every row of a model carries (a fixed batch axis) once for the
    model, the others once per row; then the outputs whose verdicts disagree."""
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    out = []
    for name, model_rows in by_model.items():
        common = set.intersection(*(set(r["notes"]) for r in model_rows))
        out += [f"- {name}: note: {text}" for text in model_rows[0]["notes"] if text in common]
        for r in model_rows:
            where = f"{name} {r['policy']}" + ("" if r["batch"] is None else f" batch {r['batch']}")
            out += [f"- {where}: note: {text}" for text in r["notes"] if text not in common]
            out += [f"- {where}: error: {text}" for text in r["errors"]]
            disagree = [o["name"] for o in r["outputs_agree"] if not o["agree"]]
            if disagree:
                out.append(f"- {where}: the real and the emulated verdict differ on {', '.join(disagree)}")
    return "\n".join(out)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--target", choices=("cuda", "cpu"), default=None,
                    help="convert for this provider (default: --provider's); --provider cpu --target cuda shows "
                         "which CUDA-targeted models the CPU provider cannot load")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "gpu_check.json"))
    ap.add_argument("--models", nargs="+", default=None,
                    help=f"names, spaces or commas (known: {', '.join(FIXTURE_MODELS + EXPORT_MODELS)}); "
                         "default: all (the exports only without --quick and when torch imports)")
    ap.add_argument("--repeats", type=int, default=20, help="timed runs per measurement; the median is reported")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs before them")
    ap.add_argument("--skip-pytest", action="store_true", help="do not run `pytest -m cuda` first")
    ap.add_argument("--quick", action="store_true", help="the fixture models only (no torch exports)")
    args = ap.parse_args(argv)
    args.target = args.target or args.provider
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be at least 1 and --warmup at least 0")
    args.model_names = model_names(ap, args)
    return args


def model_names(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if args.models is None:
        if args.quick or exports_available() is not None:
            return list(FIXTURE_MODELS)
        return list(FIXTURE_MODELS + EXPORT_MODELS)
    names = [n for item in args.models for n in item.split(",") if n]
    unknown = [n for n in names if n not in FIXTURE_MODELS + EXPORT_MODELS]
    if unknown or not names:
        ap.error(f"--models: unknown {', '.join(unknown) or '(none given)'} "
                 f"(known: {', '.join(FIXTURE_MODELS + EXPORT_MODELS)})")
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ort.set_default_logger_severity(3)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="rlx-gpu-check-") as tmp:
        work = Path(tmp)
        cuda_options: dict[str, str] = {}
        if args.provider == "cuda":
            problem, cuda_options = probe_cuda(work)
            if problem is not None:
                print(f"gpu_check: {problem}", file=sys.stderr)
                return 2
        pytest_result = None
        if args.provider == "cuda" and not args.skip_pytest:
            print("... python3 -m pytest -q -m cuda", file=sys.stderr, flush=True)
            pytest_result = run_pytest()
        settings = Settings(args.provider, args.target, args.warmup, args.repeats, work)
        data: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "models"},
                                "policies": list(POLICIES), "pytest": pytest_result, "rows": []}
        if args.models is None and not args.quick and exports_available() is not None:
            data["exports_skipped"] = exports_available()
        data["environment"] = environment(args.provider, cuda_options)
        for name in args.model_names:
            print(f"... {name}: writing", file=sys.stderr, flush=True)
            data["rows"] += check_model(prepare_model(name, work), settings)
            write_json(out, data)
    data["environment"] = environment(args.provider, cuda_options)  # again: now with the versions of torch & co.
    rows = data["rows"]
    failed = pytest_failed(pytest_result) or not all(r["ok"] for r in rows)
    data["exit_code"] = 1 if failed else 0
    write_json(out, data)
    print(table(rows))
    notes = notes_text(rows)
    if notes:
        print("\n" + notes)
    if pytest_result is not None:
        print(f"\npytest -m cuda: {pytest_result.get('summary') or pytest_result.get('error')} (exit {pytest_result['rc']})")
    if data.get("exports_skipped"):
        print(f"\nexports skipped: {data['exports_skipped']}")
    print(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} rows ok; JSON: {out}")
    return data["exit_code"]


if __name__ == "__main__":
    sys.exit(main())

"""End to end: real transformer architectures, exported by torch, converted under every policy.

The models (BERT, GPT-2, Llama with grouped-query attention, ViT, the Whisper encoder) come from
fixtures/export_transformers.py: tiny configs, random weights, the dynamo exporter, external
data. Each (model, policy) pair is converted with `convert_file` and then checked:

* the output is OUT + OUT.<content hash>.data and passes `onnx.checker.check_model(full_check=True)`;
* graph input/output names and element types are unchanged, integer initializers are
  byte-identical, float initializers only ever change to the policy's low precision;
* f32 / f16 policies: onnxruntime (CPU) outputs match the original model's: always-f32 exactly,
  f16 policies within max_abs <= 1e-2 + 1e-2 * max|ref| and cosine >= 0.999, no new NaN/Inf;
* auto-mixed-bf16 (for the default CUDA target): the emulated candidate within the bf16
  tolerance (onnxruntime's CPU provider lacks most bf16 kernels); converted for the CPU target,
  the bf16 model runs on the CPU provider for real (test_transformer_bf16_for_cpu_runs_for_real).

Skipped only when torch / transformers / onnxscript cannot be imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import rlx_onnx_amp
from rlx_onnx_amp.verification.emulate import emulate
from tests.helpers import data_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("bert", "gpt2", "llama_gqa", "vit", "whisper_encoder")
POLICIES = ("always-f32", "always-f16", "auto-mixed-conservative", "auto-mixed", "auto-mixed-bf16")
LOW_TYPE = {
    "always-f32": None,
    "always-f16": TensorProto.FLOAT16,
    "auto-mixed-conservative": TensorProto.FLOAT16,
    "auto-mixed": TensorProto.FLOAT16,
    "auto-mixed-bf16": TensorProto.BFLOAT16,
}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
COSINE_MIN = 0.999


def _load_exporter():
    spec = importlib.util.spec_from_file_location("export_transformers", ROOT / "fixtures" / "export_transformers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Export every model once for the module: {name: (path, example inputs)}."""
    for name in ("torch", "transformers", "onnxscript"):
        try:
            importlib.import_module(name)
        except ImportError as e:
            pytest.skip(f"exporting real transformers needs {name} (pip install -e '.[export]'): {e}")
    exporter = _load_exporter()
    out_dir = tmp_path_factory.mktemp("transformers")
    t0 = time.perf_counter()
    results, seconds = exporter.export_all(out_dir, use_cache=False)
    took = ", ".join(f"{n} {s:.1f}s" for n, s in seconds.items())
    print(f"\nexported {len(results)} transformers in {time.perf_counter() - t0:.1f}s ({took})")
    assert set(results) == set(MODELS)
    for path, _ in results.values():
        assert path.is_file() and path.with_name(path.name + ".data").is_file(), path
    return results


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _session_from_proto(model: onnx.ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


_REFERENCE: dict[str, dict[str, np.ndarray]] = {}


def _reference(name: str, path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The original model's outputs under onnxruntime, computed once per model."""
    if name not in _REFERENCE:
        sess = _session(path)
        names = [o.name for o in sess.get_outputs()]
        _REFERENCE[name] = dict(zip(names, sess.run(None, inputs)))
    return _REFERENCE[name]


def _io_signature(values) -> list[tuple[str, int]]:
    return [(v.name, v.type.tensor_type.elem_type) for v in values]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", MODELS)
def test_convert_transformer(exported, model: str, policy: str, tmp_path: Path) -> None:
    src, inputs = exported[model]
    out = tmp_path / f"{model}.{policy}.onnx"
    report = rlx_onnx_amp.convert_file(src, out, policy)

    # External data in, external data out: OUT + OUT.<content hash>.data, and nothing else referenced.
    data = data_file(out)
    assert out.is_file() and data.is_file(), sorted(p.name for p in tmp_path.iterdir())
    converted_meta = onnx.load(str(out), load_external_data=False)
    locations = {e.value for t in converted_meta.graph.initializer if t.data_location == TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    assert locations == {data.name}

    onnx.checker.check_model(str(out), full_check=True)

    original = onnx.load(str(src), load_external_data=True)
    converted = onnx.load(str(out), load_external_data=True)

    # Structure: the interface does not move.
    assert _io_signature(converted.graph.input) == _io_signature(original.graph.input)
    assert _io_signature(converted.graph.output) == _io_signature(original.graph.output)

    # Integer (and other non-float) initializers are byte-identical; float ones only narrow
    # to the policy's low precision.
    after = {t.name: t for t in converted.graph.initializer}
    low = LOW_TYPE[policy]
    for before in original.graph.initializer:
        if before.data_type in FLOAT_TYPES:
            if before.name in after and after[before.name].data_type != before.data_type:
                assert after[before.name].data_type == low, (
                    f"{before.name}: {TensorProto.DataType.Name(before.data_type)} became "
                    f"{TensorProto.DataType.Name(after[before.name].data_type)} under {policy}")
            continue
        assert before.name in after, f"integer initializer {before.name} is gone"
        t = after[before.name]
        assert (t.data_type, list(t.dims)) == (before.data_type, list(before.dims)), before.name
        assert numpy_helper.to_array(t).tobytes() == numpy_helper.to_array(before).tobytes(), before.name
    wrong = {TensorProto.FLOAT16, TensorProto.BFLOAT16} - ({low} if low else set())
    stray = [t.name for t in converted.graph.initializer if t.data_type in wrong]
    assert not stray, f"initializers of a precision {policy} does not use: {stray}"

    # The report says what happened.
    counts = report.nodes.by_precision
    if policy == "always-f32":
        assert counts.get("f16", 0) == 0 and counts.get("bf16", 0) == 0, counts
    elif policy == "always-f16":
        assert counts.get("f16", 0) > 0, counts
    elif policy == "auto-mixed-bf16":
        assert counts.get("bf16", 0) > 0, counts

    ref = _reference(model, src, inputs)
    if policy == "auto-mixed-bf16":
        # Converted for CUDA (the default target), the model has bf16 nodes onnxruntime's CPU
        # provider cannot load: its numbers are checked on the emulated candidate (the f32 graph
        # with every bf16 value rounded to bf16), within the bf16 tolerance.
        assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in converted.graph.output)
        emulated, rounded = emulate(original, converted)
        assert rounded > 0
        sess = _session_from_proto(emulated)
        tol, cos_min = 5e-2, 0.995
    else:
        sess = _session(out)
        tol, cos_min = 1e-2, COSINE_MIN
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    assert set(got) == set(ref)
    for name, r in ref.items():
        g = got[name]
        assert g.dtype == r.dtype and g.shape == r.shape, (name, g.dtype, g.shape, r.dtype, r.shape)
        new_bad = ~np.isfinite(g) & np.isfinite(r)
        assert not new_bad.any(), f"{model}/{policy}: output {name} has {int(new_bad.sum())} new NaN/Inf"
        if policy == "always-f32":
            assert np.array_equal(g, r, equal_nan=True), f"{model}/always-f32: output {name} changed"
            continue
        finite = np.isfinite(r)
        max_abs = float(np.max(np.abs(g[finite].astype(np.float64) - r[finite]))) if finite.any() else 0.0
        scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
        cos = _cosine(np.where(finite, g, 0), np.where(finite, r, 0))
        assert max_abs <= tol + tol * scale, f"{model}/{policy}: output {name} max_abs {max_abs:.3g} (max|ref| {scale:.3g})"
        assert cos >= cos_min, f"{model}/{policy}: output {name} cosine {cos:.6f}"


@pytest.mark.parametrize("model", MODELS)
def test_transformer_bf16_for_cpu_runs_for_real(exported, model: str, tmp_path: Path) -> None:
    # For the CPU target, nodes without a bf16 CPU kernel stay f32, so the bf16 model loads on
    # onnxruntime's CPU provider and runs there for real.
    src, inputs = exported[model]
    out = tmp_path / f"{model}.bf16-cpu.onnx"
    report = rlx_onnx_amp.convert_file(src, out, "auto-mixed-bf16", options=rlx_onnx_amp.make_options(target="cpu"))
    assert report.target == "cpu" and report.nodes.by_precision["bf16"] > 0, report.nodes.by_precision
    kernel_kept = [k for k in report.kept_f32 if k.code in ("kernel-table", "kernel-gap")]
    assert kernel_kept and all("CPUExecutionProvider" in k.reason for k in kernel_kept)
    ref = _reference(model, src, inputs)
    sess = _session(out)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    for name, r in ref.items():
        g = got[name]
        assert g.dtype == r.dtype and g.shape == r.shape
        finite = np.isfinite(r)
        assert np.array_equal(np.isfinite(g), finite), f"{model}: output {name} has new NaN/Inf"
        max_abs = float(np.max(np.abs(g[finite].astype(np.float64) - r[finite]))) if finite.any() else 0.0
        scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
        assert max_abs <= 5e-2 + 5e-2 * scale, f"{model}: output {name} max_abs {max_abs:.3g} (max|ref| {scale:.3g})"
        assert _cosine(np.where(finite, g, 0), np.where(finite, r, 0)) >= 0.995

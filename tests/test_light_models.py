"""The real graphs of onnx/backend/test/data/light convert under every policy and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test
import pytest

from rlx_onnx_amp import convert, convert_and_report
from rlx_onnx_amp.verification import VerifyOptions, verify
from tests.helpers import POLICIES, assert_close, cast_duplicates, feeds_for, run

#: A sweep over a whole zoo: make test and CI run it, make test-fast leaves it out.
pytestmark = pytest.mark.sweep


def _largest_intermediate(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    for node in model.graph.node:
        exposed.graph.output.extend(onnx.ValueInfoProto(name=o) for o in node.output)
    return max(float(np.abs(v).max()) for v in run(exposed, feeds) if v.dtype == np.float32 and v.size)

LIGHT = sorted((Path(onnx.backend.test.__file__).parent / "data" / "light").glob("light_*.onnx"))


def test_light_models_exist() -> None:
    assert len(LIGHT) >= 9


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: p.stem)
@pytest.mark.parametrize("policy", POLICIES)
def test_light_model(path: Path, policy: str, tmp_path: Path) -> None:
    model = onnx.load(str(path))
    converted, report = convert_and_report(model, policy, screen=False)  # the rewrite: overflow is shown below
    out = tmp_path / "out.onnx"
    onnx.save(converted, str(out))
    onnx.checker.check_model(str(out), full_check=True)
    assert cast_duplicates(converted) == []
    assert convert(converted, policy, screen=False).SerializeToString() == converted.SerializeToString()
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if policy == "auto-mixed-bf16":
        if opset >= 13:
            assert report.nodes.by_precision["bf16"] > 0
        else:  # bfloat16 arrived in opset 13: every float node is kept by its schema
            assert report.nodes.by_precision["bf16"] == 0 and report.kept_f32
            assert all(k.code in ("schema-admits", "cast-unavailable") for k in report.kept_f32 if k.op != "Constant")
        return  # no bf16 kernels on onnxruntime's CPU provider; see test_verify for emulated numbers
    feeds = feeds_for(None, model)
    np.savez(tmp_path / "feeds.npz", allow_pickle=False, **feeds)
    # The f16 numbers are judged on the emulated candidate (onnxruntime's CPU provider would
    # compute most f16 nodes in f32 and hide what f16 does). Not timed: latency is test_gain's.
    options = VerifyOptions(provider="cpu", inputs=str(tmp_path / "feeds.npz"), latency_runs=0)
    result = verify(path, out, options)
    assert result.emulated == (policy != "always-f32")
    if policy != "always-f32" and _largest_intermediate(model, feeds) > 65504:
        # The light models' synthetic weights drive activations past the f16 range (squeezenet
        # reaches 6e9, vgg19 2e31): in f16 they become Inf and then NaN, and the verifier says so.
        assert not result.passed
        assert {check for o in result.outputs for check in o.failed_checks or []} == {"finite"}
        assert all(o.new_nan + o.new_inf > 0 for o in result.outputs if not o.passed)
        return
    assert result.passed, [o.failures for o in result.outputs]
    tol = 0.0 if policy == "always-f32" else 3e-2
    assert_close(run(model, feeds), run(str(out), feeds), tol, tol, min_cosine=0.999 if tol else 1.0)


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: p.stem)
def test_light_model_bf16_for_cpu_runs_for_real(path: Path, tmp_path: Path) -> None:
    # Converted for the CPU target, the bf16 model loads on onnxruntime's CPU provider and its
    # bf16 nodes run there (no emulation).
    model = onnx.load(str(path))
    converted, report = convert_and_report(model, "auto-mixed-bf16", target="cpu")
    out = tmp_path / "out.onnx"
    onnx.save(converted, str(out))
    onnx.checker.check_model(str(out), full_check=True)
    assert all("CPUExecutionProvider" in k.reason for k in report.kept_f32 if k.code in ("kernel-table", "kernel-gap"))
    feeds = feeds_for(None, model)
    assert_close(run(model, feeds), run(str(out), feeds), 5e-2, 5e-2, min_cosine=0.995)

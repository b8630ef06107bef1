"""The written file is what passed (issue 39): the candidate file itself runs once on the
provider at hand, in a child process, before any verdict; a crash of onnxruntime there is exit 3
with one line, nothing left beside `-o`, and a batch goes on with its next model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures.make_fixtures import HEALTHY
from rlx_onnx_amp.child import ChildCrashed, run_in_child
from tests.helpers import rlx, without_progress


def _transpose_matmul(elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """Transpose(perm=[1, 0, 2]) of an [L, B, 256] input feeding a MatMul with a [256, 59]
    weight: in f16, onnxruntime 1.32's CPU provider dies of SIGSEGV creating its session."""
    dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 59)).astype(dtype), "w")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="tr"),
         helper.make_node("MatMul", ["t", "w"], ["y"], name="mm")],
        "g", [helper.make_tensor_value_info("x", elem, [6, 2, 256])],
        [helper.make_tensor_value_info("y", elem, [2, 6, 59])], [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _session(path: str) -> bool:
    import onnxruntime as ort

    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return True


@pytest.fixture(scope="module")
def crashing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("crash")
    onnx.save(_transpose_matmul(TensorProto.FLOAT16), str(tmp / "f16.onnx"))
    try:
        run_in_child(_session, str(tmp / "f16.onnx"))
    except ChildCrashed:
        onnx.save(_transpose_matmul(), str(tmp / "f32.onnx"))
        return tmp / "f32.onnx"
    pytest.skip("this onnxruntime no longer crashes on an f16 Transpose -> MatMul (fixed upstream)")


def test_a_crash_of_onnxruntime_on_the_written_model_is_exit_3_and_leaves_nothing(crashing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = rlx(crashing, "-p", "always-f16", "-o", out / "m.onnx", "--provider", "cpu", "--target", "cpu")
    assert result.returncode == 3, result.stderr
    [line] = without_progress(result.stderr)  # the one line, after a piped run's progress
    assert str(out / "m.onnx") in line and "on cpu" in line and "SIGSEGV" in line
    assert list(out.iterdir()) == []  # no model, no staging directory


def test_a_batch_goes_on_after_a_crash(crashing: Path, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    models = [tmp_path / "in" / "a_crash.onnx", tmp_path / "in" / "b_block.onnx"]
    models[0].write_bytes(crashing.read_bytes())
    onnx.save(HEALTHY["transformer_block"]().model, str(models[1]))
    result = rlx(*models, "-p", "always-f16", "--out-dir", tmp_path / "out", "--provider", "cpu", "--target", "cpu",
                 "--report-json", tmp_path / "r.json", "-q")
    assert result.returncode == 3
    report = json.loads((tmp_path / "r.json").read_text())
    assert [f["exit_code"] for f in report["failed"]] == [3]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b_block.onnx"]


def test_on_a_stand_in_provider_it_says_so_and_the_verdict_is_emulated(crashing: Path, tmp_path: Path) -> None:
    """For a CUDA target, the CPU provider only stands in: the written model's crash there is
    said (in the report's latency note), and the emulated verdict stands."""
    result = rlx(crashing, "-p", "always-f16", "-o", tmp_path / "m.onnx", "--provider", "cpu",
                 "--report-json", tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert verify["emulated"] and not verify["candidate_loaded"]
    assert verify["emulation_reason"].startswith("cpu cannot run the candidate: ")
    assert "SIGSEGV" in verify["emulation_reason"] and "SIGSEGV" in verify["latency"]["note"] and verify["latency"]["candidate_ms"] is None


@pytest.fixture()
def written(tmp_path: Path) -> tuple[Path, Path]:
    """A transformer block and its always-f16 copy, written unverified."""
    src, cand = tmp_path / "f32.onnx", tmp_path / "f16.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    assert rlx(src, "-p", "always-f16", "-o", cand, "--no-verify", "-q").returncode == 0
    return src, cand


def test_a_stop_while_judging_does_not_wait_for_the_written_files_run(written: tuple[Path, Path],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The written file's run overlaps the emulated judgement; a stop (^C) during the judgement
    ends the verification at once (the child killed), without waiting for the child's answer,
    which its timed runs hold back until the judgement is done."""
    from rlx_onnx_amp.verification import core
    from rlx_onnx_amp.verification.options import VerifyOptions

    src, cand = written
    answers: list[str] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    real_answer = core._written_answer

    def recorded(*args: Any) -> Any:
        answers.append("waited")
        return real_answer(*args)

    monkeypatch.setattr(core, "_written_answer", recorded)
    monkeypatch.setattr(core.Verifier, "judge", interrupted)
    with pytest.raises(KeyboardInterrupt), core.Verifier.prepare(src, VerifyOptions(provider="cpu")) as verifier:
        verifier.verify(cand)
    assert answers == []


def test_the_overlapped_and_the_one_at_a_time_runs_report_alike(written: tuple[Path, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Above `OVERLAP_MAX_BYTES` of weights the written file's run comes first and the judgement
    after it, one session at a time; below, they overlap. Both give the same verdict, drifts and
    proof of loading, and both time the written file."""
    from rlx_onnx_amp.verification import core
    from rlx_onnx_amp.verification.options import VerifyOptions

    src, cand = written
    reports = []
    for limit in (core.OVERLAP_MAX_BYTES, 0):
        monkeypatch.setattr(core, "OVERLAP_MAX_BYTES", limit)
        with core.Verifier.prepare(src, VerifyOptions(provider="cpu")) as verifier:
            reports.append(verifier.verify(cand))
    overlapped, one_at_a_time = reports
    assert overlapped.emulated and overlapped.candidate_loaded and overlapped.passed
    for field in ("passed", "emulated", "emulation_reason", "candidate_loaded", "outputs", "task"):
        assert getattr(overlapped, field) == getattr(one_at_a_time, field), field
    assert overlapped.latency is not None and one_at_a_time.latency is not None
    assert overlapped.latency.candidate_ms is not None and one_at_a_time.latency.candidate_ms is not None

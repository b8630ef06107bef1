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


def test_on_a_stand_in_provider_it_says_so_and_exits_4(crashing: Path, tmp_path: Path) -> None:
    """For a CUDA target, the CPU provider only stands in: the written model's crash there is
    said in one line, even with -q, the file is written, the verdict is the emulation's, and
    the exit code 4 (written, not verified), never 0 (issue 49)."""
    out = tmp_path / "m.onnx"
    result = rlx(crashing, "-p", "always-f16", "-o", out, "--provider", "cpu", "--report-json", tmp_path / "r.json",
                 "-q")
    assert result.returncode == 4, result.stderr
    assert out.is_file()
    assert (f"{out}: the written file crashes onnxruntime's CPU provider (signal 11, SIGSEGV); the verdict is the "
            "emulation's (exit 4)") in result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    verify = report["verify"]
    assert verify["passed"] and verify["emulated"] and not verify["candidate_loaded"]
    assert verify["emulation_reason"].startswith("cpu cannot run the candidate: ")
    assert "SIGSEGV" in verify["emulation_reason"] and "SIGSEGV" in verify["latency"]["note"] and verify["latency"]["candidate_ms"] is None
    assert verify["written"] == {"provider": "cpu", "target": "cuda", "ran": False, "crashed": "signal 11 (SIGSEGV)",
                                 "error": verify["written"]["error"], "outputs": [], "passed": None}
    assert "SIGSEGV" in verify["written"]["error"]


def test_a_search_ends_as_the_plain_command_where_its_candidates_crash_a_stand_in(crashing: Path, tmp_path: Path) -> None:
    """`--policy auto` and `--repair` judge their candidates emulated on the CPU provider
    without loading them there first (a sweep's f16 LSTM recognizers crashed it as they loaded:
    exit 3, nothing written); the written file's crash in its child is exit 4, the file
    written, as the plain command's."""
    for flags in (("-p", "auto"), ("-p", "always-f16", "--repair")):
        out = tmp_path / f"{flags[-1].lstrip('-')}.onnx"
        result = rlx(crashing, *flags, "-o", out, "--provider", "cpu", "-q")
        assert result.returncode == 4, (flags, result.stdout + result.stderr)
        assert out.is_file() and "the written file crashes onnxruntime's CPU provider" in result.stdout


def test_the_verify_command_exits_4_where_the_written_file_crashes_a_stand_in(crashing: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    assert rlx(crashing, "-p", "always-f16", "-o", out, "--no-verify", "-q").returncode == 0
    result = rlx("verify", crashing, out, "--provider", "cpu", "--target", "cuda")
    assert result.returncode == 4, result.stderr
    assert "the written file crashes onnxruntime's CPU provider (signal 11, SIGSEGV)" in result.stdout
    assert "PASSED" in result.stdout  # the emulation's verdict, said as such
    result = rlx("verify", crashing, out, "--provider", "cpu", "--target", "cpu")
    assert result.returncode == 3 and "SIGSEGV" in result.stderr


def _f16_mask_block(tmp_path: Path) -> tuple[Path, Path]:
    """The transformer block with its attention mask's fill, -1e9, clamped to f16's -65504 by
    the conversion: where a row masks every position (the seeded second input set does), the
    scores plus the fill overflow to -inf in onnxruntime's f16 Add on the CPU provider, which the
    emulation (f32 arithmetic, each value rounded and saturated to f16's range) does not."""
    src = tmp_path / "block.onnx"
    onnx.save(HEALTHY["transformer_block"]().model, str(src))
    return src, tmp_path / "block16.onnx"


def _masked_sets(path: Path) -> list[dict[str, np.ndarray]]:
    """Two seeded input sets of 8 tokens for the block, as a user saves them: the second masks
    every position (a row of padding only)."""
    rng = np.random.default_rng(7)
    sets: list[dict[str, np.ndarray]] = [
        {"x": rng.standard_normal((1, 8, 32)).astype(np.float32),
         "attention_mask": np.array([[1, 1, 1, 1, 1, 1, 0, 0]], dtype=np.int64)},
        {"x": rng.standard_normal((1, 8, 32)).astype(np.float32), "attention_mask": np.zeros((1, 8), dtype=np.int64)}]
    saved: dict[str, Any] = {f"{n}{suffix}": v for suffix, s in zip(("", "#1"), sets) for n, v in s.items()}
    np.savez(path, **saved)
    return sets


def test_the_written_file_fails_where_its_emulation_passes(tmp_path: Path) -> None:
    """The written file's own outputs are judged as well as the emulation's: it fails on the
    CPU provider where the emulation passes, so the verdict fails (exit 1), and the line says
    which run failed and what it means. Its figures are onnxruntime's on the saved inputs."""
    import onnxruntime as ort

    src, out = _f16_mask_block(tmp_path)
    sets = _masked_sets(tmp_path / "in.npz")
    result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--inputs", tmp_path / "in.npz",
                 "--report-json", tmp_path / "r.json")
    assert result.returncode == 1, result.stderr
    verify = json.loads((tmp_path / "r.json").read_text())["verify"]
    assert not verify["passed"] and verify["emulated"] and all(o["passed"] for o in verify["outputs"])
    written = verify["written"]
    assert written["ran"] and written["passed"] is False and written["crashed"] is None
    [y] = written["outputs"]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("written file on cpu: "))
    assert line.startswith(f"written file on cpu: y FAIL cosine {y['cosine']:.7f} < 0.999 (")
    assert "onnxruntime's CPU kernels for f16 differ from the emulation, which passes" in line
    assert "the file is wrong for CPU users" in line
    # The same figures from onnxruntime directly: the second set masks every position.
    ref, cand = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (src, out))
    r = np.stack([ref.run(None, f)[0] for f in sets]).astype(np.float64).ravel()
    c = np.stack([cand.run(None, f)[0] for f in sets]).astype(np.float64).ravel()
    assert abs(r @ c / np.linalg.norm(r) / np.linalg.norm(c) - y["cosine"]) < 1e-6
    assert abs(np.abs(r - c).max() - y["max_abs"]) < 1e-5
    quiet = rlx(src, "-p", "always-f16", "-o", tmp_path / "q.onnx", "--provider", "cpu", "--inputs",
                tmp_path / "in.npz", "-q")
    assert quiet.returncode == 1
    assert f"FAILED {tmp_path / 'q.onnx'}: the written file on cpu: y (max-scaled, cosine)" in quiet.stdout


def test_the_written_file_passes_where_it_matches(tmp_path: Path) -> None:
    """One input set, no fully masked row: the written file passes as the emulation does, and
    the report says so in one short line."""
    src, out = _f16_mask_block(tmp_path)
    result = rlx(src, "-p", "always-f16", "-o", out, "--provider", "cpu", "--report-json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "r.json").read_text())["verify"]["written"]
    assert written["ran"] and written["passed"] and [o["name"] for o in written["outputs"]] == ["y"]
    assert "written file on cpu: PASS" in result.stdout


def test_the_session_constructor_refuses_a_fallback(tmp_path: Path) -> None:
    """`sessions.OrtSession` on a provider onnxruntime cannot start here falls back to the CPU,
    which it refuses; and it tells a supervisor what it loads and runs, before onnxruntime does."""
    import onnxruntime as ort

    from rlx_onnx_amp import contain
    from rlx_onnx_amp.errors import InputError
    from rlx_onnx_amp.sessions import OrtSession

    path = tmp_path / "m.onnx"
    onnx.save(_transpose_matmul(), str(path))
    missing = [p for p in ("CUDAExecutionProvider", "CoreMLExecutionProvider") if p not in ort.get_available_providers()]
    if not missing:
        pytest.skip("every provider is available here")
    with pytest.raises(InputError, match=f"m.onnx: onnxruntime fell back to CPUExecutionProvider instead of {missing[0]}"):
        OrtSession(str(path), missing[0], str(path))
    notes: list[str] = []
    contain.listen(notes.append)
    try:
        session = OrtSession(str(path), "CPUExecutionProvider", "m.onnx", role="the written file")
        [y] = session.run(["y"], {"x": np.ones((6, 2, 256), np.float32)})
    finally:
        contain.listen(None)
    assert y.shape == (2, 6, 59)
    assert notes == ["loading the written file m.onnx on CPUExecutionProvider",
                     "running the written file m.onnx on CPUExecutionProvider"]


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


def test_a_heavy_input_is_not_timed_where_the_provider_only_stands_in(written: tuple[Path, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `SECOND_SIZE_WEIGHT_LIMIT` of weights (here 0), on a provider that stands in for the
    target, the input gets no second session for a time that concludes nothing: the written file
    is timed alone and the note says why. On the target's own provider both are timed."""
    from rlx_onnx_amp.reports.text import latency_line
    from rlx_onnx_amp.verification import core
    from rlx_onnx_amp.verification.options import VerifyOptions

    src, cand = written
    monkeypatch.setattr(core, "SECOND_SIZE_WEIGHT_LIMIT", 0)
    found = {}
    for target in ("cuda", "cpu"):
        with core.Verifier.prepare(src, VerifyOptions(provider="cpu", target=target)) as verifier:
            found[target] = verifier.verify(cand)
    stand_in, own = found["cuda"].latency, found["cpu"].latency
    assert stand_in is not None and stand_in.reference_ms is None and stand_in.candidate_ms is not None
    assert stand_in.note is not None and stand_in.note.startswith("the input not timed: cpu stands in for the cuda")
    assert own is not None and own.reference_ms is not None and own.candidate_ms is not None and own.note is None
    line = latency_line(found["cuda"], "cuda")
    assert line is not None and line.startswith("latency on cpu: the written model ") and "the input not timed" in line

"""The verification object: one reference run, prepared once, judges every candidate; verify,
localize and repair's evaluations and proof share it. Reference runs are counted with a spy on
rlx-amp's own `Session` that lets onnxruntime run as it does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, REPAIR_CASES
from rlx_onnx_amp import convert, convert_file
from rlx_onnx_amp.repair import repair_file
from rlx_onnx_amp.verification import InputSpec, Tolerances, Verifier, VerifyOptions, verify
from rlx_onnx_amp.verification.compare import Session


def _fingerprint(model: onnx.ModelProto) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """A model's nodes and weights: the reference's, whatever outputs a run exposes."""
    return tuple(n.SerializeToString() for n in model.graph.node), tuple(
        t.SerializeToString() for t in model.graph.initializer
    )


class _ReferenceRuns:
    """How often onnxruntime ran the reference (its nodes and weights, any outputs exposed), and
    with which outputs fetched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, reference: Path) -> None:
        self.fingerprint = _fingerprint(onnx.load(str(reference)))
        self.fetched: list[int] = []  # how many values each reference run fetched
        init, run = Session.__init__, Session.run
        fingerprints: dict[int, bool] = {}

        def counted_init(session: Session, model: str, *args: object, **kwargs: object) -> None:
            init(session, model, *args, **kwargs)  # type: ignore[arg-type]
            fingerprints[id(session)] = _fingerprint(onnx.load(model, load_external_data=False)) == self.fingerprint

        def counted_run(session: Session, feeds: object, names: object = None) -> dict[str, np.ndarray]:
            values = run(session, feeds, names)  # type: ignore[arg-type]
            if fingerprints.get(id(session)):
                self.fetched.append(len(values))
            return values

        monkeypatch.setattr(Session, "__init__", counted_init)
        monkeypatch.setattr(Session, "run", counted_run)

    @property
    def count(self) -> int:
        return len(self.fetched)


@pytest.fixture
def shapes(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """data_dependent_shapes and its always-f16 conversion, which fails (its output lengths move)."""
    src, out = tmp_path / "dd.onnx", tmp_path / "dd16.onnx"
    onnx.save(REPAIR_CASES["data_dependent_shapes"]().model, str(src))
    convert_file(src, out, "always-f16", screen=False)  # the literal rewrite: the screen would keep it whole
    yield src, out


def test_verify_with_localize_runs_the_reference_once_per_input_set_and_once_for_its_intermediates(
    shapes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = shapes
    runs = _ReferenceRuns(monkeypatch, src)
    report = verify(src, out, VerifyOptions(provider="cpu", localize=True, spec=InputSpec(samples=2)))
    assert not report.passed and report.localized
    assert runs.fetched == [2, 2, 4]  # two input sets with the two outputs; then s, v, selected and top


def test_repair_shares_one_reference_run_across_its_evaluations_localizations_and_proof(
    shapes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Repair localizes twice, bisects, minimizes and proves the written file with --localize:
    the reference runs on the input sets once and with its intermediates once."""
    src, _ = shapes
    runs = _ReferenceRuns(monkeypatch, src)
    options = VerifyOptions(provider="cpu", localize=True, spec=InputSpec(samples=2))
    _conversion, verified, result = repair_file(src, tmp_path / "out.onnx", "always-f16", verify_options=options)
    stages = [e.stage for e in result.history]
    assert sum(s.startswith("localize") for s in stages) == 2 and len(stages) >= 5 and result.passed
    assert verified.passed and verified.localized == () and verified.samples == 2
    assert runs.fetched == [2, 2, 4]


def test_one_verification_judges_many_candidates(shapes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates in memory and on disk are judged against the same run; localizing two
    candidates runs the reference's intermediates once; the judgement's verdict and score are
    its outputs' (failing first). A candidate that is the reference itself passes exactly."""
    src, out = shapes
    runs = _ReferenceRuns(monkeypatch, src)
    model = onnx.load(str(src))
    with Verifier.prepare(src, VerifyOptions(provider="cpu")) as verification:
        same = verification.judge(convert(model, "always-f32", screen=False))  # the reference again
        f16 = verification.judge(onnx.load(str(out)), out, label="dd16")
        assert same.passed and same.score == 0.0 and [d.name for d in same.drifts] == ["selected", "top"]
        assert not f16.passed and f16.score == max(d.score or 0.0 for d in f16.drifts) > 1
        assert [d.passed for d in f16.drifts] == sorted(d.passed for d in f16.drifts)
        assert f16.compared.emulated and f16.compared.precision.value == "f16"
        first = verification.localize(f16, 10)
        again = verification.localize(verification.judge(convert(model, "always-f16", screen=False)), 10)
        scratch = verification.scratch.dir
    assert first == again and first[0].node == "unshift" and first[0].reason == "drift jumps"
    assert not scratch.exists()
    # One input set with the two outputs (and the f32 candidate, the reference itself); then
    # the four float values, once for both localizations.
    assert runs.fetched == [2, 2, 4]


def test_the_verification_judges_by_its_tolerance(tmp_path: Path) -> None:
    """The same candidate fails the precision's defaults and passes a looser per-output table."""
    src, out = tmp_path / "m.onnx", tmp_path / "m16.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    convert_file(src, out, "always-f16", screen=False)  # the literal rewrite, whose exp overflows
    candidate = onnx.load(str(out))
    strict = Verifier.prepare(src, VerifyOptions(provider="cpu"))
    with strict:
        assert not strict.judge(candidate, out).passed
    loose = Verifier(strict.reference, VerifyOptions(provider="cpu", tolerance=Tolerances.of(atol={"y": 1e30})))
    with loose:
        judged = loose.judge(candidate, out)
    assert judged.drifts[0].atol == 1e30

"""One typed result per model (`reports.record`): it writes what the JSON report holds, that JSON
reads back into an equal record, and merge-reports reads the reports it merges back into the
same records. Real fixture models, converted, verified and repaired for real."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY, REPAIR_CASES
from rlx_onnx_amp import convert_file
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.repair import repair_file
from rlx_onnx_amp.reports.merge import merge_reports, read_report
from rlx_onnx_amp.reports.record import Localized, ModelResult, TracePoint
from rlx_onnx_amp.verification import VerifyOptions, verify


def _text(data: dict) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"  # as --report-json writes it


def _cli(*args: str | Path) -> tuple[int, str]:
    """The command line in this process: (exit code, stderr)."""
    from rlx_onnx_amp.cli import main

    err = io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main.main(args=[str(a) for a in args], prog_name="rlx-amp", standalone_mode=True)
        except SystemExit as e:
            code = e.code
    return (code if isinstance(code, int) else 1), err.getvalue()


def test_a_drifting_model_s_result_round_trips_through_its_json(tmp_path: Path) -> None:
    """Outputs whose shapes differ, localized: the record writes the conversion and drift
    reports' own JSON, and reads back equal, its localization entries typed."""
    src, out = tmp_path / "shapes.onnx", tmp_path / "out.onnx"
    onnx.save(REPAIR_CASES["data_dependent_shapes"]().model, str(src))
    conversion = convert_file(src, out, "always-f16")
    verified = verify(src, out, VerifyOptions(provider="cpu", localize=True))
    result = ModelResult(conversion, verified)
    text = _text(result.to_json())
    data = json.loads(text)  # the conversion's keys, then its drift report under "verify"
    assert list(data)[: len(conversion.to_json()) - 1] == [k for k in conversion.to_json() if k != "proof"]
    assert data["verify"] == json.loads(_text(verified.to_json())) and data["proof"] == "onnx.checker"
    back = ModelResult.from_json(json.loads(text))
    assert back == result and _text(back.to_json()) == text
    assert back.verify is not None and back.conversion is not None
    assert back.exit_code == 1 and not back.verify.passed
    localized = back.verify.localized
    assert localized and all(isinstance(entry, Localized) for entry in localized)
    differ = [entry for entry in localized if entry.reason == "shape differs"]
    assert differ and all(entry.reference_shape != entry.candidate_shape for entry in differ)
    trace = back.verify.localize_trace
    assert trace and all(isinstance(point, TracePoint) for point in trace)
    assert isinstance(back.conversion.policy, Policy) and back.conversion.policy.name == "always-f16"


def test_a_repaired_model_s_result_round_trips_through_its_json(tmp_path: Path) -> None:
    src = tmp_path / "exp.onnx"
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(src))
    conversion, verified, repaired = repair_file(src, tmp_path / "out.onnx", "always-f16",
                                                 verify_options=VerifyOptions(provider="cpu"))
    result = ModelResult(conversion, verified, repaired)
    text = _text(result.to_json())
    assert list(json.loads(text))[-3:] == ["verify", "proof", "repair"]
    back = ModelResult.from_json(json.loads(text))
    assert back == result
    assert back.repair is not None and back.repair.passed and back.exit_code == 0
    assert back.repair.kept_f32 == repaired.kept_f32 and repaired.kept_f32
    assert sum(step.written for step in back.repair.history) == 1


def test_merge_reports_reads_back_the_results_each_report_holds(tmp_path: Path) -> None:
    """A batch shard (a model and a failure), a repaired model's report and a verify command's
    report: each reads back as its typed results, the merge holds them in order, and the
    merged report reads back as the same results again."""
    for name, build in (("good", HEALTHY["transformer_block"]), ("exp", BROKEN_IN_F16["exp_overflow"])):
        onnx.save(build().model, str(tmp_path / f"{name}.onnx"))
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07 not a model")
    (tmp_path / "out").mkdir()
    cpu = ("--provider", "cpu", "-q")
    assert _cli(tmp_path / "good.onnx", tmp_path / "broken.onnx", "--out-dir", tmp_path / "out", *cpu,
                "--report-json", tmp_path / "batch.json")[0] == 2
    assert _cli(tmp_path / "exp.onnx", "-p", "always-f16", "-o", tmp_path / "exp16.onnx", "--repair", *cpu,
                "--report-json", tmp_path / "repair.json")[0] == 0
    assert _cli("verify", tmp_path / "good.onnx", tmp_path / "out" / "good.onnx", *cpu,
                "--report-json", tmp_path / "verify.json")[0] == 0
    shards = [tmp_path / "batch.json", tmp_path / "repair.json", tmp_path / "verify.json"]
    batch, repair, verified = (read_report(p) for p in shards)
    assert [r.exit_code for r in batch] == [0, 2] and batch[1].failure is not None
    assert batch[1].failure.model == str(tmp_path / "broken.onnx")
    assert repair[0].repair is not None and repair[0].repair.passed
    assert verified[0].conversion is None and verified[0].verify is not None and verified[0].verify.passed
    written = json.loads((tmp_path / "verify.json").read_text())
    assert list(written) == ["schema_version", "run", "verify"] and written["run"]["provider"] == "cpu"
    assert _text({"verify": verified[0].verify.to_json()}) == _text({"verify": written["verify"]})
    for shard in shards:  # every report file the command line writes starts with its layout's version
        assert next(iter(json.loads(shard.read_text()))) == "schema_version"
    merged = merge_reports(shards)
    assert merged.results == (*batch, *repair, *verified) and merged.exit_code == 2
    assert _cli("merge-reports", *shards, "--report-json", tmp_path / "merged.json", "-q")[0] == 2
    written_merge = json.loads((tmp_path / "merged.json").read_text())
    assert written_merge.pop("run")["provider"] is None  # a merge runs no model
    assert _text(written_merge) == _text(merged.to_json())
    models_first = sorted(merged.results, key=lambda r: r.failure is not None)  # a batch report's order
    assert read_report(tmp_path / "merged.json") == models_first
    written = json.loads((tmp_path / "merged.json").read_text())
    assert written["models"][-1] == {"model": str(tmp_path / "good.onnx"), "output": str(tmp_path / "out" / "good.onnx"),
                                     "verify": json.loads((tmp_path / "verify.json").read_text())["verify"]}


@pytest.mark.broken_reports  # it writes reports the schema must refuse
def test_merge_reports_reads_reports_written_before_schema_version(tmp_path: Path) -> None:
    """A report without `schema_version` (written before the key existed) merges as version 1;
    a version this rlx-amp does not know is refused in one line (exit 2)."""
    good = tmp_path / "good.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(good))
    assert _cli(good, "-o", tmp_path / "good16.onnx", "--provider", "cpu", "-q", "--report-json", tmp_path / "new.json")[0] == 0
    data = json.loads((tmp_path / "new.json").read_text())
    assert data.pop("schema_version") == 1
    (tmp_path / "old.json").write_text(_text(data))
    assert read_report(tmp_path / "old.json") == read_report(tmp_path / "new.json")
    assert merge_reports([tmp_path / "old.json"]).to_json()["schema_version"] == 1
    (tmp_path / "future.json").write_text(_text({"schema_version": 2, **data}))
    code, err = _cli("merge-reports", tmp_path / "new.json", tmp_path / "future.json", "-q")
    assert code == 2 and err.strip() == (f"rlx-amp: error: {tmp_path / 'future.json'}: report schema_version 2 is not 1, "
                                         "the one this rlx-amp reads")


@pytest.mark.broken_reports  # it writes reports the schema must refuse
def test_merge_reports_refuses_a_report_that_is_not_one_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(good))
    assert _cli(good, "-o", tmp_path / "out.onnx", "--provider", "cpu", "-q", "--report-json", tmp_path / "r.json")[0] == 0
    report = json.loads((tmp_path / "r.json").read_text())
    for name, broken in (("no-kind", {**report, "nodes": {"total": 3}}),
                         ("passed-text", {**report, "verify": {**report["verify"], "passed": "yes"}}),
                         ("nothing", {"models": [{"model": "m", "output": "o"}], "failed": []})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(broken))
        code, stderr = _cli("merge-reports", path)
        assert code == 2 and len(stderr.splitlines()) == 1, stderr
        assert stderr.startswith(f"rlx-amp: error: {path}: not an rlx-amp report ("), stderr


def test_merge_reports_counts_a_model_written_unverified_as_its_shard_did(tmp_path: Path) -> None:
    """A shard whose model was written unverified exited 4; merged with a passing shard, the
    merge exits 4 too (the worst of the shards' codes), as one batch of both models does."""
    from tests.test_cli import _wide_conv

    wide = _wide_conv(tmp_path / "conv.onnx")  # the reference cannot run on the guessed axes
    good = tmp_path / "good.onnx"
    onnx.save(HEALTHY["conv_net"]().model, str(good))
    cpu = ("--provider", "cpu", "-q")
    assert _cli(wide, "-p", "always-f16", "-o", tmp_path / "wide16.onnx", *cpu, "--report-json", tmp_path / "a.json")[0] == 4
    assert _cli(good, "-o", tmp_path / "good16.onnx", *cpu, "--report-json", tmp_path / "b.json")[0] == 0
    (unverified,) = read_report(tmp_path / "a.json")
    assert unverified.unverified and unverified.verify is None and unverified.exit_code == 4
    merged = merge_reports([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged.exit_code == 4 and merged.to_json()["exit_code"] == 4
    assert _cli("merge-reports", tmp_path / "a.json", tmp_path / "b.json", "-q")[0] == 4
    (tmp_path / "out").mkdir()
    assert _cli(wide, good, "-p", "always-f16", "--out-dir", tmp_path / "out", *cpu)[0] == 4  # one batch of both

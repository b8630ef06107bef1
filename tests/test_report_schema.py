"""The JSON Schema of the reports (docs/report.schema.json) is generated from the records
(`reports.record.json_schema`), checked in up to date, and every report the command line
writes matches it (tests/conftest.py checks every report any test writes, too); a report that
drifts from it (a key added, removed or of another type) fails."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import onnx
import pytest

from fixtures.make_fixtures import BROKEN_IN_F16, HEALTHY
from rlx_onnx_amp.reports.record import json_schema
from tests.conftest import report_schema_problem
from tests.test_reports import _cli

REPO = Path(__file__).resolve().parents[1]


def test_the_checked_in_schema_is_the_records_schema() -> None:
    checked_in = json.loads((REPO / "docs" / "report.schema.json").read_text())
    assert checked_in == json_schema(), "run: python -m rlx_onnx_amp.reports.record > docs/report.schema.json"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One of each report file the command line writes: a model's, a repaired model's, a
    batch's (with a failure), a verify command's and a merge's."""
    tmp = tmp_path_factory.mktemp("reports")
    onnx.save(HEALTHY["transformer_block"]().model, str(tmp / "good.onnx"))
    onnx.save(BROKEN_IN_F16["exp_overflow"]().model, str(tmp / "exp.onnx"))
    (tmp / "broken.onnx").write_bytes(b"\x08\x07 not a model")
    (tmp / "out").mkdir()
    cpu = ("--provider", "cpu", "-q")
    assert _cli(tmp / "good.onnx", "-o", tmp / "good16.onnx", "--localize", *cpu, "--report-json", tmp / "model.json")[0] == 0
    assert _cli(tmp / "exp.onnx", "-p", "always-f16", "-o", tmp / "exp16.onnx", "--repair", *cpu,
                "--report-json", tmp / "repair.json")[0] == 0
    assert _cli(tmp / "good.onnx", tmp / "broken.onnx", "--out-dir", tmp / "out", *cpu,
                "--report-json", tmp / "batch.json")[0] == 2
    assert _cli("verify", tmp / "good.onnx", tmp / "good16.onnx", *cpu, "--report-json", tmp / "verify.json")[0] == 0
    shards = [tmp / "batch.json", tmp / "repair.json", tmp / "verify.json"]
    assert _cli("merge-reports", *shards, "--report-json", tmp / "merged.json", "-q")[0] == 2
    names = ("model", "repair", "batch", "verify", "merged")
    return {name: json.loads((tmp / f"{name}.json").read_text()) for name in names}


def test_every_report_the_command_writes_matches_the_schema(reports: dict[str, dict]) -> None:
    for name, data in reports.items():
        assert report_schema_problem(data) is None, name
    # Not vacuous: the optional parts are there to be checked.
    assert reports["model"]["verify"]["localized"] is not None and "cost" in reports["model"]
    assert reports["repair"]["repair"]["history"] and reports["batch"]["failed"]


@pytest.mark.parametrize(
    "report, drift, where",
    [
        ("model", lambda d: d.update(gain={"latency_ms": 1.0}), "gain"),  # a key the schema does not know
        ("model", lambda d: d.pop("casts_inserted"), "casts_inserted"),  # a key it requires
        ("model", lambda d: d["nodes"].update(total="12"), "nodes/total"),  # a number as a string
        ("repair", lambda d: d["repair"]["kept_f32"].append({"path": "0"}), "repair/kept_f32"),
        ("verify", lambda d: d["verify"]["outputs"][0].update(passed=None), "verify/outputs/0/passed"),
        ("batch", lambda d: d.update(schema_version=2), "schema_version"),
    ],
)
def test_a_report_that_drifts_from_the_schema_fails(reports: dict[str, dict], report: str, drift, where: str) -> None:
    data = copy.deepcopy(reports[report])
    drift(data)
    problem = report_schema_problem(data)
    assert problem is not None
    assert where.split("/")[0] in problem

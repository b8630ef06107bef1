from __future__ import annotations

import functools
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Tests import the fixture builders from the repository's fixtures/ package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# A suite started with SIGINT ignored (from a background job or under nohup) would pass that on
# to every rlx-amp it starts, which then rightly leaves SIGINT ignored (`stops.stop_handlers`),
# and the tests that interrupt a run would fail. Python's own handler here gives the runs the
# default disposition (an exec resets a handled signal, not an ignored one).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _reports_match_their_schema(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every JSON report a test writes under its tmp_path (a file with `schema_version`) is valid
    against docs/report.schema.json: the schema is checked against every report the suite makes."""
    # Asked for before the test runs, so that it is torn down after this fixture's check. A test
    # that writes malformed reports on purpose (to see them refused) is marked broken_reports.
    checked = "tmp_path" in request.fixturenames and request.node.get_closest_marker("broken_reports") is None
    tmp_path: Path | None = request.getfixturevalue("tmp_path") if checked else None
    yield
    if tmp_path is None:
        return
    for path in tmp_path.rglob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue  # not a report: a config or a deliberately broken file
        if isinstance(data, dict) and "schema_version" in data:
            problem = report_schema_problem(data)
            assert problem is None, f"{path.name} does not match docs/report.schema.json: {problem}"


def report_schema_problem(data: object) -> str | None:
    """Why `data` is not a report the schema describes, or None."""
    import jsonschema

    from rlx_onnx_amp.reports.record import report_kind

    schema = _schema()
    if not isinstance(data, dict):
        return "not an object"
    if jsonschema.Draft202012Validator(schema).is_valid(data):
        return None
    # Which report it means to be, by its keys: that definition's first error names the place.
    kind = {**schema, "oneOf": None, "$ref": f"#/$defs/{report_kind(data)}"}
    del kind["oneOf"]
    best = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(kind).iter_errors(data))
    if best is None:  # valid as its kind, yet not as exactly one of them
        return "matches none, or more than one, of the report kinds"
    return f"{'/'.join(map(str, best.absolute_path))}: {best.message}"[:500]


@functools.cache
def _schema() -> Any:
    return json.loads((Path(__file__).resolve().parents[1] / "docs" / "report.schema.json").read_text())

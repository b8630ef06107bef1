"""`rlx-amp merge-reports`: one summary from the JSON reports of several runs (the shards of a
model zoo spread over CI jobs), with the worst exit code of all.

Each input is what `--report-json` wrote: a batch report (`{"models", "failed", "passed",
"exit_code"}`), a single conversion report (with `verify` when verified), or a `verify`
command's report (`{"verify": ...}`), each with its `schema_version` (docs/reports.md) or, as
written before that key existed, without it. The merged report is a batch report over every
model of every shard, in the order the files are given, plus `shards` (the files merged).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.exits import EXIT_OK, worst_exit_code
from rlx_onnx_amp.reports.record import (
    SCHEMA_VERSION,
    Failure,
    ModelResult,
    RecordError,
    Run,
    Verification,
    batch_json,
)
from rlx_onnx_amp.reports.text import SUMMARY_COLUMNS, SUMMARY_LEGEND, size_ratio, speedup

__all__ = ["MergedReport", "merge_reports", "merged_markdown", "read_report"]


def read_report(path: str | Path) -> list[ModelResult]:
    """One report file's models, then its failures, as typed results."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{p}: not a JSON report ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: not an rlx-amp report (a JSON object was expected)")
    version = data.pop("schema_version", SCHEMA_VERSION)  # absent: written before the key existed
    data.pop("run", None)  # provenance of the file, not of its models
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise InputError(
            f"{p}: report schema_version {version!r:.20} is not {SCHEMA_VERSION}, the one this rlx-amp reads"
        )
    try:
        if "models" in data and "failed" in data:
            return [*map(ModelResult.from_json, _entries(data, "models")), *map(_failure, _entries(data, "failed"))]
        if "model" in data and "output" in data:  # one conversion report
            return [ModelResult.from_json(data)]
        if set(data) == {"verify"} and isinstance(data["verify"], dict):  # the verify command
            return [ModelResult(verify=Verification.from_json(data["verify"]))]
    except RecordError as e:
        raise InputError(f"{p}: not an rlx-amp report ({e})") from None
    raise InputError(f"{p}: not an rlx-amp report (no 'models', 'model' or 'verify' key)")


def _entries(data: dict[str, Any], key: str) -> list[Any]:
    if not isinstance(data[key], list):
        raise RecordError(f"{key}: a list was expected, not {type(data[key]).__name__}")
    return data[key]


def _failure(data: Any) -> ModelResult:
    return ModelResult(failure=Failure.from_json(data))


@dataclass(frozen=True)
class MergedReport:
    """Every model of several reports, in the order the files are given, and those files."""

    results: tuple[ModelResult, ...]
    shards: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return worst_exit_code([r.exit_code for r in self.results])

    def to_json(self, run: Run | None = None) -> dict[str, Any]:
        """The merged batch report: a batch report over every model, plus `shards`."""
        return {**batch_json(self.results, self.exit_code, run), "shards": list(self.shards)}


def merge_reports(paths: Sequence[str | Path]) -> MergedReport:
    """The batch report over every model of `paths`, in order, with the worst exit code."""
    if not paths:
        raise InputError("merge-reports needs at least one report file")
    _refuse_repeats(paths)
    return MergedReport(tuple(r for path in paths for r in read_report(path)), tuple(str(p) for p in paths))


def _refuse_repeats(paths: Sequence[str | Path]) -> None:
    """A shard given twice (the same file, or a copy with the same bytes) would count its models
    twice: an input error naming both."""
    seen: dict[object, str] = {}
    for path in paths:
        p = Path(path)
        keys: list[object] = [p.resolve()]
        with contextlib.suppress(OSError):  # a missing file is read_report's to report
            keys.append(hashlib.sha256(p.read_bytes()).hexdigest())
        for key in keys:
            if key in seen:
                raise InputError(f"{p}: the same report as {seen[key]}; each shard is merged once")
            seen[key] = str(p)


def _score(r: ModelResult) -> str:
    scores = [o.score for o in (r.verify.outputs if r.verify is not None else ()) if o.score is not None]
    return f"{max(scores):.4g}" if scores else "-"


def _row(r: ModelResult) -> str:
    v, c = r.verify, r.conversion
    share = c.cost.mac_low_share if c is not None and c.cost is not None else None
    cells = [
        f"`{r.output or r.model}`",
        ("pass" if v.passed else "**FAIL**") if v else "converted",
        c.policy.name if c is not None and c.policy is not None else "-",
        v.provider if v else "-",
        ("yes" if v.emulated else "no") if v else "-",
        str(len(v.outputs)) if v else "-",
        str(sum(not o.passed for o in v.outputs)) if v else "-",
        _score(r),
        f"{100 * share:.0f}%" if share is not None else "-",
        size_ratio(c),
        speedup(v),
    ]
    return "| " + " | ".join(cells) + " |"


def merged_markdown(merged: MergedReport) -> str:
    """The CI job summary: one row per model of every shard, the failures and why."""
    models = [r for r in merged.results if r.failure is None]
    failed = [r.failure for r in merged.results if r.failure is not None]
    out = [
        f"# rlx-amp drift report: {'✅ passed' if merged.exit_code == EXIT_OK else '❌ failed'}",
        "",
        f"{len(merged.results)} models from {len(merged.shards)} report(s); exit code {merged.exit_code}.",
        "",
        "| " + " | ".join(SUMMARY_COLUMNS) + " |",
        "|---" * len(SUMMARY_COLUMNS) + "|",
        *map(_row, models),
        *(
            f"| `{f.model}` | **ERROR** (exit {f.exit_code}) | {' | '.join(['-'] * 5)} | {f.error} | - | - | - |"
            for f in failed
        ),
    ]
    why = [
        f"- `{r.output or r.model}` `{o.name}`: {'; '.join(o.failures or [])}"
        for r in models
        for o in (r.verify.outputs if r.verify is not None else ())
        if not o.passed
    ]
    out += ["", SUMMARY_LEGEND]
    if why:
        out += ["", "Failing outputs:", "", *why]
    return "\n".join(out) + "\n"

"""`rlx-amp merge-reports`: one summary from the JSON reports of several runs (the shards of a
model zoo spread over CI jobs), with the worst exit code of all.

Each input is what `--report-json` wrote: a batch report (`{"models", "failed", "passed",
"exit_code"}`), a single conversion report (with `verify` when verified), or a `verify`
command's report (`{"verify": ...}`). The merged report is a batch report over every model of
every shard, in the order the files are given, plus `shards` (the files merged).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_OK, worst_exit_code

__all__ = ["merge_reports", "merged_markdown", "read_report"]


def read_report(path: str | Path) -> dict[str, Any]:
    """One report file as a batch report: {"models": [...], "failed": [...]}."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{p}: not a JSON report ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: not an rlx-amp report (a JSON object was expected)")
    if "models" in data and "failed" in data:
        return {"models": list(data["models"]), "failed": list(data["failed"])}
    if "model" in data and "output" in data:  # one conversion report
        return {"models": [data], "failed": []}
    if set(data) == {"verify"} and isinstance(data["verify"], dict):  # the verify command
        v = data["verify"]
        return {"models": [{"model": v.get("reference"), "output": v.get("candidate"), "verify": v}], "failed": []}
    raise InputError(f"{p}: not an rlx-amp report (no 'models', 'model' or 'verify' key)")


def _exit_code(models: Sequence[Mapping[str, Any]], failed: Sequence[Mapping[str, Any]]) -> int:
    codes = [EXIT_DRIFT if m.get("verify") and not m["verify"].get("passed") else EXIT_OK for m in models]
    codes += [int(f.get("exit_code", 2)) for f in failed]
    return worst_exit_code(codes)


def merge_reports(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The batch report over every model of `paths`, in order, with the worst exit code."""
    if not paths:
        raise InputError("merge-reports needs at least one report file")
    models: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for path in paths:
        report = read_report(path)
        models += report["models"]
        failed += report["failed"]
    code = _exit_code(models, failed)
    return {"models": models, "failed": failed, "passed": code == EXIT_OK, "exit_code": code,
            "shards": [str(p) for p in paths]}


def _score(model: Mapping[str, Any]) -> str:
    outputs = (model.get("verify") or {}).get("outputs") or []
    scores = [o["score"] for o in outputs if o.get("score") is not None]
    return f"{max(scores):.4g}" if scores else "-"


def merged_markdown(merged: Mapping[str, Any]) -> str:
    """The CI job summary: one row per model of every shard, the failures and why."""
    passed = merged["passed"]
    out = [
        f"# rlx-amp drift report: {'✅ passed' if passed else '❌ failed'}",
        "",
        f"{len(merged['models']) + len(merged['failed'])} models from {len(merged['shards'])} report(s); "
        f"exit code {merged['exit_code']}.",
        "",
        "| model | result | policy | provider | emulated | outputs | failed | worst score | MACs low |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in merged["models"]:
        v = m.get("verify")
        cost = m.get("cost") or {}
        share = cost.get("mac_low_share")
        out.append(
            "| "
            + " | ".join(
                [
                    f"`{m.get('output') or m.get('model')}`",
                    ("pass" if v["passed"] else "**FAIL**") if v else "converted",
                    (m.get("policy") or {}).get("name", "-"),
                    v.get("provider", "-") if v else "-",
                    ("yes" if v.get("emulated") else "no") if v else "-",
                    str(len(v.get("outputs") or [])) if v else "-",
                    str(sum(not o.get("passed") for o in v.get("outputs") or [])) if v else "-",
                    _score(m),
                    f"{100 * share:.0f}%" if share is not None else "-",
                ]
            )
            + " |"
        )
    for f in merged["failed"]:
        out.append(f"| `{f['model']}` | **ERROR** (exit {f.get('exit_code')}) | - | - | - | - | - | {f['error']} | - |")
    why = [
        f"- `{m.get('output') or m.get('model')}` `{o['name']}`: {'; '.join(o.get('failures') or [])}"
        for m in merged["models"]
        for o in ((m.get("verify") or {}).get("outputs") or [])
        if not o.get("passed")
    ]
    if why:
        out += ["", "Failing outputs:", "", *why]
    return "\n".join(out) + "\n"

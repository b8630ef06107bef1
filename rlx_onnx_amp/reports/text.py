"""Text and Markdown renderings of the reports. Only the CLI prints them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.reports.conversion import REASON_CODES, ConversionReport
from rlx_onnx_amp.verification.metrics import OutputDrift

__all__ = [
    "DRIFT_COLUMNS",
    "DriftColumn",
    "conversion_markdown",
    "conversion_table",
    "drift_rows",
    "failed_verdict",
    "inspect_table",
    "repair_summary",
    "table",
    "verify_markdown",
    "verify_table",
]

PRECISION_COLUMNS = (*(p.value for p in Precision), "none")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _kind_rows(by_kind: dict[str, dict[str, int]]) -> list[list[object]]:
    return [[kind, *(counts.get(p, 0) for p in PRECISION_COLUMNS)] for kind, counts in sorted(by_kind.items())]


def _count(n: float) -> str:
    """1234567 -> 1.23 M: MAC and byte counts at a glance."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f}"


def cost_line(cost: Mapping[str, Any] | None) -> str | None:
    """The cost model in one line (JSON `cost`), or None when there is none."""
    if not cost:
        return None
    shapes = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in cost["input_shapes"].items())
    macs = f"{_count(cost['macs'])} MACs, {percent(cost['mac_low_share'])} low"
    if cost["unknown_macs_nodes"]:
        macs += f" ({cost['unknown_macs_nodes']} Compute nodes of unknown shape not counted)"
    casts = f"{cost['casts']} float Casts moving {_count(cost['cast_bytes'])}B per inference"
    if cost["unknown_cast_nodes"]:
        casts += f" ({cost['unknown_cast_nodes']} of unknown shape)"
    return (
        f"cost: {macs}; weights {percent(cost['weight_low_share'])} low; {casts}; "
        f"{cost['islands']} low-precision islands (inputs {shapes or 'none'})"
    )


def compare_policies_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`inspect --compare-policies`: one row per policy from `inspect_model` summaries."""
    first = rows[0]
    input_shapes = (first.get("cost") or {}).get("input_shapes", {})
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in input_shapes.items())
    body = []
    for r in rows:
        c = r.get("cost") or {}
        body.append(
            [
                r["policy"]["name"],
                percent(c.get("mac_low_share")),
                percent(c.get("weight_low_share")),
                r["casts_inserted"],
                f"{_count(c.get('cast_bytes', 0))}B",
                c.get("islands", "-"),
                len(r["kept_f32"]),
            ]
        )
    return "\n".join(
        [
            f"{first['model']}  (target {first['target']}, {first['nodes']['total']} nodes, inputs {shapes or 'none'}, "
            f"{_count((first.get('cost') or {}).get('macs', 0))} MACs)",
            "",
            table(("policy", "MACs low", "weights low", "casts", "cast bytes/inference", "islands", "kept f32"), body),
        ]
    )


def conversion_table(report: ConversionReport) -> str:
    lines = [
        f"{report.model} -> {report.output}  "
        f"(policy {report.policy.name if report.policy else '?'}, target {report.target or '?'})",
        table(("kind", *PRECISION_COLUMNS), _kind_rows(report.by_kind)),
        f"nodes {report.nodes_total}, casts inserted {report.casts_inserted}, kept f32 {len(report.kept_f32)}, "
        f"weights {_mib(report.initializer_bytes_before)} -> {_mib(report.initializer_bytes_after)}",
    ]
    if report.clamped:
        worst = max(report.clamped.items(), key=lambda kv: abs(float(kv[1]["worst"])))
        total = sum(int(v["clamped"]) for v in report.clamped.values())
        if total:
            lines.append(
                f"clamped {total} values in {len(report.clamped)} tensors (worst {worst[1]['worst']:g} in {worst[0]})"
            )
    if report.unknown_ops:
        lines.append(f"unknown ops kept in original types: {', '.join(sorted(set(report.unknown_ops)))}")
    if not report.changed:
        lines.append("nothing changed: every node keeps its original types, no Cast was inserted or removed")
    cost = cost_line(report.cost.to_json() if report.cost else None)
    if cost:
        lines.append(cost)
    return "\n".join(lines)


def conversion_markdown(reports: Sequence[ConversionReport], failed: Sequence[tuple[str, str]] = ()) -> str:
    out = ["# rlx-amp conversion", ""]
    if failed:
        out += [*_md_table(["model", "error"], [[f"`{m}`", e] for m, e in failed]), ""]
    for r in reports:
        out += [
            f"## `{r.model}` → `{r.output}` "
            f"(policy `{r.policy.name if r.policy else '?'}`, target `{r.target or '?'}`)",
            "",
        ]
        out += ["| kind | " + " | ".join(PRECISION_COLUMNS) + " |", "|---" * (len(PRECISION_COLUMNS) + 1) + "|"]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in _kind_rows(r.by_kind)]
        out += [
            "",
            f"Casts inserted: {r.casts_inserted}. Kept f32: {len(r.kept_f32)}. "
            f"Weights: {_mib(r.initializer_bytes_before)} → {_mib(r.initializer_bytes_after)}.",
            "",
        ]
        cost = cost_line(r.cost.to_json() if r.cost else None)
        if cost:
            out += [cost[0].upper() + cost[1:] + ".", ""]
    return "\n".join(out)


def inspect_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['model']}  (policy {summary['policy']['name']}, target {summary['target']}, "
        f"{summary['nodes']['total']} nodes)",
        "",
        table(("kind", *PRECISION_COLUMNS), _kind_rows(summary["by_kind"])),
        "",
        table(
            ("op", *PRECISION_COLUMNS),
            [[op, *(c.get(p, 0) for p in PRECISION_COLUMNS)] for op, c in summary["by_op"].items()],
        ),
    ]
    if summary.get("by_rule"):
        rows = [[code, count, REASON_CODES[code]] for code, count in summary["by_rule"].items()]
        lines += ["", table(("rule", "nodes", "meaning"), rows)]
    if summary["kept_f32"]:
        lines += [
            "",
            table(("kept f32", "op", "reason"), [[k["node"], k["op"], k["reason"]] for k in summary["kept_f32"][:50]]),
        ]
        if len(summary["kept_f32"]) > 50:
            lines.append(f"... and {len(summary['kept_f32']) - 50} more")
    cost = cost_line(summary.get("cost"))
    if cost:
        lines += ["", cost]
    return "\n".join(lines)


@dataclass(frozen=True)
class DriftColumn:
    """One column of the drift table: the text, Markdown and JSON reports all come from these."""

    header: str
    json_key: str  # the key of `outputs[]` in the JSON report that holds its value
    legend: str
    cell: Callable[[OutputDrift], object]


def _cosine(value: float | None) -> str:
    """Enough digits that a cosine just under 1 (0.9999997) does not print as 1."""
    if value is None:
        return "-"
    return "1" if value == 1.0 else f"{value:.7f}"


#: The drift table, per output. `why` names the failed checks and their numbers.
DRIFT_COLUMNS: tuple[DriftColumn, ...] = (
    DriftColumn("output", "name", "the model output", lambda o: o.name),
    DriftColumn("result", "passed", "PASS or FAIL by the criterion below", lambda o: "PASS" if o.passed else "FAIL"),
    DriftColumn(
        "max_abs", "max_abs", "largest |candidate - reference| over values finite in both", lambda o: o.max_abs
    ),
    DriftColumn("bound", "bound", "atol + rtol_of_max * max|reference|: max_abs must not pass it", lambda o: o.bound),
    DriftColumn(
        "max_rel",
        "max_rel",
        "largest |c - r| / max(|r|, atol): elements near zero are scaled by atol",
        lambda o: o.max_rel,
    ),
    DriftColumn("cosine", "cosine", "cosine similarity of the two outputs (7 decimals)", lambda o: _cosine(o.cosine)),
    DriftColumn("snr_db", "snr_db", "signal-to-noise ratio of the difference, in dB", lambda o: o.snr_db),
    DriftColumn(
        "mismatch",
        "mismatch_pct",
        "share of elements over atol + rtol·|r| (rtol_of_max when no rtol)",
        lambda o: f"{o.mismatch_pct:.3g}%",
    ),
    DriftColumn(
        "new nan/inf",
        "new_nan",
        "NaN / Inf in the candidate where the reference has none",
        lambda o: f"{o.new_nan}/{o.new_inf}",
    ),
    DriftColumn(
        "top1",
        "top1_agreement",
        "share of rows whose argmax agrees (outputs with a last axis > 1)",
        lambda o: o.top1_agreement,
    ),
    DriftColumn("why", "failures", "the checks that failed, with their numbers", lambda o: "; ".join(o.failures or [])),
)


def drift_rows(report: Any) -> list[list[str]]:
    """The drift table's cells, one row per output (failures first)."""
    return [[fmt(c.cell(o)) for c in DRIFT_COLUMNS] for o in report.outputs]


def failed_verdict(report: Any) -> str:
    """The one line `-q` prints for a failing verification: each failing output and its checks."""
    failed = [f"{o.name} ({', '.join(o.failed_checks or [])})" for o in report.outputs if not o.passed]
    return f"FAILED {report.candidate}: {'; '.join(failed) or 'no output compared'}"


def required_tolerances(o: OutputDrift) -> str | None:
    """The smallest tolerance that would have passed this output (Polygraphy's 'minimum
    required tolerance'), each option alone."""
    r = o.required or {}
    if not r:
        return None
    parts = [f"--atol {o.name}:{r['atol']:.4g}"]
    if r.get("rtol_of_max") is not None:
        parts.append(f"--rtol-of-max {o.name}:{r['rtol_of_max']:.4g}")
    if r.get("rtol") is not None:
        parts.append(f"--rtol {o.name}:{r['rtol']:.4g} (element-wise)")
    text = f"{o.name}: would pass the size checks with " + " or ".join(parts)
    if r.get("min_cosine") is not None:
        text += f"; cosine {_cosine(r['min_cosine'])} needs --min-cosine at most that"
    return text


def criterion_line(report: Any) -> str:
    rtol = report.rtol.get("")
    tolerances = f"atol {report.atol['']:g}, rtol_of_max {report.rtol_of_max['']:g}"
    if rtol is not None:
        tolerances += f", rtol {rtol:g} (element-wise)"
    return (
        f"{'PASSED' if report.passed else 'FAILED'}: {tolerances}, min cosine {report.min_cosine['']:g} "
        f"({report.precision} defaults unless overridden; per-output values in the JSON report)"
    )


def constant_note(report: Any) -> str | None:
    """What to note when some output of the reference is one value everywhere (random weights
    that saturate, inputs that mask everything): its pass shows little of the conversion."""
    constant = report.constant_outputs
    if not constant:
        return None
    shown = ", ".join(f"{name} (every element {value:g})" for name, value in constant.items())
    return (
        f"the reference's output is constant for {shown}: only max_abs <= atol was checked there; "
        "real inputs (--inputs) or trained weights test more"
    )


def verify_table(report: Any, verbose: bool = False) -> str:
    """One row per output, failures first; the legend and the tolerances that would have passed
    when something failed or with -v."""
    header = (
        f"verify {report.candidate} against {report.reference} on {report.provider} "
        f"({', '.join(report.providers_used)})"
        + (f", emulated {report.precision}: {report.emulation_reason}" if report.emulated else "")
    )
    lines = [header, table([c.header for c in DRIFT_COLUMNS], drift_rows(report))]
    if report.localized:
        lines += ["", "first nodes where drift starts:", table(*localized_table(report.localized))]
    lines.append(criterion_line(report))
    lines.append(f"criterion: {report.criterion}")
    note = constant_note(report)
    if note:
        lines.append(f"note: {note}")
    if verbose or not report.passed:
        needed = [t for o in report.outputs if (verbose or not o.passed) and (t := required_tolerances(o))]
        if needed:
            lines += ["minimum tolerances:", *(f"  {t}" for t in needed)]
        lines += ["columns:", *(f"  {c.header}: {c.legend}" for c in DRIFT_COLUMNS)]
    return "\n".join(lines)


def localized_table(localized: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[object]]]:
    rows = []
    for d in localized:
        detail = (
            f"{d['reference_shape']} vs {d['candidate_shape']}"
            if d["reason"] == "shape differs"
            else fmt(d["rel_error"])
        )
        rows.append([d["node"], d["op"], d["tensor"], d["reason"], detail, d["input_rel_error"]])
    return ["node", "op", "tensor", "reason", "rel_error or shapes", "inputs' rel_error"], rows


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        return fmt(v).replace("|", "\\|")

    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(cell(c) for c in r) + " |" for r in rows),
    ]


def verify_markdown(entries: Sequence[tuple[Any, Any]], failed: Sequence[tuple[str, str]] = ()) -> str:
    """A Markdown summary for a CI job's summary page: (conversion report or None, verify
    report) per model; `failed` lists (model, error) for models that could not be converted."""
    passed = all(v.passed for _, v in entries) and not failed
    out = [f"# rlx-amp drift report: {'✅ passed' if passed else '❌ failed'}", ""]
    summary = []
    for conv, v in entries:
        worst = max((o.score for o in v.outputs), default=0.0)
        policy = conv.policy.name if conv is not None and conv.policy is not None else "-"
        summary.append(
            [
                f"`{v.candidate}`",
                "pass" if v.passed else "**FAIL**",
                policy,
                v.provider,
                "yes" if v.emulated else "no",
                len(v.outputs),
                sum(not o.passed for o in v.outputs),
                worst,
            ]
        )
    summary += [[f"`{model}`", "**ERROR**", "-", "-", "-", "-", "-", error] for model, error in failed]
    out += _md_table(["model", "result", "policy", "provider", "emulated", "outputs", "failed", "worst score"], summary)
    out.append("")
    for conv, v in entries:
        out += [
            f"## `{v.candidate}`",
            "",
            f"Compared against `{v.reference}`. Criterion: {v.criterion}.",
            "",
            criterion_line(v) + f". Seed {v.seed}, {v.samples} input set(s).",
            "",
        ]
        note = constant_note(v)
        if note:
            out += [f"> Note: {note}.", ""]
        out += _md_table([c.header for c in DRIFT_COLUMNS], drift_rows(v))
        needed = [t for o in v.outputs if not o.passed and (t := required_tolerances(o))]
        if needed:
            out += ["", "Minimum tolerances that would have passed:", "", *(f"- `{t}`" for t in needed)]
        if v.localized:
            out += ["", "First nodes where drift starts:", "", *_md_table(*localized_table(v.localized))]
        if conv is not None:
            out += ["", "### Conversion", "", *_conversion_facts_md(conv)]
            if conv.repair is not None:
                out += ["", "### Repair", "", *_repair_md(conv.repair)]
        out.append("")
    out += ["### Columns", "", *(f"- **{c.header}**: {c.legend}" for c in DRIFT_COLUMNS), ""]
    return "\n".join(out)


def _conversion_facts_md(r: ConversionReport) -> list[str]:
    out = [
        f"Policy `{r.policy.name if r.policy else '?'}`, target `{r.target or '?'}`: {r.nodes_total} nodes, "
        f"{r.casts_inserted} Casts inserted, {len(r.kept_f32)} kept f32, weights {_mib(r.initializer_bytes_before)} → "
        f"{_mib(r.initializer_bytes_after)}.",
        "",
    ]
    cost = cost_line(r.cost.to_json() if r.cost else None)
    if cost:
        out += [cost[0].upper() + cost[1:] + ".", ""]
    out += _md_table(["kind", *PRECISION_COLUMNS], _kind_rows(r.by_kind))
    if r.kept_f32:
        shown = r.kept_f32[:20]
        out += ["", *_md_table(["kept f32", "op", "reason"], [[f"`{k.node}`", k.op, k.reason] for k in shown])]
        if len(r.kept_f32) > len(shown):
            out.append(f"\n… and {len(r.kept_f32) - len(shown)} more (JSON report).")
    total = sum(int(v["clamped"]) for v in r.clamped.values())
    if total:
        out += ["", f"Clamped {total} values in {len(r.clamped)} tensors to the low precision's range."]
    return out


def _repair_md(repair: dict[str, Any]) -> list[str]:
    best = repair.get("best") or {}
    out = [
        f"{'Met the tolerance' if repair['passed'] else 'Did not meet the tolerance'} after "
        f"{repair['evaluations']} evaluations; wrote evaluation {best.get('evaluation')} ({best.get('stage')}, "
        f"score {fmt(best.get('score'))}); minimality {repair.get('minimality')}.",
        "",
    ]
    out += _md_table(
        ["evaluation", "stage", "kept", "passed", "score", "written"],
        [
            [h["evaluation"], h["stage"], h["kept"], h["passed"], h["score"], "✓" if h.get("written") else ""]
            for h in repair["history"]
        ],
    )
    if repair["kept_f32"]:
        out += [
            "",
            *_md_table(
                ["kept f32", "op", "reason", "path"],
                [[f"`{k['node']}`", k["op"], k["reason"], k["path"]] for k in repair["kept_f32"]],
            ),
        ]
    return out


def repair_summary(result: Any) -> str:
    best = result.best or {}
    written = f"evaluation {best.get('evaluation')} ({best.get('stage')}, score {best.get('score', 0):.3g})"
    verdict = (
        "met the tolerance"
        if result.passed
        else "the tolerance was not met within the budget or by any keep; wrote the best model found"
    )
    lines = [
        f"repair: {verdict} after {result.evaluations} evaluations: {written}; {len(result.kept)} nodes kept f32 "
        f"(minimality {result.minimality}); "
        f"low precision: {percent(result.compute_low_share)} of Compute nodes, "
        f"{percent(result.weight_low_share)} of float weight bytes"
    ]
    if result.kept:
        lines.append(
            table(
                ("kept f32", "op", "reason", "path"),
                [[v["node"], v["op"], v["reason"], p] for p, v in result.kept.items()],
            )
        )
    return "\n".join(lines)


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"

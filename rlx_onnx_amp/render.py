"""Text and Markdown renderings of the reports. Only the CLI prints them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlx_onnx_amp.report import ConversionReport

__all__ = ["conversion_markdown", "conversion_table", "inspect_table", "table", "repair_summary", "verify_markdown", "verify_table"]

_PRECISION_COLUMNS = ("f32", "f16", "bf16", "none")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _kind_rows(by_kind: dict[str, dict[str, int]]) -> list[list[object]]:
    return [[kind, *(counts.get(p, 0) for p in _PRECISION_COLUMNS)] for kind, counts in sorted(by_kind.items())]


def conversion_table(report: ConversionReport) -> str:
    lines = [
        f"{report.model} -> {report.output}  (policy {report.policy.name if report.policy else '?'}, target {report.target or '?'})",
        table(("kind", *_PRECISION_COLUMNS), _kind_rows(report.by_kind)),
        f"nodes {report.nodes_total}, casts inserted {report.casts_inserted}, kept f32 {len(report.kept_f32)}, "
        f"weights {_mib(report.initializer_bytes_before)} -> {_mib(report.initializer_bytes_after)}",
    ]
    if report.clamped:
        worst = max(report.clamped.items(), key=lambda kv: abs(float(kv[1]["worst"])))
        total = sum(int(v["clamped"]) for v in report.clamped.values())
        if total:
            lines.append(f"clamped {total} values in {len(report.clamped)} tensors (worst {worst[1]['worst']:g} in {worst[0]})")
    if report.unknown_ops:
        lines.append(f"unknown ops kept in original types: {', '.join(sorted(set(report.unknown_ops)))}")
    return "\n".join(lines)


def conversion_markdown(reports: Sequence[ConversionReport]) -> str:
    out = ["# rlx-amp conversion", ""]
    for r in reports:
        out += [f"## `{r.model}` → `{r.output}` (policy `{r.policy.name if r.policy else '?'}`, target `{r.target or '?'}`)", ""]
        out += ["| kind | " + " | ".join(_PRECISION_COLUMNS) + " |", "|---" * (len(_PRECISION_COLUMNS) + 1) + "|"]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in _kind_rows(r.by_kind)]
        out += ["", f"Casts inserted: {r.casts_inserted}. Kept f32: {len(r.kept_f32)}. "
                f"Weights: {_mib(r.initializer_bytes_before)} → {_mib(r.initializer_bytes_after)}.", ""]
    return "\n".join(out)


def inspect_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['model']}  (policy {summary['policy']['name']}, target {summary['target']}, {summary['nodes']['total']} nodes)",
        "",
        table(("kind", *_PRECISION_COLUMNS), _kind_rows(summary["by_kind"])),
        "",
        table(("op", *_PRECISION_COLUMNS), [[op, *(c.get(p, 0) for p in _PRECISION_COLUMNS)] for op, c in summary["by_op"].items()]),
    ]
    if summary["kept_f32"]:
        lines += ["", table(("kept f32", "op", "reason"), [[k["node"], k["op"], k["reason"]] for k in summary["kept_f32"][:50]])]
        if len(summary["kept_f32"]) > 50:
            lines.append(f"... and {len(summary['kept_f32']) - 50} more")
    return "\n".join(lines)


def verify_table(report: Any) -> str:
    """One row per output, failures first."""
    header = (f"verify {report.candidate} against {report.reference} on {report.provider} "
              f"({', '.join(report.providers_used)})" + (f", emulated {report.precision}: {report.emulation_reason}" if report.emulated else ""))
    rows = [[o.name, "PASS" if o.passed else "FAIL", o.max_abs, o.max_rel, o.cosine, o.snr_db, f"{o.mismatch_pct:.3g}%",
             f"{o.nan_cand}/{o.inf_cand}", o.top1_agreement, "; ".join(o.failures or [])] for o in report.outputs]
    lines = [header, table(("output", "result", "max_abs", "max_rel", "cosine", "snr_db", "mismatch", "nan/inf", "top1", "why"), rows)]
    if report.localized:
        lines += ["", "first nodes where drift jumps:",
                  table(("node", "op", "tensor", "reason", "rel_error", "inputs' rel_error"),
                        [[d["node"], d["op"], d["tensor"], d["reason"], d["rel_error"], d["input_rel_error"]] for d in report.localized])]
    lines.append(f"{'PASSED' if report.passed else 'FAILED'}: atol {report.atol['']:g}, rtol {report.rtol['']:g}, "
                 f"min cosine {report.min_cosine['']:g} ({report.precision} defaults unless overridden)")
    return "\n".join(lines)


def verify_markdown(entries: Sequence[tuple[Any, Any]]) -> str:
    """A Markdown summary for a CI job's summary page: (conversion report or None, verify report)."""
    passed = all(v.passed for _, v in entries)
    out = [f"# rlx-amp drift report: {'✅ passed' if passed else '❌ failed'}", ""]
    out += ["| model | policy | provider | emulated | outputs | failed | worst max_abs | min cosine |",
            "|---|---|---|---|---|---|---|---|"]
    for conv, v in entries:
        failed = [o for o in v.outputs if not o.passed]
        worst = max((o.max_abs for o in v.outputs), default=0.0)
        cosines = [o.cosine for o in v.outputs if o.cosine is not None]
        policy = conv.policy.name if conv is not None and conv.policy is not None else "-"
        out.append(f"| `{v.candidate}` | {policy} | {v.provider} | {'yes' if v.emulated else 'no'} | {len(v.outputs)} | "
                   f"{len(failed)} | {worst:.4g} | {_fmt(min(cosines) if cosines else None)} |")
    out.append("")
    for _, v in entries:
        out += [f"## `{v.candidate}`", "",
                f"Criterion: no new NaN/Inf; max_abs ≤ atol + rtol·max|ref| (atol {v.atol['']:g}, rtol {v.rtol['']:g}); "
                f"cosine ≥ {v.min_cosine['']:g} where the reference is not constant. Seed {v.seed}, {v.samples} sample(s).", "",
                "| output | result | max_abs | max_rel | mean_abs | p99_abs | cosine | snr_db | mismatch % | NaN/Inf (cand) | top-1 |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for o in v.outputs:
            out.append(f"| `{o.name}` | {'pass' if o.passed else '**FAIL**'} | {_fmt(o.max_abs)} | {_fmt(o.max_rel)} | {_fmt(o.mean_abs)} | "
                       f"{_fmt(o.p99_abs)} | {_fmt(o.cosine)} | {_fmt(o.snr_db)} | {o.mismatch_pct:.3g} | {o.nan_cand}/{o.inf_cand} | {_fmt(o.top1_agreement)} |")
        if v.localized:
            out += ["", "First nodes where drift jumps:", "", "| node | op | tensor | reason | rel_error |", "|---|---|---|---|---|"]
            out += [f"| `{d['node']}` | {d['op']} | `{d['tensor']}` | {d['reason']} | {_fmt(d['rel_error'])} |" for d in v.localized]
        out.append("")
    return "\n".join(out)


def repair_summary(result: Any) -> str:
    best = result.best or {}
    written = f"evaluation {best.get('evaluation')} ({best.get('stage')}, score {best.get('score', 0):.3g})"
    verdict = ("met the tolerance" if result.passed else
               "the tolerance was not met within the budget or by any keep; wrote the best model found")
    lines = [f"repair: {verdict} after {result.evaluations} evaluations: {written}; {len(result.kept)} nodes kept f32 "
             f"(minimality {result.minimality}); "
             f"low precision: {_share(result.compute_low_share)} of Compute nodes, {_share(result.weight_low_share)} of float weight bytes"]
    if result.kept:
        lines.append(table(("kept f32", "op", "reason", "path"), [[v["node"], v["op"], v["reason"], p] for p, v in result.kept.items()]))
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"

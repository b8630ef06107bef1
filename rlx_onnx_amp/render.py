"""Text and Markdown renderings of the reports. Only the CLI prints them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlx_onnx_amp.report import ConversionReport

__all__ = ["conversion_markdown", "conversion_table", "inspect_table", "table"]

_PRECISION_COLUMNS = ("f32", "f16", "bf16", "none")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _kind_rows(by_kind: dict[str, dict[str, int]]) -> list[list[object]]:
    return [[kind, *(counts.get(p, 0) for p in _PRECISION_COLUMNS)] for kind, counts in sorted(by_kind.items())]


def conversion_table(report: ConversionReport) -> str:
    lines = [
        f"{report.model} -> {report.output}  (policy {report.policy.name if report.policy else '?'})",
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
        out += [f"## `{r.model}` → `{r.output}` (policy `{r.policy.name if r.policy else '?'}`)", ""]
        out += ["| kind | " + " | ".join(_PRECISION_COLUMNS) + " |", "|---" * (len(_PRECISION_COLUMNS) + 1) + "|"]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in _kind_rows(r.by_kind)]
        out += ["", f"Casts inserted: {r.casts_inserted}. Kept f32: {len(r.kept_f32)}. "
                f"Weights: {_mib(r.initializer_bytes_before)} → {_mib(r.initializer_bytes_after)}.", ""]
    return "\n".join(out)


def inspect_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['model']}  (policy {summary['policy']['name']}, {summary['nodes']['total']} nodes)",
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

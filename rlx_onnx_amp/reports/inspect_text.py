"""The `inspect` command's tables: a model's precision plan by kind, op and rule, and one row per
policy for `--compare-policies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlx_onnx_amp.cost import short_count
from rlx_onnx_amp.reports.text import PRECISION_COLUMNS, cost_line, kind_rows, percent, table
from rlx_onnx_amp.rewrite.rules import REASON_CODES


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
                f"{short_count(c.get('cast_bytes', 0))}B",
                c.get("islands", "-"),
                len(r["kept_f32"]),
            ]
        )
    return "\n".join(
        [
            f"{first['model']}  (target {first['target']}, {first['nodes']['total']} nodes, inputs {shapes or 'none'}, "
            f"{short_count((first.get('cost') or {}).get('macs', 0))} MACs)",
            "",
            table(("policy", "MACs low", "weights low", "casts", "cast bytes/inference", "islands", "kept f32"), body),
        ]
    )


def inspect_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['model']}  (policy {summary['policy']['name']}, target {summary['target']}, "
        f"{summary['nodes']['total']} nodes)",
        "",
        table(("kind", *PRECISION_COLUMNS), kind_rows(summary["by_kind"])),
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

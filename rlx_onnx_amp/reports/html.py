"""The HTML report (`--report-html`): one self-contained page to look at.

Everything is inline: CSS, and the plots as SVG drawn by matplotlib (its object API, so no
global pyplot state, and the SVG backend, so no display). The page loads nothing (its
Content-Security-Policy forbids any request), so it opens from a CI artifact or a mail
attachment. Plots take their text and axis colour from the page (`currentColor`), so they read
in light and dark mode; the numbers stay in tables beside them. The tables come from the same
rows as the text and Markdown reports (`text.DRIFT_COLUMNS`).

Per model: the verdict, the drift table and, per output, the |c - r| histogram (log scale) and
reference against candidate for a sample of elements with the worst marked; with `--localize`,
the relative error of every compared tensor along graph order with the flagged nodes named;
from the conversion, the precision of each kind and op type, the nodes kept in f32 with their
reasons, Casts, clamped tensors and the cost model; with `--repair`, each evaluation's score and
what it kept.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.reports.record import (
    Conversion,
    Localized,
    ModelResult,
    OutputResult,
    Repair,
    RepairStep,
    TracePoint,
    Verification,
)
from rlx_onnx_amp.reports.text import (
    DRIFT_COLUMNS,
    PRECISION_COLUMNS,
    constant_note,
    cost_line,
    criterion_line,
    drift_rows,
    fmt,
    gain_line,
    latency_line,
    localized_table,
    next_step,
    percent,
    proof_line,
    repair_kept_rows,
    required_tolerances,
    size_ratio,
    speedup,
    task_line,
    worst_score,
    written_line,
)

__all__ = ["html_report"]

#: Colours that read on a light and a dark background alike.
PASS_COLOUR, FAIL_COLOUR, ACCENT, SECOND = "#2e9e5b", "#d9453b", "#3b7dd8", "#e08a1e"
PRECISION_COLOURS = {
    Precision.F32.value: "#3b7dd8",
    Precision.F16.value: "#e08a1e",
    Precision.BF16.value: "#9b59b6",
    "none": "#8a8a8a",
}
#: matplotlib draws text, ticks and spines in this colour; the SVG gets `currentColor` instead.
_INK = "#010203"
_GRID = "#040506"

_CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d1f23; --muted: #5f6670; --line: #d7dbe0;
  --pass: #1f7a45; --fail: #b3261e; --card: #f6f7f9; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #15171a; --fg: #e6e8eb; --muted: #a0a7b0; --line: #3a3f46; --pass: #5fd08e;
    --fail: #ff7b72; --card: #1e2125; }
}
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--fg);
  margin: 0 auto; padding: 1.5rem; max-width: 1200px; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.25rem; margin-top: 2.5rem; border-top: 1px solid var(--line);
  padding-top: 1rem; } h3 { font-size: 1.05rem; margin-top: 1.5rem; }
code { font-size: 0.92em; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.88rem; }
th, td { border: 1px solid var(--line); padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: var(--card); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: var(--pass); font-weight: 600; } .fail { color: var(--fail); font-weight: 600; }
.muted { color: var(--muted); }
.plots { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
figure { margin: 0; background: var(--card); border-radius: 6px; padding: 0.4rem; }
figure svg { display: block; max-width: 100%; height: auto; }
figcaption { font-size: 0.8rem; color: var(--muted); padding: 0.2rem 0.4rem; max-width: 560px; }
details { margin: 0.5rem 0; }
@media print { body { max-width: none; padding: 0; } figure { break-inside: avoid; } h2 { break-before: page; } }
"""


def html_report(results: Sequence[ModelResult], title: str = "rlx-amp report") -> str:
    """The page for the results of a run: each model's verification, conversion and repair
    where it has them, and the models that could not be converted."""
    figures = _Figures()
    body = [f"<h1>{_e(title)}</h1>", _summary(results)]
    for r in results:
        if r.failure is None:
            body += _model_section(r, figures)
    body.append(
        "<h2>Columns</h2><table><tr><th>column</th><th>meaning</th></tr>"
        + "".join(f"<tr><td>{_e(c.header)}</td><td>{_e(c.legend)}</td></tr>" for c in DRIFT_COLUMNS)
        + "</table>"
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        # Nothing may leave the file: no script, no fetch, images only from data: URLs.
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _verdict(passed: bool | None) -> str:
    if passed is None:
        return "<span class='muted'>converted</span>"
    return "<span class='pass'>PASS</span>" if passed else "<span class='fail'>FAIL</span>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        text = fmt(value)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        return f"<td class='num'>{_e(text)}</td>" if numeric else f"<td>{_e(text)}</td>"

    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>" + "".join("<tr>" + "".join(map(cell, r)) + "</tr>" for r in rows) + "</table>"


def _summary(results: Sequence[ModelResult]) -> str:
    rows = []
    entries = [r for r in results if r.failure is None]
    for r in entries:
        conv, v = r.conversion, r.verify
        cost = conv.cost if conv is not None else None
        rows.append(
            "<tr>"
            f"<td><a href='#{_anchor(_name(r))}'><code>{_e(_name(r))}</code></a></td>"
            f"<td>{_verdict(v.passed if v is not None else None)}</td>"
            f"<td>{_e(conv.policy.name if conv is not None and conv.policy is not None else '-')}</td>"
            f"<td class='num'>{_e(sum(not o.passed for o in v.outputs) if v is not None else '-')}</td>"
            f"<td class='num'>{_e(fmt(worst_score(v)) if v is not None else '-')}</td>"
            f"<td class='num'>{_e(percent(cost.mac_low_share) if cost is not None else '-')}</td>"
            f"<td class='num'>{_e(size_ratio(conv))}</td>"
            f"<td class='num'>{_e(speedup(v))}</td>"
            "</tr>"
        )
    failed = [r.failure for r in results if r.failure is not None]
    rows += [
        f"<tr><td><code>{_e(f.model)}</code></td><td><span class='fail'>ERROR</span></td>"
        f"<td colspan='6'>{_e(f.error)}</td></tr>"
        for f in failed
    ]
    passed = all(r.verify is None or r.verify.passed for r in entries) and not failed
    verdict = "passed" if passed else "failed"
    advice = next_step(results)
    return (
        f"<p>Verdict: <span class='{'pass' if passed else 'fail'}'>{verdict}</span> "
        f"({len(entries) + len(failed)} model(s)).</p>"
        + (f"<p><strong>Next:</strong> {_e(advice)}</p>" if advice else "")
        + "<table><tr><th>model</th><th>result</th><th>policy</th><th>failed outputs</th><th>worst score</th>"
        "<th>MACs low</th><th>size</th><th>speed-up</th></tr>" + "".join(rows) + "</table>"
    )


def _name(r: ModelResult) -> str:
    """What the page calls a model: the candidate verified, else the output written."""
    if r.verify is not None:
        return r.verify.candidate
    return r.conversion.output if r.conversion is not None else "?"


def _anchor(name: str) -> str:
    return "m-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")


def _model_section(r: ModelResult, figures: _Figures) -> list[str]:
    v, name = r.verify, _name(r)
    out = [f"<h2 id='{_anchor(name)}'><code>{_e(name)}</code> {_verdict(v.passed if v is not None else None)}</h2>"]
    if v is not None:
        out += _verify_section(v, figures)
        latency = latency_line(v, r.conversion.target if r.conversion is not None else None)
        if latency:
            out.append(f"<p>{_e(latency[0].upper() + latency[1:])}.</p>")
    if r.conversion is not None:
        out += _conversion_section(r.conversion, figures)
        if r.repair is not None:
            out += _repair_section(r.repair, figures)
    return out


def _verify_section(v: Verification, figures: _Figures) -> list[str]:
    emulated = f", emulated {v.precision}: {v.emulation_reason}" if v.emulated else ""
    out = [
        f"<p>Compared against <code>{_e(v.reference)}</code> on {_e(v.provider)} "
        f"({_e(', '.join(v.providers_used))}){_e(emulated)}. Seed {v.seed}, {v.samples} input set(s).</p>",
        f"<p>{_e(criterion_line(v))}.<br><span class='muted'>Criterion: {_e(v.criterion)}.</span></p>",
    ]
    task = task_line(v)
    if task:
        out.append(f"<p><strong>{_e(task[0].upper() + task[1:])}.</strong></p>")
    written = written_line(v, verbose=True)
    if written:  # the file itself, beside the emulation: in the verdict's colour where it fails
        style = f" style='color:{FAIL_COLOUR}'" if v.written is not None and v.written.passed is False else ""
        out.append(f"<p{style}>{_e(written[0].upper() + written[1:])}.</p>")
    note = constant_note(v)
    if note:
        out.append(f"<p><strong>Note</strong>: {_e(note)}.</p>")
    out.append(_table([c.header for c in DRIFT_COLUMNS], drift_rows(v)))
    needed = [t for o in v.outputs if not o.passed and (t := required_tolerances(o))]
    if needed:
        out.append("<p>Minimum tolerances that would have passed:</p><ul>")
        out += [f"<li><code>{_e(t)}</code></li>" for t in needed]
        out.append("</ul>")
    for o in v.outputs:
        out.append(f"<h3>Output <code>{_e(o.name)}</code> {_verdict(o.passed)}</h3>")
        why = "; ".join(o.failures or []) or "Every check passed"
        bound = f"max_abs {fmt(o.max_abs)} against bound {fmt(o.bound)}"
        top1 = f"; top-1 agreement {percent(o.top1_agreement)}" if o.top1_agreement is not None else ""
        out.append(f"<p>{_e(bound)}{_e(top1)}. {_e(why)}.</p>")
        if o.distribution:
            out.append("<div class='plots'>")
            out.append(figures.error_histogram(o))
            out.append(figures.scatter(o))
            out.append("</div>")
    if v.localize_trace:
        out.append("<h3>Where drift starts (<code>--localize</code>)</h3>")
        out.append(figures.localize(v.localize_trace, v.localized or ()))
        if v.localized:
            out.append(_table(*localized_table(v.localized)))
        else:
            out.append("<p class='muted'>No node where drift jumps or NaN/Inf appears.</p>")
    return out


def _conversion_section(r: Conversion, figures: _Figures) -> list[str]:
    policy = r.policy.name if r.policy is not None else "?"
    out = [
        "<h3>Conversion</h3>",
        f"<p><code>{_e(r.model)}</code> → <code>{_e(r.output)}</code>: policy {_e(policy)}, target {_e(r.target)}, "
        f"{r.nodes.total} nodes, {r.casts_inserted} Casts inserted, {r.casts_removed} removed, "
        f"{len(r.kept_f32)} nodes kept f32.</p>",
    ]
    cost = cost_line(r.cost.to_json() if r.cost is not None else None)
    if cost:
        out.append(f"<p>{_e(cost[0].upper() + cost[1:])}.</p>")
    gain = gain_line(r)
    if gain:
        out.append(f"<p><strong>{_e(gain[0].upper() + gain[1:])}.</strong></p>")
    proof = proof_line(r)
    if proof:
        out.append(f"<p class='proof'><strong>{_e(proof[0].upper() + proof[1:])}.</strong></p>")
    out.append("<div class='plots'>")
    out.append(figures.precision_bars("Node kind", r.by_kind))
    busiest = dict(sorted(r.by_op.items(), key=lambda kv: -sum(kv[1].values()))[:20])
    out.append(figures.precision_bars("Op type (20 most frequent)", busiest))
    out.append("</div>")
    columns = PRECISION_COLUMNS
    out.append(
        "<details><summary>Nodes per op type and precision</summary>"
        + _table(["op", *columns], [[op, *(c.get(p, 0) for p in columns)] for op, c in sorted(r.by_op.items())])
        + "</details>"
    )
    if r.kept_f32:
        out.append(f"<p>Nodes kept in f32 ({len(r.kept_f32)}):</p>")
        out.append(_table(["node", "op", "reason", "path"], [[k.node, k.op, k.reason, k.path] for k in r.kept_f32]))
    clamped = [(name, c) for name, c in r.clamped.items() if c.get("clamped") or c.get("flushed_to_zero")]
    if clamped:
        out.append("<p>Clamped tensors (values past the low precision's range, or flushed to zero):</p>")
        out.append(
            _table(
                ["tensor", "clamped", "worst", "flushed to zero"],
                [[n, c.get("clamped", 0), c.get("worst", 0.0), c.get("flushed_to_zero", 0)] for n, c in clamped],
            )
        )
    return out


def _repair_section(repair: Repair, figures: _Figures) -> list[str]:
    b = repair.best
    evaluation, stage, score = (b.evaluation, b.stage, b.score) if b is not None else (None, None, None)
    out = [
        "<h3>Repair</h3>",
        f"<p>{'Met' if repair.passed else 'Did not meet'} the tolerance after {repair.evaluations} evaluations; "
        f"wrote evaluation {_e(evaluation)} ({_e(stage)}, score {_e(fmt(score))}); minimality "
        f"{_e(repair.minimality)}; Compute nodes still low {_e(percent(repair.compute_low_share))}.</p>",
        figures.repair(repair.history),
        _table(
            ["evaluation", "stage", "kept", "passed", "score", "written"],
            [
                [h.evaluation, h.stage, h.kept, "yes" if h.passed else "no", h.score, "✓" if h.written else ""]
                for h in repair.history
            ],
        ),
    ]
    if repair.kept_f32:
        out.append(_table(["kept f32", "op", "reason", "path"], repair_kept_rows(repair)))
    return out


class _Figures:
    """matplotlib figures as inline SVG, each with its own id prefix (several share a page)."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def _figure(self, width: float, height: float) -> Iterator[Any]:
        import matplotlib
        from matplotlib.figure import Figure

        style: dict[str, Any] = {
            "svg.fonttype": "none",  # text stays text: smaller, selectable, in the page's font
            "svg.hashsalt": "rlx-amp",  # the same report gives the same bytes
            "font.size": 9,
            "text.color": _INK,
            "axes.labelcolor": _INK,
            "axes.edgecolor": _INK,
            "xtick.color": _INK,
            "ytick.color": _INK,
            "axes.facecolor": "none",
            "figure.facecolor": "none",
            "savefig.facecolor": "none",
            "grid.color": _GRID,
            "legend.frameon": False,
        }
        with matplotlib.rc_context(style):  # type: ignore[arg-type]
            fig = Figure(figsize=(width, height), layout="constrained")
            yield fig

    def _svg(self, fig: Any, caption: str, wide: bool = False) -> str:
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        svg = buffer.getvalue()
        svg = svg[svg.index("<svg") :]  # drop the XML prolog and doctype: the SVG is inline
        self.count += 1
        prefix = f"f{self.count}-"
        svg = re.sub(r'id="([^"]+)"', rf'id="{prefix}\1"', svg)
        svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}\1)", svg)
        svg = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}\1"', svg)
        svg = svg.replace(_INK, "currentColor").replace(_GRID, "currentColor")
        svg = svg.replace("<svg ", f"<svg role='img' aria-label='{_e(caption)}' ", 1)
        return f"<figure{' class=wide' if wide else ''}>{svg}<figcaption>{_e(caption)}</figcaption></figure>"

    def error_histogram(self, o: OutputResult) -> str:
        assert o.distribution is not None
        h = o.distribution.abs_error_histogram
        with self._figure(5.2, 2.8) as fig:
            ax = fig.subplots()
            if h.counts:
                edges = h.edges
                ax.stairs(h.counts, edges, fill=True, color=ACCENT, alpha=0.85)
                ax.set_xscale("log")
                if o.bound:
                    ax.axvline(o.bound, color=FAIL_COLOUR, linestyle="--", linewidth=1.2, label=f"bound {o.bound:.3g}")
                    ax.legend(loc="upper left")
            else:
                ax.text(0.5, 0.5, "every element identical", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("|candidate - reference|")
            ax.set_ylabel("elements")
            ax.grid(True, alpha=0.25, linewidth=0.5)
            zeros = f"; {h.zeros} exactly equal" if h.zeros else ""
            caption = f"{o.name}: histogram of the absolute error over {o.elements} elements (log scale){zeros}"
            return self._svg(fig, caption)

    def scatter(self, o: OutputResult) -> str:
        assert o.distribution is not None
        sample, worst = o.distribution.sample, o.distribution.worst
        with self._figure(4.2, 3.4) as fig:
            ax = fig.subplots()
            ax.scatter(sample.reference, sample.candidate, s=6, color=ACCENT, alpha=0.6, label="sample")
            ax.scatter(worst.reference, worst.candidate, s=22, color=FAIL_COLOUR, marker="x", label="worst")
            values = [*sample.reference, *sample.candidate, *worst.reference, *worst.candidate]
            finite = [x for x in values if math.isfinite(x)]
            if finite:
                lo, hi = min(finite), max(finite)
                ax.plot([lo, hi], [lo, hi], color=_INK, linewidth=0.6, alpha=0.5)
            ax.set_xlabel("reference")
            ax.set_ylabel("candidate")
            ax.grid(True, alpha=0.25, linewidth=0.5)
            ax.legend(loc="upper left")
            n = len(sample.reference)
            return self._svg(
                fig,
                f"{o.name}: candidate against reference, {n} elements evenly spaced and the "
                f"{len(worst.reference)} worst (x)",
            )

    def localize(self, trace: Sequence[TracePoint], flagged: Sequence[Localized]) -> str:
        from matplotlib.ticker import MaxNLocator

        xs = list(range(len(trace)))
        floor = 1e-12
        ys = [max(t.rel_error, floor) if t.rel_error is not None else None for t in trace]
        index = {t.tensor: i for i, t in enumerate(trace)}
        with self._figure(11, 3.2) as fig:
            ax = fig.subplots()
            ax.plot(
                [x for x, y in zip(xs, ys) if y is not None],
                [y for y in ys if y is not None],
                color=ACCENT,
                linewidth=0.9,
                marker=".",
                markersize=3,
            )
            bad = [i for i, t in enumerate(trace) if t.new_nonfinite]
            if bad:
                ax.scatter(bad, [ys[i] or floor for i in bad], color=FAIL_COLOUR, s=14, label="new NaN/Inf", zorder=3)
            for f in flagged:
                i = index.get(f.tensor)
                if i is None:
                    continue
                ax.axvline(i, color=SECOND, linewidth=1, linestyle="--")
                ax.annotate(
                    f"{f.node} ({f.reason})",
                    (i, ys[i] or floor),
                    textcoords="offset points",
                    xytext=(4, 6),
                    fontsize=8,
                    color=SECOND,
                )
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("tensor, in graph order")
            ax.set_ylabel("relative error (max_abs / max|ref|)")
            ax.grid(True, alpha=0.25, linewidth=0.5)
            if bad:
                ax.legend(loc="upper left")
            caption = (
                f"relative error of each of the {len(trace)} compared tensors along graph order (exact matches "
                f"drawn at {floor:g}); dashed lines mark the nodes where drift starts"
            )
            return self._svg(fig, caption, wide=True)

    def precision_bars(self, title: str, counts: dict[str, dict[str, int]]) -> str:
        labels = list(counts)
        with self._figure(5.2, 0.5 + 0.24 * max(len(labels), 2)) as fig:
            ax = fig.subplots()
            left = [0] * len(labels)
            for precision, colour in PRECISION_COLOURS.items():
                widths = [counts[k].get(precision, 0) for k in labels]
                if any(widths):
                    ax.barh(labels, widths, left=left, color=colour, label=precision)
                    left = [a + b for a, b in zip(left, widths)]
            ax.invert_yaxis()
            ax.set_xlabel("nodes")
            ax.legend(loc="lower right", ncols=4, fontsize=8)
            ax.grid(True, axis="x", alpha=0.25, linewidth=0.5)
            return self._svg(fig, f"{title}: nodes by the precision they run at")

    def repair(self, history: Sequence[RepairStep]) -> str:
        from matplotlib.ticker import MaxNLocator

        with self._figure(11, 3.0) as fig:
            ax = fig.subplots()
            xs = [h.evaluation for h in history]
            scores = [max(float(h.score), 1e-6) if h.score is not None else 1e9 for h in history]
            ax.plot(xs, scores, color=_INK, linewidth=0.6, alpha=0.5)
            for passed, colour, label in ((True, PASS_COLOUR, "passes"), (False, FAIL_COLOUR, "fails")):
                pts = [(x, y) for x, y, h in zip(xs, scores, history) if h.passed == passed]
                if pts:
                    ax.scatter(*zip(*pts), color=colour, s=22, label=label, zorder=3)
            written = [(x, y) for x, y, h in zip(xs, scores, history) if h.written]
            if written:
                ax.scatter(
                    *zip(*written),
                    s=160,
                    facecolors="none",
                    edgecolors=ACCENT,
                    linewidths=1.5,
                    label="written",
                    zorder=4,
                )
            ax.axhline(1.0, color=_INK, linestyle=":", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("evaluation")
            ax.set_ylabel("score (≤ 1 passes)")
            twin = ax.twinx()
            twin.step(xs, [h.kept for h in history], where="mid", color=SECOND, linewidth=1, alpha=0.8)
            twin.set_ylabel("nodes kept f32", color=SECOND)
            twin.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0))
            ax.grid(True, alpha=0.25, linewidth=0.5)
            return self._svg(
                fig,
                "repair: the score of each evaluation (log scale, at most 1 passes) and the nodes "
                "it kept in f32 (steps)",
                wide=True,
            )

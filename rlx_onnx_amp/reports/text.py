"""Text and Markdown renderings of the reports, from the typed results (`record`). Only the CLI
prints them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx_onnx_amp.cost import Cost, short_count
from rlx_onnx_amp.errors import LINE_LIMIT, summarized
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.reports.record import (
    Conversion,
    Failure,
    Localized,
    ModelResult,
    OutputResult,
    Repair,
    TaskVerdict,
    Verification,
    WrittenRun,
)

__all__ = [
    "BATCH_LEGEND",
    "DRIFT_COLUMNS",
    "DriftColumn",
    "batch_table",
    "conversion_markdown",
    "conversion_table",
    "drift_rows",
    "failed_verdict",
    "localized_table",
    "repair_kept_rows",
    "repair_summary",
    "table",
    "verify_markdown",
    "verify_table",
    "worst_score",
    "written_line",
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


def kind_rows(by_kind: dict[str, dict[str, int]]) -> list[list[object]]:
    return [[kind, *(counts.get(p, 0) for p in PRECISION_COLUMNS)] for kind, counts in sorted(by_kind.items())]


def cost_line(cost: Mapping[str, Any] | None) -> str | None:
    """The cost model in one line (JSON `cost`), or None when there is none."""
    if not cost:
        return None
    macs = f"{short_count(cost['macs'])} MACs, {percent(cost['mac_low_share'])} low"
    if cost["unknown_macs_nodes"]:
        macs += f" ({cost['unknown_macs_nodes']} Compute nodes of unknown shape not counted)"
    casts = f"{cost['casts']} float Casts moving {short_count(cost['cast_bytes'])}B per inference"
    if cost["unknown_cast_nodes"]:
        casts += f" ({cost['unknown_cast_nodes']} of unknown shape)"
    weights = f"weights {percent(cost['weight_low_share'])} low"
    line = f"cost: {macs}; {weights}; {casts}; {cost['islands']} low-precision islands"
    return f"{line} (inputs {_listed(cost['input_shapes'], LINE_LIMIT - len(line) - len(' (inputs )'))})"


def _listed(shapes: Mapping[str, Sequence[int]], room: int) -> str:
    """The input shapes as `name=1x8`, as many as fit in `room` characters, then how many more
    (the JSON report has them all); `none` without inputs."""
    parts = [f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in shapes.items()]
    for shown in range(len(parts), 0, -1):
        text = ", ".join(parts[:shown]) + (f", {len(parts) - shown} more" if shown < len(parts) else "")
        if len(text) <= room:
            return text
    return f"{len(parts)} inputs" if parts else "none"


def conversion_table(c: Conversion) -> str:
    lines = [
        f"{c.model} -> {c.output}  (policy {_policy(c)}, target {c.target or '?'})",
        table(("kind", *PRECISION_COLUMNS), kind_rows(c.by_kind)),
        f"nodes {c.nodes.total}, casts inserted {c.casts_inserted}, kept f32 {len(c.kept_f32)}, "
        f"weights {_mib(c.initializer_bytes.before)} -> {_mib(c.initializer_bytes.after)}",
    ]
    if c.clamped:
        name, worst = max(c.clamped.items(), key=lambda kv: abs(float(kv[1]["worst"])))
        total = _clamped_values(c)
        if total:
            lines.append(f"clamped {total} values in {len(c.clamped)} tensors (worst {worst['worst']:g} in {name})")
    if c.unknown_ops:
        lines.append(f"unknown ops kept in original types: {', '.join(sorted(set(c.unknown_ops)))}")
    if not c.changed:
        lines.append("nothing changed: every node keeps its original types, no Cast was inserted or removed")
    cost = cost_line(c.cost.to_json() if c.cost else None)
    if cost:
        lines.append(cost)
    proof = proof_line(c)
    if proof:
        lines.append(proof)
    return "\n".join(lines)


def proof_line(c: Conversion) -> str | None:
    """The proof in one line where it is not onnx.checker's own (an input the checker refuses,
    proven by onnxruntime loading the input and the output alike); None where the checker passed."""
    if c.proof is None or c.proof == "onnx.checker":
        return None
    why = c.proof.partition("(the input fails onnx.checker: ")[2].removesuffix(")") or c.proof
    return f"proof: onnx.checker refuses the input ({why}); onnxruntime loads the input and the output"


def _policy(c: Conversion) -> str:
    return c.policy.name if c.policy else "?"


def _clamped_values(c: Conversion) -> int:
    return sum(int(v["clamped"]) for v in c.clamped.values())


def _cost_sentence(c: Conversion) -> list[str]:
    """The cost line as a Markdown sentence and a blank line (none without a cost model)."""
    cost = cost_line(c.cost.to_json() if c.cost else None)
    return [cost[0].upper() + cost[1:] + ".", ""] if cost else []


def _gain_sentence(c: Conversion) -> list[str]:
    """What the conversion buys as a Markdown sentence and a blank line."""
    gain = gain_line(c)
    return [gain[0].upper() + gain[1:] + ".", ""] if gain else []


def _failures(results: Sequence[ModelResult]) -> list[Failure]:
    return [r.failure for r in results if r.failure is not None]


def conversion_markdown(results: Sequence[ModelResult]) -> str:
    """The Markdown summary of a run that verified nothing: the failures, then each conversion."""
    out = ["# rlx-amp conversion", ""]
    failed = _failures(results)
    if failed:
        out += [*_md_table(["model", "error"], [[f"`{f.model}`", f.error] for f in failed]), ""]
    for c in (r.conversion for r in results if r.conversion is not None):
        out += [f"## `{c.model}` → `{c.output}` (policy `{_policy(c)}`, target `{c.target or '?'}`)", ""]
        out += ["| kind | " + " | ".join(PRECISION_COLUMNS) + " |", "|---" * (len(PRECISION_COLUMNS) + 1) + "|"]
        out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in kind_rows(c.by_kind)]
        out += [
            "",
            f"Casts inserted: {c.casts_inserted}. Kept f32: {len(c.kept_f32)}. "
            f"Weights: {_mib(c.initializer_bytes.before)} → {_mib(c.initializer_bytes.after)}.",
            "",
        ]
        out += _cost_sentence(c)
        out += _gain_sentence(c)
        out += _proof_sentence(c)
    return "\n".join(out)


def _proof_sentence(c: Conversion) -> list[str]:
    proof = proof_line(c)
    return [f"**{proof[0].upper() + proof[1:]}.**", ""] if proof else []


@dataclass(frozen=True)
class DriftColumn:
    """One column of the drift table: the text, Markdown and JSON reports all come from these."""

    header: str
    json_key: str  # the key of `outputs[]` in the JSON report that holds its value
    legend: str
    cell: Callable[[OutputResult], object]


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


def drift_rows(v: Verification) -> list[list[str]]:
    """The drift table's cells, one row per output (failures first)."""
    return [[fmt(c.cell(o)) for c in DRIFT_COLUMNS] for o in v.outputs]


def failed_verdict(v: Verification) -> str:
    """The one line `-q` prints for a failing verification: each failing output and its checks,
    and the written file's own run where it fails."""
    written = v.written if v.written is not None and v.written.passed is False else None
    failed = _failed_outputs(v.task, v.outputs) if judged_passed(v) is False else []
    if written is not None:
        outputs = ", ".join(_failed_outputs(written.task, written.outputs))
        failed.append(f"the written file on {written.provider}: {outputs}")
    return f"FAILED {v.candidate}: {'; '.join(failed) or 'no output compared'}"


def _failed_outputs(task: TaskVerdict | None, outputs: Sequence[OutputResult]) -> list[str]:
    if task is not None and task.judged:  # an output the task could not judge is judged element-wise
        wise = {o.name: o.passed for o in outputs}
        return [f"{t.output} ({t.task if t.not_judged is None else 'element-wise'})" for t in task.outputs
                if not (t.passed if t.not_judged is None else wise.get(t.output, False))]
    return [f"{o.name} ({', '.join(o.failed_checks or [])})" for o in outputs if not o.passed]


def judged_passed(v: Verification) -> bool:
    """The verdict on the candidate judged in the verifying process (often the emulation of the
    written file), apart from the written file's own run (`Verification.written`)."""
    if v.task is not None and v.task.judged:
        return v.task.passed
    return bool(v.outputs) and all(o.passed for o in v.outputs)


#: What onnxruntime calls each provider, as a user knows it.
PROVIDER_NAMES = {"cpu": "CPU", "cuda": "CUDA", "coreml": "CoreML"}


def written_line(v: Verification, verbose: bool = False) -> str | None:
    """The written file's own run (issue 49) in one line: it crashed or cannot run here (the
    verdict is then the emulation's; onnxruntime's words with `verbose`), it fails (which run
    failed, and what that means), or it passes too. None where it was not run."""
    w = v.written
    if w is None:
        return None
    name = PROVIDER_NAMES.get(w.provider, w.provider)
    if w.crashed is not None:
        died = w.crashed.replace(" (", ", ").rstrip(")")  # "signal 11, SIGSEGV": one pair of brackets
        return (f"{v.candidate}: the written file crashes onnxruntime's {name} provider ({died}); the verdict is the "
                "emulation's (exit 4)")
    if not w.ran:
        why = summarized(w.error or "unknown", 100) if verbose else "-v says why"
        return (f"{v.candidate}: the written file cannot run on onnxruntime's {name} provider; the verdict is the "
                f"emulation's ({why})")
    if w.passed:
        return f"written file on {w.provider}: PASS (its own outputs, run as a user runs it, within the tolerance too)"
    failed = [f"{o.name} FAIL {(o.failures or ('',))[-1]}" for o in w.outputs if not o.passed]
    if w.task is not None:
        failed = [f"{t.output} FAIL ({t.task})" for t in w.task.outputs if not t.passed] or failed
    return f"written file on {w.provider}: {'; '.join(failed)} ({_written_meaning(v, w, name)})"


def _written_meaning(v: Verification, w: WrittenRun, name: str) -> str:
    """What a failing written run means beside the judged candidate's verdict."""
    if not v.emulated:
        return f"the file itself fails on {name}"
    if not judged_passed(v):
        return "the emulation fails as well"
    return (f"onnxruntime's {name} kernels for {v.precision} differ from the emulation, which passes: the file is "
            f"wrong for {name} users")


def task_line(v: Verification) -> str | None:
    """The task verdict in one line, from the figures each task summed up
    (`TaskResult.summary`): where it judged something it decides the verdict and the
    element-wise rows are diagnostics; where it judged nothing, the element-wise verdict decides.
    None where no task was judged."""
    t = v.task
    if t is None:
        return None
    head = f"task {t.task} ({t.chosen_by})"
    if not t.judged:
        return f"{head}: not judged ({t.not_judged}); the element-wise verdict decides"
    parts = [
        f"{r.output} {'PASS' if r.passed else 'FAIL'}: {r.summary or f'{r.rows} rows'}" if r.not_judged is None
        else f"{r.output} not judged ({r.not_judged}): judged element-wise"
        for r in t.outputs
    ]
    return (
        f"{head}: {'PASSED' if t.passed else 'FAILED'}; {'; '.join(parts)}; "
        "the element-wise rows above are diagnostics"
    )


def required_tolerances(o: OutputResult) -> str | None:
    """The smallest tolerance that would have passed this output (Polygraphy's 'minimum
    required tolerance'), each option alone."""
    r = o.required
    if r is None:
        return None
    parts = [f"--atol {o.name}:{r.atol:.4g}"]
    if r.rtol_of_max is not None:
        parts.append(f"--rtol-of-max {o.name}:{r.rtol_of_max:.4g}")
    if r.rtol is not None:
        parts.append(f"--rtol {o.name}:{r.rtol:.4g} (element-wise)")
    text = f"{o.name}: would pass the size checks with " + " or ".join(parts)
    if r.min_cosine is not None:
        text += f"; cosine {_cosine(r.min_cosine)} needs --min-cosine at most that"
    return text


def criterion_line(v: Verification) -> str:
    """The verdict and the tolerances it was judged by (the task's verdict where one was judged)."""
    rtol = v.rtol.get("")
    tolerances = f"atol {v.atol['']:g}, rtol_of_max {v.rtol_of_max['']:g}"
    if rtol is not None:
        tolerances += f", rtol {rtol:g} (element-wise)"
    verdict = "FAILED" if not v.passed else "NO VERDICT" if v.unmoved else "PASSED"
    return (
        f"{verdict}: {tolerances}, min cosine {v.min_cosine['']:g} "
        f"({v.precision} defaults unless overridden; per-output values in the JSON report)"
    )


def constant_note(v: Verification) -> str | None:
    """What to note when some output of the reference is one value everywhere (random weights
    that saturate, inputs that mask everything): its pass shows little of the conversion."""
    constant = v.constant_outputs
    if not constant:
        return None
    if v.unmoved_why is not None:
        return f"{v.unmoved_why}; the model counts as unverified (exit 4)"
    shown = ", ".join(f"{name} (every element {value:g})" for name, value in constant.items())
    return (
        f"the reference's output is constant for {shown}: only max_abs <= atol was checked there; "
        "real inputs (--inputs) or trained weights test more"
    )


def inputs_line(v: Verification, shown: int = 4) -> str | None:
    """`inputs: images 1x3x320x320 from metadata imgsz; second size ...`: the synthesized inputs
    whose sizes the model does not fix, and why those (JSON `inputs_why`); with --inputs samples,
    what made them (`inputs_from`); None where neither."""
    if v.inputs_from:
        return f"inputs: {v.inputs_from}"
    chosen = [(n, why) for n, why in (v.inputs_why or {}).items() if why != "fixed by the model"]
    if not chosen:
        return None
    parts = [f"{n} {'x'.join(map(str, v.inputs.get(n, []))) or 'scalar'} ({why})" for n, why in chosen[:shown]]
    if len(chosen) > shown:
        parts.append(f"{len(chosen) - shown} more in the JSON report")
    line = f"inputs: {'; '.join(parts)}"
    if v.inputs_second:
        grown = [f"{n} {'x'.join(map(str, s))}" for n, s in v.inputs_second.items() if s != v.inputs.get(n)]
        line += f"; second size: {', '.join(grown[:shown])}{', ...' if len(grown) > shown else ''}"
    return line


def verify_table(v: Verification, verbose: bool = False) -> str:
    """One row per output, failures first; the legend and the tolerances that would have passed
    when something failed or with -v."""
    header = f"verify {v.candidate} against {v.reference} on {v.provider}"
    if verbose:  # the providers and why it emulates: with -v and in the JSON
        header += f" ({', '.join(v.providers_used)})"
        header += f", emulated {v.precision}: {v.emulation_reason}" if v.emulated else ""
    elif v.emulated:
        header += f", emulated {v.precision} (-v says why)"
    lines = [header, table([c.header for c in DRIFT_COLUMNS], drift_rows(v))]
    if v.localized:
        lines += ["", "first nodes where drift starts:", table(*localized_table(v.localized))]
    lines.append(criterion_line(v))
    lines.append(f"criterion: {v.criterion}")
    task = task_line(v)
    if task:
        lines.append(task)
    written = written_line(v, verbose)
    if written:
        lines.append(written)
    note = constant_note(v)
    if note:
        lines.append(f"note: {note}")
    sizes = inputs_line(v)
    if sizes:
        lines.append(sizes)
    if verbose or not v.passed:
        needed = [t for o in v.outputs if (verbose or not o.passed) and (t := required_tolerances(o))]
        if needed:
            lines += ["minimum tolerances:", *(f"  {t}" for t in needed)]
        lines += ["columns:", *(f"  {c.header}: {c.legend}" for c in DRIFT_COLUMNS)]
    return "\n".join(lines)


def localized_table(localized: Sequence[Localized]) -> tuple[list[str], list[list[object]]]:
    rows: list[list[object]] = []
    for d in localized:
        shapes = f"{list(d.reference_shape or ())} vs {list(d.candidate_shape or ())}"
        detail = shapes if d.reason == "shape differs" else fmt(d.rel_error)
        rows.append([d.node, d.op, d.tensor, d.reason, detail, d.input_rel_error])
    return ["node", "op", "tensor", "reason", "rel_error or shapes", "inputs' rel_error"], rows


def worst_score(v: Verification) -> float:
    """The worst output's score (0 with no output): how far from passing the model is."""
    return max((o.score for o in v.outputs if o.score is not None), default=0.0)


#: What a batch's closing table's words mean, under it.
BATCH_LEGEND = (
    "worst score: the worst output's distance from passing (1 or less passes); "
    "MACs low: the written model's multiply-accumulates in f16, bf16 or a quantized class"
)


def batch_table(results: Sequence[ModelResult], seconds: Sequence[float | None] = ()) -> str:
    """A batch's closing table, one row per model: its exit code, MACs low, worst score and
    seconds, then what the words mean."""
    rows = []
    for k, r in enumerate(results):
        cost = r.conversion.cost if r.conversion is not None else None
        took = seconds[k] if k < len(seconds) else None
        rows.append(
            [
                r.model,
                r.exit_code,
                percent(cost.mac_low_share) if cost is not None else "-",
                fmt(worst_score(r.verify)) if r.verify is not None else "-",
                "-" if took is None else f"{took:.1f}",
            ]
        )
    return table(["model", "exit", "MACs low", "worst score", "seconds"], rows) + f"\n{BATCH_LEGEND}"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        return fmt(v).replace("|", "\\|")

    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(cell(c) for c in r) + " |" for r in rows),
    ]


#: The summary table's columns (drift report, merge-reports); the last three are what the
#: conversion buys: its MACs in low precision, its files' size against the input's, and its
#: speed-up on the provider the check ran on.
SUMMARY_COLUMNS = (
    "model",
    "result",
    "policy",
    "provider",
    "emulated",
    "outputs",
    "failed",
    "worst score",
    "MACs low",
    "size",
    "speed-up",
)


#: What the summary's words mean, where the summary is (Markdown, merge-reports).
SUMMARY_LEGEND = (
    "*worst score*: the worst output's distance from passing (its max_abs over the bound it was judged "
    "against, and the like; at most 1 passes); *MACs low*: the written model's multiply-accumulates in "
    "f16, bf16 or a quantized class; *size*: its files' bytes over the input's; *speed-up*: the original's "
    "time per inference over the written model's, on the provider the check ran on."
)


def verify_markdown(results: Sequence[ModelResult]) -> str:
    """A Markdown summary for a CI job's summary page: each verified model (with its conversion
    and repair where it has them), and the models that could not be converted."""
    verified = [r for r in results if r.verify is not None]
    failed = _failures(results)
    passed = all(_verification(r).passed for r in verified) and not failed
    out = [f"# rlx-amp drift report: {'✅ passed' if passed else '❌ failed'}", ""]
    advice = next_step(results)
    if advice is not None:
        out += [f"> **Next:** {advice}", ""]
    summary = []
    for r in verified:
        v = _verification(r)
        summary.append(
            [
                f"`{v.candidate}`",
                "pass" if v.passed else "**FAIL**",
                r.conversion.policy.name if r.conversion is not None and r.conversion.policy is not None else "-",
                v.provider,
                "yes" if v.emulated else "no",
                len(v.outputs),
                sum(not o.passed for o in v.outputs),
                worst_score(v),
                percent(r.conversion.cost.mac_low_share) if r.conversion and r.conversion.cost else "-",
                size_ratio(r.conversion),
                speedup(v),
            ]
        )
    summary += [[f"`{f.model}`", "**ERROR**", "-", "-", "-", "-", "-", f.error, "-", "-", "-"] for f in failed]
    out += _md_table(SUMMARY_COLUMNS, summary)
    out += ["", SUMMARY_LEGEND, ""]
    for r in verified:
        out += _verified_md(r)
    out += ["### Columns", "", *(f"- **{c.header}**: {c.legend}" for c in DRIFT_COLUMNS), ""]
    return "\n".join(out)


def _verification(r: ModelResult) -> Verification:
    assert r.verify is not None
    return r.verify


def _verified_md(r: ModelResult) -> list[str]:
    v = _verification(r)
    out = [
        f"## `{v.candidate}`",
        "",
        f"Compared against `{v.reference}`. Criterion: {v.criterion}.",
        "",
        criterion_line(v) + f". Seed {v.seed}, {v.samples} input set(s).",
        "",
    ]
    task = task_line(v)
    if task:
        out += [task[0].upper() + task[1:] + ".", ""]
    written = written_line(v, verbose=True)
    if written:
        bold = "**" if v.written is not None and v.written.passed is False else ""  # which run failed, at a glance
        out += [f"{bold}{written[0].upper()}{written[1:]}.{bold}", ""]
    note = constant_note(v)
    if note:
        out += [f"> Note: {note}.", ""]
    out += _md_table([c.header for c in DRIFT_COLUMNS], drift_rows(v))
    needed = [t for o in v.outputs if not o.passed and (t := required_tolerances(o))]
    if needed:
        out += ["", "Minimum tolerances that would have passed:", "", *(f"- `{t}`" for t in needed)]
    if v.localized:
        out += ["", "First nodes where drift starts:", "", *_md_table(*localized_table(v.localized))]
    latency = latency_line(v, r.conversion.target if r.conversion is not None else None)
    if latency:
        out += ["", latency[0].upper() + latency[1:] + "."]
    if r.conversion is not None:
        out += ["", "### Conversion", "", *_conversion_facts_md(r.conversion)]
        if r.repair is not None:
            out += ["", "### Repair", "", *_repair_md(r.repair)]
    out.append("")
    return out


def _conversion_facts_md(c: Conversion) -> list[str]:
    out = [
        f"Policy `{_policy(c)}`, target `{c.target or '?'}`: {c.nodes.total} nodes, "
        f"{c.casts_inserted} Casts inserted, {len(c.kept_f32)} kept f32, weights {_mib(c.initializer_bytes.before)} → "
        f"{_mib(c.initializer_bytes.after)}.",
        "",
        *_cost_sentence(c),
        *_gain_sentence(c),
        *_proof_sentence(c),
    ]
    out += _md_table(["kind", *PRECISION_COLUMNS], kind_rows(c.by_kind))
    if c.kept_f32:
        shown = c.kept_f32[:20]
        out += ["", *_md_table(["kept f32", "op", "reason"], [[f"`{k.node}`", k.op, k.reason] for k in shown])]
        if len(c.kept_f32) > len(shown):
            out.append(f"\n… and {len(c.kept_f32) - len(shown)} more (JSON report).")
    total = _clamped_values(c)
    if total:
        out += ["", f"Clamped {total} values in {len(c.clamped)} tensors to the low precision's range."]
    return out


def repair_history_rows(repair: Repair) -> list[list[object]]:
    """The repair's evaluations as table rows: evaluation, stage, kept, passed, score, written."""
    return [[h.evaluation, h.stage, h.kept, h.passed, h.score, "✓" if h.written else ""] for h in repair.history]


def repair_kept_rows(repair: Repair, node: Callable[[str], str] = str) -> list[list[object]]:
    """The nodes the repaired model keeps in f32 as table rows: node (as `node` writes it), op,
    reason, path."""
    return [[node(k.node), k.op, k.reason, k.path] for k in repair.kept_f32]


def _repair_md(repair: Repair) -> list[str]:
    b = repair.best
    evaluation, stage, score = (b.evaluation, b.stage, b.score) if b is not None else (None, None, None)
    out = [
        f"{'Met the tolerance' if repair.passed else 'Did not meet the tolerance'} after "
        f"{_evaluations(repair)}; wrote evaluation {evaluation} ({stage}, "
        f"score {fmt(score)}); minimality {repair.minimality}."
        + (f" Stopped early: {repair.stopped}." if repair.stopped else ""),
        "",
    ]
    out += _md_table(["evaluation", "stage", "kept", "passed", "score", "written"], repair_history_rows(repair))
    if repair.kept_f32:
        out += ["", *_md_table(["kept f32", "op", "reason", "path"], repair_kept_rows(repair, lambda n: f"`{n}`"))]
    return out


def repair_summary(repair: Repair) -> str:
    b = repair.best
    written = f"evaluation {b.evaluation} ({b.stage}, score {b.score:.3g})" if b is not None else "no evaluation"
    verdict = (
        "met the tolerance"
        if repair.passed
        else "the tolerance was not met within the budget or by any keep; wrote the best model found"
    )
    lines = [
        f"repair: {verdict} after {_evaluations(repair)}: {written}; {len(repair.kept_f32)} nodes kept f32 "
        f"(minimality {repair.minimality}); "
        f"low precision: {percent(repair.compute_low_share)} of Compute nodes, "
        f"{percent(repair.weight_low_share)} of float weight bytes"
    ]
    if repair.stopped:
        lines.append(f"repair: auto stopped early: {repair.stopped}")
    if repair.kept_f32 and repair.history:  # none evaluated: every node kept, no table of them
        lines.append(table(("kept f32", "op", "reason", "path"), repair_kept_rows(repair)))
    return "\n".join(lines)


def _evaluations(repair: Repair) -> str:
    """`3 of 20 evaluations in 4.1 s`, as much as the record holds."""
    budget = f" of {repair.budget}" if repair.budget is not None else ""
    seconds = f" in {repair.seconds:.1f} s" if repair.seconds is not None else ""
    return f"{repair.evaluations}{budget} evaluations{seconds}"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


# -- what a conversion buys -------------------------------------------------------------------


def size_ratio(c: Conversion | None) -> str:
    """The written files' bytes over the input's ("0.51x"), or "-" where unknown."""
    if c is None or c.file_bytes is None or not c.file_bytes.before:
        return "-"
    return f"{c.file_bytes.after / c.file_bytes.before:.2f}x"


def speedup(v: Verification | None) -> str:
    """The original's time per inference over the written model's ("1.35x": faster), or "-"."""
    value = v.latency.speedup if v is not None and v.latency is not None else None
    return "-" if value is None else f"{value:.2f}x"


def _mac_classes(cost: Cost) -> str:
    """MACs per precision class, the classes present: "f16 98%, int8 2%"."""
    if not cost.macs:
        return ""
    present = [(k, n) for k, n in cost.macs_by_precision.items() if n]
    return ", ".join(f"{k} {100 * n / cost.macs:.0f}%" for k, n in present)


def gain_line(c: Conversion) -> str | None:
    """What the conversion buys, in one line: files, weights, compute in low precision and
    its classes, the Casts it pays per inference; None without a cost model."""
    cost = c.cost
    if cost is None:
        return None
    parts = []
    if c.file_bytes is not None:
        parts.append(f"file {_mib(c.file_bytes.before)} -> {_mib(c.file_bytes.after)} ({size_ratio(c)})")
    parts.append(f"weights {_mib(c.initializer_bytes.before)} -> {_mib(c.initializer_bytes.after)}")
    if cost.macs:
        parts.append(f"{percent(cost.mac_low_share)} of {short_count(cost.macs)} MACs low ({_mac_classes(cost)})")
    else:
        unknown = cost.unknown_macs_nodes
        parts.append("no MACs counted" + (f" ({unknown} Compute nodes of unknown shape)" if unknown else ""))
    parts.append(f"{cost.casts} Casts moving {short_count(cost.cast_bytes)}B per inference")
    return "buys: " + ", ".join(parts)


def latency_line(v: Verification, target: str | None) -> str | None:
    """The measured time per inference of the original and the written model on the provider
    the check ran on; where that provider is not the target's, it says so and draws no speed
    conclusion. None when nothing was timed."""
    lat = v.latency
    if lat is None:
        return None
    if lat.reference_ms is None and lat.candidate_ms is not None:  # the written file alone was timed
        return (f"latency on {lat.provider}: the written model {lat.candidate_ms:.3g} ms per inference (median of "
                f"{lat.runs}); {summarized(lat.note or 'the input not timed', 200)}")
    if lat.reference_ms is None or lat.candidate_ms is None:
        return f"latency on {lat.provider}: not measured ({summarized(lat.note or 'unknown', 120)})"
    ratio = lat.speedup
    assert ratio is not None
    verdict = "faster" if ratio > 1.05 else "slower" if ratio < 1 / 1.05 else "about the same"
    line = (
        f"latency on {lat.provider}: {lat.reference_ms:.3g} ms -> {lat.candidate_ms:.3g} ms per inference "
        f"(median of {lat.runs}; {ratio:.2f}x, {verdict})"
    )
    if target and target != lat.provider:
        line += f"; {lat.provider} stands in for the {target} target: no speed conclusion"
    elif verdict == "slower":
        line += f": the written model is slower than the original on {lat.provider}, its target"
    return line


def next_step(results: Sequence[ModelResult]) -> str | None:
    """What to do next, in one line, after a run that did not pass (drift, a gate, no verdict);
    None when every model passed."""
    for r in results:
        v, name = r.verify, Path(r.model).name  # the name keeps the line short; the path is above
        w = v.written if v is not None else None
        if v is not None and w is not None and w.passed is False and judged_passed(v) and v.emulated:
            return (f"{name}: the written file fails on {w.provider}, its emulation passes: rlx-amp verify "
                    "--no-emulate judges the file alone; --keep-f32-node NAME keeps a node f32")
        if v is not None and not v.passed:
            first = v.localized[0].node if v.localized else None
            if r.conversion is None:  # the verify command: the candidate is someone else's
                return f"{Path(v.candidate).name}: rerun with --localize to name the nodes where drift starts"
            if r.repair is not None:
                return f"{name}: the repair ran out of evaluations: raise --repair-budget, or --keep-f32-node NAME"
            if first is not None:
                return f"{name}: add --repair (or --policy auto), or --keep-f32-node {first}: drift starts there"
            return f"{name}: add --repair (or --policy auto) to keep drifting nodes in f32; --localize names them"
        if r.gate is not None and not r.gate.passed:
            return f"{name}: --policy auto keeps the most compute low that passes the verdict"
        if v is not None and v.written_unproven:
            return f"{name}: verify the written file on its target's provider (--provider {w.target if w else ''})"
        if r.unverified is not None:
            give = r.unverified[r.unverified.find("give ") :] if "give " in r.unverified else ""
            return f"{name}: " + (give or "give its inputs with --inputs FILE.npz, or sizes with --shape NAME:DIMS")
    return None

"""One model's result, typed: what its JSON report holds (docs/reports.md, "Conversion report" and
"Drift report keys"), as frozen records that every rendering takes (`text`, `html`, the JSON
written by `--report-json`) and that `merge-reports` reads back.

A `ModelResult` holds a model's `Conversion`, its `Verification` (per output an `OutputResult`,
the nodes where drift starts as `Localized` entries), its `Repair`, why it was written
unverified, or its `Failure`. Each stage builds its record once (the rewrite its `Conversion`,
the verifier its `Verification`, repair its `Repair`), and nothing else writes them. Each
record's JSON is its fields in order, nested records and tuples as objects and lists
(`to_json`), and `from_json` reads that JSON back into equal records; a field marked
`ABSENT_WHEN_NONE` is left out of the JSON when None, as the reports leave it, and one marked
`NOT_IN_JSON` (what the run needs, not the report) is not written. `json_schema` is the JSON
Schema of the report files, from the same field types.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx_onnx_amp import __version__
from rlx_onnx_amp.cost import Cost
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_LOW_GAIN, EXIT_OK, EXIT_UNVERIFIED
from rlx_onnx_amp.policy import Policy

__all__ = [
    "SCHEMA_VERSION",
    "ByteCounts",
    "Conversion",
    "Distribution",
    "Failure",
    "Gate",
    "HeldOut",
    "Histogram",
    "KeptNode",
    "Latency",
    "Localized",
    "ModelResult",
    "NodeIndex",
    "OutputResult",
    "RecordError",
    "Repair",
    "RepairKeep",
    "RepairStep",
    "Run",
    "Sample",
    "TaskResult",
    "TaskVerdict",
    "TracePoint",
    "Verification",
    "WrittenRun",
    "batch_json",
    "json_schema",
    "report_document",
    "report_kind",
    "report_text",
    "run_record",
]


from rlx_onnx_amp.reports.codec import (
    ABSENT_WHEN_NONE,
    NOT_IN_JSON,
    Record,
    RecordError,
    record_schema,
    type_schema,
)

# -- the conversion ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Nodes(Record):
    total: int
    by_precision: dict[str, int]


@dataclass(frozen=True)
class ByteCounts(Record):
    """Bytes before the conversion and after it."""

    before: int
    after: int


@dataclass(frozen=True)
class KeptNode(Record):
    """A node left in its original (f32) types although the policy wanted it lower."""

    node: str
    op: str
    reason: str
    path: str
    code: str | None = None  # rewrite.rules.REASON_CODES


@dataclass(frozen=True)
class NodeIndex:
    """Per node path, what repair and the keep options need of a conversion (not in the JSON):
    the precision it ended at ("none": no float values), the deciding rule's code for every
    node one of the rules stopped from running at its kind's precision, and the nodes in low precision
    that a keep (`ConvertOptions.keep_f32_paths`) would return to their original types, with
    their label and op: the only nodes repair may spend an evaluation on."""

    decisions: Mapping[str, str] = field(default_factory=dict)
    rules: Mapping[str, str] = field(default_factory=dict)
    keepable: Mapping[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Conversion(Record):
    """What the rewrite did to one model (`rewrite.summary.summarize`), with what the file layer
    adds: where it was written, its data files, and what proved it sound."""

    model: str
    output: str
    policy: Policy | None
    target: str
    nodes: Nodes
    by_kind: dict[str, dict[str, int]]
    by_op: dict[str, dict[str, int]]
    casts_inserted: int
    casts_removed: int
    changed: bool
    kept_f32: tuple[KeptNode, ...]
    by_rule: dict[str, int]
    clamped: dict[str, dict[str, Any]]
    initializer_bytes: ByteCounts
    unknown_ops: tuple[str, ...]
    data_files: tuple[str, ...]
    cost: Cost | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: The model file and its external data files, as read and as written (a file's conversion).
    file_bytes: ByteCounts | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: What proved the output sound (`api.prove`); the JSON has it after `verify` and `unverified`.
    proof: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    index: NodeIndex = field(default_factory=NodeIndex, compare=False, repr=False, metadata=NOT_IN_JSON)


# -- the verification -------------------------------------------------------------------------


@dataclass(frozen=True)
class Worst(Record):
    """The element with the largest |candidate - reference|."""

    index: tuple[int, ...]
    reference: float
    candidate: float


@dataclass(frozen=True)
class Required(Record):
    """The smallest tolerance that would have passed the output, each alone."""

    atol: float
    rtol_of_max: float | None
    rtol: float | None
    min_cosine: float | None


@dataclass(frozen=True)
class Histogram(Record):
    """|c - r| over log-spaced bins, and how many elements are exactly equal."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    zeros: int


@dataclass(frozen=True)
class Sample(Record):
    """Elements by flat index, with their reference and candidate values."""

    index: tuple[int, ...]
    reference: tuple[float, ...]
    candidate: tuple[float, ...]


@dataclass(frozen=True)
class Distribution(Record):
    """What the HTML report plots of one output."""

    abs_error_histogram: Histogram
    sample: Sample
    worst: Sample


@dataclass(frozen=True)
class OutputResult(Record):
    """One output's drift and verdict (`metrics.compare_arrays`; a metric that is not finite
    is None, as in the JSON), with the tolerance it was judged by."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    elements: int
    max_abs: float | None
    max_rel: float | None
    mean_abs: float | None
    p99_abs: float | None
    cosine: float | None
    snr_db: float | None
    mismatch_pct: float | None
    nan_ref: int
    nan_cand: int
    inf_ref: int
    inf_cand: int
    new_nan: int
    new_inf: int
    worst: Worst | None
    top1_agreement: float | None
    constant_reference: float | None
    passed: bool
    failures: tuple[str, ...] | None
    failed_checks: tuple[str, ...] | None
    bound: float | None
    required: Required | None
    score: float | None
    distribution: Distribution | None
    atol: float | None
    rtol_of_max: float | None
    rtol: float | None
    min_cosine: float | None


@dataclass(frozen=True)
class Localized(Record):
    """A node where drift starts (`--localize`): its output `tensor` drifts `rel_error` where
    its inputs drift `input_rel_error`; `reason` is "drift jumps", "input rounded", "NaN/Inf
    appears" or "shape differs" (with both shapes)."""

    node: str
    op: str
    path: str
    tensor: str
    rel_error: float
    input_rel_error: float
    max_abs: float
    new_nonfinite: int
    reason: str
    reference_shape: tuple[int, ...] | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    candidate_shape: tuple[int, ...] | None = field(default=None, metadata=ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class TracePoint(Record):
    """One compared tensor of `--localize`, in graph order (what the HTML report plots)."""

    tensor: str
    node: str
    op: str
    rel_error: float | None
    new_nonfinite: int
    #: The reference's shape and the candidate's, where they differ.
    shapes: tuple[tuple[int, ...], ...] | None = field(default=None, metadata=ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class TaskResult(Record):
    """One output judged by its task (`verification.task`; docs/verification.md says what each
    field means per task): top-1/top-5 agreement over the rows (`generate`: prompt-steps;
    `segment`: pixels) that are no near-tie (`set_apart`), the lowest row cosine; `generate`'s
    `steps`, free-running `token_agreement` and `first_divergence` (None: no prompt's tokens
    part); `detect`'s `recall`, `precision` and `mean_iou` (`set_apart`: detections at the score
    cut); `segment`'s `mean_iou` over the classes present and `classes` (its class axis' length).
    `not_judged` says why nothing of the output was compared (then it does not pass, and the
    element-wise verdict decides); `summary` is the task's one-line account of the figures."""

    output: str
    task: str
    rows: int
    set_apart: int
    top1_agreement: float | None
    top5_agreement: float | None
    min_cosine: float | None
    passed: bool
    steps: int | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    token_agreement: float | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    first_divergence: int | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    recall: float | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    precision: float | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    mean_iou: float | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    classes: int | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    not_judged: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    summary: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class TaskVerdict(Record):
    """The verdict on the task: where it judged something it decides `Verification.passed` (the
    element-wise figures are diagnostics then); `chosen_by` says how the task was picked.
    `not_judged` says why it compared nothing (every row a near-tie, no detection off the score
    cut, no token step): then `passed` is false and the element-wise verdict decides."""

    task: str
    chosen_by: str
    passed: bool
    outputs: tuple[TaskResult, ...]
    not_judged: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)

    @property
    def judged(self) -> bool:
        return self.not_judged is None


@dataclass(frozen=True)
class Latency(Record):
    """The reference's and the candidate file's median time per inference over `runs` warm
    runs on the first input set, on `provider` (the one the verification ran on, which may
    stand in for the target's), with onnxruntime's default session options. None where a model
    could not be timed there; `note` says why."""

    provider: str
    runs: int
    reference_ms: float | None
    candidate_ms: float | None
    note: str | None

    @property
    def speedup(self) -> float | None:
        """Reference time over candidate time: above 1 the candidate is faster."""
        if self.reference_ms is None or not self.candidate_ms:
            return None
        return self.reference_ms / self.candidate_ms


@dataclass(frozen=True)
class WrittenRun(Record):
    """The written file itself, run on `provider` in a child process on every input set (issue
    49), beside the candidate judged (often its emulation): its outputs against the reference's
    by the same tolerance, and its `task` verdict where a task is judged. `ran`: it ran; else
    `crashed` says how onnxruntime died ("signal 11 (SIGSEGV)") or `error` why it cannot run,
    which on `provider` standing in for the `target` leaves the emulation's verdict (exit 4).
    `passed` is None where it did not run."""

    provider: str
    target: str | None
    ran: bool
    crashed: str | None
    error: str | None
    outputs: tuple[OutputResult, ...]
    passed: bool | None
    task: TaskVerdict | None = field(default=None, metadata=ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class Verification(Record):
    """The drift report of one candidate against its reference (`verification.Verifier.verify`);
    the tolerances are per output name, "" the default."""

    reference: str
    candidate: str
    provider: str
    providers_used: tuple[str, ...]
    emulated: bool
    emulation_reason: str | None
    candidate_loaded: bool
    precision: str
    criterion: str
    atol: dict[str, float]
    rtol_of_max: dict[str, float]
    rtol: dict[str, float | None]
    min_cosine: dict[str, float]
    seed: int
    samples: int
    inputs: dict[str, list[int]]
    passed: bool
    outputs: tuple[OutputResult, ...]
    localized: tuple[Localized, ...] | None
    localize_trace: tuple[TracePoint, ...] | None
    latency: Latency | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    task: TaskVerdict | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: Synthesized inputs: where each one's sizes came from ("metadata imgsz", "default sequence
    #: 128"); absent with --inputs.
    inputs_why: dict[str, str] | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: The input shapes of the sets drawn at the second size (`sizes.SizePlan.grown`); absent
    #: where every set has the first's.
    inputs_second: dict[str, list[int]] | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: --inputs samples: what the input sets were made from ("samples: 2 images
    #: (preprocessor_config.json: resize shortest edge 32, crop 28x28, /255, mean/std)"); absent
    #: for synthesized inputs and arrays.
    inputs_from: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: The written file's own run (`WrittenRun`): where its outputs fail, `passed` is False.
    written: WrittenRun | None = field(default=None, metadata=ABSENT_WHEN_NONE)

    @property
    def written_unproven(self) -> bool:
        """The written file crashed onnxruntime on the provider that stands in for its target
        here: the verdict is the emulation's alone, and the model's exit code 4. (One that
        cannot run here, as a bf16 file on the CPU provider, leaves the emulation's verdict and
        its exit code: the provider lacks it, which says nothing against the file.)"""
        return self.written is not None and self.written.crashed is not None

    @property
    def constant_outputs(self) -> dict[str, float]:
        """Outputs whose reference holds one value everywhere: a pass there proves little."""
        return {o.name: o.constant_reference for o in self.outputs if o.constant_reference is not None}

    @property
    def unmoved(self) -> bool:
        """Every output of the reference holds one value over every input set, and no task
        verdict judged them: a pass compares nothing that moves, so it is no verdict (exit 4)."""
        judged = self.task is not None and self.task.judged
        return bool(self.outputs) and len(self.constant_outputs) == len(self.outputs) and not judged

    @property
    def unmoved_why(self) -> str | None:
        """Why a verification that `unmoved` is no verdict, in words; None for one that moved."""
        if not self.unmoved:
            return None
        shown = ", ".join(f"{name} (every element {value:g})" for name, value in self.constant_outputs.items())
        return (f"every output of the reference is constant on these inputs: {shown}; nothing that moves was "
                "compared: give inputs that make it move (--inputs)")


# -- the repair -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepairKeep(Record):
    """A node the repaired model keeps in f32, and why (overflow, underflow, drift)."""

    path: str
    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class RepairBest(Record):
    """The evaluation written."""

    evaluation: int
    stage: str
    score: float
    kept: int


@dataclass(frozen=True)
class RepairStep(Record):
    """One candidate the repair evaluated: how many nodes it kept, and how it did."""

    evaluation: int
    stage: str
    kept: int
    passed: bool
    score: float
    written: bool


@dataclass(frozen=True)
class HeldOut(Record):
    """`--policy auto` with several input sets: the search chose on the first `chosen_on` of
    them and the written model was confirmed on the other `confirmed_on` (the model's `verify`);
    `choosing_passed` is its verdict on the sets that chose."""

    chosen_on: int
    confirmed_on: int
    choosing_passed: bool


@dataclass(frozen=True)
class Repair(Record):
    """What `--repair` did (`repair.repair_file`)."""

    passed: bool
    evaluations: int
    kept_f32: tuple[RepairKeep, ...]
    compute_low_share: float | None
    weight_low_share: float | None
    best: RepairBest | None
    minimality: str
    history: tuple[RepairStep, ...]
    held_out: HeldOut | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    budget: int | None = field(default=None, metadata=ABSENT_WHEN_NONE)  # evaluations allowed
    #: Wall seconds of the whole repair: the reference run and the written model's proof included.
    seconds: float | None = field(default=None, metadata=ABSENT_WHEN_NONE)
    #: Why `auto` stopped before its budget ran out: nothing to gain, or only f32 passed.
    stopped: str | None = field(default=None, metadata=ABSENT_WHEN_NONE)


# -- one model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure(Record):
    """A model of a batch that could not be converted: the one-line error and its exit code."""

    model: str
    error: str
    exit_code: int


@dataclass(frozen=True)
class Gate(Record):
    """`--min-low-share`: the share of the written model's multiply-accumulates in low precision
    (quantized compute counts as low; None when the model's MACs are unknown) against the
    minimum asked."""

    min_low_share: float
    low_share: float | None
    passed: bool


@dataclass(frozen=True)
class ModelResult:
    """What one model came to: converted (and verified, repaired, or written unverified), a
    `verify` command's candidate (no conversion), or a failure."""

    conversion: Conversion | None = None
    verify: Verification | None = None
    repair: Repair | None = None
    unverified: str | None = None  # why a conversion verified by default was written without a verdict
    failure: Failure | None = None
    gate: Gate | None = None  # --min-low-share

    def __post_init__(self) -> None:
        if (self.failure is None) == (self.conversion is None and self.verify is None):
            raise RecordError("a model result holds a conversion or a verification, or else a failure")

    @property
    def model(self) -> str:
        if self.failure is not None:
            return self.failure.model
        return self.conversion.model if self.conversion is not None else self._verify.reference

    @property
    def output(self) -> str | None:
        if self.conversion is not None:
            return self.conversion.output
        return self.verify.candidate if self.verify is not None else None

    @property
    def exit_code(self) -> int:
        """This model's share of its batch's exit code (`exits.worst_exit_code`)."""
        if self.failure is not None:
            return self.failure.exit_code
        if self.verify is not None and not self.verify.passed:
            return EXIT_DRIFT
        if self.gate is not None and not self.gate.passed:
            return EXIT_LOW_GAIN
        unproven = self.verify is not None and (self.verify.written_unproven or self.verify.unmoved)
        return EXIT_UNVERIFIED if self.unverified is not None or unproven else EXIT_OK

    @property
    def _verify(self) -> Verification:
        assert self.verify is not None
        return self.verify

    def to_json(self) -> dict[str, Any]:
        """The model's entry of a report (a failure's: `{model, error, exit_code}`): the
        conversion's keys, then `verify`, `unverified`, `proof` and `repair` where they are."""
        if self.failure is not None:
            return self.failure.to_json()
        if self.conversion is None:  # a verify command's report, as a batch report holds it
            return {"model": self._verify.reference, "output": self._verify.candidate, "verify": self._verify.to_json()}
        data = self.conversion.to_json()
        proof = data.pop("proof", None)
        if self.verify is not None:
            data["verify"] = self.verify.to_json()
        if self.unverified is not None:
            data["unverified"] = self.unverified
        if proof is not None:
            data["proof"] = proof
        if self.repair is not None:
            data["repair"] = self.repair.to_json()
        if self.gate is not None:
            data["gate"] = self.gate.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any) -> ModelResult:
        """A model entry of a report, as `to_json` writes it (not a failure: `Failure.from_json`)."""
        if not isinstance(data, Mapping):
            raise RecordError(f"a model: an object was expected, not {type(data).__name__}")
        if "nodes" not in data and "verify" not in data:
            raise RecordError("a model with neither a conversion ('nodes') nor a verification ('verify')")
        unverified = data.get("unverified")
        if unverified is not None and not isinstance(unverified, str):
            raise RecordError(f"unverified: str expected, not {unverified!r:.60}")
        return cls(
            conversion=Conversion.from_json(data) if "nodes" in data else None,
            verify=Verification.from_json(data["verify"]) if data.get("verify") is not None else None,
            repair=Repair.from_json(data["repair"]) if data.get("repair") is not None else None,
            unverified=unverified,
            gate=Gate.from_json(data["gate"]) if data.get("gate") is not None else None,
        )


#: The layout of the JSON reports: the top-level `schema_version` of every report file the
#: command line writes (docs/reports.md). A report without the key was written before it existed,
#: and reads as version 1.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Run(Record):
    """Where and how a report file was made: the versions that made it, the provider the
    verification ran on and the target the models were converted for (None where there was
    none), when it started (UTC, ISO 8601), how long it took, and the command line as given."""

    rlx_amp: str
    onnx: str | None
    onnxruntime: str | None
    numpy: str | None
    provider: str | None
    target: str | None
    started: str
    seconds: float
    command: tuple[str, ...]


def run_record(started: float, provider: str | None, target: str | None, command: Sequence[str]) -> Run:
    """The `Run` of a command that started at `started` (`time.time()`) and ends now."""

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    when = datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds")
    ort = version("onnxruntime") or version("onnxruntime-gpu")
    return Run(
        __version__,
        version("onnx"),
        ort,
        version("numpy"),
        provider,
        target,
        when,
        round(time.time() - started, 3),
        tuple(command),
    )


def report_document(data: Mapping[str, Any], run: Run | None = None) -> dict[str, Any]:
    """`data` as a report file holds it: `schema_version` first, then `run` where it is given,
    then its own keys."""
    head: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    if run is not None:
        head["run"] = run.to_json()
    return {**head, **data}


def report_text(data: Mapping[str, Any]) -> str:
    """A JSON report as a report file holds it (`--report-json`, Olive's report file)."""
    return json.dumps(data, indent=2, default=str) + "\n"


def batch_json(results: Sequence[ModelResult], exit_code: int, run: Run | None = None) -> dict[str, Any]:
    """A batch report: its models' entries and its failures, each in input order, and how the
    batch ended."""
    return report_document(
        {
            "models": [r.to_json() for r in results if r.failure is None],
            "failed": [r.failure.to_json() for r in results if r.failure is not None],
            "passed": exit_code == EXIT_OK,
            "exit_code": exit_code,
        },
        run,
    )


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every report file the command line writes: one
    model's (`--report-json` of a conversion), a batch's, and a verify command's. Built from
    the records' field types, so a field added to a record is in the schema too; the checked-in
    copy is docs/report.schema.json (`python -m rlx_onnx_amp.reports.record`)."""
    defs: dict[str, Any] = {}
    verification = type_schema(Verification, defs)
    repair = type_schema(Repair, defs)
    defs["Model"] = record_schema(
        Conversion,
        defs,
        {
            "verify": verification,
            "unverified": {"type": "string"},
            "proof": {"type": "string"},
            "repair": repair,
            "gate": type_schema(Gate, defs),
        },
    )
    defs["Model"]["description"] = "One model: its conversion's keys, then its drift report, proof and repair."
    verify_entry = {
        "type": "object",
        "properties": {"model": {"type": "string"}, "output": {"type": "string"}, "verify": verification},
        "required": ["model", "output", "verify"],
        "additionalProperties": False,
    }
    version = {"const": SCHEMA_VERSION}
    run = type_schema(Run, defs)
    model_file = {**defs["Model"], "properties": {"schema_version": version, "run": run, **defs["Model"]["properties"]}}
    model_file["description"] = "A model's report file (`--report-json` of one conversion)."
    defs["ModelReport"] = model_file
    defs["BatchReport"] = {
        "description": "A batch's report file (several models, `merge-reports`).",
        "type": "object",
        "properties": {
            "schema_version": version,
            "run": run,
            "models": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Model"}, verify_entry]}},
            "failed": {"type": "array", "items": type_schema(Failure, defs)},
            "passed": {"type": "boolean"},
            "exit_code": {"type": "integer"},
            "shards": {"type": "array", "items": {"type": "string"}, "description": "merge-reports: the files merged"},
        },
        "required": ["schema_version", "models", "failed", "passed", "exit_code"],
        "additionalProperties": False,
    }
    defs["VerifyReport"] = {
        "description": "A verify command's report file.",
        "type": "object",
        "properties": {"schema_version": version, "run": run, "verify": verification},
        "required": ["schema_version", "verify"],
        "additionalProperties": False,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "rlx-amp report",
        "description": "A JSON report of rlx-amp (docs/reports.md): one model's, a batch's, or a verify command's.",
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in REPORT_KINDS],
        "$defs": dict(sorted(defs.items())),
    }


#: The report files' kinds, by their definition in the schema.
REPORT_KINDS = ("ModelReport", "BatchReport", "VerifyReport")


def report_kind(data: Mapping[str, Any]) -> str:
    """Which of `REPORT_KINDS` a report file is, by its keys."""
    if "models" in data:
        return "BatchReport"
    return "VerifyReport" if "verify" in data and "nodes" not in data else "ModelReport"


if __name__ == "__main__":  # python -m rlx_onnx_amp.reports.record > docs/report.schema.json
    print(json.dumps(json_schema(), indent=2))

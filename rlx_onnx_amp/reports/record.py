"""One model's result, typed: what its JSON report holds (docs/reports.md, "Conversion report" and
"Drift report keys"), as frozen records that every rendering takes (`text`, `html`, the JSON
written by `--report-json`) and that `merge-reports` reads back.

A `ModelResult` holds a model's `Conversion`, its `Verification` (per output an `OutputResult`,
the nodes where drift starts as `Localized` entries), its `Repair`, why it was written
unverified, or its `Failure`. Each record's JSON is its fields in order, nested records and
tuples as objects and lists (`to_json`), and `from_json` reads that JSON back into equal
records; a field marked `_ABSENT_WHEN_NONE` is left out of the JSON when None, as the reports
leave it. Records are built from the live results through that same JSON (`from_report`), so a
rendering sees exactly what the JSON report says, and `from_json(r.to_json()) == r`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from rlx_onnx_amp.cost import Cost
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_OK, EXIT_UNVERIFIED
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.conversion import ConversionReport, KeptNode

if TYPE_CHECKING:
    from rlx_onnx_amp.repair import RepairResult
    from rlx_onnx_amp.verification.core import VerifyReport

__all__ = [
    "SCHEMA_VERSION",
    "Conversion",
    "Distribution",
    "Failure",
    "Histogram",
    "Localized",
    "ModelResult",
    "OutputResult",
    "RecordError",
    "Repair",
    "RepairKeep",
    "RepairStep",
    "Sample",
    "TracePoint",
    "Verification",
    "batch_json",
    "report_document",
    "report_text",
]


class RecordError(ValueError):
    """JSON that is not what a report of rlx-amp holds (a key missing, a value of another type)."""


#: A field's metadata: the JSON leaves the key out when the value is None.
_ABSENT_WHEN_NONE = {"absent_when_none": True}


class _Record:
    """A frozen dataclass whose JSON object is its fields, in order."""

    def to_json(self) -> dict[str, Any]:
        data = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("absent_when_none"):
                continue
            data[f.name] = _encode(value)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Self:
        if not isinstance(data, Mapping):
            raise RecordError(f"{cls.__name__}: an object was expected, not {type(data).__name__}")
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                values[f.name] = _decode(hints[f.name], data[f.name], f.name)
            elif not f.metadata.get("absent_when_none"):
                raise RecordError(f"{cls.__name__}: no {f.name!r}")
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The fields' types of a record class, resolved once."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _encode(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return copy.deepcopy(value)
    return value


#: The JSON types a declared scalar accepts (numbers.Integral/Real: numpy's scalars count too).
_SCALARS: dict[Any, tuple[type, ...]] = {str: (str,), bool: (bool,), int: (numbers.Integral,), float: (numbers.Real,)}


def _decode(kind: Any, value: Any, key: str) -> Any:
    """`value` read as a `kind` (a record, a tuple, a dict, a scalar or an optional one)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType or origin is typing.Union:
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, key)
    if kind is Any:
        return copy.deepcopy(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise RecordError(f"{key}: a list was expected, not {type(value).__name__}")
        return tuple(_decode(args[0], v, key) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise RecordError(f"{key}: an object was expected, not {type(value).__name__}")
        return copy.deepcopy(dict(value))
    if hasattr(kind, "from_json"):
        try:
            return kind.from_json(value)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, RecordError):
                raise
            raise RecordError(f"{key}: {type(e).__name__}: {e}") from None
    accepted = _SCALARS[kind]
    if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
        raise RecordError(f"{key}: {kind.__name__} expected, not {value!r:.60}")
    return value


# -- the conversion ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Nodes(_Record):
    total: int
    by_precision: dict[str, int]


@dataclass(frozen=True)
class InitializerBytes(_Record):
    before: int
    after: int


@dataclass(frozen=True)
class Conversion(_Record):
    """What the rewrite did to one model (`ConversionReport.to_json`)."""

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
    initializer_bytes: InitializerBytes
    unknown_ops: tuple[str, ...]
    data_files: tuple[str, ...]
    cost: Cost | None = field(default=None, metadata=_ABSENT_WHEN_NONE)
    #: What proved the output sound (`api.prove`); the JSON has it after `verify` and `unverified`.
    proof: str | None = field(default=None, metadata=_ABSENT_WHEN_NONE)

    @classmethod
    def from_report(cls, report: ConversionReport, output: str | None = None) -> Conversion:
        """The record of `report`; `output`: the path the reports name, when it is not the one
        the model was staged for (a file of a directory, put in place with the directory)."""
        data = report.to_json()
        if output is not None:
            data["output"] = output
        return cls.from_json(data)


# -- the verification -------------------------------------------------------------------------


@dataclass(frozen=True)
class Worst(_Record):
    """The element with the largest |candidate - reference|."""

    index: tuple[int, ...]
    reference: float
    candidate: float


@dataclass(frozen=True)
class Required(_Record):
    """The smallest tolerance that would have passed the output, each alone."""

    atol: float
    rtol_of_max: float | None
    rtol: float | None
    min_cosine: float | None


@dataclass(frozen=True)
class Histogram(_Record):
    """|c - r| over log-spaced bins, and how many elements are exactly equal."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    zeros: int


@dataclass(frozen=True)
class Sample(_Record):
    """Elements by flat index, with their reference and candidate values."""

    index: tuple[int, ...]
    reference: tuple[float, ...]
    candidate: tuple[float, ...]


@dataclass(frozen=True)
class Distribution(_Record):
    """What the HTML report plots of one output."""

    abs_error_histogram: Histogram
    sample: Sample
    worst: Sample


@dataclass(frozen=True)
class OutputResult(_Record):
    """One output's drift and verdict (`metrics.OutputDrift`; a metric that is not finite is
    None, as in the JSON), with the tolerance it was judged by."""

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
class Localized(_Record):
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
    reference_shape: tuple[int, ...] | None = field(default=None, metadata=_ABSENT_WHEN_NONE)
    candidate_shape: tuple[int, ...] | None = field(default=None, metadata=_ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class TracePoint(_Record):
    """One compared tensor of `--localize`, in graph order (what the HTML report plots)."""

    tensor: str
    node: str
    op: str
    rel_error: float | None
    new_nonfinite: int
    #: The reference's shape and the candidate's, where they differ.
    shapes: tuple[tuple[int, ...], ...] | None = field(default=None, metadata=_ABSENT_WHEN_NONE)


@dataclass(frozen=True)
class Verification(_Record):
    """The drift report of one candidate against its reference (`VerifyReport.to_json`); the
    tolerances are per output name, "" the default."""

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

    @classmethod
    def from_report(cls, report: VerifyReport) -> Verification:
        return cls.from_json(report.to_json())

    @property
    def constant_outputs(self) -> dict[str, float]:
        """Outputs whose reference holds one value everywhere: a pass there proves little."""
        return {o.name: o.constant_reference for o in self.outputs if o.constant_reference is not None}


# -- the repair -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepairKeep(_Record):
    """A node the repaired model keeps in f32, and why (overflow, underflow, drift)."""

    path: str
    node: str
    op: str
    reason: str


@dataclass(frozen=True)
class RepairBest(_Record):
    """The evaluation written."""

    evaluation: int
    stage: str
    score: float
    kept: int


@dataclass(frozen=True)
class RepairStep(_Record):
    """One candidate the repair evaluated: how many nodes it kept, and how it did."""

    evaluation: int
    stage: str
    kept: int
    passed: bool
    score: float
    written: bool


@dataclass(frozen=True)
class Repair(_Record):
    """What `--repair` did (`repair.RepairResult.to_json`)."""

    passed: bool
    evaluations: int
    kept_f32: tuple[RepairKeep, ...]
    compute_low_share: float | None
    weight_low_share: float | None
    best: RepairBest | None
    minimality: str
    history: tuple[RepairStep, ...]

    @classmethod
    def from_report(cls, result: RepairResult) -> Repair:
        return cls.from_json(result.to_json())


# -- one model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure(_Record):
    """A model of a batch that could not be converted: the one-line error and its exit code."""

    model: str
    error: str
    exit_code: int


@dataclass(frozen=True)
class ModelResult:
    """What one model came to: converted (and verified, repaired, or written unverified), a
    `verify` command's candidate (no conversion), or a failure."""

    conversion: Conversion | None = None
    verify: Verification | None = None
    repair: Repair | None = None
    unverified: str | None = None  # why a conversion verified by default was written without a verdict
    failure: Failure | None = None

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
        if self.verify is not None:
            return EXIT_OK if self.verify.passed else EXIT_DRIFT
        return EXIT_UNVERIFIED if self.unverified is not None else EXIT_OK

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
        )


#: The layout of the JSON reports: the top-level `schema_version` of every report file the
#: command line writes (docs/reports.md). A report without the key was written before it existed,
#: and reads as version 1.
SCHEMA_VERSION = 1


def report_document(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` as a report file holds it: `schema_version` first, then its own keys."""
    return {"schema_version": SCHEMA_VERSION, **data}


def report_text(data: Mapping[str, Any]) -> str:
    """A JSON report as a report file holds it (`--report-json`, Olive's report file)."""
    return json.dumps(data, indent=2, default=str) + "\n"


def batch_json(results: Sequence[ModelResult], exit_code: int) -> dict[str, Any]:
    """A batch report: its models' entries and its failures, each in input order, and how the
    batch ended."""
    return report_document({
        "models": [r.to_json() for r in results if r.failure is None],
        "failed": [r.failure.to_json() for r in results if r.failure is not None],
        "passed": exit_code == EXIT_OK,
        "exit_code": exit_code,
    })

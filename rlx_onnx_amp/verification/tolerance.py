"""Tolerances: the bound one output is judged against, and the table a verification is given.

`Tolerance` is one output's pass criterion, every value set. `Tolerances` is what the user gave,
each criterion globally (the key "") and per output, as Polygraphy takes per-output tolerances:
parsed and checked once (`parse` from the command line's `[NAME:]X` values, `of` from Python),
checked against the model's outputs once (`check_outputs`), and resolved per output against
the defaults of the candidate's precision (`for_output`). A report holds the table resolved for
its precision (`resolved`), which writes the JSON keys and says in words what was checked.

Words keep the meaning peers give them: `rtol` is element-wise, as in Polygraphy, `np.allclose`
and onnxconverter-common (`|c - r| <= atol + rtol * |r|` for every element); the default check,
which suits f16 better (relative error near zero references is noise), is named for what it is:
`rtol_of_max`, `max_abs <= atol + rtol_of_max * max|reference|`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.precision import PRECISIONS, Precision, PrecisionInfo

__all__ = ["CRITERIA", "Criterion", "Tolerance", "Tolerances"]


@dataclass(frozen=True)
class Tolerance:
    """Pass criterion of one output: no new NaN/Inf; max_abs <= atol + rtol_of_max * max|ref|;
    with `rtol` set, |c - r| <= atol + rtol * |r| for every element; and cosine >= min_cosine
    wherever the reference is not constant."""

    atol: float
    rtol_of_max: float
    min_cosine: float
    rtol: float | None = None  # element-wise; None: not checked

    def bound(self, scale: float) -> float:
        """What max_abs may reach for an output whose largest |reference| is `scale`."""
        return self.atol + self.rtol_of_max * scale

    def to_json(self) -> dict[str, float | None]:
        """The values this output was judged against, under the report's keys."""
        return {c.name: getattr(self, c.name) for c in CRITERIA}


@dataclass(frozen=True)
class Criterion:
    """One tolerance a user may set: its `Tolerance` field and JSON key, its option, the values
    it takes, and where its default comes from (None: a check that is off unless given)."""

    name: str
    flag: str
    low: float = 0.0
    high: float = math.inf
    default_field: str | None = None  # the `PrecisionInfo` field holding the default

    def default(self, info: PrecisionInfo) -> float | None:
        return getattr(info, self.default_field) if self.default_field else None

    def check(self, value: float, text: str) -> float:
        """`value`, or a one-line error naming the option and `text`, what was written."""
        if not math.isfinite(value) or not self.low <= value <= self.high:
            bounds = f"at least {self.low:g}" if self.high == math.inf else f"in [{self.low:g}, {self.high:g}]"
            raise InputError(f"{self.flag}: expected a finite number {bounds}, got {text!r}")
        return value


#: The criteria, in the order reports list them.
CRITERIA = (
    Criterion("atol", "--atol", default_field="atol"),
    Criterion("rtol_of_max", "--rtol-of-max", default_field="rtol_of_max"),
    Criterion("rtol", "--rtol"),
    Criterion("min_cosine", "--min-cosine", -1.0, 1.0, default_field="min_cosine"),
)
_BY_NAME = {c.name: c for c in CRITERIA}


def _criterion(name: str) -> Criterion:
    if name not in _BY_NAME:
        raise ValueError(f"unknown tolerance {name!r} (known: {', '.join(_BY_NAME)})")
    return _BY_NAME[name]


@dataclass(frozen=True)
class Tolerances:
    """The tolerances a verification is given: criterion name -> output name -> value, where the
    output "" stands for every output without its own. A criterion or output not given takes the
    default of the candidate's precision (`for_output`). Checked when built."""

    given: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, values in self.given.items():
            criterion = _criterion(name)
            for output, value in values.items():
                criterion.check(value, f"{output}:{value!r}" if output else repr(value))

    @classmethod
    def parse(cls, **options: Sequence[str]) -> Tolerances:
        """From the command line: criterion name -> its option's values, each `X` (every output)
        or `NAME:X` (that output), repeatable, the last for a name winning. Checked in the order
        given: the first bad value is the error, one line naming its option."""
        given: dict[str, dict[str, float]] = {}
        for name, texts in options.items():
            criterion = _criterion(name)
            values: dict[str, float] = {}
            for text in texts:
                output, _, number = text.rpartition(":")
                try:
                    value = float(number)
                except ValueError:
                    raise InputError(f"{criterion.flag}: expected a number or NAME:number, got {text!r}") from None
                values[output] = criterion.check(value, text)
            if values:
                given[name] = values
        return cls({c.name: given[c.name] for c in CRITERIA if c.name in given})

    @classmethod
    def of(cls, **options: float | Mapping[str, float]) -> Tolerances:
        """From Python, as Polygraphy takes them: `atol=1e-3` for every output, or
        `rtol={"logits": 1e-2}` per output ("" for the rest)."""
        return cls({name: dict(v) if isinstance(v, Mapping) else {"": float(v)} for name, v in options.items()})

    def for_output(self, name: str, precision: Precision) -> Tolerance:
        """The bound output `name` is judged against when the candidate is at `precision`:
        its own value, else the global one, else the precision's default."""
        info = PRECISIONS[precision]
        picked: dict[str, float | None] = {}
        for c in CRITERIA:
            values = self.given.get(c.name, {})
            picked[c.name] = values.get(name, values.get("", c.default(info)))
        atol, rtol_of_max, min_cosine = (picked[k] for k in ("atol", "rtol_of_max", "min_cosine"))
        assert atol is not None and rtol_of_max is not None and min_cosine is not None  # each has a default
        return Tolerance(atol, rtol_of_max, min_cosine, picked["rtol"])

    def check_outputs(self, outputs: Iterable[str], path: Path) -> None:
        """A tolerance for an output the model lacks would do nothing: refuse it."""
        names = set(outputs)
        for c in CRITERIA:
            unknown = sorted(k for k in self.given.get(c.name, {}) if k and k not in names)
            if unknown:
                raise InputError(
                    f"{c.flag} {unknown[0]}:...: {path} has no output {unknown[0]!r} "
                    f"(outputs: {', '.join(sorted(names))})"
                )

    def resolved(self, precision: Precision) -> Tolerances:
        """The same table with each global value that was not given set to `precision`'s default."""
        info = PRECISIONS[precision]
        given = {c.name: dict(self.given.get(c.name, {})) for c in CRITERIA}
        for c in CRITERIA:
            default = c.default(info)
            if "" not in given[c.name] and default is not None:
                given[c.name] = {"": default, **given[c.name]}
        return Tolerances({k: v for k, v in given.items() if v})

    def table(self, name: str) -> dict[str, float | None]:
        """One criterion as the report writes it: the global value first (None: not given),
        then each output's own."""
        values = self.given.get(_criterion(name).name, {})
        return {"": values.get(""), **{k: v for k, v in values.items() if k}}

    def to_json(self) -> dict[str, dict[str, float | None]]:
        """Every criterion's `table`, under the report's keys."""
        return {c.name: self.table(c.name) for c in CRITERIA}

    @property
    def criterion(self) -> str:
        """The checks every output is judged by, in words."""
        checks = ["no new NaN/Inf", "max_abs <= atol + rtol_of_max * max|reference| (max-scaled)"]
        if self.given.get("rtol"):
            checks.append("|c - r| <= atol + rtol * |r| for every element (element-wise, where rtol is given)")
        checks.append("cosine >= min_cosine where the reference is not constant")
        return "; ".join(checks)

"""The tolerance object: parsed and checked once, resolved per output against the precision's
defaults, and the bound each output is judged against in a real verification."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from fixtures.make_fixtures import HEALTHY
from rlx_onnx_amp import convert_file
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.precision import PRECISIONS, Precision
from rlx_onnx_amp.verification import Tolerance, Tolerances, VerifyOptions, compare_arrays, verify


def test_parse_global_and_per_output_values() -> None:
    """`X` is every output's, `NAME:X` one output's; the last value for a name wins; what is not
    given is the precision's default, and rtol stays off."""
    t = Tolerances.parse(atol=["1e-3", "y:0.5", "y:0.25"], rtol=["trace:1e-2"], min_cosine=[], rtol_of_max=[])
    assert t.given == {"atol": {"": 1e-3, "y": 0.25}, "rtol": {"trace": 1e-2}}
    assert t.for_output("y", Precision.F16) == Tolerance(atol=0.25, rtol_of_max=1e-2, min_cosine=0.999, rtol=None)
    assert t.for_output("trace", Precision.F16) == Tolerance(atol=1e-3, rtol_of_max=1e-2, min_cosine=0.999, rtol=1e-2)
    bf16 = PRECISIONS[Precision.BF16]
    assert t.for_output("other", Precision.BF16) == Tolerance(1e-3, bf16.rtol_of_max, bf16.min_cosine, None)
    assert t.for_output("", Precision.F32) == Tolerance(1e-3, 1e-4, 0.99999, None)  # "" is the global bound
    assert Tolerances().for_output("y", Precision.F16) == Tolerance(1e-2, 1e-2, 0.999, None)


def test_python_values_take_the_same_table() -> None:
    assert Tolerances.of(atol=1e-3, rtol={"trace": 1e-2}) == Tolerances.parse(atol=["1e-3"], rtol=["trace:1e-2"])


def test_the_resolved_table_is_what_the_report_writes() -> None:
    """Global values first (filled from the precision where not given; rtol `None`: off),
    then each output's own, under the report's keys and in its order."""
    t = Tolerances.parse(atol=["y:1e-3", "1e-4"], rtol_of_max=["trace:0.5"], min_cosine=["y:0.9"])
    assert t.resolved(Precision.F16).to_json() == {
        "atol": {"": 1e-4, "y": 1e-3},
        "rtol_of_max": {"": 1e-2, "trace": 0.5},
        "rtol": {"": None},
        "min_cosine": {"": 0.999, "y": 0.9},
    }
    assert "element-wise" not in t.criterion
    assert "element-wise" in Tolerances.parse(rtol=["trace:1e-2"]).criterion


def test_the_bound_an_output_is_judged_against() -> None:
    tol = Tolerance(atol=1e-3, rtol_of_max=1e-2, min_cosine=0.9)
    assert tol.bound(4.0) == pytest.approx(1e-3 + 1e-2 * 4.0)
    assert tol.to_json() == {"atol": 1e-3, "rtol_of_max": 1e-2, "rtol": None, "min_cosine": 0.9}
    ref = np.array([1.0, -4.0, 2.0], np.float32)
    drift = compare_arrays("y", ref, ref + np.float32(0.05), tol)
    assert drift.bound == tol.bound(4.0) and drift.max_abs is not None and drift.max_abs > drift.bound
    assert drift.failed_checks == ("max-scaled",)
    data = drift.to_json()
    assert {k: data[k] for k in ("atol", "rtol_of_max", "rtol", "min_cosine")} == tol.to_json()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"atol": ["-1"]}, "--atol: expected a finite number at least 0, got '-1'"),
        ({"rtol_of_max": ["inf"]}, "--rtol-of-max: expected a finite number at least 0, got 'inf'"),
        ({"rtol": ["y:nan"]}, "--rtol: expected a finite number at least 0, got 'y:nan'"),
        ({"min_cosine": ["2"]}, "--min-cosine: expected a finite number in [-1, 1], got '2'"),
        ({"rtol": ["y:abc"]}, "--rtol: expected a number or NAME:number, got 'y:abc'"),
        # checked in the order given: the first bad value is the error
        ({"rtol": ["x"], "atol": ["-1"]}, "--rtol: expected a number or NAME:number, got 'x'"),
    ],
)
def test_bad_values_are_one_line_errors(options: dict[str, list[str]], message: str) -> None:
    with pytest.raises(InputError) as e:
        Tolerances.parse(**options)
    assert str(e.value) == message


def test_bad_values_from_python_are_refused_alike() -> None:
    with pytest.raises(InputError, match=r"^--min-cosine: expected a finite number in \[-1, 1\], got 'y:1.5'$"):
        Tolerances.of(min_cosine={"y": 1.5})
    with pytest.raises(ValueError, match="unknown tolerance 'atl'"):
        Tolerances.of(atl=1e-3)


def test_a_tolerance_for_an_output_the_model_lacks_is_refused() -> None:
    t = Tolerances.parse(atol=["1e-3", "y:1e-2"], min_cosine=["nope:0.5"])
    t.check_outputs(["y", "nope"], Path("m.onnx"))
    with pytest.raises(InputError) as e:
        t.check_outputs(["y", "z"], Path("m.onnx"))
    assert str(e.value) == "--min-cosine nope:...: m.onnx has no output 'nope' (outputs: y, z)"


def test_per_output_tolerances_judge_only_their_output(tmp_path: Path) -> None:
    """control_flow has two float outputs, `y` and `trace`, each moved by about 7e-4 in f16.
    With no tolerance at all both fail the max-scaled check; `atol y:1e-3` passes `y` alone,
    judged against its own bound; `rtol trace:1e-4` adds the element-wise check to `trace`
    alone (its max-scaled bound loosened by `rtol_of_max trace:0.5`). The report writes the
    table it judged by."""
    src, out = tmp_path / "cf.onnx", tmp_path / "cf16.onnx"
    onnx.save(HEALTHY["control_flow"]().model, str(src))
    convert_file(src, out, "always-f16")

    def outputs(**given: list[str]) -> dict[str, dict]:
        tolerance = Tolerances.parse(**{"atol": ["0"], "rtol_of_max": ["0"], **given})
        report = verify(src, out, VerifyOptions(provider="cpu", tolerance=tolerance)).to_json()
        return {o["name"]: o for o in report["outputs"]} | {"": report}

    strict = outputs()
    assert all(strict[n]["failed_checks"] == ["max-scaled"] and strict[n]["bound"] == 0.0 for n in ("y", "trace"))
    assert 1e-4 < strict["y"]["max_abs"] < 1e-3 and 1e-4 < strict["trace"]["max_abs"] < 1e-3

    loose_y = outputs(atol=["0", "y:1e-3"])
    assert loose_y["y"]["passed"] and loose_y["y"]["atol"] == 1e-3 and loose_y["y"]["bound"] == 1e-3
    assert loose_y["trace"]["failed_checks"] == ["max-scaled"] and loose_y["trace"]["atol"] == 0.0
    assert loose_y[""]["atol"] == {"": 0.0, "y": 1e-3} and not loose_y[""]["passed"]

    elementwise = outputs(atol=["0", "y:1e-3"], rtol_of_max=["0", "trace:0.5"], rtol=["trace:1e-4"])
    assert elementwise["y"]["passed"] and elementwise["y"]["rtol"] is None
    assert elementwise["trace"]["failed_checks"] == ["element-wise"] and elementwise["trace"]["rtol"] == 1e-4
    assert elementwise[""]["rtol"] == {"": None, "trace": 1e-4}

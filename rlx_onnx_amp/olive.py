"""rlx-amp as an Olive pass: `RlxAmp` converts an ONNX model by a precision policy, verifies it
with onnxruntime and fails the pass on drift (docs/olive.md).

Olive (`pip install 'rlx-onnx-amp[olive]'`) is imported here and nowhere else in the package.
The pass reads its input by path (`model.model_path`, never one protobuf of the whole model)
and converts, verifies and repairs exactly as the convert command does (`pipeline.ConvertJob`), so
the model it writes is the one `rlx-amp MODEL -o OUT --report-json R` writes for the same
options, and the report it attaches (`rlx_amp_report.json`, in `additional_files`) is that `R`.

Verdicts: drift over tolerance (the CLI's exit 1; with `repair`, a repair that ran out of
budget) raises `RlxAmpVerificationFailed`, a ValueError, so `olive run` stops with an error and
writes no model; the report is left in the pass's cache directory and the message names it.
A model whose reference cannot run on the synthesized inputs (the CLI's exit 4) is written, as
the plain command writes it: the log says so and the report's `unverified` says why; with
`verify_required` it fails the pass instead (the CLI's explicit `--verify`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

# Olive ships no type information (no py.typed): its names are Any to mypy.
try:
    from olive.common.config_utils import ParamCategory  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.hardware.accelerator import AcceleratorSpec  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.model import ONNXModelHandler  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.model.utils import resolve_onnx_path  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.package_config import OlivePackageConfig  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.passes import Pass  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.passes.onnx.common import get_external_data_config  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.passes.pass_config import BasePassConfig, PassConfigParam  # type: ignore[import-untyped, import-not-found, unused-ignore]
    from olive.resource_path import LocalFile, LocalFolder  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError as e:  # olive itself, or what it imports without declaring it (requests)
    raise ImportError(
        f"rlx_onnx_amp.olive needs Olive 0.13: pip install 'rlx-onnx-amp[olive]' ({type(e).__name__}: {e})"
    ) from e

from rlx_onnx_amp.api import make_options, resolve_policy
from rlx_onnx_amp.batch import RunResults
from rlx_onnx_amp.errors import AmpError, InputError
from rlx_onnx_amp.exits import EXIT_DRIFT, EXIT_OK, EXIT_UNVERIFIED
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.pipeline import ConvertJob, JobSettings
from rlx_onnx_amp.repair import DEFAULT_BUDGET
from rlx_onnx_amp.reports.record import ModelResult, report_text
from rlx_onnx_amp.verification import InputSpec, VerifyOptions
from rlx_onnx_amp.verification.tolerance import Tolerances

__all__ = [
    "PASS_ENTRY",
    "REPORT_NAME",
    "RlxAmp",
    "RlxAmpError",
    "RlxAmpVerificationFailed",
    "package_config",
]

#: Olive's own passes log under "olive": so does this one, at the workflow's log_severity_level.
logger = logging.getLogger("olive.passes.rlx_amp")

#: The drift report's file name beside the output model (and in Olive's output_dir).
REPORT_NAME = "rlx_amp_report.json"

#: This pass's entry in an Olive package config (`rlx-amp olive-config`).
PASS_ENTRY: dict[str, Any] = {
    "module_path": "rlx_onnx_amp.olive.RlxAmp",
    "supported_providers": ["*"],
    "supported_accelerators": ["*"],
    "supported_precisions": ["fp16", "bf16"],
    "module_dependencies": ["rlx-onnx-amp[olive]"],
}

#: The tolerance options: each a global value, as `--atol X` and the like.
_TOLERANCES = {
    "atol": "Absolute tolerance (every output).",
    "rtol_of_max": "Tolerance relative to max|reference|: max_abs <= atol + X * max|reference| (the default check).",
    "rtol": "Element-wise relative tolerance, as np.allclose: |c - r| <= atol + X * |r| (off unless given).",
    "min_cosine": "Minimum cosine similarity (every output).",
}

#: Olive's external-data options rlx-amp has no twin for, with the only value it accepts.
_NO_TWIN = {"all_tensors_to_one_file": True, "size_threshold": 1024, "convert_attribute": False}

#: Options that mean something only when the model is verified (`verify` or `repair`), with
#: their defaults: another value with verify=False is an error, as the CLI's with --no-verify.
_VERIFY_ONLY: dict[str, Any] = {"inputs": None, "seed": 0, "samples": 1, "provider": "auto"}
_VERIFY_ONLY.update(dict.fromkeys(_TOLERANCES))


class RlxAmpError(ValueError):
    """A config or input rlx-amp cannot use (the CLI's exit 2 or 3). A ValueError: Olive's
    engine re-raises it, so `olive run` exits non-zero instead of logging "no output model"."""


class RlxAmpVerificationFailed(RlxAmpError):
    """The converted model drifts past its tolerances (the CLI's exit 1): nothing is written."""

    def __init__(self, message: str, report_path: Path, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report_path, self.report = report_path, report


def package_config() -> dict[str, Any]:
    """Olive's default package config (its registry of passes) with `RlxAmp` added: what
    `olive run --package-config` needs to find the pass, since that file replaces the default."""
    with open(OlivePackageConfig.get_default_config_path(), encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    config.setdefault("passes", {})["RlxAmp"] = dict(PASS_ENTRY)
    return config


def _param(type_: Any, default: Any, description: str, **kwargs: Any) -> PassConfigParam:
    return PassConfigParam(type_=type_, default_value=default, description=description, **kwargs)


class RlxAmp(Pass):
    """Convert an ONNX model to f16/bf16 by an rlx-amp precision policy, verify the drift with
    onnxruntime and fail on drift (or repair it); the JSON drift report comes with the model."""

    @classmethod
    def _default_config(cls, accelerator_spec: AcceleratorSpec) -> dict[str, PassConfigParam]:
        config = {
            "policy": _param(
                str,
                "auto-mixed",
                "Precision policy: always-f32, always-f16, auto-mixed-conservative, auto-mixed, auto-mixed-bf16, "
                "auto (the most low-precision compute that passes: it verifies and repairs) or custom (with kind_map).",
            ),
            "kind_map": _param(dict, None, "Kind map for policy custom, e.g. {'compute': 'f16', 'reduction': 'f32'}."),
            "target": _param(str, "cuda", "Execution provider the model is meant for: cuda or cpu (as --target)."),
            "keep_f32_ops": _param(list, None, "Op types kept in f32 (as --keep-f32-op)."),
            "keep_f32_nodes": _param(list, None, "Regular expressions of node names kept in f32 (--keep-f32-node)."),
            "keep_io_types": _param(bool, True, "Graph inputs and outputs keep their element type."),
            "verify": _param(bool, True, "Verify the drift with onnxruntime; fail the pass on drift."),
            "verify_required": _param(
                bool,
                False,
                "Fail the pass when the reference cannot run (the CLI's --verify); "
                "by default such a model is written unverified (the CLI's exit 4).",
            ),
            "screen": _param(bool, True, "Rule range-screen from the reference run (as --screen/--no-screen)."),
            "repair": _param(bool, False, "Keep the nodes responsible for drift in f32 until it passes."),
            "repair_budget": _param(int, DEFAULT_BUDGET, "Most candidate evaluations repair may use."),
            "provider": _param(str, "auto", "onnxruntime provider of the verification: auto, cpu, cuda or coreml."),
            "inputs": _param(
                str,
                None,
                "Verification inputs: an .npz of name -> array or a directory of input_N.pb.",
                category=ParamCategory.PATH,
            ),
            "shapes": _param(dict, None, "Shapes of inputs with dynamic dimensions, name -> list of sizes."),
            "seed": _param(int, 0, "Seed of synthesized inputs."),
            "samples": _param(int, 1, "Number of synthesized input sets."),
        }
        config.update({name: _param(float, None, text) for name, text in _TOLERANCES.items()})
        config.update(get_external_data_config())
        return config

    def _run_for_config(
        self, model: ONNXModelHandler, config: type[BasePassConfig], output_model_path: str
    ) -> ONNXModelHandler:
        values: dict[str, Any] = config.model_dump()
        src = str(model.model_path)  # the .onnx file itself; its data is read beside it, never loaded here
        dst = Path(resolve_onnx_path(output_model_path, Path(src).name))
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = _convert(src, dst, values)
        except AmpError as e:
            raise RlxAmpError(f"rlx-amp: {e}") from None
        return _handler(model, dst, result)


#: How the pass config spells what `JobSettings.checked` refuses.
_SPELLING = {
    "no_verify": "verify=False",
    "repair": "repair=True",
    "auto": "policy='auto'",
    "budget": "repair_budget",
    "min_low_share": "min_low_share",
}


def _settings(values: dict[str, Any]) -> JobSettings:
    """The convert command's settings for a pass config, checked as every door checks them
    (`JobSettings.checked`)."""
    for name, accepted in _NO_TWIN.items():
        if values.get(name) is not None and values[name] != accepted:
            raise RlxAmpError(f"RlxAmp: {name}={values[name]!r} has no twin in rlx-amp (only {accepted!r})")
    policy = resolve_policy(values["policy"], values.get("kind_map"))
    verifying = bool(values["verify"]) or bool(values["repair"]) or policy.searches
    idle = [name for name, default in _VERIFY_ONLY.items() if values.get(name, default) != default]
    if idle and not verifying:
        raise RlxAmpError(f"RlxAmp: {idle[0]} does nothing with verify=False")
    shapes = {name: tuple(int(d) for d in dims) for name, dims in (values.get("shapes") or {}).items()}
    options = make_options(
        values["keep_io_types"],
        values.get("keep_f32_ops") or (),
        values.get("keep_f32_nodes") or (),
        target=values["target"],
        shapes=shapes,
        cost=True,  # as the CLI with --report-json: the report has its cost section
    )
    try:
        return JobSettings.checked(
            policy,
            options,
            _verify_options(values, shapes) if verifying else None,
            verify=None if values["verify"] else False,
            repair=bool(values["repair"]),
            verify_required=bool(values["verify_required"]),
            budget=values["repair_budget"],
            spelling=_SPELLING,
            data_name=values.get("external_data_name"),
            screen=bool(values["screen"]),
        )
    except InputError as e:
        raise RlxAmpError(f"RlxAmp: {e}") from None


def _verify_options(values: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> VerifyOptions:
    inputs = values.get("inputs")
    given = {name: float(values[name]) for name in _TOLERANCES if values.get(name) is not None}
    options = VerifyOptions(
        provider=values["provider"],
        inputs=str(inputs) if inputs is not None else None,
        spec=InputSpec(shapes, {}, values["seed"], values["samples"]),
        tolerance=Tolerances.of(**given),
    )
    try:
        options.check(str)  # before any work, with the pass config's names
    except InputError as e:
        raise RlxAmpError(f"RlxAmp: {e}") from None
    return options



def _convert(src: str, dst: Path, values: dict[str, Any]) -> ModelResult:
    """Convert (verify, repair) `src` to `dst` as the convert command does; on drift nothing
    is committed but the report."""
    settings = _settings(values)
    report_path = dst.parent / REPORT_NAME
    paths = RunPaths()
    paths.read(src, "input model")
    paths.write(dst, "output model")
    paths.write(report_path, "drift report")
    if settings.verify_options is not None and settings.verify_options.inputs:
        paths.read(settings.verify_options.inputs, "inputs file")
    paths.check()
    with OutputSet(paths.protected()) as outputs:
        result = ConvertJob(settings, paths).convert(src, str(dst), outputs)  # it logs what the CLI prints
        report = RunResults((result,), settings.verify_options is not None).json(False)
        if values.get("save_as_external_data") and not (result.conversion and result.conversion.data_files):
            raise RlxAmpError(
                f"RlxAmp: save_as_external_data: rlx-amp writes external data when the input has it (or past "
                f"1.8 GB of weights); {src} has none, so the output is one file: drop the option"
            )
        if result.exit_code == EXIT_DRIFT:
            report_path.write_text(report_text(report), encoding="utf-8")
            verdict = "repair ran out of budget" if settings.repair else "drift over tolerance"
            raise RlxAmpVerificationFailed(
                f"RlxAmp: {src}: {verdict}; no model written (drift report: {report_path})", report_path, report
            )
        outputs.write_text(report_path, report_text(report))
        outputs.commit()
    return result  # unverified (exit 4): the job's warning is in the log, `unverified` in the report


def _verdict(result: ModelResult) -> dict[str, Any]:
    """The result's gist for `model_attributes["rlx_amp"]` (JSON; the whole report is the file)."""
    conversion = result.conversion
    assert conversion is not None
    return {
        "report": REPORT_NAME,
        "exit_code": result.exit_code,
        "passed": result.verify.passed if result.verify is not None else None,
        "verified": result.verify is not None,
        "unverified": result.unverified,
        "policy": conversion.policy.name if conversion.policy is not None else None,
        "casts_inserted": conversion.casts_inserted,
        "kept_f32": len(conversion.kept_f32),
        "data_files": list(conversion.data_files),
        "repaired": result.repair is not None,
    }


def _handler(model: ONNXModelHandler, dst: Path, result: ModelResult) -> ONNXModelHandler:
    """The output model: a file, or its folder when it has external data; the upstream
    attributes kept, the report added to `additional_files`."""
    attributes = dict(model.model_attributes or {})
    files = set(attributes.get("additional_files") or [])
    files.add(str(dst.parent / REPORT_NAME))
    attributes["additional_files"] = sorted(files)
    attributes["rlx_amp"] = _verdict(result)
    assert result.exit_code in (EXIT_OK, EXIT_UNVERIFIED) and result.conversion is not None
    if result.conversion.data_files:
        return ONNXModelHandler(
            model_path=LocalFolder({"path": str(dst.parent)}), onnx_file_name=dst.name, model_attributes=attributes
        )
    return ONNXModelHandler(model_path=LocalFile({"path": str(dst)}), model_attributes=attributes)

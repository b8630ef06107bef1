"""Verification: run a reference and a candidate on the same inputs and measure the drift."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from rlx_onnx_amp.api import load_model
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.verification.compare import (
    PROVIDERS,
    Progress,
    Scratch,
    VerifyOptions,
    compare_outputs,
    open_compared,
    pair_runs,
    resolve_provider,
    run_each,
)
from rlx_onnx_amp.verification.inputs import (
    save_inputs,
)
from rlx_onnx_amp.verification.localize import localize
from rlx_onnx_amp.verification.metrics import OutputDrift
from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable, prepare_reference
from rlx_onnx_amp.verification.tolerance import Tolerances

__all__ = [
    "PROVIDERS",
    "Reference",
    "ReferenceUnavailable",
    "VerifyOptions",
    "VerifyReport",
    "prepare_reference",
    "resolve_provider",
    "verify",
]

logger = logging.getLogger(__name__)


@dataclass
class VerifyReport:
    reference: str
    candidate: str
    provider: str
    providers_used: list[str]
    emulated: bool
    emulation_reason: str | None
    candidate_loaded: bool
    precision: str
    tolerance: Tolerances  # resolved for `precision`: every global value set
    seed: int
    samples: int
    inputs: dict[str, list[int]]
    outputs: list[OutputDrift]
    localized: list[dict[str, Any]] | None = None
    #: With --localize: every compared tensor in graph order with its relative error (see `localize`).
    localize_trace: list[dict[str, Any]] | None = None

    @property
    def criterion(self) -> str:
        """The checks every output was judged by, in words."""
        return self.tolerance.criterion

    # Each criterion's table ("" the global value, then each output's own), as renderers read it.
    @property
    def atol(self) -> dict[str, float | None]:
        return self.tolerance.table("atol")

    @property
    def rtol_of_max(self) -> dict[str, float | None]:
        return self.tolerance.table("rtol_of_max")

    @property
    def rtol(self) -> dict[str, float | None]:
        return self.tolerance.table("rtol")

    @property
    def min_cosine(self) -> dict[str, float | None]:
        return self.tolerance.table("min_cosine")

    @property
    def constant_outputs(self) -> dict[str, float]:
        """Outputs whose reference holds one value everywhere: a pass there proves little."""
        return {o.name: o.constant_reference for o in self.outputs if o.constant_reference is not None}

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "candidate": self.candidate,
            "provider": self.provider,
            "providers_used": self.providers_used,
            "emulated": self.emulated,
            "emulation_reason": self.emulation_reason,
            "candidate_loaded": self.candidate_loaded,
            "precision": self.precision,
            "criterion": self.criterion,
            **self.tolerance.to_json(),
            "seed": self.seed,
            "samples": self.samples,
            "inputs": self.inputs,
            "passed": self.passed,
            "outputs": [o.to_json() for o in self.outputs],
            "localized": self.localized,
            "localize_trace": self.localize_trace,
        }


def verify(
    reference: str | os.PathLike[str],
    candidate: str | os.PathLike[str],
    options: VerifyOptions | None = None,
    progress: Progress | None = None,
    *,
    candidate_label: str | None = None,
    outputs: OutputSet | None = None,
    prepared: Reference | None = None,
) -> VerifyReport:
    """Compare `candidate` against `reference` on the same inputs (see README, Verification).

    `candidate_label` names the candidate in the report (a staged model is verified before it
    is moved to its final path). `--save-inputs` is staged into `outputs` when given (the
    caller commits it); otherwise it is written when the verification ends. `prepared` is the
    reference's run already made (`prepare_reference`, with the range screen): it is not run
    again.
    """
    options = options or VerifyOptions()
    ref_path, cand_path = Path(reference), Path(candidate)
    cand_label = candidate_label or str(cand_path)
    cand_model = load_model(cand_path)
    if prepared is None:
        _check_interfaces(load_model(ref_path), cand_model, ref_path, Path(cand_label))
        # One onnxruntime session at a time (the reference's outputs kept, its session
        # released, then the candidate's): verifying needs about one model's memory, not two.
        try:
            prepared = prepare_reference(ref_path, options, progress=progress)
        except ReferenceUnavailable as e:
            raise e.error from None
    else:
        _check_interfaces(prepared.model, cand_model, ref_path, Path(cand_label))
    ref_model, provider, samples = prepared.model, prepared.provider, prepared.samples
    if options.save_inputs:
        if outputs is None:
            paths = RunPaths()
            for path, role in ((ref_path, "reference model"), (cand_path, "candidate model")):
                paths.read(path, role)
            paths.write(options.save_inputs, "--save-inputs file")
            paths.check()
            with OutputSet(paths.protected()) as own:
                save_inputs(own, options.save_inputs, samples)
                own.commit()
        else:
            save_inputs(outputs, options.save_inputs, samples)

    names, providers_used = prepared.output_names, prepared.providers_used
    with Scratch("rlx-amp-verify-") as tmp:
        compared = open_compared(
            ref_model, ref_path.parent, cand_model, cand_path, provider, options.emulate, tmp, cand_label, progress
        )
        precision = compared.precision
        cand_runs = run_each(compared, samples, names, progress, "running the candidate")
        compared.release()
        results = pair_runs(prepared.runs, cand_runs, names)
        del cand_runs
        localized = None
        trace: list[dict[str, Any]] | None = None
        if options.localize:
            trace = []
            localized = localize(
                ref_model,
                ref_path.parent,
                compared,
                samples[0],
                provider,
                tmp,
                options.tolerance.for_output("", precision),
                options.localize_top,
                trace,
            )
    drifts = compare_outputs(results, precision, options)
    return VerifyReport(
        reference=str(ref_path),
        candidate=cand_label,
        provider=provider,
        providers_used=providers_used,
        emulated=compared.emulated,
        emulation_reason=compared.reason,
        candidate_loaded=compared.loaded,
        precision=precision.value,
        tolerance=options.tolerance.resolved(precision),
        seed=options.spec.seed,
        samples=len(samples),
        inputs={k: list(v.shape) for k, v in samples[0].items()},
        outputs=drifts,
        localized=localized,
        localize_trace=trace,
    )


def _check_interfaces(ref: onnx.ModelProto, cand: onnx.ModelProto, ref_path: Path, cand_path: Path) -> None:
    ref_in = {i.name for i in ref.graph.input} - {t.name for t in ref.graph.initializer}
    cand_in = {i.name for i in cand.graph.input} - {t.name for t in cand.graph.initializer}
    if ref_in != cand_in:
        raise InputError(f"{cand_path}: inputs {sorted(cand_in)} differ from {ref_path}'s {sorted(ref_in)}")
    ref_out = [o.name for o in ref.graph.output]
    if not ref_out:
        raise InputError(f"{ref_path}: the model has no outputs to compare")
    missing = set(ref_out) - {o.name for o in cand.graph.output}
    if missing:
        raise InputError(f"{cand_path}: lacks output(s) {', '.join(sorted(missing))} of {ref_path}")

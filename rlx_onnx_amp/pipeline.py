"""One model's way through rlx-amp, the same behind every door: the command line (one model, a
batch, `--jobs`, an export directory), the library's `run`, the Olive pass and the onnx-ir pass
all make one checked `JobSettings` and run a `ConvertJob` (the library's `convert` and
`convert_file` run its first two stages, `api.screened_options`):

1. the reference's run on the verification's inputs, range-screened unless `screen` is off
   (where the settings verify; without verification nothing runs);
2. the conversion (`api.stage_conversion`: rewrite, proof, staging), its MACs counted at the
   shapes the reference ran;
3. the verification of the written file (`verification.core.verify`), or with `repair` (and
   `--policy auto`) the search that keeps nodes f32 until it passes (`repair.repair_file`);
4. the `--min-low-share` gate.

The pipeline prints nothing: what happens is told to a `Reporter` (the command line's prints,
`progress.TerminalReporter`; every other door logs, `LogReporter`) and the answer is a
`ModelResult`. `ConvertJob.convert_contained` runs steps 1-4 under a supervisor
(`supervise.run_contained`), so that an onnxruntime crash is this model's exit 3, not the end of
the run.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rlx_onnx_amp.api import KindMap, checker_failure, options_from, resolve_policy, stage_conversion
from rlx_onnx_amp.directory import with_genai_folder_hint
from rlx_onnx_amp.errors import AmpError, InputError, first_line
from rlx_onnx_amp.exits import EXIT_INTERNAL, EXIT_LOW_GAIN, EXIT_UNVERIFIED, EXIT_USAGE
from rlx_onnx_amp.files import OutputSet, RunPaths
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.record import Failure, Gate, ModelResult
from rlx_onnx_amp.rewrite import ConvertOptions
from rlx_onnx_amp.supervise import run_contained
from rlx_onnx_amp.verification.inputs import GuessedAxesError
from rlx_onnx_amp.verification.options import DEFAULT_BUDGET, VerifyOptions, session_threads

if TYPE_CHECKING:
    from rlx_onnx_amp.verification.reference import Reference, ReferenceUnavailable

__all__ = [
    "CLI_SPELLING",
    "LIBRARY_SPELLING",
    "ConvertJob",
    "JobSettings",
    "LogReporter",
    "Reporter",
    "ReporterFactory",
    "invalid_input",
    "reference_run",
    "run",
    "unexpected_failure",
    "with_reference",
]

logger = logging.getLogger(__name__)

#: A progress callback: (stage, done, total) for the verification's stages, (done, total) for
#: the conversion's weight bytes.
StageProgress = Callable[[str, int, int], None]
ByteProgress = Callable[[int, int], None]


class Reporter(Protocol):
    """What a door is told while one model goes through the pipeline. The command line prints
    it (`progress.TerminalReporter`); the library's doors log it (`LogReporter`)."""

    def begin(self, stage: str) -> None:
        """A stage of the model starts ("converting", "repairing")."""

    def end(self) -> None:
        """The current stage ends."""

    def release(self) -> None:
        """The outputs' paths passed their checks: what was held back may be shown."""

    def done(self, exit_code: int) -> None:
        """The model ends with `exit_code`."""

    def staged(self) -> AbstractContextManager[StageProgress]:
        """The verification's progress, stage by stage, for one `with` block."""

    def conversion_progress(self, label: str) -> AbstractContextManager[ByteProgress]:
        """The conversion's progress in weight bytes, for one `with` block."""

    def status(self, line: str) -> None:
        """A long step starts."""

    def warning(self, message: str) -> None:
        """Something the user should know (an option that matched nothing, a gate not met)."""

    def repair_line(self, line: str) -> None:
        """One step of a search (`--repair`, `--policy auto`)."""

    def unverified(self, line: str) -> None:
        """The model was written without a verdict, and why."""

    def converted(self, result: ModelResult) -> None:
        """The conversion (with `--repair`, its repair and verification) is done."""

    def verified(self, result: ModelResult) -> None:
        """The verification is done."""

    def failed(self, message: str, code: int) -> None:
        """The model failed (a batch goes on with the next)."""


#: Makes the reporter of one model: (the model's path, its `[k/N] ` in a batch) -> Reporter.
ReporterFactory = Callable[[str, str], Reporter]


def _no_progress(*args: object) -> None:
    return None


class LogReporter:
    """A `Reporter` that logs (the library's doors: `convert_file`, Olive, onnx-ir)."""

    def __init__(self, model: str = "", position: str = "") -> None:
        self.model = f"{position}{model}"

    def begin(self, stage: str) -> None:
        logger.debug("%s: %s", self.model, stage)

    def end(self) -> None:
        return None

    def release(self) -> None:
        return None

    def done(self, exit_code: int) -> None:
        logger.debug("%s: exit %d", self.model, exit_code)

    def staged(self) -> AbstractContextManager[StageProgress]:
        return nullcontext(_no_progress)

    def conversion_progress(self, label: str) -> AbstractContextManager[ByteProgress]:
        return nullcontext(_no_progress)

    def status(self, line: str) -> None:
        logger.debug("%s", line)

    def warning(self, message: str) -> None:
        logger.warning("%s", message)

    def repair_line(self, line: str) -> None:
        logger.info("repair: %s", line)

    def unverified(self, line: str) -> None:
        logger.warning("%s", line)

    def converted(self, result: ModelResult) -> None:
        c = result.conversion
        if c is not None:
            logger.info("%s: converted under %s, %d Casts inserted", c.output, c.policy, c.casts_inserted)

    def verified(self, result: ModelResult) -> None:
        v = result.verify
        if v is not None:
            logger.info("%s: %s", v.candidate, "PASSED" if v.passed else "FAILED")

    def failed(self, message: str, code: int) -> None:
        logger.error("%s (exit %d)", message, code)


#: How the command line spells the settings that `JobSettings.checked` refuses; another door
#: gives its own spelling (Olive: "verify=False", ...).
CLI_SPELLING: Mapping[str, str] = {
    "no_verify": "--no-verify",
    "repair": "--repair",
    "auto": "--policy auto",
    "budget": "--repair-budget",
    "min_low_share": "--min-low-share",
}


@dataclass(frozen=True)
class JobSettings:
    """What a door asks of each model; made by `checked`, which every door calls."""

    policy: Policy
    options: ConvertOptions
    verify_options: VerifyOptions | None  # None: no verification (--no-verify)
    repair: bool = False  # --repair, or --policy auto (a search that verifies and repairs)
    budget: int = DEFAULT_BUDGET
    data_name: str | None = None
    screen: bool = True  # rule range-screen from the reference run (unread with repair: it screens itself)
    verify_required: bool = False  # --verify: a reference that cannot run is an error, not exit 4
    #: onnxruntime's intra-op threads per session (0: onnxruntime's choice, every core); batch
    #: workers share the CPUs out.
    session_threads: int = 0
    export_dir: bool = False  # the models of an export directory (`convert_directory`)
    #: --min-low-share: the least share of the written model's MACs in low precision (exit 5 below it).
    min_low_share: float | None = None
    #: Each model under a supervisor (`supervise.run_contained`): an onnxruntime crash is its exit 3.
    contain: bool = False

    @classmethod
    def checked(
        cls,
        policy: Policy,
        options: ConvertOptions,
        verify_options: VerifyOptions | None,
        *,
        verify: bool | None = None,
        repair: bool = False,
        budget: int = DEFAULT_BUDGET,
        min_low_share: float | None = None,
        verify_required: bool | None = None,
        spelling: Mapping[str, str] = CLI_SPELLING,
        **fields: object,
    ) -> JobSettings:
        """The settings of a door, checked once for all doors: `verify` is the door's choice
        (None: its default, verification on; False: off), `verify_options` the options it
        verifies with. A search (`--policy auto`) and `--repair` verify every candidate; the
        target of the conversion is the verification's. `verify_required` (default: `verify`
        given as True, the command's explicit `--verify`): a reference that cannot run is an
        error, not a model written unverified."""
        say = {**CLI_SPELLING, **spelling}
        if policy.searches and verify is False:
            raise InputError(
                f"{say['auto']} searches by verifying its candidates: it cannot run with {say['no_verify']}"
            )
        if repair and verify is False:
            raise InputError(f"{say['no_verify']} and {say['repair']}: repair verifies every candidate")
        if min_low_share is not None and not 0 <= min_low_share <= 1:
            raise InputError(f"{say['min_low_share']}: expected a share from 0 to 1, got {min_low_share:g}")
        if budget < 1:
            raise InputError(f"{say['budget']} must be at least 1")
        searching = repair or policy.searches
        verifying = verify is not False or searching
        if verifying:
            verify_options = dataclasses.replace(verify_options or VerifyOptions(), target=options.target.value)
        return cls(
            policy,
            options,
            verify_options if verifying else None,
            repair=searching,
            budget=budget,
            min_low_share=min_low_share,
            verify_required=bool(verify) if verify_required is None else verify_required,
            **fields,  # type: ignore[arg-type]
        )


class ConvertJob:
    """Converts (verifies, repairs) the models of one door's run, one at a time, telling each
    one's `Reporter` as it goes; each call answers what its model came to. It holds no results:
    the one the parent runs and the copies the workers get are alike."""

    def __init__(self, settings: JobSettings, paths: RunPaths, reporters: ReporterFactory = LogReporter) -> None:
        self.settings, self.paths, self.reporters = settings, paths, reporters

    def replaced(self, **changes: object) -> ConvertJob:
        """This job with some of its settings changed."""
        return ConvertJob(dataclasses.replace(self.settings, **changes), self.paths, self.reporters)  # type: ignore[arg-type]

    def in_folder(
        self, shapes: Mapping[str, tuple[int, ...]], task: tuple[str, str] | None, encoder: Path | None = None
    ) -> ConvertJob:
        """This job with `shapes` for inputs its verification synthesizes, where `--shape`
        names none (an export directory's `genai_cache_shapes`), the task the folder's
        config names (`directory.config_task`), and the folder's encoder whose output its
        decoders read (`generate.folder_encoder`)."""
        verify_options = self.settings.verify_options
        if verify_options is None or (not shapes and task is None and encoder is None):
            return self
        spec = dataclasses.replace(verify_options.spec, shapes={**shapes, **verify_options.spec.shapes})
        return self.replaced(verify_options=dataclasses.replace(
            verify_options, spec=spec, folder_task=task, encoder=str(encoder) if encoder is not None else None))

    def convert_contained(
        self, src: str, dst: str, outputs: OutputSet, shown: str | None = None, position: str = ""
    ) -> ModelResult:
        """`convert`, under a supervisor when the settings ask for one (`contain`): an onnxruntime
        crash is this model's ModelRunError (exit 3), with nothing of it left staged."""
        if not self.settings.contain:
            return self.convert(src, dst, outputs, shown, position)
        warm = self.settings.verify_options is not None  # the written file runs in a child of its own
        return run_contained(self.convert, (src, dst, outputs, shown, position), outputs, label=src, warm=warm)

    def convert(
        self, src: str, dst: str, outputs: OutputSet, shown: str | None = None, position: str = ""
    ) -> ModelResult:
        """Convert (verify, repair) `src` into `dst`, staged in `outputs`; `shown` is the path
        the reports name (a directory's file, staged elsewhere until the directory is whole);
        `position` is its `[k/N] ` in a batch."""
        reporter = self.reporters(src, position)
        with session_threads(self.settings.session_threads):
            if self.settings.repair:
                result = self._repair(src, dst, outputs, shown or dst, reporter)
            else:
                result = self._convert(src, dst, outputs, shown or dst, reporter)
        result = self._gated(result, reporter)
        v = result.verify
        if v is not None and v.passed and v.unmoved_why is not None:  # exit 4, said as every exit 4 is
            reporter.unverified(f"{shown or dst}: written, not verified (exit {EXIT_UNVERIFIED}): {v.unmoved_why}")
        reporter.done(result.exit_code)
        return result

    def _gated(self, result: ModelResult, reporter: Reporter) -> ModelResult:
        """The result with its `--min-low-share` verdict; one line when it falls short."""
        least = self.settings.min_low_share
        if least is None or result.conversion is None:
            return result
        cost = result.conversion.cost
        share = cost.mac_low_share if cost is not None else None
        gate = Gate(least, share, share is not None and share >= least)
        if not gate.passed:
            kept = "an unknown share" if share is None else f"{share:.1%}"
            reporter.warning(
                f"{result.conversion.output}: keeps {kept} of its multiply-accumulates in low precision, under "
                f"--min-low-share {least:g} (exit {EXIT_LOW_GAIN}; written)"
            )
        return dataclasses.replace(result, gate=gate)

    def _repair(self, src: str, dst: str, outputs: OutputSet, shown: str, reporter: Reporter) -> ModelResult:
        from rlx_onnx_amp.repair import repair_file  # the verification's modules: not for a conversion alone

        s = self.settings
        assert s.verify_options is not None
        from rlx_onnx_amp.verification.reference import ReferenceUnavailable

        reporter.begin("repairing")
        try:
            conversion, verified, repaired = repair_file(
                src,
                dst,
                s.policy,
                options=s.options,
                verify_options=s.verify_options,
                budget=s.budget,
                data_name=s.data_name,
                outputs=outputs,
                paths=self.paths,
                progress=reporter.repair_line,
            )
        except ReferenceUnavailable as e:  # as the plain command: written unverified (exit 4), or --verify's error
            reporter.release()
            reporter.end()
            return self._convert(src, dst, outputs, shown, reporter, unavailable=_unavailable(e, src, s))
        reporter.release()
        reporter.end()
        result = ModelResult(dataclasses.replace(conversion, output=shown), verified, repaired)
        self._warn_idle(result, reporter)
        reporter.converted(result)
        return result

    def _convert(
        self, src: str, dst: str, outputs: OutputSet, shown: str, reporter: Reporter, unavailable: str | None = None
    ) -> ModelResult:
        """Convert and verify `src`; with `unavailable` (why the reference cannot run, found by a
        search) written unverified without another reference run."""
        s = self.settings
        reference, unverified = (None, unavailable) if unavailable else reference_run(src, s, reporter)
        options = with_reference(s.options, reference)
        reporter.begin("converting")
        with reporter.conversion_progress(f"converting {Path(src).name}") as progress:
            staged = stage_conversion(
                src, dst, outputs, self.paths, s.policy, options=options, data_name=s.data_name, progress=progress
            )
        reporter.release()
        reporter.end()
        conversion = dataclasses.replace(staged.conversion, output=shown)
        converted = ModelResult(conversion)
        self._warn_idle(converted, reporter)
        reporter.converted(converted)
        if reference is None:
            if unverified is not None:  # exit 4 (`ModelResult.exit_code`); the whole reason with -v and in the JSON
                reporter.unverified(f"{shown}: written, not verified (exit {EXIT_UNVERIFIED}): {unverified}")
            return ModelResult(conversion, unverified=unverified)
        from rlx_onnx_amp.verification.core import verify  # the verification's modules: not for a conversion alone

        reporter.status(f"verifying {shown} against {src} ...")
        with reporter.staged() as verify_progress:
            verified = verify(
                src,
                staged.path,
                s.verify_options,
                progress=verify_progress,
                candidate_label=shown,
                outputs=outputs,
                prepared=reference,
            )
        result = ModelResult(conversion, verified)
        reporter.verified(result)
        return result

    def convert_own(self, src: str, dst: str, position: str = "") -> ModelResult:
        """One model of a batch: committed on its own; a failure is reported and the rest go on."""
        try:
            with OutputSet(self.paths.protected()) as own:
                result = self.convert_contained(src, dst, own, position=position)
                own.commit()
            return result
        except AmpError as e:
            return self._failed(src, str(e), e.exit_code, position)
        except Exception as e:
            return self._failed(src, *unexpected_failure(e, [src]), position)

    def _warn_idle(self, result: ModelResult, reporter: Reporter) -> None:
        """Options that matched nothing in this model: a warning, since they may match others."""
        c = result.conversion
        assert c is not None
        options, data_name = self.settings.options, self.settings.data_name
        ops = {op.rpartition(".")[2] for op in c.by_op}
        for op in options.keep_f32_ops:
            if op not in ops:
                close = difflib.get_close_matches(op, sorted(ops), n=3)
                hint = f" (close: {', '.join(close)})" if close else ""
                reporter.warning(f"--keep-f32-op {op}: {c.model} has no {op} node{hint}")
        for pattern in options.keep_f32_nodes:
            if not any(k.reason == f"user: --keep-f32-node {pattern}" for k in c.kept_f32):
                reporter.warning(f"--keep-f32-node {pattern}: no node of {c.model} that the policy lowers matches")
        if data_name is not None and not c.data_files:
            reporter.warning(f"--data-name {data_name}: {c.output} is written without external data")

    def _failed(self, src: str, message: str, code: int, position: str = "") -> ModelResult:
        """A model of a batch that failed: one line (onnxruntime's words summarized unless -v), and
        the whole message in the reports."""
        self.reporters(src, position).failed(message, code)
        return ModelResult(failure=Failure(src, message, code))


def reference_run(
    src: str | os.PathLike[str], settings: JobSettings, reporter: Reporter
) -> tuple[Reference | None, str | None]:
    """The pipeline's first stage: the reference's one run on the verification's inputs
    (range-screened unless the settings turn the screen off), or why there is none: a reference
    that cannot run leaves the model unverified, unless verification was asked for explicitly
    (`verify_required`: its error). None, None without verification."""
    if settings.verify_options is None:
        return None, None
    # The verification's modules, here: a conversion without verification does not load them.
    from rlx_onnx_amp.verification.reference import ReferenceUnavailable, prepare_reference

    with reporter.staged() as progress:
        try:
            return prepare_reference(src, settings.verify_options, screen=settings.screen, progress=progress), None
        except ReferenceUnavailable as e:
            return None, _unavailable(e, src, settings)


def _unavailable(e: ReferenceUnavailable, src: str | os.PathLike[str], settings: JobSettings) -> str:
    """Why the reference cannot run, for a model written unverified; where verification was asked
    for explicitly (`verify_required`), the error itself."""
    error = e.error
    if isinstance(error, GuessedAxesError) and not settings.export_dir:  # say where the sizes are
        error = with_genai_folder_hint(error, Path(src))
    if settings.verify_required:
        raise error from None
    return str(error)


#: How the library's `run` spells the settings `JobSettings.checked` refuses.
LIBRARY_SPELLING: Mapping[str, str] = {
    "no_verify": "verify=False",
    "repair": "repair=True",
    "auto": "policy 'auto'",
    "budget": "budget",
    "min_low_share": "min_low_share",
}


def run(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    policy: Policy | str = "auto-mixed",
    *,
    kind_map: KindMap | None = None,
    options: ConvertOptions | None = None,
    verify: bool = True,
    verify_options: VerifyOptions | None = None,
    screen: bool = True,
    repair: bool = False,
    budget: int = DEFAULT_BUDGET,
    min_low_share: float | None = None,
    data_name: str | None = None,
    reporters: ReporterFactory = LogReporter,
    **option_kwargs: object,
) -> ModelResult:
    """What `rlx-amp INPUT -o OUTPUT --policy POLICY` does for one model, from Python: the same
    checked settings and stages (the reference's run and range screen, the conversion, the
    verdict on the written file, with `repair` or policy `auto` the search, `min_low_share`'s
    gate), the reports aside; the answer is the `ModelResult` every report reads (its
    `exit_code` is the command's). Nothing is printed: `reporters` is told what happens
    (`LogReporter`: logging). The output is written as the command writes it, a failed
    verdict included; an error a user can cause raises `AmpError` and writes nothing.

    Unlike the command, the run is not under a supervisor: an onnxruntime crash ends the
    caller's process, which a library must not fork behind its caller's back (threads, CUDA
    contexts); the command (`rlx-amp`) contains it."""
    settings = JobSettings.checked(
        resolve_policy(policy, kind_map),
        options_from(options, option_kwargs),
        verify_options,
        verify=None if verify else False,
        repair=repair,
        budget=budget,
        min_low_share=min_low_share,
        spelling=LIBRARY_SPELLING,
        screen=screen,
        data_name=data_name,
    )
    paths = RunPaths()
    with OutputSet(paths.protected()) as outputs:
        result = ConvertJob(settings, paths, reporters).convert(str(input_path), str(output_path), outputs)
        outputs.commit()
    return result


def with_reference(options: ConvertOptions, reference: Reference | None) -> ConvertOptions:
    """The conversion's options with what the reference's run measured, where it ran
    (`Reference.conversion_options`)."""
    return options if reference is None else reference.conversion_options(options)


def invalid_input(models: Sequence[str]) -> str | None:
    """One line naming the first input model that fails onnx.checker (full check), if any."""
    for model in models:
        first = checker_failure(model, 300)
        if first is not None:
            return f"{model}: not a valid ONNX model (onnx.checker: {first}); nothing written"
    return None


def unexpected_failure(error: Exception, models: Sequence[str]) -> tuple[str, int]:
    """What an exception that is no AmpError says, and its exit code: an input model that fails
    onnx.checker is bad input (`invalid_input`, exit 2); anything else is a bug, whose traceback
    goes to stderr now (exit 70)."""
    invalid = invalid_input(models)
    if invalid is not None:
        return invalid, EXIT_USAGE
    traceback.print_exception(error)
    bug = f"internal error ({type(error).__name__}: {first_line(error)}); this is a bug in rlx-amp"
    return f"{bug}, please report it with the model", EXIT_INTERNAL

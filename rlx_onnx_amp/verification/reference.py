"""One f32 reference run that serves both the range screen and the verdict.

`prepare_reference` loads the reference once, builds the input sets a verification uses
(`input_sets`: the user's file, or seeded synthesis with `--shape` and `--input-range`), and runs
it once per input set. With `screen=True` the same run surfaces every float value of the model
(`screen.ScreenPlan`): their ranges go to the converter (`ConvertOptions.value_ranges`, rule
range-screen) and the graph outputs of that very run are what the candidate is judged
against; the shapes onnxruntime produced on the first input set go to the cost model
(`Reference.value_shapes`, `ConvertOptions.value_shapes`), so it needs no shape inference where
the model ran. Nothing is run twice, and one session is held at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from rlx_onnx_amp.errors import AmpError, ModelRunError
from rlx_onnx_amp.loading import load_model
from rlx_onnx_amp.ranges import ValueRange
from rlx_onnx_amp.rewrite import ConvertOptions
from rlx_onnx_amp.verification.compare import (
    Progress,
    Scratch,
    Session,
    VerifyOptions,
    resolve_provider,
    run_each,
)
from rlx_onnx_amp.verification.generate import (
    ENCODER_STATES,
    encoder_beside,
    samples_through_encoder,
    with_encoder_states,
)
from rlx_onnx_amp.verification.inputs import (
    PAST_INPUT,
    UnsynthesizableInput,
    check_feeds,
    load_inputs,
    synthesized_inputs_error,
    synthesized_sets,
)
from rlx_onnx_amp.verification.samples import SampleSets, folder_positions, is_samples
from rlx_onnx_amp.verification.screen import ScreenPlan
from rlx_onnx_amp.verification.sizes import SizePlan, plan_sizes

__all__ = ["Reference", "ReferenceUnavailable", "choosing_sets", "input_sets", "prepare_reference"]

logger = logging.getLogger(__name__)


class ReferenceUnavailable(AmpError):
    """The reference cannot run on the inputs the verification would use: `error` says why
    (an input error, exit 2, when symbolic axes were guessed; onnxruntime's, exit 3,
    otherwise). A conversion that verifies by default is then written unverified."""

    def __init__(self, error: AmpError) -> None:
        super().__init__(str(error))
        self.error = error
        self.exit_code = error.exit_code


@dataclass
class Reference:
    """The reference model and what its one run gave."""

    path: Path
    model: onnx.ModelProto  # loaded without its external data
    provider: str
    samples: list[dict[str, np.ndarray]]
    output_names: list[str]
    providers_used: list[str]
    runs: list[dict[str, np.ndarray]]  # the graph outputs on every input set
    #: Value name -> its range over the input sets screened (empty unless screened).
    value_ranges: dict[str, ValueRange] = field(default_factory=dict)
    screened: bool = False
    #: Value name -> the shape onnxruntime produced for it on the first input set (graph inputs,
    #: outputs and, when screened, the main graph's values the cost model reads).
    value_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: The sizes synthesized inputs were drawn at, and why (None: the user's --inputs).
    sizes: SizePlan | None = None
    #: Wall seconds of the reference's run per input set, its session's start included (an
    #: overestimate of one inference): what the latency's timed runs are budgeted by.
    seconds_per_set: float | None = None
    #: What made the input sets where --inputs gave samples (`samples.SampleSets.source`).
    inputs_from: str | None = None

    def second_size(self) -> dict[str, tuple[int, ...]] | None:
        """Each input's shape in the first input set at the plan's second size, where it has one."""
        if self.sizes is None or not self.sizes.grown or len(self.samples) < 2:
            return None
        # synthesized_sets' order: as many sets at the first size as at the second (a merged
        # decoder's cached-branch set at the first size differs in shape too: it is not one)
        return {n: tuple(v.shape) for n, v in self.samples[len(self.samples) // 2].items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each input's shape in the first input set: what the run's cost model counts at."""
        return {name: tuple(value.shape) for name, value in self.samples[0].items()}

    def conversion_options(self, options: ConvertOptions) -> ConvertOptions:
        """The conversion's options with what this run measured: the value ranges the range
        screen reads, and the shapes the MACs are counted at (`--shape` first)."""
        return dataclasses.replace(
            options,
            value_ranges=self.value_ranges,
            shapes={**self.shapes(), **options.shapes},
            value_shapes=self.value_shapes,  # the MACs from the shapes the run saw
        )


def prepare_reference(
    path: str | os.PathLike[str],
    options: VerifyOptions,
    *,
    screen: bool = False,
    progress: Progress | None = None,
    held_out: bool = False,
) -> Reference:
    """Load and run the reference on the verification's inputs; with `screen`, in the same run,
    the range of every float value (with `held_out`, over the input sets that choose only:
    `choosing_sets`). Raises `ReferenceUnavailable` when it cannot run."""
    ref_path = Path(path)
    provider = resolve_provider(options.provider)
    model = load_model(ref_path)
    options.tolerance.check_outputs((o.name for o in model.graph.output), ref_path)
    given = Path(options.inputs) if options.inputs else None
    if given is not None and options.encoder is not None and is_samples(given) and _later_decoder_step(model):
        logger.warning("%s: a decoder step that reads its cache takes no sample: its inputs are drawn (the folder's "
                       "decoders that read %s start from the samples)", ref_path, ENCODER_STATES)
        options = dataclasses.replace(options, inputs=None)
    if not options.inputs and options.spec.positions is None:  # its folder's config.json says how long
        written = folder_positions(model, ref_path.parent)
        # the generate task's greedy steps go on past the prompt: they need positions too
        positions = (written[0] - options.generate_steps, written[1]) if written is not None else None
        options = dataclasses.replace(options, spec=dataclasses.replace(options.spec, positions=positions))
    plan = None if options.inputs else plan_sizes(model, options.spec.shapes, positions=options.spec.positions)
    try:
        samples = input_sets(model, options, plan, ref_path.parent)
    except UnsynthesizableInput as e:  # no run without a value the user has to give
        raise ReferenceUnavailable(e) from None
    outputs = [o.name for o in model.graph.output]
    reference = Reference(ref_path, model, provider, samples, outputs, [], [], sizes=plan,
                          inputs_from=samples.source if isinstance(samples, SampleSets) else None)
    try:
        _run(reference, screen, held_out, progress)
    except ModelRunError as e:
        if plan is None or not plan.guessed:
            error = e if options.inputs else synthesized_inputs_error(e, model, options.spec)
            raise ReferenceUnavailable(error) from None
        # The sizes were guessed: try others, one reference run each, before giving up.
        found, tried = _other_sizes(reference, options, plan)
        if found is None:
            raise ReferenceUnavailable(synthesized_inputs_error(e, model, options.spec, tried)) from None
        logger.info("inputs: %s (after %s failed: %s)", found.shown(), plan.shown(), e)
        reference.sizes, reference.samples = found, input_sets(model, options, found, ref_path.parent)
        try:
            _run(reference, screen, held_out, progress)
        except ModelRunError as again:
            raise ReferenceUnavailable(synthesized_inputs_error(again, model, options.spec, tried)) from None
    if not reference.value_shapes:  # not screened: the inputs and outputs alone
        outs = reference.runs[0] if reference.runs else {}
        reference.value_shapes = {**reference.shapes(), **{n: tuple(np.shape(v)) for n, v in outs.items()}}
    return reference


def _later_decoder_step(model: onnx.ModelProto) -> bool:
    """A seq2seq decoder's later step: its past cache in, no encoder states (optimum's
    decoder_with_past_model.onnx): no sample is its input."""
    names = {i.name for i in model.graph.input}
    return ENCODER_STATES not in names and any(PAST_INPUT.match(n) for n in names)


def _run(reference: Reference, screen: bool, held_out: bool, progress: Progress | None) -> None:
    """The reference's run on its input sets (screened with `screen`), and its seconds per set."""
    total = len(reference.samples)
    started = time.perf_counter()
    if screen:
        _screened_run(reference, progress, choosing_sets(total) if held_out else total)
    else:
        session = Session(str(reference.path), reference.provider, str(reference.path), role="the input")
        reference.providers_used = session.session.get_providers()
        reference.runs = run_each(session, reference.samples, reference.output_names, progress,
                                  "running the reference")
    reference.seconds_per_set = (time.perf_counter() - started) / max(total, 1)


def _other_sizes(
    reference: Reference, options: VerifyOptions, first: SizePlan
) -> tuple[SizePlan | None, list[SizePlan]]:
    """The first sizes the reference runs at, after `first` failed: `first` without its second
    size, then each attempt of `plan_sizes` (its second size dropped where only that fails),
    each try one run of one input set per branch of a merged decoder, on one session. None
    where no size runs; and every plan tried, `first` first."""
    tried = [first]
    model, spec = reference.model, options.spec
    try:
        session = Session(str(reference.path), reference.provider, str(reference.path), role="the input")
    except ModelRunError:  # no session at all: no size helps
        return None, tried

    def runs(plan: SizePlan, grown: bool) -> bool:
        shapes = {**plan.shapes, **plan.grown} if grown else plan.shapes
        # the first sets as synthesized_sets draws them (a decoder step's mask over past and new
        # tokens), one per branch of a merged decoder: its cached one reads further positions
        try:
            for feeds in synthesized_sets(model, dataclasses.replace(spec, samples=1), SizePlan(shapes, plan.why)):
                session.run(feeds, reference.output_names[:1])
        except ModelRunError as e:
            logger.info("the reference cannot run at %s: %s", plan.shown(shapes), e)
            return False
        return True

    for attempt in range(first.attempts):
        plan = first if attempt == 0 else plan_sizes(model, spec.shapes, attempt, positions=spec.positions)
        if attempt:
            tried.append(plan)
            if not runs(plan, False):
                continue
        elif not (first.grown and runs(first, False)):
            continue  # the first size itself fails (or there is no second one to blame)
        if plan.grown and runs(plan, True):
            return plan, tried
        return plan_sizes(model, spec.shapes, attempt, grow=False, positions=spec.positions), tried
    return None, tried


def choosing_sets(total: int) -> int:
    """How many of `total` input sets steer a held-out search (`--policy auto`): the first half,
    rounded up; the others confirm its result, and nothing from them may steer it."""
    return (total + 1) // 2 if total >= 2 else total


def _screened_run(reference: Reference, progress: Progress | None, screened: int) -> None:
    """The reference's outputs and every float value's range, from one run per input set: with
    its bodies' values surfaced, or (where those cannot be stacked) its main graph's alone, or,
    where even that cannot run, its outputs only (nothing screened)."""
    last: ModelRunError | None = None
    with Scratch("rlx-amp-screen-") as tmp:
        for bodies in (True, False):
            plan = ScreenPlan(reference.model, reference.output_names, bodies)
            try:
                session = tmp.session(plan.model, reference.path.parent, reference.provider, str(reference.path))
                ranges: dict[str, ValueRange] = {}
                shapes: dict[str, tuple[int, ...]] = {}
                runs = []
                for k, feeds in enumerate(reference.samples):
                    if progress is not None:
                        progress("running the reference", k, len(reference.samples))
                    fetched = session.run(feeds, plan.fetch)
                    if k < screened:
                        plan.ranges(fetched, ranges)
                    if k == 0:
                        shapes = plan.shapes(fetched)
                    runs.append({n: np.asarray(fetched[n]) for n in reference.output_names})
                    del fetched
                if progress is not None:
                    progress("running the reference", len(reference.samples), len(reference.samples))
            except ModelRunError as e:
                logger.info("screening %s values failed (%s)", "every" if bodies else "the main graph's", e)
                last = e
                continue
            reference.providers_used = session.session.get_providers()
            reference.runs, reference.value_ranges, reference.screened = runs, ranges, True
            reference.value_shapes = {**reference.shapes(), **shapes}
            return
    logger.info("screening failed; running the reference alone")
    try:
        session = Session(str(reference.path), reference.provider, str(reference.path), role="the input")
    except ModelRunError:
        raise last or ModelRunError(f"{reference.path}: onnxruntime cannot run it") from None
    reference.providers_used = session.session.get_providers()
    reference.runs = run_each(session, reference.samples, reference.output_names, progress, "running the reference")


def input_sets(
    model: onnx.ModelProto, options: VerifyOptions, plan: SizePlan | None = None, folder: Path | None = None
) -> list[dict[str, np.ndarray]]:
    """The input sets a verification runs: the user's file (samples made into inputs by the
    model's `folder`'s preprocessing), or seeded synthesis (at `plan`'s sizes,
    `sizes.plan_sizes`' by default); checked against the model before anything runs."""
    # A seq2seq decoder: its encoder's states, the export folder's (`options.encoder`) or the
    # encoder file beside it (the decoder given alone, or with its encoder), on drawn inputs or
    # on the user's samples; an .npz of --inputs gives the states itself.
    given = Path(options.inputs) if options.inputs else None
    encoder = Path(options.encoder) if options.encoder is not None else None
    if encoder is None and folder is not None and (given is None or is_samples(given)):
        encoder = encoder_beside(model, folder)
    reads_states = ENCODER_STATES in {i.name for i in model.graph.input}
    provider = resolve_provider(options.provider)
    samples: list[dict[str, np.ndarray]]
    if given is not None and encoder is not None and reads_states and is_samples(given):
        samples = samples_through_encoder(model, encoder, given, options.spec, folder, provider)
    elif given is not None:
        samples = load_inputs(given, model, options.spec, folder)
    else:
        samples = synthesized_sets(model, options.spec, plan)
        if encoder is not None:
            samples = with_encoder_states(samples, encoder, options.spec, provider)
            if plan is not None and ENCODER_STATES in plan.why:  # the report says where they came from
                plan.why[ENCODER_STATES] += f", the output of {encoder.name} on drawn inputs"
    check_feeds(model, samples, f"--inputs {options.inputs}" if options.inputs else "synthesized inputs (--shape)")
    return samples

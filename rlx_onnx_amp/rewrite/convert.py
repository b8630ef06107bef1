"""Running the three passes over one model: `convert_model`, and the plan and passes to run one at a time."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

from onnx import ModelProto

from rlx_onnx_amp.cost import Cost, estimate_cost
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.passes import PassContractError, run_passes
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.record import Conversion as ConversionRecord
from rlx_onnx_amp.rewrite.decide import DecidePass
from rlx_onnx_amp.rewrite.emit import EmitPass
from rlx_onnx_amp.rewrite.plan import Conversion, ConvertOptions, Plan
from rlx_onnx_amp.rewrite.store import StorePass
from rlx_onnx_amp.rewrite.summary import summarize
from rlx_onnx_amp.tensors import WeightSink, WeightSource
from rlx_onnx_amp.types import NodeFields, sort_topologically

__all__ = [
    "RewrittenModel",
    "check_idempotent",
    "conversion_passes",
    "convert_model",
    "gc_paused",
    "rewrite_model",
    "summarize_plan",
]

logger = logging.getLogger(__name__)


def convert_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    *,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    weights: bool = True,
    progress: Callable[[int], None] | None = None,
    label: str = "model",
) -> ConversionRecord:
    """Rewrite `model` in place under `policy` (resolved at the edge: `api.resolve_policy`);
    returns what the conversion did (its `model`, `output`, `data_files` and `proof` are the
    file layer's to fill).

    With `weights=False` initializers keep their data but take their new element type (a dry
    run for `inspect`: the model is for counting, not for saving).
    `progress`, if given, is called with the bytes of each initializer once it is written.
    `label` names the model in an error.
    """
    with rewrite_model(
        model, policy, options, source=source, sink=sink, weights=weights, progress=progress, label=label
    ) as rewritten:
        return rewritten.finish()


class RewrittenModel:
    """A model rewritten in place (`rewrite_model`) whose record `finish` makes: a caller can
    save the model first, and summarize once the plan is no longer needed for anything else."""

    def __init__(self, plan: Plan, conversion: Conversion) -> None:
        self._plan: Plan | None = plan
        self._conversion: Conversion | None = conversion
        self._record: ConversionRecord | None = None

    def finish(self) -> ConversionRecord:
        """The conversion's record (with its cost estimate when asked); then the plan is freed
        and the model dropped. Once; later calls return the same record."""
        if self._record is not None:
            return self._record
        plan, cx = self._plan, self._conversion
        assert plan is not None and plan.main is not None and cx is not None, "finish after close"
        self._record = summarize(cx, plan.main, _cost(cx) if cx.options.cost else None)
        self.close()
        return self._record

    def close(self) -> None:
        """Free the plan and drop the model."""
        if self._plan is not None:
            self._plan.release()
        self._plan = self._conversion = None


def _cost(cx: Conversion) -> Cost:
    """The cost figures at the run's shapes where it ran (`ConvertOptions.value_shapes`)."""
    return estimate_cost(cx.model, cx.options.shapes, cx.options.value_shapes)


def check_idempotent(model: ModelProto, policy: Policy, options: ConvertOptions) -> None:
    """The pipeline's promise (checked with the passes' contracts): converting its result again
    under the same policy and options changes nothing. Node-path keeps are left out by the
    caller: their paths are the input's."""
    again = ModelProto()
    again.CopyFrom(model)
    record = convert_model(again, policy, replace(options, cost=False, check_contracts=False), weights=False)
    if record.changed:
        raise PassContractError(
            f"conversion: converting the result again changes it ({record.casts_inserted} Casts inserted, "
            f"{record.casts_removed} removed)"
        )


@contextlib.contextmanager
def rewrite_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    *,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    weights: bool = True,
    progress: Callable[[int], None] | None = None,
    fields: NodeFields | None = None,
    label: str = "model",
) -> Iterator[RewrittenModel]:
    """`convert_model` up to its record, as a context: the model is rewritten in place and
    ready to save; `finish()` returns the record. The garbage collector stays paused until the
    context ends (it would walk the live plan), and the plan is freed then if `finish` was not
    called. `fields`: the main graph's nodes as the loader read them (`types.NodeFields`), not
    read again."""
    options = options or ConvertOptions()
    with gc_paused():
        plan, passes = _plan(
            model, policy, options, source or WeightSource(None), sink or WeightSink(), weights, progress, fields, label
        )
        conversion = passes[0].cx
        run_passes(plan, passes, options.check_contracts)
        if options.check_contracts and not options.keep_f32_paths:
            check_idempotent(model, policy, options)
        del passes
        rewritten = RewrittenModel(plan, conversion)
        del plan, conversion
        try:
            yield rewritten
        finally:
            rewritten.close()


def conversion_passes(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    """A new plan for `model` and the three passes that rewrite it in place, weights inline
    (`convert_model` runs them in order): to run, inspect or test one at a time;
    `summarize_plan` gives the record once the emit pass ran."""
    return _plan(model, policy, options or ConvertOptions(), WeightSource(None), WeightSink(), True)


def summarize_plan(plan: Plan, passes: tuple[DecidePass, StorePass, EmitPass]) -> ConversionRecord:
    """The record of a conversion run pass by pass (`conversion_passes`), without a cost estimate."""
    assert plan.main is not None, "the passes have not run"
    return summarize(passes[0].cx, plan.main)


def _plan(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions,
    source: WeightSource,
    sink: WeightSink,
    weights: bool,
    progress: Callable[[int], None] | None = None,
    fields: NodeFields | None = None,
    label: str = "model",
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{label}: the graph is empty")
    # The passes type values in node order: nodes out of order (onnxruntime loads such a model,
    # the checker does not) are put in order first, and the report counts it as a change.
    fields = fields if fields is not None else NodeFields.read(model.graph)
    reordered = sort_topologically(model.graph, fields=fields)
    if reordered:
        logger.info("%d graphs had nodes out of topological order: sorted", reordered)
        fields = NodeFields.read(model.graph)
    conversion = Conversion(model, policy, options, source, sink, weights, progress, fields)
    conversion.edits += reordered
    return Plan(model), (DecidePass(conversion), StorePass(conversion), EmitPass(conversion))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the sweeps allocate a few objects per node and free
    them by reference counting, but each full collection walks every live one (a fifth of the
    time on a 200,000-node graph)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

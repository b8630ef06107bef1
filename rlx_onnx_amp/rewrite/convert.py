"""Running the three passes over one model: `convert_model`, and the plan and passes to run one at a time."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator

from onnx import ModelProto

from rlx_onnx_amp.cost import estimate_cost
from rlx_onnx_amp.errors import InputError
from rlx_onnx_amp.passes import run_passes
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.reports.conversion import ConversionReport
from rlx_onnx_amp.rewrite.decide import DecidePass
from rlx_onnx_amp.rewrite.emit import EmitPass
from rlx_onnx_amp.rewrite.plan import Conversion, ConvertOptions, Plan
from rlx_onnx_amp.rewrite.store import StorePass
from rlx_onnx_amp.rewrite.summary import fill_report
from rlx_onnx_amp.tensors import WeightSink, WeightSource
from rlx_onnx_amp.types import NodeFields, sort_topologically

__all__ = ["RewrittenModel", "conversion_passes", "convert_model", "gc_paused", "rewrite_model"]

logger = logging.getLogger(__name__)


def convert_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    *,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    report: ConversionReport | None = None,
    weights: bool = True,
    progress: Callable[[int], None] | None = None,
) -> ConversionReport:
    """Rewrite `model` in place under `policy` (resolved at the edge: `api.resolve_policy`);
    returns the conversion report.

    With `weights=False` initializers keep their data but take their new element type (a dry
    run for `inspect`: the model is for counting, not for saving).
    `progress`, if given, is called with the bytes of each initializer once it is written.
    """
    with rewrite_model(
        model, policy, options, source=source, sink=sink, report=report, weights=weights, progress=progress
    ) as rewritten:
        return rewritten.finish()


class RewrittenModel:
    """A model rewritten in place (`rewrite_model`) whose report `finish` fills: a caller can
    save the model and start its proof first (`proof.CheckerRun`), and fill the report while
    the proof runs."""

    def __init__(self, plan: Plan, conversion: Conversion) -> None:
        self._plan: Plan | None = plan
        self._conversion: Conversion | None = conversion
        self.report = conversion.report

    def finish(self) -> ConversionReport:
        """Fill the report (and its cost estimate when asked), then free the plan and drop the
        model; once."""
        plan, cx = self._plan, self._conversion
        if plan is None or cx is None:
            return self.report
        assert plan.main is not None
        fill_report(cx, plan.main)
        if cx.options.cost:
            self.report.cost = estimate_cost(cx.model, cx.options.shapes)
        self.close()
        return self.report

    def close(self) -> None:
        """Free the plan (the report is left as it is) and drop the model."""
        if self._plan is not None:
            self._plan.release()
        self._plan = self._conversion = None


@contextlib.contextmanager
def rewrite_model(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions | None = None,
    *,
    source: WeightSource | None = None,
    sink: WeightSink | None = None,
    report: ConversionReport | None = None,
    weights: bool = True,
    progress: Callable[[int], None] | None = None,
    fields: NodeFields | None = None,
) -> Iterator[RewrittenModel]:
    """`convert_model` up to its report, as a context: the model is rewritten in place and
    ready to save; `finish()` fills the report and returns it. The garbage collector stays
    paused until the context ends (it would walk the live plan), and the plan is freed then
    if `finish` was not called. `fields`: the main graph's nodes as the loader read them
    (`types.NodeFields`), not read again."""
    options = options or ConvertOptions()
    report = report or ConversionReport()
    with gc_paused():
        plan, passes = _plan(
            model, policy, options, report, source or WeightSource(None), sink or WeightSink(), weights, progress,
            fields,
        )
        conversion = passes[0].cx
        conversion.report_at_emit = False  # finish() fills it
        run_passes(plan, passes, options.check_contracts)
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
    report: ConversionReport | None = None,
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    """A new plan for `model` and the three passes that rewrite it in place, weights inline
    (`convert_model` runs them in order): to run, inspect or test one at a time. The emit
    pass fills `report`."""
    return _plan(
        model, policy, options or ConvertOptions(), report or ConversionReport(), WeightSource(None), WeightSink(), True
    )


def _plan(
    model: ModelProto,
    policy: Policy,
    options: ConvertOptions,
    report: ConversionReport,
    source: WeightSource,
    sink: WeightSink,
    weights: bool,
    progress: Callable[[int], None] | None = None,
    fields: NodeFields | None = None,
) -> tuple[Plan, tuple[DecidePass, StorePass, EmitPass]]:
    report.policy = policy
    report.target = options.target.value
    if not model.graph.node and not model.graph.output:
        raise InputError(f"{report.model or 'model'}: the graph is empty")
    # The passes type values in node order: nodes out of order (onnxruntime loads such a model,
    # the checker does not) are put in order first, and the report counts it as a change.
    fields = fields if fields is not None else NodeFields.read(model.graph)
    reordered = sort_topologically(model.graph, fields=fields)
    if reordered:
        logger.info("%d graphs had nodes out of topological order: sorted", reordered)
        fields = NodeFields.read(model.graph)
    conversion = Conversion(model, policy, options, source, sink, report, weights, progress, fields)
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

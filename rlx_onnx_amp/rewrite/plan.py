"""What the three passes share: the options, each node's decision, each graph scope's values,
the conversion's state and the plan that flows from pass to pass (`rlx_onnx_amp.rewrite`)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from onnx import GraphProto, ModelProto, NodeProto

from rlx_onnx_amp.kernels import Target
from rlx_onnx_amp.policy import Policy
from rlx_onnx_amp.precision import Precision
from rlx_onnx_amp.ranges import NumericFacts, ValueRange
from rlx_onnx_amp.taxonomy import QDQ_CONSUMERS, QDQ_PRODUCERS, OpKind, canonical_domain
from rlx_onnx_amp.tensors import ClampStats, WeightSink, WeightSource
from rlx_onnx_amp.types import FreshNames, NodeFields, initializer_rows, opset_versions

__all__ = ["Conversion", "ConvertOptions", "NodeDecision", "Plan", "Scope", "Stage"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertOptions:
    """What the user can say besides the policy."""

    keep_io_types: bool = True
    keep_f32_ops: frozenset[str] = frozenset()
    keep_f32_nodes: tuple[str, ...] = ()  # regular expressions on node names
    #: Node paths (see `NodeDecision.path`) kept in f32, with the reason to report.
    keep_f32_paths: dict[str, str] = field(default_factory=dict)
    #: The execution provider the model is meant for: a node whose op has no kernel there for
    #: its low precision stays f32 (see `kernels`).
    target: Target = Target.CUDA
    #: Concrete input shapes for the cost model (`--shape`); symbolic axes not named here get
    #: the verifier's defaults.
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Fill the conversion record's `cost`: one shape inference over the graph (about 2.5 s per
    #: 100,000 nodes); the CLI turns it off when nothing would show it (-q and no report file).
    cost: bool = True
    #: Check every pass's contract (`rlx_onnx_amp.passes`): onnx's full checker on the result
    #: and a second conversion of it that must change nothing, among others. For tests and
    #: for a model that looks mis-converted; a broken promise raises PassContractError.
    check_contracts: bool = False
    #: Value key (`ranges.scoped_name`: its name, after the path of the body defining it) -> what
    #: one f32 reference run saw of it (the range screen, `verification.screen`): rule
    #: range-screen keeps the nodes whose values pass the range.
    value_ranges: Mapping[str, ValueRange] = field(default_factory=dict)
    #: Value name -> the shape onnxruntime produced for it in the reference run at `shapes`
    #: (`verification.reference.Reference.value_shapes`): the cost model counts at these and
    #: infers only what the run did not see.
    value_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class NodeDecision:
    """What the rewrite does to one node."""

    path: str  # stable id: node index in its graph, prefixed by the path of its scope
    node: NodeProto
    kind: OpKind | None
    # The node's fields, read once from the protobuf (field access there is slow).
    op: str = ""
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    precision: Precision | None = None  # the low precision it runs at; None: original types
    input_types: dict[int, int | None] = field(default_factory=dict)  # required; None: any
    output_types: dict[int, int] = field(default_factory=dict)
    reason: str | None = None  # why it was kept, when the policy wanted it lower
    source: bool = False  # a Constant-like node whose type follows its consumers
    keepable: bool = False  # the policy wants it lower, so a user keep (rule user-keep) applies to it
    code: str | None = None  # the deciding rule of `rules.KEEP_RULES`; None: lowered
    name: str = ""  # the node's name, read once

    @property
    def label(self) -> str:
        return self.name or f"{self.op}@{self.path}"


class Scope:
    """One graph (main or body) and what the sweeps learn about its values."""

    def __init__(
        self,
        graph: GraphProto,
        path: str,
        parent: Scope | None,
        types: dict[str, int],
        fields: NodeFields | None = None,
    ) -> None:
        """`fields`: the graph's, already read (`types.NodeFields`)."""
        self.graph = graph
        self.path = path
        self.parent = parent
        self.orig: dict[str, int] = dict(types)  # element types before the rewrite
        self.storage: dict[str, int] = {}  # element types after
        self.defined: set[str] = {i.name for i in graph.input}
        self.defined.update(name for _, name, _ in initializer_rows(graph, fields))
        #: Values whose storage type follows what their consumers want (graph inputs,
        #: initializers, Constant-like outputs): the only ones whose `wants` are recorded.
        self.tracked: set[str] = set(self.defined)
        self.producer: dict[str, NodeDecision] = {}
        self.wants: dict[str, set[int]] = {}
        self.decisions: list[NodeDecision] = []
        self.children: dict[int, list[Scope]] = {}
        self.rename: dict[str, str] = {}
        self.cast_cache: dict[tuple[str, int], str] = {}
        self.positions: list[int] = []  # sort keys of the graph's nodes while emit_scope runs
        self.quantized_inputs: set[str] = set()  # values read by QuantizeLinear
        self.folded: set[str] = set()  # Cast outputs some reader skipped (a Cast chain folded)
        self.has_qdq = False  # this scope or an enclosing one holds Q/DQ nodes

    def in_qdq_region(self, inputs: list[str], outputs: list[str]) -> bool:
        if not self.has_qdq:
            return False
        if any(n in self.quantized_inputs for n in outputs):
            return True
        for name in inputs:
            scope = self.owner(name) if name else None
            producer = scope.producer.get(name) if scope else None
            if producer is not None and producer.op in QDQ_PRODUCERS:
                return True
        return False

    def owner(self, name: str) -> Scope | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.defined:
                return scope
            scope = scope.parent
        return None

    def orig_type(self, name: str) -> int | None:
        scope = self.owner(name)
        return scope.orig.get(name) if scope else None

    def storage_type(self, name: str) -> int | None:
        scope = self.owner(name)
        if scope is None:
            return None
        return scope.storage.get(name, scope.orig.get(name))

    def scan_qdq(self, nodes: Sequence[NodeProto], op_types: list[str]) -> None:
        """Whether this scope (or an enclosing one) holds Q/DQ nodes, and the values QuantizeLinear reads."""
        present = set(op_types)
        self.quantized_inputs = (
            {n.input[0] for n in nodes if n.op_type in QDQ_CONSUMERS and n.input} if present & QDQ_CONSUMERS else set()
        )
        self.has_qdq = (
            bool(self.quantized_inputs)
            or (self.parent is not None and self.parent.has_qdq)
            or bool(present & QDQ_PRODUCERS)
        )

    def want(self, name: str, elem: int | None) -> None:
        """Record that a consumer reads `name` at `elem` (None: at any type)."""
        owner = self.owner(name)
        if owner is not None and elem is not None:
            owner.wants.setdefault(name, set()).add(elem)

    def record_outputs(self, decision: NodeDecision, outs: list[str]) -> None:
        """What the decide sweep learns from a decided node's outputs: their producer and storage
        type, and which become tracked (a source's). The sweep records a node of one named
        output itself, without this call; `record_reads` records its reads."""
        for k, name in enumerate(outs):
            if name:
                self.defined.add(name)
                self.producer[name] = decision
                if k in decision.output_types:
                    self.storage[name] = decision.output_types[k]
        if decision.source and outs and outs[0]:
            self.tracked.add(outs[0])

    def record_reads(self, decision: NodeDecision, ins: list[str], orig_type: Callable[[str], int | None]) -> None:
        """The types a decided node reads the values whose storage follows their consumers
        (`tracked`: initializers, sources; see StorePass) at: only those values' are recorded."""
        defined, tracked = self.defined, self.tracked
        nested = self.parent is not None
        input_types = decision.input_types
        owner: Scope | None
        for k, name in enumerate(ins):
            if name in tracked:
                owner = self
            elif nested and name and name not in defined:
                owner = self.owner(name)
                if owner is None or name not in owner.tracked:
                    continue
            else:
                continue
            elem = input_types[k] if k in input_types else orig_type(name)
            if elem is not None:
                wanted = owner.wants.get(name)
                if wanted is None:
                    owner.wants[name] = {elem}
                else:
                    wanted.add(elem)



class Conversion:
    """What the three passes of one conversion share: the model, the policy and options, the
    weights' source and sink, fresh names, and what they count for the report and for their
    honest `modified`."""

    def __init__(
        self,
        model: ModelProto,
        policy: Policy,
        options: ConvertOptions,
        source: WeightSource,
        sink: WeightSink,
        weights: bool = True,
        progress: Callable[[int], None] | None = None,
        fields: NodeFields | None = None,
    ) -> None:
        #: The main graph's nodes, read once for every pass (`types.NodeFields`; None: read them).
        self.fields = fields if fields is not None else NodeFields.read(model.graph)
        self.weights = weights
        self.progress = progress
        self.model = model
        self.policy = policy
        self.options = options
        self.source = source
        self.sink = sink
        self.opsets = opset_versions(model)
        self.fresh = FreshNames()
        self.casts_inserted = 0
        self.casts_removed = 0  # rule idle-cast
        # What the passes changed in the protobuf, so that each says so honestly (`passes`):
        self.edits = 0  # rewired inputs, renamed outputs, retyped values, attributes and weights
        self.saturated = 0  # f32 sources clamped to the low range (the store pass)
        self.relocated = False  # unconverted weights moved into the sink's file
        self.clamped: dict[str, ClampStats] = {}
        self.initializer_bytes_before = 0  # float initializers' bytes, as read and as written
        self.initializer_bytes_after = 0
        self.numeric = NumericFacts(model, source, self.fields)

    @property
    def changed(self) -> bool:
        """A Cast inserted or removed, or an edit: what the report says."""
        return bool(self.casts_inserted or self.casts_removed or self.edits)

    def opset(self, domain: str) -> int:
        return self.opsets.get(canonical_domain(domain), 1)

    def collect_names(self, graph: GraphProto, fields: NodeFields | None = None) -> None:
        """Names of the graph's declared values; node names and outputs are added while deciding.
        `fields`: the graph's, already read."""
        self.fresh.take([vi.name for vi in (*graph.input, *graph.output, *graph.value_info)])
        self.fresh.take([name for _, name, _ in initializer_rows(graph, fields)])

    def record_clamp(self, name: str, stats: ClampStats) -> None:
        if stats.clamped or stats.flushed:
            self.clamped[name] = stats
            if stats.clamped:
                logger.info("%s: %d values clamped (worst %g)", name, stats.clamped, stats.worst)


class Stage(enum.IntEnum):
    """Where a plan stands: each pass needs one stage and leaves the plan at the next."""

    NEW = 0
    DECIDED = 1  # every node has its decision
    STORED = 2  # every float value has its storage type
    EMITTED = 3  # the model is rewritten


@dataclass
class Plan:
    """The rewrite's decisions beside the model they are about: the main scope holds each
    node's `NodeDecision`, each value's original and storage type, and its bodies' scopes."""

    model: ModelProto
    main: Scope | None = None
    stage: int = Stage.NEW

    def scopes(self) -> Iterator[Scope]:
        """The main scope and every body's, each body after the scope that holds it."""
        pending = [self.main] if self.main is not None else []
        while pending:
            scope = pending.pop()
            yield scope
            for children in scope.children.values():
                pending.extend(children)

    def release(self) -> None:
        """Break the scopes' links to their bodies and parents (cycles): once the plan is
        dropped, what the passes built is freed by reference counting, with no garbage
        collection walking a few objects per node of the model."""
        for scope in list(self.scopes()):
            scope.children, scope.parent = {}, None
        self.main = None


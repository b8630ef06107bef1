"""Sweep 1 of the rewrite: each node's precision, or the first of the keep rules to stop it."""

from __future__ import annotations

import itertools
import logging

from onnx import NodeProto

from rlx_onnx_amp.passes import Pass, PassResult
from rlx_onnx_amp.precision import F32
from rlx_onnx_amp.rewrite.context import DecideContext
from rlx_onnx_amp.rewrite.plan import Conversion, NodeDecision, Plan, Scope, Stage
from rlx_onnx_amp.rewrite.rules import (
    KEEP_RULES,
    KEEPABLE_FROM,
    NODE_INDEPENDENT_RULES,
    PER_NODE_RULES,
    REASON_CODES,
    RULE_ORDER,
    RULES_BY_CODE,
    Effect,
    NodeFacts,
)
from rlx_onnx_amp.rewrite.templates import OMITTED, Outcome, Templates, Untyped, type_outputs
from rlx_onnx_amp.schema import signature
from rlx_onnx_amp.taxonomy import ANY_FLOAT_INPUTS, DEFAULT_DOMAINS, OpKind, kind_of
from rlx_onnx_amp.types import (
    ATTRIBUTE_TYPED_OUTPUTS,
    FreshNames,
    NodeFields,
    ScopeTypes,
    attribute_output_type,
    declared_types,
    infer_types,
    subgraphs,
)

__all__ = ["DecidePass"]

logger = logging.getLogger(__name__)


class DecidePass(Pass[Plan]):
    """Sweep 1: each node's precision, or the rule of `KEEP_RULES` that stops it.

    Requires a graph with nodes or outputs. Ensures one decision per node, in node order, in
    every scope; a reason exactly when the deciding rule's effect is KEEPS, a source exactly
    when it is FOLLOWS_CONSUMERS; lowered only float values that were f32 or already at the
    node's precision. Does not modify the model."""

    name, needs_stage, gives_stage = "decide", Stage.NEW, Stage.DECIDED

    def __init__(self, conversion: Conversion) -> None:
        self.cx = conversion
        self.context = DecideContext(conversion)
        # The per-node rules that can fire on this model (each rule's own `active`): the others
        # cost nothing per node.
        self.node_rules = tuple(r for r in PER_NODE_RULES if r.active is None or r.active(self.context))
        self.kind_precision = {k: conversion.policy.precision_for(k) for k in OpKind}
        self.templates = Templates()

    def requires(self, plan: Plan) -> None:
        if not plan.model.graph.node and not plan.model.graph.output:
            self.fail("needs a graph with nodes or outputs")

    def call(self, plan: Plan) -> PassResult:
        plan.main = self.decide_model()
        return PassResult(modified=False)

    def ensures(self, plan: Plan) -> None:
        for scope in plan.scopes():
            if len(scope.decisions) != len(scope.graph.node):
                self.fail(f"scope {scope.path!r}: {len(scope.decisions)} decisions for {len(scope.graph.node)} nodes")
            for i, (d, node) in enumerate(zip(scope.decisions, scope.graph.node)):
                if d.path != f"{scope.path}{i}" or d.op != node.op_type:
                    self.fail(f"decision {d.path} ({d.op}) is not about node {i} ({node.op_type}) of {scope.path!r}")
                problem = _decision_problem(scope, d)
                if problem:
                    self.fail(f"{d.label}: {problem}")

    def decide_model(self) -> Scope:
        """Sweep 1 over the whole model: the main scope, every node decided."""
        graph = self.cx.model.graph
        fields = self.cx.fields
        self.cx.collect_names(graph, fields)
        names = set(self.cx.fresh.taken)
        declared = declared_types(graph, fields)
        main = Scope(graph, "", None, declared or {}, fields)
        try:
            if declared is None:
                raise Untyped("a graph input or output is not a tensor")
            self.decide_scope(main, None)  # typed from the schemas as it goes
        except Untyped as e:
            logger.debug("schema typing gave up (%s); running onnx shape inference", e)
            self.cx.fresh = FreshNames(names)
            types = infer_types(self.cx.model)
            main = Scope(graph, "", None, types.get("", {}), fields)
            self.decide_scope(main, types)
        return main

    def decide_scope(self, scope: Scope, types: ScopeTypes | None) -> None:
        """Decide every node of `scope` (and of the bodies it holds) in node order.

        With `types=None` (the main graph of a model without control flow) values are typed
        as the sweep goes, from the op schemas; a value that cannot be typed for certain that
        way raises `Untyped`, and the caller starts over with onnx's inference.
        """
        # One read of each node's fields (`types.NodeFields`): the main graph's was read for every pass.
        fields = self.cx.fields if scope.parent is None else NodeFields.read(scope.graph)
        scope.scan_qdq(fields.nodes, fields.ops)
        orig, templates, prefix = scope.orig, self.templates, scope.path
        orig_type = orig.get if scope.parent is None else scope.orig_type  # main-graph names need no scope walk
        templated = not scope.has_qdq
        # Every output and node name is taken before the emit pass makes fresh ones.
        self.cx.fresh.take(itertools.chain.from_iterable(fields.outputs))
        self.cx.fresh.take(fields.names)
        # Bound once: the loop runs once per node of the graph.
        get_template, type_from = templates.get, templates.type_from
        append, record_outputs, record_reads = scope.decisions.append, scope.record_outputs, scope.record_reads
        nested = scope.parent is not None
        defined_add, tracked_add, tracked = scope.defined.add, scope.tracked.add, scope.tracked
        producer, storage = scope.producer, scope.storage
        no_bodies: list[Scope] = []
        holders = set(fields.holders)  # the nodes that may hold bodies; most graphs have none
        node_rules = self.node_rules
        # The main graph's Constants' attributes, as the load read them (`NodeFields.attributes`).
        attributes = fields.attributes if scope.parent is None else None
        rows = zip(fields.nodes, fields.ops, fields.domains, fields.inputs, fields.outputs, fields.names)
        for i, (node, op, domain, ins, outs, name) in enumerate(rows):
            path = f"{prefix}{i}"
            children = self._bodies(scope, node, path, types) if holders and i in holders else no_bodies
            if children:
                scope.children[i] = children
            key_types = (
                tuple(map(orig_type, ins)) if "" not in ins else tuple([orig_type(n) if n else OMITTED for n in ins])
            )
            # An attribute that types the output is part of the template key.
            attr_type = (
                attribute_output_type(node, op, attributes(i) if attributes else None)
                if op in ATTRIBUTE_TYPED_OUTPUTS and domain in DEFAULT_DOMAINS
                else None
            )
            key = (domain, op, key_types, attr_type, len(outs)) if templated and not children else None
            template = get_template(key) if key is not None else None
            # type_from's common case without a call: one named output, of no declared type.
            if template is not None and len(outs) == 1 and outs[0] and outs[0] not in orig:
                orig[outs[0]] = template.output_types[0]  # type: ignore[assignment]  # as type_from
                outcome = template.outcome
            elif template is not None and type_from(template, outs, orig):
                outcome = template.outcome
            else:
                facts, derived = self._facts(
                    node, path, scope, children, op, domain, ins, outs, key_types, attr_type, types
                )
                outcome = self._outcome(facts)
                if key is not None:
                    templates.offer(key, derived, facts.out_types, outs, domain, op, outcome)
            # The node's decision from its outcome (built here: once per node), then the per-node rules.
            kind, code, reason, precision, input_types, output_types, source, keepable = outcome
            if source:  # the store pass settles a source's precision on its own copy
                input_types, output_types = dict(input_types), dict(output_types)
            decision = NodeDecision(
                path, node, kind, op, domain, ins, outs, precision, input_types, output_types, reason, source,
                keepable, code, name,
            )
            if keepable and node_rules:
                self._apply_node_rules(decision, scope)
            append(decision)
            if children:
                self._decide_bodies(children, types)
            # What the sweep learns from the node: most have one named output, recorded here
            # without a call (`Scope.record_outputs` for the others).
            if len(outs) == 1 and outs[0]:
                out = outs[0]
                defined_add(out)
                producer[out] = decision
                if 0 in decision.output_types:
                    storage[out] = decision.output_types[0]
                if decision.source:
                    tracked_add(out)
            else:
                record_outputs(decision, outs)
            # A body reads outer values, which `record_reads` finds; a main-graph node's reads
            # matter only where it reads a tracked value.
            if nested or not tracked.isdisjoint(ins):
                record_reads(decision, ins, orig_type)
        if scope.parent is None:
            for out in scope.graph.output:
                scope.want(out.name, out.type.tensor_type.elem_type if self.cx.options.keep_io_types else None)

    def _decide_bodies(self, children: list[Scope], types: ScopeTypes | None) -> None:
        """Decide the bodies a node holds, right after the node."""
        for child in children:
            self.decide_scope(child, types)
            for out in child.graph.output:  # bodies hand back their original types
                child.want(out.name, child.orig_type(out.name))

    def _bodies(self, scope: Scope, node: NodeProto, path: str, types: ScopeTypes | None) -> list[Scope]:
        """The scopes of the bodies `node` holds (If/Loop/Scan, or a custom op with a graph)."""
        children = []
        for attr_key, sub in subgraphs(node):
            if types is None:
                raise Untyped(f"{node.op_type} holds a graph")
            child_path = f"{path}/{attr_key}/"
            children.append(Scope(sub, child_path, scope, types.get(child_path, {})))
            self.cx.collect_names(sub)
        return children

    def _apply_node_rules(self, d: NodeDecision, scope: Scope) -> None:
        """The rules that depend on the node itself (its name, its path, the values it reads),
        over a decision that may come from the template cache: one fires when it comes before
        the one that decided (`KEEP_RULES` order is the precedence); the node then keeps its
        original types."""
        decided = RULE_ORDER.get(d.code or "", len(KEEP_RULES))
        facts = NodeFacts(d.node, d.path, scope, d.op, d.domain, d.inputs, d.outputs, [], [], None, False, d.kind)
        facts.target = d.precision
        for rule in self.node_rules:
            if RULE_ORDER[rule.code] >= decided:
                return
            verdict = rule.check(self.context, facts)
            if verdict is not None:
                d.precision, d.reason, d.code = None, verdict.reason, rule.code
                d.input_types = {k: t for k, t in d.input_types.items() if t is None}  # any-float inputs stay any
                d.output_types = {}
                return

    def _facts(
        self,
        node: NodeProto,
        path: str,
        scope: Scope,
        children: list[Scope],
        op: str,
        domain: str,
        ins: list[str],
        outs: list[str],
        key_types: tuple[int | None, ...],
        attr_type: int | None,
        types: ScopeTypes | None,
    ) -> tuple[NodeFacts, list[int | None]]:
        """Type a node's outputs and gather what the rules read of it; also what the schema
        alone gives its outputs (`templates.type_outputs`)."""
        in_types = [None if t == OMITTED else t for t in key_types]
        sig = signature(domain, op, self.cx.opset(domain), len(ins), len(outs))
        derived, out_types = type_outputs(sig, attr_type, in_types, outs, scope.orig, types is None, op)
        return NodeFacts(node, path, scope, op, domain, ins, outs, in_types, out_types, sig, bool(children)), derived

    def _outcome(self, f: NodeFacts) -> Outcome:
        """What `KEEP_RULES` give one node whose values are typed: the first of them to fire,
        in their order, or the lowering when none does. The per-node rules are left to
        `_apply_node_rules`, over the template cache."""
        f.kind = kind = kind_of(f.domain, f.op)
        any_inputs: dict[int, int | None] = {k: None for k in ANY_FLOAT_INPUTS.get(f.op, ()) if k < len(f.ins)}
        f.any_inputs = tuple(any_inputs)
        f.target = target = self.kind_precision[kind] if kind is not None else None
        for rule in NODE_INDEPENDENT_RULES:
            verdict = rule.check(self.context, f)
            if verdict is not None:
                reported = verdict.reason if rule.effect is Effect.KEEPS else None
                keepable = RULE_ORDER[rule.code] > KEEPABLE_FROM
                source = rule.effect is Effect.FOLLOWS_CONSUMERS
                return Outcome(kind, rule.code, reported, None, {} if source else any_inputs, {}, source, keepable)
        assert target is not None and f.lowering is not None  # the lowering rules asked for it
        low, ins = target.elem_type, f.ins
        input_types: dict[int, int | None] = {**any_inputs, **{k: low for k in f.lowering.inputs if ins[k]}}
        return Outcome(kind, None, None, target, input_types, {k: low for k in f.lowering.outputs}, False, True)


def _decision_problem(scope: Scope, d: NodeDecision) -> str | None:
    """What breaks the decide pass's promise in `d` (see `DecidePass`), or None."""
    rule = RULES_BY_CODE.get(d.code) if d.code is not None else None
    reported = rule is not None and rule.effect is Effect.KEEPS
    if (d.code is not None and (rule is None or d.code not in REASON_CODES)) or (d.reason is not None) != reported:
        return f"reason {d.reason!r} with code {d.code!r}"
    if d.source != (rule is not None and rule.effect is Effect.FOLLOWS_CONSUMERS):
        return f"a source exactly when rule source-follows-consumers decided it (code {d.code!r})"
    low = d.precision.elem_type if d.precision is not None else None
    lowered = [(d.inputs[k], t) for k, t in d.input_types.items() if t is not None]
    lowered += [(d.outputs[k], t) for k, t in d.output_types.items()]
    for name, elem in lowered:
        if elem != low or scope.orig_type(name) not in (F32, low, None):
            return f"{name!r} lowered to {elem} (node at {d.precision}, value {scope.orig_type(name)})"
    if d.precision is not None and (d.reason is not None or not lowered):
        return f"at {d.precision.value} with nothing lowered, or with a reason to keep it"
    return None



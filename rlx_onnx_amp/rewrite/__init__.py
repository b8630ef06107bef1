"""The mixed-precision rewrite (docs/design.md, "Rewrite rules").

The rewrite is three passes with contracts (`DecidePass`, `StorePass`, `EmitPass`; see
`rlx_onnx_amp.passes`), each a sweep over every graph scope (main graph and If/Loop/Scan bodies)
of one `Plan` (`plan`):

1. **Decide.** Each node gets a precision from its op kind through the policy, unless a rule of
   `KEEP_RULES` stops it (the first that fires, in that order, decides: `Cast` keeps its `to`,
   Constant/ConstantOfShape are sources that follow their readers, a user keep, a kernel
   gap...); the type variables of a lowered node are lowered unless a rule of `VARIABLE_RULES`
   keeps one (Resize `scales`: rule type-variable).
2. **Store.** Each float value gets a storage type: node outputs from their producer's
   decision; initializers and Constant values are narrowed in place when every consumer wants
   the same low precision (rule source-follows-consumers); graph inputs and outputs keep their type (rule io-types).
3. **Emit.** Each consumer reads each input at the type it requires; a mismatch is served by
   one Cast per (value, type) in each scope (rule one-cast-per-value), or by the input of an existing widening
   Cast (a chain that adds nothing is folded). Graph outputs computed in low precision get a
   Cast back under their original name (rule names-kept).

Names of original values are kept on the values that carried them, so a verifier can compare
any intermediate tensor by name.

The modules: `plan` (options, decisions, scopes, the plan), `rules` (the keep and variable
rules as data, each reading a node's facts and a small `rules.RuleContext`), `context` (the
converter's context), `templates` (schema typing and the template cache), `decide`, `store`,
`emit` with `weights` (values retyped) and `summary` (the report), and `convert` (the three
passes run in order).

Cost: every sweep is linear in nodes and edges. The decide sweep also types the main graph's
values from the op schemas as it goes (starting over with onnx's inference when a value cannot
be typed that way: control flow, sequences, attribute-typed outputs), and nodes that repeat an
(op, input types, type attribute) share one template for output types and decision. Casts are
appended where they are made and sorted into place once; small weights and Constant values are
narrowed together in one numpy pass (`tensors.NarrowBatch`).
"""

from rlx_onnx_amp.rewrite.convert import (
    RewrittenModel,
    conversion_passes,
    convert_model,
    rewrite_model,
    summarize_plan,
)
from rlx_onnx_amp.rewrite.decide import DecidePass
from rlx_onnx_amp.rewrite.emit import EmitPass
from rlx_onnx_amp.rewrite.plan import ConvertOptions, NodeDecision, Plan, Stage
from rlx_onnx_amp.rewrite.rules import KEEP_RULES, REASON_CODES, RULES_BY_CODE, VARIABLE_RULES, KeepRule, VariableRule
from rlx_onnx_amp.rewrite.store import StorePass
from rlx_onnx_amp.rewrite.summary import why_not_keepable

__all__ = [
    "KEEP_RULES",
    "REASON_CODES",
    "RULES_BY_CODE",
    "VARIABLE_RULES",
    "ConvertOptions",
    "DecidePass",
    "EmitPass",
    "KeepRule",
    "NodeDecision",
    "Plan",
    "RewrittenModel",
    "Stage",
    "StorePass",
    "VariableRule",
    "conversion_passes",
    "convert_model",
    "rewrite_model",
    "summarize_plan",
    "why_not_keepable",
]

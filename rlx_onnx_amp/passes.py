"""Passes with contracts: the shape of the rewrite's sweeps (docs/design.md, "Passes").

A pass states what it needs of its input (`requires`), does its work (`call`) and states what
it guarantees (`ensures`); `call` also says whether it changed the model, and that answer is
checked. This is onnx-ir's pass contract (`requires`, `call`, `ensures`, `modified`), kept
small: the rewrite's passes work on a plan of decisions beside the model, not on the model
alone.

Contracts cost time (the last pass's postconditions run onnx's full checker, and the pipeline
converts its result again: `rewrite.convert.check_idempotent`), so `run_passes` checks them
only when asked: the tests ask on every fixture,
`ConvertOptions.check_contracts` asks for one conversion. A pass's order check (the stage its
plan must be at) always runs: it is one comparison.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

from onnx import ModelProto

__all__ = ["Pass", "PassContractError", "PassResult", "Planned", "run_passes"]


class PassContractError(RuntimeError):
    """A pass was run on an input it does not accept, or broke a promise: a bug, never bad input."""


@dataclass(frozen=True)
class PassResult:
    modified: bool  # whether the pass changed the model (its plan may change either way)


class Planned(Protocol):
    """What a pass works on: the model, and the stage of the plan beside it."""

    model: ModelProto
    stage: int


PlanT = TypeVar("PlanT", bound=Planned)


def fingerprint(model: ModelProto) -> str:
    """A digest of the model's serialized form: equal exactly when the protobufs are."""
    return hashlib.sha256(model.SerializeToString()).hexdigest()


class Pass(abc.ABC, Generic[PlanT]):
    """One pass. A subclass names itself, the stage its plan must be at and the stage it
    leaves it at; `requires` and `ensures` raise `PassContractError` through `fail`."""

    name: ClassVar[str]
    needs_stage: ClassVar[int]
    gives_stage: ClassVar[int]

    def requires(self, plan: PlanT) -> None:
        """Preconditions beyond the stage (checked only when contracts are)."""

    @abc.abstractmethod
    def call(self, plan: PlanT) -> PassResult:
        """The work; `modified` must be true exactly when the model's protobuf changed."""

    def ensures(self, plan: PlanT) -> None:
        """Postconditions (checked only when contracts are)."""

    def fail(self, promise: str) -> None:
        raise PassContractError(f"pass {self.name}: {promise}")

    def __call__(self, plan: PlanT, check: bool = False) -> PassResult:
        if plan.stage != self.needs_stage:
            self.fail(f"needs a plan at stage {self.needs_stage}, got one at stage {plan.stage}")
        before = ""
        if check:
            self.requires(plan)
            before = fingerprint(plan.model)
        result = self.call(plan)
        plan.stage = self.gives_stage
        if check:
            if (fingerprint(plan.model) != before) != result.modified:
                did = "did not change" if result.modified else "changed"
                self.fail(f"says modified={result.modified}, but the model {did}")
            self.ensures(plan)
        return result


def run_passes(plan: PlanT, passes: Sequence[Pass[PlanT]], check: bool = False) -> bool:
    """Run `passes` in order over `plan`; whether any modified the model."""
    modified = False
    for p in passes:
        modified = p(plan, check).modified or modified
    return modified

"""A gate of the report: one acceptance condition, the value it judged and its verdict, beside what it
could reach at this profile (evidence/attainability.py). The keys a gate carries in report.json say
what happened to it, so a gate keeps exactly those: `comparable` (False) and `reason` only where it
was shown not comparable (GPUs shared on purpose, the value kept), `evaluated` (False) and `reason`
only where it could not be evaluated — never a null in their place.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

ABSENT_UNLESS_SET = ("comparable", "evaluated", "reason")
"""The fields a gate has only in some cases: left out of its dump when unset, as report.json has them."""


class Gate(BaseModel):
    """Fields in the order the report's gates were always built (a dump is the dict written before)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: str  # its name, naming its threshold: "gain ≥ 5.0 pp"
    value: int | float | None  # None: not evaluated (ints stay ints: counts of requests, tasks, models)
    passed: bool | None  # None: not evaluated, or not comparable
    comparable: Literal[False] | None = None  # False: compares seconds of ranks that shared GPUs
    evaluated: Literal[False] | None = None  # False: what it needs is not in the home, or was not run
    reason: str | None = None  # why it was not evaluated, or not comparable
    attainable: bool | None  # could an outcome at this profile pass it (None: decided by measurement)
    attainability: str  # what this profile can detect, in words

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None or k not in ABSENT_UNLESS_SET}

    @property
    def failed(self) -> bool:
        return self.passed is False

    @property
    def unattainable_failure(self) -> bool:
        """Failed where no outcome at this profile could have passed: still failed, never hidden."""
        return self.passed is False and self.attainable is False

    @property
    def not_evaluated(self) -> bool:
        """No verdict, and not because GPUs were shared (those are `comparable` False instead)."""
        return self.passed is None and self.comparable is not False

"""recovery-comparison.json as a record: what `orchestrate recovery-trial` ran, how the kill went, and
every rank's final state compared with the uninterrupted run (and with its control). The writer
(orchestrate/recovery.py) seals it; the report (evidence/report/recovery.py) and `verify` read it
back through the same models, so what is written and what is read cannot drift apart."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evidence.sealed import Sealed

Number = int | float  # as given: an int stays an int and a float a float, so the JSON and its digest stay the same

_FACT = ConfigDict(extra="forbid", frozen=True)


class PartComparison(BaseModel):
    """One part of two rank states (`training.checkpoint.compare.compare_states`): tensors and elements
    compared, the largest |Δ|, and every difference that is not a number (shape, keys, NaN, -0.0)."""

    model_config = _FACT

    tensors: int
    elements: int
    max_abs_diff: Number
    mismatches: list[str]


class RankComparison(BaseModel):
    """One rank's final state in the two runs: a `PartComparison` per numerical part, each under the part's
    name (which parts: `training.checkpoint.compare.NUMERICAL_PARTS`, the arm kinds' among them)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, PartComparison] = Field(init=False)

    rank: int
    max_abs_diff: Number
    identical: bool

    @property
    def parts(self) -> dict[str, PartComparison]:
        return self.__pydantic_extra__


class Comparison(BaseModel):
    """Every rank's checkpointed state at `step` in two homes, tensor by tensor (`compare_homes`)."""

    model_config = _FACT

    step: int
    ranks: list[RankComparison]
    max_abs_diff: Number
    identical: bool
    final_parameter_digests_equal: bool


class Shared(BaseModel):
    """`--share-gpus`: this many ranks on this many GPUs."""

    model_config = _FACT

    ranks: int
    gpus: int


class Kill(BaseModel):
    """The fault asked for: this rank killed after this many updates (`TRIAL_FAULT_KILL`)."""

    model_config = _FACT

    rank: int
    after_update: int


class Failure(BaseModel):
    """The killed attempt as the supervisor saw it: when the rank died (its `fault.json`), when its failure
    was observed and the survivors stopped (unix times), and every rank's exit status."""

    model_config = _FACT

    killed_at: Number
    observed_rank: int | None
    reason: str | None  # the supervisor's `Reason` (a StrEnum), kept by its value
    observed_at: Number | None
    survivors_stopped_at: Number | None
    kill_to_observed_seconds: Number
    kill_to_survivors_stopped_seconds: Number
    exit_codes: list[int | None]


class Seconds(BaseModel):
    """Wall time of the uninterrupted run, and of the recovered one from its first start to its finish."""

    model_config = _FACT

    uninterrupted: Number
    recovered_total: Number


class Parting(BaseModel):
    """Where two runs of one arm first part: the first update (1-based) after the checkpoint they both
    start from whose loss or gradient norm differs on any rank (None: none does), and that rank. The
    loss of update u is computed from the parameters update u-1 left, so the first parting update
    bounds where the trajectories split."""

    model_config = _FACT

    update: int | None
    rank: int | None
    a: list[Number] | None = Field(None, description="(loss_sum_local, grad_norm) of the first run there")
    b: list[Number] | None = None


class Control(BaseModel):
    """The same arm resumed from the same checkpoint without a kill, against the uninterrupted run: whether
    the trajectory itself is reproducible here. Identical control, different recovery: the restart does
    not restore something. Different control: the numerics are not reproducible, and no recovery can be
    compared exactly (the profile's `deterministic`)."""

    model_config = _FACT

    comparison: Comparison
    parting: Parting
    seconds: Number


class RecoveryComparison(Sealed):
    """recovery-comparison.json: what was run, how the kill went, and the two runs' final states compared.
    It seals itself: `digest` is the canonical sha256 of every other field (`evidence.report.verify`
    checks it). A rank's checkpoint I/O and restore records are the ranks' own (`training.train`)."""

    model_config = _FACT

    format: str = "trial-recovery-comparison-v1"
    experiment: str
    profile: str
    arm: str
    world_size: int
    updates: int
    checkpoint_every: int
    device: str
    shared: Shared | None
    from_step: int
    kill: Kill
    failure: Failure
    resumed_from: list[int]
    comparison: Comparison
    checkpoint_io_per_rank: list[dict[str, Any]]
    restore_per_rank: list[dict[str, Any]]
    seconds: Seconds
    uninterrupted_final_parameters: list[str]
    # later fields: left out of the file while unset, so that every comparison written before them keeps its digest
    deterministic: bool | None = Field(None, description="the profile's `deterministic` (every kernel deterministic)")
    parting: Parting | None = Field(None, description="where the recovered run first parts from the uninterrupted")
    control: Control | None = None
    digest: str

    def body(self, *, exclude_digest: bool = False) -> dict[str, Any]:
        return {k: v for k, v in super().body(exclude_digest=exclude_digest).items()
                if v is not None or k not in ("deterministic", "parting", "control")}

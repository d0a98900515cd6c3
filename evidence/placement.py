"""The placement record: which arms the cluster can run, decided before anything trains.

`orchestrate run` decides it from the cluster's hosts and GPUs (orchestrate/placement.py), writes
`placement.json` and commits it as 'placement' before the first arm launches (once per home, before
the candidates). An arm the cluster cannot place is never launched, never a candidate and never
scored; it is reported as not run, with the reason, and every gate that needs it is shown as not
evaluated — neither passed nor failed. The selection rules do not change: the primary and serving
arms stay the ones the experiment names, whether they ran or not.

    {"format": "trial-placement-v1", "experiment", "profile", "device",
     "cluster": {"source", "hosts", "gpus_per_host", "controller_gpus", "gpus_from"},
     "arms": [{"arm", "kind", "world_size", "runs", "reason"[, "shared": {"ranks", "gpus"}]}, ...],
                                                                  reason: "not run: needs N GPUs, ..."
     "serving": {"arm", "replicas", "runs", "reason"[, "shared": {"replicas", "gpus"}]}}

`PlacementRecord` below is that record (`orchestrate` builds it, everything else reads it through
`committed_placement`); its dump is the dict written before, key for key.

"shared" (and the cluster's "share_gpus": true) only where the operator let processes share GPUs on
purpose (`orchestrate run --share-gpus`): an arm of N ranks ran on M < N GPUs. Its learning is as
real as on N GPUs; its timings are not, so the report marks every gate that compares times of such
an arm "not comparable", the figure shown, neither passed nor failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from evidence.canonical import read_json
from evidence.commitments import CommitmentLog

PLACEMENT = "placement.json"
FORMAT = "trial-placement-v1"
SERVING_PROBE = "serving probe"


class _Record(BaseModel):
    """A part of placement.json: its fields in the order the record was always built, so a dump is the
    dict written before (the file is canonical JSON, its keys sorted, so the bytes are the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _AbsentUnlessSet(_Record):
    """A part some of whose keys are written only in some cases (`ABSENT`: left out of the dump at
    their default, never a null or a false in their place — as the dicts were built)."""

    ABSENT: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items()
                if k not in self.ABSENT or v != type(self).model_fields[k].default}


class SharedRanks(_Record):
    """An arm's N ranks on M < N GPUs, shared on purpose."""

    ranks: int
    gpus: int

    @property
    def processes(self) -> str:
        return f"{self.ranks} ranks"


class SharedReplicas(_Record):
    """The serving probe's N replicas on M < N GPUs, shared on purpose."""

    replicas: int
    gpus: int

    @property
    def processes(self) -> str:
        return f"{self.replicas} replicas"


Shared = SharedRanks | SharedReplicas


class PlacementCluster(_AbsentUnlessSet):
    """What the cluster offered ranks when the placement was decided (orchestrate/placement.py's Devices)."""

    ABSENT: ClassVar[tuple[str, ...]] = ("share_gpus", "no_serve")

    source: str  # local | hosts | pulumi (orchestrate/cluster.py), or stack (a planned stack)
    hosts: int | None  # host slots; None: the embedded cluster without a description (any number of ranks)
    gpus_per_host: list[int | None]  # by rank; the local cluster: one entry, this machine's (None: unknown)
    controller_gpus: int | None  # this machine's, where the local cluster's serving probe runs
    gpus_from: str  # where the counts came from
    share_gpus: bool = False  # the operator's --share-gpus (written only when true)
    no_serve: bool = False  # the operator's --no-serve (written only when true)


class ArmPlacement(_AbsentUnlessSet):
    """One trained arm: whether it runs here, and why not."""

    ABSENT: ClassVar[tuple[str, ...]] = ("shared",)

    arm: str
    kind: str
    world_size: int
    runs: bool
    reason: str | None  # "not run: needs N GPUs, ..."; None when it runs
    shared: SharedRanks | None = None  # written only where its ranks share GPUs on purpose


class ServingPlacement(_AbsentUnlessSet):
    """The serving probe: its replicas of the serving arm, whether they run here, and why not."""

    ABSENT: ClassVar[tuple[str, ...]] = ("shared",)

    arm: str
    replicas: int
    runs: bool
    reason: str | None
    shared: SharedReplicas | None = None  # written only where its replicas share GPUs on purpose


class PlacementRecord(_Record):
    """placement.json: the decision for every trained arm and the serving probe, on this cluster."""

    format: str  # FORMAT
    experiment: str
    profile: str
    device: str  # the profile's: cuda | cpu
    cluster: PlacementCluster
    arms: list[ArmPlacement]
    serving: ServingPlacement


def committed_placement(home: str | Path) -> PlacementRecord | None:
    """The committed placement (its file re-hashed against the commitment), or None for a home that
    has none (prepared before placements were recorded: every arm ran)."""
    log = CommitmentLog(home)
    entry = log.latest("placement")
    if entry is None:
        return None
    log.verify_subject(entry)  # raises CommitmentError when the file changed
    return PlacementRecord.model_validate(read_json(Path(home) / entry["subject"]))


def not_run(placement: PlacementRecord | None) -> dict[str, str]:
    """Arm → reason, for every arm the placement did not run; the serving probe under
    `SERVING_PROBE` when it cannot run."""
    if placement is None:
        return {}
    out = {a.arm: a.reason for a in placement.arms if not a.runs}
    if not placement.serving.runs:
        out[SERVING_PROBE] = placement.serving.reason
    return out


def shared(placement: PlacementRecord | None) -> dict[str, Shared]:
    """Arm (or `SERVING_PROBE`) → how many ranks (replicas) shared how many GPUs, for what the
    placement ran on GPUs shared on purpose."""
    if placement is None:
        return {}
    out: dict[str, Shared] = {a.arm: a.shared for a in placement.arms if a.runs and a.shared}
    sv = placement.serving
    if sv.runs and sv.shared:
        out[SERVING_PROBE] = sv.shared
    return out


def shared_text(what: str, s: Shared) -> str:
    return f"{what}: {s.processes} shared {s.gpus} GPU{'s' if s.gpus != 1 else ''}"


TIMING_GATES = ("active time ≤", "active speedup ≥", "whole speedup ≥")
"""The gates that compare seconds (evidence/report/compute.py names them so): on shared GPUs they
are not comparable; every other gate (accuracy, noninferiority, retention, bytes, schedules,
recovery, serving) does not depend on where a rank ran."""


def not_comparable(gate: dict[str, Any], arms: tuple[str, ...], on_shared: dict[str, Shared]) -> dict[str, Any]:
    """`gate` as evaluated, unless it compares times and one of `arms` ran on shared GPUs: then its
    value stays, passed is None and the reason names who shared what — never passed, never failed."""
    why = [shared_text(a, on_shared[a]) for a in arms if a in on_shared]
    if not why or not gate["gate"].startswith(TIMING_GATES):
        return gate
    return {**gate, "passed": None, "comparable": False, "reason": "not comparable: " + "; ".join(why)}


def rule_gates(acc: dict[str, Any], primary: str, baseline: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every acceptance gate the report evaluates from the experiment's rules, with the arms it needs
    (names as evidence/report/compute.py writes them; tests/orchestrate/test_placement.py checks that they agree)."""
    out: list[tuple[str, tuple[str, ...]]] = [
        (f"gain ≥ {acc['min_gain_pp']} pp", (primary, baseline)),
        (f"McNemar p ≤ {acc['p_max']}", (primary, baseline)),
        (f"retention upper bound ≤ +{acc['retention_max_nats']} nats", (primary, baseline)),
    ]
    if acc.get("noninferiority_vs"):
        out.append((f"noninferiority lower bound ≥ {acc['noninferiority_pp']} pp vs {acc['noninferiority_vs']}",
                    (primary, acc["noninferiority_vs"])))
    if acc.get("max_bytes_ratio_vs"):
        out.append((f"bytes ≤ {acc['max_bytes_ratio']} × {acc['max_bytes_ratio_vs']}",
                    (primary, acc["max_bytes_ratio_vs"])))
        if acc.get("max_active_ratio"):
            out.append((f"active time ≤ {acc['max_active_ratio']} × {acc['max_bytes_ratio_vs']}",
                        (primary, acc["max_bytes_ratio_vs"])))
    if acc.get("min_speedup_vs"):
        for k in ("active", "whole"):
            out.append((f"{k} speedup ≥ {acc['min_speedup']}", (primary, acc["min_speedup_vs"])))
    return out


def not_evaluated(gate: str, reason: str) -> dict[str, Any]:
    """A gate that could not be evaluated: no value, neither passed nor failed."""
    return {"gate": gate, "value": None, "passed": None, "evaluated": False, "reason": reason}


def unevaluated_gates(acc: dict[str, Any], primary: str, baseline: str, skipped: dict[str, str],
                      present: set[str]) -> list[dict[str, Any]]:
    """Every rule gate the report could not evaluate, so none disappears: one that needs an arm the
    placement did not run says so; any other says what it lacks (before, a seed whose only test
    attempt had not finished silently took the primary gates out of the report)."""
    out = []
    for gate, arms in rule_gates(acc, primary, baseline):
        if gate in present:
            continue
        missing = [a for a in arms if a in skipped]
        out.append(not_evaluated(gate, "; ".join(f"{a} {skipped[a]}" for a in missing) if missing else
                                 f"what it needs of {' and '.join(arms)} is not in the home (a finished test "
                                 "evaluation, its probes, a training result)"))
    return out

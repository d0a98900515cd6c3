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

"shared" (and the cluster's "share_gpus": true) only where the operator let processes share GPUs on
purpose (`orchestrate run --share-gpus`): an arm of N ranks ran on M < N GPUs. Its learning is as
real as on N GPUs; its timings are not, so the report marks every gate that compares times of such
an arm "not comparable", the figure shown, neither passed nor failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evidence.canonical import read_json
from evidence.commitments import CommitmentLog

PLACEMENT = "placement.json"
FORMAT = "trial-placement-v1"
SERVING_PROBE = "serving probe"


def committed_placement(home: str | Path) -> dict[str, Any] | None:
    """The committed placement (its file re-hashed against the commitment), or None for a home that
    has none (prepared before placements were recorded: every arm ran)."""
    log = CommitmentLog(home)
    entry = log.latest("placement")
    if entry is None:
        return None
    log.verify_subject(entry)  # raises CommitmentError when the file changed
    return read_json(Path(home) / entry["subject"])


def not_run(placement: dict[str, Any] | None) -> dict[str, str]:
    """Arm → reason, for every arm the placement did not run; the serving probe under
    `SERVING_PROBE` when it cannot run."""
    if placement is None:
        return {}
    out = {a["arm"]: a["reason"] for a in placement["arms"] if not a["runs"]}
    sv = placement.get("serving")
    if sv and not sv["runs"]:
        out[SERVING_PROBE] = sv["reason"]
    return out


def shared(placement: dict[str, Any] | None) -> dict[str, dict[str, int]]:
    """Arm (or `SERVING_PROBE`) → {"ranks" or "replicas", "gpus"}, for what the placement ran on
    GPUs shared on purpose."""
    if placement is None:
        return {}
    out = {a["arm"]: a["shared"] for a in placement["arms"] if a.get("runs") and a.get("shared")}
    sv = placement.get("serving") or {}
    if sv.get("runs") and sv.get("shared"):
        out[SERVING_PROBE] = sv["shared"]
    return out


def shared_text(what: str, s: dict[str, int]) -> str:
    n, unit = (s["ranks"], "ranks") if "ranks" in s else (s["replicas"], "replicas")
    return f"{what}: {n} {unit} shared {s['gpus']} GPU{'s' if s['gpus'] != 1 else ''}"


TIMING_GATES = ("active time ≤", "active speedup ≥", "whole speedup ≥")
"""The gates that compare seconds (evidence/report/compute.py names them so): on shared GPUs they
are not comparable; every other gate (accuracy, noninferiority, retention, bytes, schedules,
recovery, serving) does not depend on where a rank ran."""


def not_comparable(gate: dict[str, Any], arms: tuple[str, ...], on_shared: dict[str, dict[str, int]]
                   ) -> dict[str, Any]:
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

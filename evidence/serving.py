"""The serving probe's fixed workload, its figures, and the report's check of a committed probe.

The probe (orchestrate) and the report (here) share one definition of the workload and one way of
computing a phase's figures, so the report recomputes every number from the per-request records and
refuses the evidence when a stored figure, the workload or a receipt disagrees with them.

    serving/attempt-<n>/plan.json       arm, replicas, concurrency, attempts bound, what was stopped
    serving/attempt-<n>/warmup.json     four identical development cases per replica, distinct IDs
    serving/attempt-<n>/<phase>.json    single · replicas · failure: every request, every attempt
    serving/attempt-<n>/receipt.json    committed as 'serving'
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from evidence.canonical import read_json
from evidence.receipts import verify_receipt

PHASES = ("single", "replicas", "failure")
REQUESTS = 64
"""Requests per phase unless the profile sets `serving_requests` (the studies' 64; a smoke profile fewer:
the probe's fixed workload was over a third of a smoke trial's time). Committed with the profile."""
CONCURRENCY = 4
MAX_ATTEMPTS = 4
WARMUP_CASES = 4


class ServingEvidenceError(RuntimeError):
    """A committed serving probe whose files, workload or figures disagree."""


def requests_of(prepared: dict[str, Any]) -> int:
    """Requests per phase of the home's committed profile (`prepared.json`): its `serving_requests`, or
    the studies' 64 for a profile that sets none (homes prepared before the setting existed included)."""
    return prepared["experiment"]["profile"].get("serving_requests") or REQUESTS


def workload(dev_ids: list[str], phase: str, n: int = REQUESTS) -> list[dict[str, str]]:
    """The fixed requests of one phase: the development tasks in ID order, cycled to n requests.
    Request IDs are unique per phase so one phase's answers never come from another's cache."""
    ids = sorted(dev_ids)
    return [{"request_id": f"{phase}-{i:03d}", "task_id": ids[i % len(ids)]} for i in range(n)]


def warmup_workload(dev_ids: list[str], replica: str) -> list[dict[str, str]]:
    ids = sorted(dev_ids)[:WARMUP_CASES]
    return [{"request_id": f"warmup-{replica}-{k}", "task_id": t} for k, t in enumerate(ids)]


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def phase_figures(records: list[dict[str, Any]], wall_seconds: float) -> dict[str, Any]:
    """Completed/failed requests, every retry, latency percentiles of completed requests (first
    attempt's start to the answer, retries included) and throughput over the phase's wall time."""
    done = [r for r in records if r["outcome"] == "ok"]
    lat = [r["latency_seconds"] for r in done]
    attempts = sum(len(r["attempts"]) for r in records)
    return {
        "requests": len(records), "completed": len(done), "failed": len(records) - len(done),
        "attempts": attempts, "retries": attempts - len(records),
        "requests_retried": sum(len(r["attempts"]) > 1 for r in records),
        "cached_answers": sum(bool(r.get("response", {}).get("cached")) for r in done),
        "wall_seconds": wall_seconds,
        "throughput_rps": len(done) / wall_seconds if wall_seconds > 0 else None,
        "latency_seconds": {f"p{q}": percentile(lat, q) for q in (50, 90, 99)} | {"max": max(lat, default=None)},
        "per_endpoint_answers": _count(r["response"]["replica"] for r in done),
    }


def derived_figures(records: list[dict[str, Any]], wall_seconds: float) -> dict[str, Any]:
    """Figures the report derives from a phase's records beside the stored ones (which stay as the
    probe wrote them, so earlier probes still verify): the p95 latency, and the tokens the replicas
    generated for completed requests, per second of the phase's wall time (cached answers count no
    generation)."""
    done = [r for r in records if r["outcome"] == "ok"]
    generated = sum(len(r["response"]["token_ids"]) for r in done if not r["response"].get("cached"))
    return {"latency_p95_seconds": percentile([r["latency_seconds"] for r in done], 95),
            "generated_tokens": generated,
            "generated_tokens_per_second": generated / wall_seconds if wall_seconds > 0 else None}


def _count(xs) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def comparisons(phases: dict[str, dict[str, Any]], warmup: list[dict[str, Any]]) -> dict[str, Any]:
    """Across phases: throughput ratio, failover overhead, token and model identity per task."""
    # written by run_phase (the report checks them first), with what the report derives beside them
    fig = {p: {**d["figures"], **derived_figures(d["requests"], d["wall_seconds"])} for p, d in phases.items()}
    tokens: dict[str, set[tuple[int, ...]]] = {}
    models: set[str] = set()
    for rec in [*warmup, *(r for d in phases.values() for r in d["requests"])]:
        if rec["outcome"] == "ok":
            tokens.setdefault(rec["task_id"], set()).add(tuple(rec["response"]["token_ids"]))
            models.add(rec["response"]["model"]["receipt_digest"] + "/" + rec["response"]["model"]["parameters_sha256"])
    out: dict[str, Any] = {
        "tasks_answered": len(tokens),
        "tasks_with_differing_tokens": sorted(t for t, v in tokens.items() if len(v) > 1),
        "model_identities": sorted(models),
    }
    s, m, f = (fig.get(p) for p in PHASES)
    if s and m and s["throughput_rps"] and m["throughput_rps"] is not None:
        out["throughput_ratio_replicas_vs_single"] = m["throughput_rps"] / s["throughput_rps"]
    if m and f and m["completed"] and f["completed"]:
        out["failover"] = {
            "extra_retries": f["retries"] - m["retries"],
            "extra_latency_p50_seconds": f["latency_seconds"]["p50"] - m["latency_seconds"]["p50"],
            "extra_latency_p90_seconds": f["latency_seconds"]["p90"] - m["latency_seconds"]["p90"],
            "wall_ratio_failure_vs_replicas": f["wall_seconds"] / m["wall_seconds"],
        }
    return {"phases": fig, **out}


def check_probe(home: Path, entry: dict[str, Any], dev_ids: list[str], model: dict[str, str], *,
                requests: int) -> dict[str, Any]:
    """Recompute a committed probe's figures; raise ServingEvidenceError on any inconsistency.
    `model`: the receipt digest the selection names for the serving arm, and that arm's name;
    `requests`: the committed profile's requests per phase (`requests_of`)."""
    d = home / Path(entry["subject"]).parent
    receipt = read_json(home / entry["subject"])
    try:
        verify_receipt(d, receipt, what=f"serving probe {d.relative_to(home)}", exclude=["started.json"])
    except Exception as e:  # noqa: BLE001
        raise ServingEvidenceError(str(e)) from None
    if entry["data"].get("receipt_digest") != receipt["digest"]:
        raise ServingEvidenceError(f"{d}: its receipt is not the one committed")
    plan = read_json(d / "plan.json")
    if plan["arm"] != model["arm"]:
        raise ServingEvidenceError(f"{d}: served {plan['arm']}, the selection's serving arm is {model['arm']}")
    warm = read_json(d / "warmup.json")["requests"]
    want_warm = [w for name in plan["replicas"] for w in warmup_workload(dev_ids, name)]
    if [(r["request_id"], r["task_id"]) for r in warm] != [(w["request_id"], w["task_id"]) for w in want_warm]:
        raise ServingEvidenceError(f"{d / 'warmup.json'}: not the fixed four-case warmup on every replica")
    if plan["concurrency"] != CONCURRENCY:
        raise ServingEvidenceError(f"{d / 'plan.json'}: client concurrency {plan['concurrency']}, "
                                   f"the workload fixes {CONCURRENCY}")
    stopped = plan.get("stopped") or {}
    if stopped.get("replica") not in plan["replicas"]:
        raise ServingEvidenceError(f"{d / 'plan.json'}: the failure phase stopped no advertised replica "
                                   f"({stopped.get('replica')!r})")
    if plan["requests"] != requests or plan["max_attempts"] > MAX_ATTEMPTS:
        raise ServingEvidenceError(f"{d / 'plan.json'}: {plan['requests']} requests with up to "
                                   f"{plan['max_attempts']} attempts; the committed profile fixes {requests} and "
                                   f"{MAX_ATTEMPTS}")
    phases = {}
    for p in PHASES:
        data = read_json(d / f"{p}.json")
        if [(r["request_id"], r["task_id"]) for r in data["requests"]] != \
                [(w["request_id"], w["task_id"]) for w in workload(dev_ids, p, requests)]:
            raise ServingEvidenceError(f"{d / (p + '.json')}: not the fixed {requests}-request workload")
        for r in data["requests"]:
            if len(r["attempts"]) > plan["max_attempts"]:
                raise ServingEvidenceError(f"{d / (p + '.json')}: request {r['request_id']} made "
                                           f"{len(r['attempts'])} attempts; the bound is {MAX_ATTEMPTS}")
            ok = r["outcome"] == "ok"
            if ok != (bool(r["attempts"]) and r["attempts"][-1].get("status") == 200 and "response" in r):
                raise ServingEvidenceError(f"{d / (p + '.json')}: request {r['request_id']}'s outcome "
                                           "disagrees with its attempts")
            if ok and (r["response"]["request_id"], r["response"]["task_id"]) != (r["request_id"], r["task_id"]):
                raise ServingEvidenceError(f"{d / (p + '.json')}: request {r['request_id']} was answered "
                                           f"for {r['response']['request_id']}/{r['response']['task_id']}")
        advertised = 1 if p == "single" else len(plan["replicas"])
        if p == "failure" and data.get("stopped") != stopped:
            raise ServingEvidenceError(f"{d / 'failure.json'}: does not name the stopped replica the plan names")
        if data["max_attempts"] != plan["max_attempts"]:
            raise ServingEvidenceError(f"{d / (p + '.json')}: attempt bound {data['max_attempts']}, "
                                       f"the plan's is {plan['max_attempts']}")
        if data["concurrency"] != CONCURRENCY or len(data["endpoints"]) != advertised:
            raise ServingEvidenceError(f"{d / (p + '.json')}: concurrency {data['concurrency']} over "
                                       f"{len(data['endpoints'])} endpoints; the phase fixes {CONCURRENCY} "
                                       f"over {advertised}")
        if phase_figures(data["requests"], data["wall_seconds"]) != data["figures"]:
            raise ServingEvidenceError(f"{d / (p + '.json')}: stored figures differ from its own records")
        phases[p] = data
    comp = comparisons(phases, warm)
    expected = f"{model['receipt_digest']}/"
    comp["model_matches_selection"] = bool(comp["model_identities"]) and \
        all(m.startswith(expected) for m in comp["model_identities"]) and len(comp["model_identities"]) == 1
    comp["replicas"] = len(plan["replicas"])
    comp["requests"] = requests
    comp["stopped"] = plan.get("stopped")
    comp["attempt"] = d.name
    return comp


def gates(comp: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The serving conditions: every request of every phase answered within the attempt bound, the
    same tokens for every task across phases and replicas, one model — the selected one."""
    if comp is None:
        return [{"gate": PROBE_GATE, "value": 0, "passed": False}]
    done = min(f["completed"] for f in comp["phases"].values())
    answered, identical, identity = gate_names(comp["requests"])
    return [
        {"gate": answered, "value": done, "passed": done == comp["requests"]},
        {"gate": identical, "value": len(comp["tasks_with_differing_tokens"]),
         "passed": not comp["tasks_with_differing_tokens"]},
        {"gate": identity, "value": len(comp["model_identities"]), "passed": comp["model_matches_selection"]},
    ]


def gate_names(requests: int) -> tuple[str, str, str]:
    """The serving gates' names at `requests` per phase (a probe the placement could not run lists
    them as not evaluated). Every one starts with "serving", as `PROBE_GATE` does."""
    return (f"serving: all {requests} requests answered in every phase (≤ {MAX_ATTEMPTS} attempts)",
            "serving: identical greedy tokens per task across phases and replicas",
            "serving: one model identity, the selected serving model")


PROBE_GATE = "serving probe committed"
"""The one gate a home without a committed probe shows instead (failed)."""

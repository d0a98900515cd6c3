"""The serving probe's fixed workload, its figures, and the report's check of a committed probe.

The probe (orchestrate) and the report (here) share one definition of the workload and one way of
computing a phase's figures, so the report recomputes every number from the per-request records and
refuses the evidence when a stored figure, the workload or a receipt disagrees with them.

    serving/attempt-<n>/plan.json            arm, replicas, concurrency levels, attempts bound, what was
                                             stopped, where each replica ran and what its engine said
    serving/attempt-<n>/warmup.json          four identical development cases per replica, distinct IDs
    serving/attempt-<n>/<phase>-c<c>.json    single · replicas · failure, each at every concurrency level
                                             c of the committed sweep: every request, every attempt
    serving/attempt-<n>/receipt.json         committed as 'serving'

Probes committed before the sweep ran each phase once at CONCURRENCY in flight (`<phase>.json`, an
integer `concurrency` in plan.json); they verify and report as they always did (`_check_one_level`).

A phase at level c keeps c requests in flight (a closed loop of c workers). Its capacity figures
(generated tokens per second in all, per replica and per device; latency and the replica's time to
first token) are held against the memory-bandwidth bound of the devices that answered (`bounds`): one
decode step reads a replica's weights once and yields one token per row in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evidence.canonical import read_json
from evidence.receipts import verify_receipt

PHASES = ("single", "replicas", "failure")
REQUESTS = 64
"""Requests per phase unless the profile sets `serving_requests` (the studies' 64; a smoke profile fewer:
the probe's fixed workload was over a third of a smoke trial's time). Committed with the profile."""
CONCURRENCY = 4
"""In flight in every phase of a probe committed before the sweep (one level per phase)."""
LEVELS = (1, 4, 16, 64)
"""The studies' concurrency sweep, for a profile that sets no `serving_concurrency` (cut at its requests
per phase: a level above them could never have that many in flight)."""
MAX_ATTEMPTS = 4
WARMUP_CASES = 4


class ServingEvidenceError(RuntimeError):
    """A committed serving probe whose files, workload or figures disagree."""


def requests_of(prepared: dict[str, Any]) -> int:
    """Requests per phase of the home's committed profile (`prepared.json`): its `serving_requests`, or
    the studies' 64 for a profile that sets none (homes prepared before the setting existed included)."""
    return prepared["experiment"]["profile"].get("serving_requests") or REQUESTS


def committed_levels(prepared: dict[str, Any]) -> tuple[int, ...] | None:
    """The committed profile's own `serving_concurrency` (None: it sets none)."""
    v = prepared["experiment"]["profile"].get("serving_concurrency")
    return tuple(v) if v else None


def sweep(requests: int, levels: Sequence[int] | None = None) -> tuple[int, ...]:
    """The concurrency levels a probe of `requests` per phase runs: `levels` as set, or the studies'
    sweep up to `requests`. `training.config` refuses a set level above the requests."""
    return tuple(levels) if levels else tuple(c for c in LEVELS if c <= requests)


def levels_of(prepared: dict[str, Any]) -> tuple[int, ...]:
    """The concurrency levels of the home's committed profile, in the order the probe runs them."""
    return sweep(requests_of(prepared), committed_levels(prepared))


def run_name(phase: str, level: int | None) -> str:
    """A phase's run at one level, as its file stem and its key among the figures (`single-c16`);
    a probe from before the sweep: the phase alone."""
    return phase if level is None else f"{phase}-c{level}"


def workload(dev_ids: list[str], phase: str, n: int = REQUESTS, level: int | None = None) -> list[dict[str, str]]:
    """The fixed requests of one phase (at one concurrency level): the development tasks in ID order,
    cycled to n requests. Request IDs are unique per phase and level (`single-c16-003`) so no answer
    comes from another run's retry cache."""
    ids = sorted(dev_ids)
    return [{"request_id": f"{run_name(phase, level)}-{i:03d}", "task_id": ids[i % len(ids)]} for i in range(n)]


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


def level_figures(records: list[dict[str, Any]], wall_seconds: float, devices: dict[str, str]) -> dict[str, Any]:
    """A phase's figures at one concurrency level, as the probe stores them and the report recomputes
    them: `phase_figures` and `derived_figures`, and its capacity — the generated tokens per second of
    each replica and of each device (`devices`: replica → the device it ran on, `devices_of`; a device
    that several replicas share is marked, their tokens summed: their scaling is not a device's), and
    the replica's own clocks where its answers carry them (server side, from accepting the request:
    first token generated, queue wait, answer). A clock the replica did not report is counted as
    absent (`answers`), never as zero."""
    fresh = [r["response"] for r in records if r["outcome"] == "ok" and not r["response"].get("cached")]
    tokens: dict[str, int] = {}
    for resp in fresh:
        tokens[resp["replica"]] = tokens.get(resp["replica"], 0) + len(resp["token_ids"])
    per_device: dict[str, dict[str, Any]] = {}
    for name, key in sorted(devices.items()):
        dev = per_device.setdefault(key, {"replicas": [], "generated_tokens": 0})
        dev["replicas"].append(name)
        dev["generated_tokens"] += tokens.get(name, 0)
    for dev in per_device.values():
        dev["shared"] = len(dev["replicas"]) > 1
        dev["generated_tokens_per_second"] = _rate(dev["generated_tokens"], wall_seconds)
    return {**phase_figures(records, wall_seconds), **derived_figures(records, wall_seconds),
            "time_to_first_token_seconds": _clock(fresh, "first_token_seconds"),
            "queue_seconds": _clock(fresh, "queue_seconds"),
            "generate_seconds": _clock(fresh, "generate_seconds"),
            "per_replica": {name: {"generated_tokens": n, "generated_tokens_per_second": _rate(n, wall_seconds)}
                            for name, n in sorted(tokens.items())},
            "per_device": per_device}


def _rate(n: float, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def _clock(responses: list[dict[str, Any]], key: str) -> dict[str, Any]:
    xs = [r[key] for r in responses if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return {"p50": percentile(xs, 50), "p95": percentile(xs, 95), "answers": len(xs)}


def device_key(place: dict[str, Any]) -> str:
    """Where a replica ran, as one name: its host and device as the backend placed it."""
    if place.get("host") and place.get("device"):
        return f"{place['host']} {place['device']}"
    return f"{place['replica']} (device not known)"  # shares with no one that we know of


def devices_of(placement: list[dict[str, Any]]) -> dict[str, str]:
    """replica → `device_key`, from plan.json's `placement`."""
    return {p["replica"]: device_key(p) for p in placement}


def sharing(placement: list[dict[str, Any]]) -> dict[str, list[str]]:
    """replica → the other replicas placed on its device (what `shares_device_with` records)."""
    dev = devices_of(placement)
    return {r: sorted(o for o in dev if o != r and dev[o] == dev[r]) for r in dev}


def answering(phase: str, replicas: list[str], stopped: str | None) -> list[str]:
    """The replicas a phase sends its requests to and that could answer: the first alone, all of
    them, or all but the one stopped."""
    if phase == "single":
        return replicas[:1]
    return [r for r in replicas if not (phase == "failure" and r == stopped)]


def rows_in_flight(level: int, replicas: list[str]) -> dict[str, float]:
    """The level's requests in flight split evenly over the replicas answering (the probe routes
    request i to replica i mod N): the rows each one's decode steps carry on average — a fraction
    where fewer are in flight than replicas answer (at 1 in flight over 2, each carries one half the
    time), so that no replica that answered is bounded at zero."""
    return {r: level / len(replicas) for r in replicas}


def _bandwidth(engines: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """A device's memory bandwidth as its replicas' engines reported it: its specification's, else
    what a replica measured by copying, else not known."""
    for key, source in (("bandwidth_bytes_per_s", "device specification"),
                        ("measured_copy_bytes_per_s", "measured copy bandwidth")):
        for e in engines:
            v = e.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return float(v), source
    return None, None


def bounds(fig: dict[str, Any], placement: list[dict[str, Any]], level: int, replicas: list[str]) -> dict[str, Any]:
    """Generated tokens per second against the memory-bandwidth bound of the devices that answered.
    One decode step reads a replica's weights once and yields one token per row it carries, so a
    device of bandwidth B whose answering replicas carry rows r_i (`rows_in_flight`, at most each
    engine's slots) over weights w_i yields at most B × Σ r_i / Σ w_i tokens per second: for one
    replica min(c, slots) × B / w; replicas sharing a device share its bound. The phase's bound is the
    sum over its devices; not known where any answering replica did not report its engine."""
    engines = {p["replica"]: p.get("engine") or {} for p in placement}
    devices = devices_of(placement)
    rows = rows_in_flight(level, replicas)
    per_device, known = [], True
    for key in sorted({devices[r] for r in replicas}):
        on = [r for r in replicas if devices[r] == key]
        engs = [engines[r] for r in on]
        bw, source = _bandwidth(engs)
        ok = all(isinstance(e.get("slots"), int) and e["slots"] >= 1 and isinstance(e.get("weights_bytes"), int)
                 and e["weights_bytes"] > 0 for e in engs)
        carried = sum(min(rows[r], engines[r]["slots"]) for r in on) if ok else None
        weights = sum(engines[r]["weights_bytes"] for r in on) if ok else None
        bound = bw * carried / weights if ok and bw else None
        got = fig["per_device"].get(key, {}).get("generated_tokens_per_second")
        per_device.append({
            "device": key, "replicas": on, "shared_with": sorted(r for r in devices if devices[r] == key and r not in on),
            "rows_in_flight": carried, "weights_bytes": weights, "bandwidth_bytes_per_s": bw, "bandwidth": source,
            "bound_tokens_per_second": bound, "generated_tokens_per_second": got,
            "fraction_of_bound": got / bound if bound and got is not None else None,
            **({} if bound else {"unknown": "no engine reported" if not ok else "no bandwidth reported"})})
        known = known and bound is not None
    total = sum(d["bound_tokens_per_second"] for d in per_device) if known and per_device else None
    got = fig.get("generated_tokens_per_second")
    return {"devices": per_device, "bound_tokens_per_second": total, "generated_tokens_per_second": got,
            "fraction_of_bound": got / total if total and got is not None else None}


def _count(xs) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _between(s: dict[str, Any] | None, m: dict[str, Any] | None, f: dict[str, Any] | None) -> dict[str, Any]:
    """One replica against N, and N against N with one stopped (the same concurrency)."""
    out: dict[str, Any] = {}
    if s and m and s["throughput_rps"] and m["throughput_rps"] is not None:
        out["throughput_ratio_replicas_vs_single"] = m["throughput_rps"] / s["throughput_rps"]
    if m and f and m["completed"] and f["completed"]:
        out["failover"] = {
            "extra_retries": f["retries"] - m["retries"],
            "extra_latency_p50_seconds": f["latency_seconds"]["p50"] - m["latency_seconds"]["p50"],
            "extra_latency_p90_seconds": f["latency_seconds"]["p90"] - m["latency_seconds"]["p90"],
            "wall_ratio_failure_vs_replicas": f["wall_seconds"] / m["wall_seconds"],
        }
    return out


def comparisons(phases: dict[str, dict[str, Any]], warmup: list[dict[str, Any]],
                plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Across phases (at each concurrency level of a sweep): throughput ratio, failover overhead,
    token and model identity per task — pooled over every phase, replica and level — and, for a
    sweep, each run's bandwidth bound (`bounds`, from `plan`'s placement)."""
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
    if plan is None or "levels" not in plan:  # a probe from before the sweep: one run per phase
        return {"phases": fig, **out, **_between(*(fig.get(p) for p in PHASES))}
    stopped = (plan.get("stopped") or {}).get("replica")
    for key, d in phases.items():
        fig[key]["bound"] = bounds(fig[key], plan["placement"], d["concurrency"],
                                   answering(d["phase"], plan["replicas"], stopped))
    by_level = {str(c): _between(*(fig.get(run_name(p, c)) for p in PHASES)) for c in plan["levels"]}
    return {"phases": fig, **out, "levels": list(plan["levels"]), "by_level": by_level}


def _refuse(path: Path, why: str) -> ServingEvidenceError:
    return ServingEvidenceError(f"{path}: {why}")


def check_probe(home: Path, entry: dict[str, Any], dev_ids: list[str], model: dict[str, str], *,
                requests: int, levels: Sequence[int] | None = None) -> dict[str, Any]:
    """Recompute a committed probe's figures; raise ServingEvidenceError on any inconsistency.
    `model`: the receipt digest the selection names for the serving arm, and that arm's name;
    `requests`: the committed profile's requests per phase (`requests_of`); `levels`: its own
    `serving_concurrency` (`committed_levels`; None: it sets none, so the studies' sweep — or, for a
    probe committed before the sweep, its single level)."""
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
    stopped = plan.get("stopped") or {}
    if stopped.get("replica") not in plan["replicas"]:
        raise ServingEvidenceError(f"{d / 'plan.json'}: the failure phase stopped no advertised replica "
                                   f"({stopped.get('replica')!r})")
    if plan["requests"] != requests or plan["max_attempts"] > MAX_ATTEMPTS:
        raise ServingEvidenceError(f"{d / 'plan.json'}: {plan['requests']} requests with up to "
                                   f"{plan['max_attempts']} attempts; the committed profile fixes {requests} and "
                                   f"{MAX_ATTEMPTS}")
    if "levels" in plan:
        phases = _check_sweep(d, plan, dev_ids, requests, sweep(requests, levels))
    elif levels is not None:
        raise _refuse(d / "plan.json", f"ran one concurrency level ({plan.get('concurrency')!r}), as probes before the "
                      f"sweep did; the committed profile sets serving_concurrency = {list(levels)}")
    else:
        phases = _check_one_level(d, plan, dev_ids, requests)
    comp = comparisons(phases, warm, plan)
    expected = f"{model['receipt_digest']}/"
    comp["model_matches_selection"] = bool(comp["model_identities"]) and \
        all(m.startswith(expected) for m in comp["model_identities"]) and len(comp["model_identities"]) == 1
    comp["replicas"] = len(plan["replicas"])
    comp["requests"] = requests
    comp["stopped"] = plan.get("stopped")
    comp["attempt"] = d.name
    if "levels" in plan:
        comp["placement"] = plan["placement"]
    return comp


def _check_one_level(d: Path, plan: dict[str, Any], dev_ids: list[str], requests: int) -> dict[str, dict[str, Any]]:
    """A probe committed before the sweep: each phase once, at CONCURRENCY in flight (`<phase>.json`)."""
    if plan["concurrency"] != CONCURRENCY:
        raise ServingEvidenceError(f"{d / 'plan.json'}: client concurrency {plan['concurrency']}, "
                                   f"the workload fixes {CONCURRENCY}")
    phases = {}
    for p in PHASES:
        path = d / f"{p}.json"
        data = read_json(path)
        _check_run(path, data, plan, workload(dev_ids, p, requests), p)
        if data["concurrency"] != CONCURRENCY or len(data["endpoints"]) != _advertised(p, plan):
            raise ServingEvidenceError(f"{path}: concurrency {data['concurrency']} over "
                                       f"{len(data['endpoints'])} endpoints; the phase fixes {CONCURRENCY} "
                                       f"over {_advertised(p, plan)}")
        if phase_figures(data["requests"], data["wall_seconds"]) != data["figures"]:
            raise ServingEvidenceError(f"{path}: stored figures differ from its own records")
        phases[p] = data
    return phases


def _check_sweep(d: Path, plan: dict[str, Any], dev_ids: list[str], requests: int,
                 levels: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """A sweep: every phase at every committed level (`<phase>-c<c>.json`), the replicas' placement
    consistent, every figure recomputed from the records."""
    if "concurrency" in plan or list(plan["levels"]) != list(levels):
        raise _refuse(d / "plan.json", f"concurrency levels {plan['levels']}"
                      + (f" beside one concurrency {plan['concurrency']!r}" if "concurrency" in plan else "")
                      + f"; the committed profile fixes {list(levels)}")
    placement = plan.get("placement")
    if not isinstance(placement, list) or [p.get("replica") for p in placement] != plan["replicas"]:
        raise _refuse(d / "plan.json", "its placement does not name the replicas it advertised, in their order")
    shares = sharing(placement)
    for p in placement:
        if p.get("shares_device_with") != shares[p["replica"]]:
            raise _refuse(d / "plan.json", f"{p['replica']} is recorded sharing its device with "
                          f"{p.get('shares_device_with')}; its placement says {shares[p['replica']]}")
    devices = devices_of(placement)
    phases = {}
    for p in PHASES:
        for c in levels:
            path = d / f"{run_name(p, c)}.json"
            if not path.is_file():
                raise _refuse(path, f"missing: the sweep runs {p} at every committed level {list(levels)}")
            data = read_json(path)
            _check_run(path, data, plan, workload(dev_ids, p, requests, c), p)
            if data.get("phase") != p or data["concurrency"] != c or len(data["endpoints"]) != _advertised(p, plan):
                raise _refuse(path, f"{data.get('phase')} at concurrency {data['concurrency']} over "
                              f"{len(data['endpoints'])} endpoints; the run fixes {p} at {c} over {_advertised(p, plan)}")
            for r in data["requests"]:
                if r["outcome"] == "ok" and r["response"].get("replica") not in plan["replicas"]:
                    raise _refuse(path, f"request {r['request_id']} was answered by {r['response'].get('replica')!r}, "
                                  "a replica the plan does not name")
            if level_figures(data["requests"], data["wall_seconds"], devices) != data["figures"]:
                raise _refuse(path, "stored figures differ from its own records")
            phases[run_name(p, c)] = data
    return phases


def _advertised(phase: str, plan: dict[str, Any]) -> int:
    return 1 if phase == "single" else len(plan["replicas"])


def _check_run(path: Path, data: dict[str, Any], plan: dict[str, Any], want: list[dict[str, str]], phase: str) -> None:
    """One run's records against its fixed workload, the attempt bound and its own attempts."""
    if [(r["request_id"], r["task_id"]) for r in data["requests"]] != [(w["request_id"], w["task_id"]) for w in want]:
        raise ServingEvidenceError(f"{path}: not the fixed {len(want)}-request workload")
    for r in data["requests"]:
        if len(r["attempts"]) > plan["max_attempts"]:
            raise ServingEvidenceError(f"{path}: request {r['request_id']} made "
                                       f"{len(r['attempts'])} attempts; the bound is {MAX_ATTEMPTS}")
        ok = r["outcome"] == "ok"
        if ok != (bool(r["attempts"]) and r["attempts"][-1].get("status") == 200 and "response" in r):
            raise ServingEvidenceError(f"{path}: request {r['request_id']}'s outcome disagrees with its attempts")
        if ok and (r["response"]["request_id"], r["response"]["task_id"]) != (r["request_id"], r["task_id"]):
            raise ServingEvidenceError(f"{path}: request {r['request_id']} was answered "
                                       f"for {r['response']['request_id']}/{r['response']['task_id']}")
    if phase == "failure" and data.get("stopped") != (plan.get("stopped") or {}):
        raise ServingEvidenceError(f"{path}: does not name the stopped replica the plan names")
    if data["max_attempts"] != plan["max_attempts"]:
        raise ServingEvidenceError(f"{path}: attempt bound {data['max_attempts']}, the plan's is {plan['max_attempts']}")


def gates(comp: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The serving conditions: every request of every phase (at every concurrency level) answered
    within the attempt bound, the same tokens for every task across phases, replicas and levels, one
    model — the selected one."""
    if comp is None:
        return [{"gate": PROBE_GATE, "value": 0, "passed": False}]
    done = min(f["completed"] for f in comp["phases"].values())
    answered, identical, identity = gate_names(comp["requests"], comp.get("levels"))
    return [
        {"gate": answered, "value": done, "passed": done == comp["requests"]},
        {"gate": identical, "value": len(comp["tasks_with_differing_tokens"]),
         "passed": not comp["tasks_with_differing_tokens"]},
        {"gate": identity, "value": len(comp["model_identities"]), "passed": comp["model_matches_selection"]},
    ]


def gate_names(requests: int, levels: Sequence[int] | None = None) -> tuple[str, str, str]:
    """The serving gates' names at `requests` per phase, for a sweep at `levels` (None: a probe from
    before the sweep, and a probe the placement could not run, which lists them as not evaluated).
    Every one starts with "serving", as `PROBE_GATE` does."""
    if levels is None:
        return (f"serving: all {requests} requests answered in every phase (≤ {MAX_ATTEMPTS} attempts)",
                "serving: identical greedy tokens per task across phases and replicas",
                "serving: one model identity, the selected serving model")
    return (f"serving: all {requests} requests answered in every phase at every concurrency level "
            f"({', '.join(map(str, levels))} in flight; ≤ {MAX_ATTEMPTS} attempts)",
            "serving: identical greedy tokens per task across phases, replicas and concurrency levels",
            "serving: one model identity, the selected serving model")


PROBE_GATE = "serving probe committed"
"""The one gate a home without a committed probe shows instead (failed)."""

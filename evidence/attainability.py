"""Whether each gate could pass at all at a profile's scale, and the smallest effect it can detect —
decided from the experiment's rules and the profile alone, before anything trains.

A gate that fails is read as "the method failed". At a small profile that reading can be wrong in a
precise way: 32 test cases cannot give an exact one-sided McNemar p ≤ 0.01 unless at least 7
discordant pairs all favour the candidate, and a DiLoCo arm with H = 4 sends 1/4 of DDP's bytes by
construction, whatever it learns. This module says so for every gate, with the same statistics the
gates use (`evidence.stats`) and the same synchronization rule the DiLoCo arm runs by
(`evidence.schedule`), so that the report can show "FAILED (unattainable at this profile: …)" and
keep such failures apart from the ones that tell something about the method.

Each gate gets one of three verdicts:
  attainable True    some outcome at this profile passes it; `figures` give the smallest one
  attainable False   no outcome at this profile can pass it (proved here, by enumeration or by
                     construction); the failure says nothing about the method
  attainable None    not decided before training: a ratio of measured seconds, whose reach depends on
                     how long communication takes; the text names what passing needs

Only a gate that provably cannot pass is called unattainable. Nothing here reads a file: `orchestrate
run` commits `analyse(...)` as attainability.json before the first arm trains, and the report
recomputes it from the committed prepared.json and checks that the two agree.

    {"format": "trial-attainability-v1", "experiment", "profile",
     "basis": {"test_cases", "probes", "updates", "primary", "baseline", "cluster": {"source", "cores"} | None},
     "gates": [{"gate", "attainable", "attainability", "figures": {...}}, ...]}
"""

from __future__ import annotations

import math
from typing import Any, Callable

from evidence import schedule
from evidence.placement import rule_gates
from evidence.stats import mcnemar_exact_greater, paired_bounds

FORMAT = "trial-attainability-v1"
ATTAINABILITY = "attainability.json"
UNATTAINABLE = "unattainable at this profile"


# ------------------------------------------------------------------ the statistics, searched


def _pairs(n: int, won: int, lost: int) -> tuple[list[bool], list[bool]]:
    """`n` paired verdicts (candidate, other): `won` cases only the candidate answers right, `lost`
    only the other does, and the rest both wrong — the bounds and p depend only on these counts."""
    cand = [True] * won + [False] * lost + [False] * (n - won - lost)
    other = [False] * won + [True] * lost + [False] * (n - won - lost)
    return cand, other


def mcnemar_min_discordant(n: int, p_max: float) -> int | None:
    """The fewest discordant pairs, all favouring the candidate, whose exact one-sided McNemar p is at
    most `p_max` among `n` cases (None: not even all `n`). Fewer in its favour, or any against it,
    only raises p, so this is the least evidence the gate can ever accept."""
    for k in range(1, n + 1):
        if mcnemar_exact_greater(*_pairs(n, k, 0)).p_value <= p_max:
            return k
    return None


def gain_min_net_cases(n: int, min_gain_pp: float) -> int | None:
    """The fewest net cases won (won − lost) whose mean paired gain, as the gate computes it (the
    paired bound's mean difference, in pp), reaches `min_gain_pp` among `n` cases (None: never)."""
    for k in range(0, n + 1):
        if paired_bounds(*_pairs(n, k, 0)).mean_difference * 100 >= min_gain_pp:
            return k
    return None


def noninferiority_reach(n: int, margin_pp: float, confidence: float) -> dict[str, Any]:
    """What the one-sided paired lower bound (the gate's `paired_bounds`) can reach among `n` cases:
    its value with identical answers (the best a candidate equal to its control can do), with one
    case lost or won alone, the most cases lost (none won) it still passes with, and the fewest
    cases won (none lost) that pass."""
    def lower_pp(won: int, lost: int) -> float:
        return paired_bounds(*_pairs(n, won, lost), confidence).lower * 100

    def first(ok: Callable[[int], bool], start: int) -> int | None:
        return next((k for k in range(start, n + 1) if ok(k)), None)

    fails_at = first(lambda c: lower_pp(0, c) < margin_pp, 0)
    return {"test_cases": n, "margin_pp": margin_pp, "identical_bound_pp": lower_pp(0, 0),
            "one_lost_bound_pp": lower_pp(0, 1), "one_won_bound_pp": lower_pp(1, 0),
            "most_lost_passing": None if fails_at == 0 else (n if fails_at is None else fails_at - 1),
            "fewest_won_passing": first(lambda b: lower_pp(b, 0) >= margin_pp, 1)}


def retention_factor(probes: int, confidence: float) -> float | None:
    """k in the retention gate's upper bound = mean + k · sd over `probes` probes, read off the
    gate's own `paired_bounds` (None: fewer than two probes, no bound). Identical losses give 0."""
    if probes < 2:
        return None
    b = paired_bounds([1.0] + [0.0] * (probes - 1), [0.0] * probes, confidence)
    return (b.upper - b.mean_difference) / b.sd


# ------------------------------------------------------------------ bytes by construction


def sync_every(arm: dict[str, Any], profile: dict[str, Any]) -> int | None:
    """An arm's synchronization period H as its ranks run it (training/config.py `Resolved.arm_settings`):
    for an arm whose kind takes H (DiLoCo), the profile's `sync_every` where it sets one, else the arm's own."""
    if arm.get("kind") != "diloco" and arm.get("sync_every") is None:
        return None
    return profile["sync_every"] if profile.get("sync_every") is not None else arm.get("sync_every")


def model_exchanges(arm: dict[str, Any], profile: dict[str, Any]) -> int | None:
    """How many times the arm's ranks exchange the model's worth of payload in the profile's
    updates: a periodic arm (H) at every synchronization `evidence.schedule` makes due, a DDP arm
    every update; None for any other kind (PowerSGD's compressed payload is a measured figure).
    tests/evidence/test_attainability.py checks this against the arm kinds' own count."""
    h, updates = sync_every(arm, profile), profile["updates"]
    if h is not None:
        return schedule.count(updates, h)
    if arm["kind"] == "ddp":
        return updates
    return None


def smallest_h_within(updates: int, ratio: float) -> int | None:
    """The smallest H whose synchronizations in `updates` updates are at most `ratio` of them."""
    return next((h for h in range(1, updates + 1) if schedule.count(updates, h) <= ratio * updates), None)


# ------------------------------------------------------------------ the gates


def _gate(name: str, attainable: bool | None, text: str, **figures: Any) -> dict[str, Any]:
    return {"gate": name, "attainable": attainable, "attainability": text, "figures": figures}


def _pp(x: float) -> str:
    return f"{x:.3g} pp" if abs(x) < 10 else f"{x:.1f} pp"


def _gain(name: str, n: int, min_pp: float) -> dict[str, Any]:
    k = gain_min_net_cases(n, min_pp)
    if k is None:
        return _gate(name, False, f"{n} test cases: even all {n} won give {100:.0f} pp < {min_pp} pp",
                     test_cases=n, min_net_cases=None, smallest_passing_gain_pp=None)
    return _gate(name, True, f"{n} test cases, one case = {_pp(100 / n)}: passes from {k} net case"
                 f"{'s' if k != 1 else ''} won ({_pp(100 * k / n)})",
                 test_cases=n, min_net_cases=k, smallest_passing_gain_pp=100 * k / n)


def _mcnemar(name: str, n: int, p_max: float, primary: str) -> dict[str, Any]:
    k = mcnemar_min_discordant(n, p_max)
    if k is None:
        best = mcnemar_exact_greater(*_pairs(n, n, 0)).p_value
        return _gate(name, False, f"{n} test cases: even all {n} discordant and for {primary} give "
                     f"p = {best:.3g} > {p_max}", test_cases=n, min_discordant=None, best_p=best,
                     smallest_passing_gain_pp=None)
    p = mcnemar_exact_greater(*_pairs(n, k, 0)).p_value
    return _gate(name, True, f"{n} test cases: needs at least {k} discordant pairs, all for {primary} "
                 f"(p = {p:.3g}), a gain of at least {_pp(100 * k / n)}",
                 test_cases=n, min_discordant=k, best_p=p, smallest_passing_gain_pp=100 * k / n)


def _retention(name: str, probes: int, confidence: float, max_nats: float) -> dict[str, Any]:
    k = retention_factor(probes, confidence)
    if k is None:
        return _gate(name, False, f"{probes} retention probe(s): a paired bound needs at least 2",
                     probes=probes, sd_factor=None)
    return _gate(name, True, f"{probes} probes: the bound is the mean loss change + {k:.3g} × its sd; "
                 f"identical losses give 0 ≤ +{max_nats}", probes=probes, sd_factor=k)


def _noninferiority(name: str, n: int, margin: float, confidence: float) -> dict[str, Any]:
    if n < 2:
        return _gate(name, False, f"{n} test case(s): a paired bound needs at least 2", test_cases=n)
    r = noninferiority_reach(n, margin, confidence)
    if r["identical_bound_pp"] < margin:  # a margin above 0: only a better candidate can pass
        attainable = r["fewest_won_passing"] is not None
        text = (f"{n} test cases: identical answers give {_pp(r['identical_bound_pp'])} < {margin} pp; "
                + (f"passes from {r['fewest_won_passing']} cases won, none lost" if attainable else
                   f"not even all {n} won pass"))
        return _gate(name, attainable, text, **r)
    lost = r["most_lost_passing"]
    text = f"{n} test cases: identical answers give {_pp(r['identical_bound_pp'])} (passes); "
    if r["one_won_bound_pp"] < margin:
        text += (f"a single discordant case fails it (one lost: {_pp(r['one_lost_bound_pp'])}, one won: "
                 f"{_pp(r['one_won_bound_pp'])})"
                 + (f"; with none lost it passes from {r['fewest_won_passing']} won" if r["fewest_won_passing"] else ""))
    elif lost == 0:
        text += f"one case lost alone fails it ({_pp(r['one_lost_bound_pp'])})"
    elif lost is not None and lost < n:
        text += (f"up to {lost} cases lost (none won) pass, {lost + 1} fail it "
                 f"({_pp(100 * (lost + 1) / n)} lost)")
    return _gate(name, True, text, **r)


def _bytes(name: str, arms: dict[str, dict], primary: str, control: str, ratio: float,
           profile: dict[str, Any]) -> dict[str, Any]:
    """Each exchange moves the model's worth for both arms (DiLoCo's outer delta, DDP's gradient: the
    same parameters), so bytes per update compare as exchanges do; the report checks that against
    the ranks' own count (`labelled`)."""
    updates = profile["updates"]
    a, b = model_exchanges(arms[primary], profile), model_exchanges(arms[control], profile)
    if a is None or b is None or b == 0:
        return _gate(name, None, f"not decided before training: {primary}'s bytes against {control}'s are "
                     "measured (no fixed schedule of whole-model exchanges for both)",
                     updates=updates, exchanges=None, control_exchanges=None, ratio=None)
    h = sync_every(arms[primary], profile)
    r = a / b
    how = (f"(H = {h}): {primary} exchanges the model {a} times in {updates} updates, {control} "
           f"{'every update' if b == updates else f'{b} times'}: {a}/{b} = {r:.3g}")
    need = smallest_h_within(updates, ratio) if h is not None and b == updates else None
    if r <= ratio:
        return _gate(name, True, f"by construction {how} ≤ {ratio}", updates=updates, sync_every=h, exchanges=a,
                     control_exchanges=b, ratio=r, fewest_sync_every_passing=need)
    return _gate(name, False, f"by construction {how} > {ratio}"
                 + (f"; passing needs H ≥ {need} at {updates} updates" if need else ""),
                 updates=updates, sync_every=h, exchanges=a, control_exchanges=b, ratio=r,
                 fewest_sync_every_passing=need)


def _cores(cluster: dict[str, Any] | None) -> tuple[str, int | None] | None:
    """Where the ranks' CPU cores are, when every rank computes on them: a CPU profile (`cluster`'s
    "device") whose ranks all run on the controller's machine (its "shared")."""
    if not cluster or not cluster.get("shared") or cluster.get("device", "cpu") != "cpu":
        return None
    c = cluster.get("cores")
    return (f"this machine's {c} CPU core{'s' if c != 1 else ''}" if c else "this machine's CPU cores"), c


def _active_ratio(name: str, arms: dict[str, dict], primary: str, control: str, ratio: float,
                  cluster: dict[str, Any] | None) -> dict[str, Any]:
    p, c = arms[primary], arms[control]
    same = p["world_size"] == c["world_size"]
    text = ("not decided before training (measured seconds): "
            + (f"{primary} computes the same documents per rank as {control} and drops its per-update "
               f"all-reduce, so it passes only if {control}'s communication takes at least {1 - ratio:.0%} "
               "of its active time" if same else
               f"it passes only if {primary}'s active time is at most {ratio} of {control}'s"))
    where = _cores(cluster)
    if where:
        crowd = ", more ranks than cores" if where[1] and p["world_size"] > where[1] else ""
        text += (f"; here both arms' {p['world_size']} ranks share {where[0]} ({cluster['source']} cluster{crowd}): "
                 "computation and communication compete for them")
    return _gate(name, None, text, ratio=ratio, least_communication_share=(1 - ratio) if same else None)


def _speedup(name: str, arms: dict[str, dict], primary: str, control: str, speedup: float,
             cluster: dict[str, Any] | None) -> dict[str, Any]:
    p, c = arms[primary], arms[control]
    w = p["world_size"] / max(1, c["world_size"])
    text = f"not decided before training (measured seconds): needs {speedup}×"
    where = _cores(cluster)
    if where:
        text += (f"; here both arms run on {where[0]} ({cluster['source']} cluster): {primary}'s "
                 f"{p['world_size']} ranks bring no more cores than {control}'s {c['world_size']}, so passing needs "
                 f"them to use the same cores {speedup}× better")
    elif w > 1:
        text += (f"; {primary}'s {p['world_size']} ranks each compute 1/{w:g} of {control}'s documents per update, "
                 f"on a device each: with communication free the speedup would be about {w:g}")
    return _gate(name, None, text, speedup=speedup, ranks_ratio=w)


def analyse(experiment: dict[str, Any], cluster: dict[str, Any] | None = None, *,
            shared_cores: bool | None = None) -> dict[str, Any]:
    """Every acceptance gate of `experiment` (prepared.json's "experiment": the rules, the profile's
    name and the profile) at its profile; the serving gates need no size (`SERVING`). `cluster`:
    {"source", "cores"} of the cluster the ranks run on, recorded as given (source: its name, only
    quoted; cores: the CPU cores the ranks share on the controller's machine, None where they run on
    hosts of their own or the count is unknown), or None; it only words the timing gates, which are
    never decided here. `shared_cores`: whether the ranks share the controller's machine's cores —
    by default where `cores` is given; the caller says so where they did but the count is unknown."""
    exp, prof = experiment["experiment"], experiment["profile"]
    acc, arms = exp["acceptance"], {a["name"]: a for a in exp["arms"]}
    primary = acc["primary"]
    baseline = next(a["name"] for a in exp["arms"] if a["kind"] == "seed")
    n, conf = prof["test"], acc.get("confidence", 0.99)
    shared = cluster is not None and (cluster.get("cores") is not None if shared_cores is None else shared_cores)
    # the cores matter where the ranks share them, on a CPU profile
    where = cluster and {**cluster, "shared": shared, "device": prof.get("device", "cpu")}
    out = []
    for gate, _ in rule_gates(acc, primary, baseline):
        if gate.startswith("gain ≥"):
            out.append(_gain(gate, n, acc["min_gain_pp"]))
        elif gate.startswith("McNemar"):
            out.append(_mcnemar(gate, n, acc["p_max"], primary))
        elif gate.startswith("retention"):
            out.append(_retention(gate, prof["probes"], conf, acc["retention_max_nats"]))
        elif gate.startswith("noninferiority"):
            out.append(_noninferiority(gate, n, acc["noninferiority_pp"], conf))
        elif gate.startswith("bytes"):
            out.append(_bytes(gate, arms, primary, acc["max_bytes_ratio_vs"], acc["max_bytes_ratio"], prof))
        elif gate.startswith("active time"):
            out.append(_active_ratio(gate, arms, primary, acc["max_bytes_ratio_vs"], acc["max_active_ratio"], where))
        elif "speedup" in gate:
            out.append(_speedup(gate, arms, primary, acc["min_speedup_vs"], acc["min_speedup"], where))
        else:  # a rule gate this module does not know: said so, never guessed
            out.append(_gate(gate, None, "not analysed"))
    return {"format": FORMAT, "experiment": exp["name"], "profile": experiment["profile_name"],
            "basis": {"test_cases": n, "probes": prof["probes"], "updates": prof["updates"], "primary": primary,
                      "baseline": baseline, "cluster": cluster},
            "gates": out}


def by_gate(analysis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["gate"]: g for g in analysis["gates"]}


SERVING = _gate("serving", True, "a condition of correct serving, not a statistic: no scale limits it")
"""The serving gates' reach, the same at every profile (so not part of a profile's analysis)."""


def labelled(gate: dict[str, Any], reach: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A report's gate with what it could reach at this profile (`reach`: `by_gate` of the analysis)
    beside its verdict — the verdict itself unchanged: an unattainable gate that failed stays failed,
    one that passed stays passed."""
    r = reach.get(gate["gate"]) or (SERVING if gate["gate"].startswith("serving") else None)  # serving.gate_names
    if r is None:
        return {**gate, "attainable": None, "attainability": "not analysed"}
    built = r["figures"].get("exchanges") and r["figures"].get("ratio")
    if built and gate.get("value") is not None and not math.isclose(gate["value"], built, rel_tol=1e-9):
        # the bytes verdict assumed each exchange moves the model's worth for both arms; the ranks'
        # own count says otherwise, so the construction decides nothing here
        return {**gate, "attainable": None,
                "attainability": f"measured {gate['value']:.4g}, not the {built:.4g} its whole-model exchanges give "
                                 f"({r['attainability']}): decided by measurement"}
    return {**gate, "attainable": r["attainable"], "attainability": r["attainability"]}


def disagreement(committed: dict[str, Any], recomputed: dict[str, Any]) -> str | None:
    """What differs between a committed analysis and the one recomputed from the same evidence
    (None: they agree). Verdicts and figures must match exactly; the wording may differ (a later
    version of this module may say the same thing better)."""
    if committed.get("format") != FORMAT:
        return f"format {committed.get('format')!r}, not {FORMAT!r}"
    for k in ("experiment", "profile", "basis"):
        if committed.get(k) != recomputed[k]:
            return f"its {k} is {committed.get(k)!r}; prepared.json gives {recomputed[k]!r}"
    mine, theirs = by_gate(recomputed), {g.get("gate"): g for g in committed.get("gates", [])}
    if set(mine) != set(theirs):
        return f"it analyses gates {sorted(theirs)}; prepared.json gives {sorted(mine)}"
    for name, g in mine.items():
        t = theirs[name]
        if t.get("attainable") != g["attainable"] or not _same(t.get("figures"), g["figures"]):
            return (f"gate '{name}': attainable {t.get('attainable')}, figures {t.get('figures')}; "
                    f"recomputed: attainable {g['attainable']}, figures {g['figures']}")
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers to 1e-9 relative (a p-value or bound recomputed by another build of scipy may
    differ in its last bits; a verdict may not)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b

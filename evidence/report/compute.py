"""The report's second step: the statistics and gates, from evidence `verify` has checked — accuracy
per arm and why its answers failed (`breakdown`), paired gains (exact one-sided McNemar p, one-sided
bounds), retention bounds, the serving gates, the experiment's gates (passed, failed or not evaluated,
the selection unchanged) and costs kept apart. Nothing here reads a file: the same `Verified` gives the same `Report`.
"""

from __future__ import annotations

from collections import Counter

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer

from evidence.attainability import by_gate, labelled
from evidence.checker import failure_counts, reason_parts
from evidence.inputs import drawn, global_losses
from evidence.placement import SERVING_PROBE, not_comparable, not_evaluated, shared_text, unevaluated_gates
from evidence.report.gate import Gate
from evidence.report.verify import FIELDS_WRONG, EvidenceError, Verified
from evidence.serving import gate_names as serving_gate_names
from evidence.serving import gates as serving_gates
from evidence.serving import requests_of
from evidence.stats import mcnemar_exact_greater, paired_bounds


class Report(BaseModel):
    """What `render` draws and report.json holds (`model_dump(mode="json")`, its keys sorted when written)."""

    # an infinite or NaN figure stays one in the dump, so writing it is refused (canonical.json_bytes)
    # instead of turning into a null
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    format: Literal["trial-report-v1"] = "trial-report-v1"
    experiment: str
    profile: str
    commitments_head: str
    anchors: dict[str, Any] | None
    selection: dict[str, Any]
    selection_committed_at_seq: int
    arms: dict[str, dict[str, Any]]  # per trained arm: loss per update, payload bytes, costs
    accuracy: dict[str, dict[str, Any]]  # per scored arm: cases, correct, accuracy, attempts
    comparisons: dict[str, dict[str, Any]]  # "<arm> vs <arm>": paired bounds and McNemar p
    rules: dict[str, Any]  # the experiment's acceptance rules, as committed in prepared.json
    gates: list[Gate]
    failed_gates: list[str]  # every failed gate, attainable or not
    unattainable_failed_gates: list[str]  # the failed gates no outcome at this profile could have passed
    not_evaluated_gates: list[str]
    not_comparable_gates: list[str]
    not_run: dict[str, str]
    shared: dict[str, str]  # arm (or the serving probe) → "N ranks shared M GPUs"
    evaluation_attempts: dict[str, dict[str, list[str]]]
    recovery_comparisons: list[dict[str, Any]]
    serving: dict[str, Any] | None
    serving_attempts: list[str]
    attainability: dict[str, Any]  # {"source", "basis", "gates": {gate: figures}}: what each gate can reach
    # time granted after the deadline to preserve the trial (evidence/grace.py); written only when there is any,
    # so a report of a home with none is byte for byte what it was before graces existed
    graces: list[dict[str, Any]] = []
    # per scored arm, why its test answers failed (`breakdown`): only for arms whose scoring kept its failures
    # (summary.json's `failures`), so a report of a home scored before then is byte for byte what it was
    failures: dict[str, dict[str, Any]] = {}
    # how the task file's cases were chosen (prepared.json's task_source.draw, `evidence.inputs.drawn`): only
    # where prepare recorded the rule, so a report of a home prepared before then is byte for byte what it was
    cases: dict[str, Any] = {}

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for optional in ("graces", "failures", "cases"):
            if not getattr(self, optional):
                out.pop(optional, None)
        return out


def drawn_cases(prepared: dict[str, Any]) -> dict[str, Any]:
    """The task file's draw as prepared.json committed it, with how many each split used, said in one line:
    {} for the generated families and for a home prepared before the rule was recorded."""
    ts = prepared.get("task_source")
    if not isinstance(ts, dict) or "draw" not in ts:
        return {}
    return {"file": ts["file"], "sha256": ts["sha256"], "used": ts["used"], "draw": ts["draw"], "said": drawn(ts)}


def breakdown(reasons: list[str], fields_wrong: list[list[str]] | None = None) -> dict[str, Any]:
    """Why answers failed, from the checker's reasons of the wrong ones (evidence/checker.py): how many
    (`wrong`), how many for each kind of reason (`reasons`: `wrong_value`, `malformed_json`, …) and, for
    a reason that names a key (`wrong_value:total`), how many for each key (`fields`: {"wrong_value":
    {"total": 8, "unit": 4}}) — an object answer's field, or for `extra_key`/`duplicate_key` a key the
    answer wrote. The checker's reason names an object answer's first failing field only; `wrong_fields`
    counts, per field, the wrong answers that get it wrong in any way (`evidence.checker.fields_wrong`: an
    answer wrong in two fields counts under both), given where any wrong answer is an object."""
    kinds: dict[str, int] = {}
    keys: dict[str, dict[str, int]] = {}
    for reason, n in failure_counts(reasons).items():
        kind, key = reason_parts(reason)
        kinds[kind] = kinds.get(kind, 0) + n
        if key is not None:
            keys.setdefault(kind, {})[key] = n
    out = {"wrong": len(reasons), "reasons": dict(sorted(kinds.items())),
           "fields": {k: dict(sorted(v.items())) for k, v in sorted(keys.items())}}
    every = Counter(f for fs in fields_wrong or [] for f in fs)
    if every:
        out["wrong_fields"] = dict(sorted(every.items()))
    return out


def compute(v: Verified) -> Report:
    exp, prepared, selection, cands = v.experiment, v.prepared, v.selection, v.candidates
    acc, evaluations, skipped, on_shared = exp["acceptance"], v.evaluations, v.not_run, v.shared
    arms: dict[str, Any] = {}
    for name, cand in cands.items():
        results = v.results[name]
        n = len(results[0]["updates"])
        losses = global_losses([r["updates"] for r in results])
        ckpt = [sum(c["publish_seconds"] for c in r.get("checkpoints", {}).get("published", []))
                for r in results]
        t = [r["timers"] for r in results]
        arms[name] = {
            "kind": cand["kind"], "world_size": cand["world_size"], "updates": n,
            "loss_per_update": losses,
            # the updates (1-based) after which the ranks synchronized (DiLoCo's outer steps) and those
            # whose gradients went compressed (PowerSGD after its dense warmup): the loss plot marks them
            "sync_every": results[0]["numerical_profile"]["arm"].get("sync_every"),
            "outer_steps": [u + 1 for u, rec in enumerate(results[0]["updates"]) if rec["outer_step"]],
            "compressed_updates": [u + 1 for u, rec in enumerate(results[0]["updates"])
                                   if rec.get("powersgd_compressed")],
            "payload_bytes_per_update": results[0]["comm"]["training_payload_bytes_per_update"],
            "costs": {
                # the journal's per-update seconds: carried across resumes, checkpoints excluded
                "active_training_seconds": max(sum(u["seconds"] for u in r["updates"]) for r in results),
                "resumed": any(r.get("checkpoints", {}).get("restored") for r in results),
                "checkpoint_seconds": max(ckpt) if ckpt else 0.0,
                "startup_seconds": max(x["seed_verification_seconds"] + x["process_group_seconds"]
                                       + x["model_load_seconds"] for x in t),
                "training_loop_seconds": max(x["training_loop_seconds"] for x in t),
                "whole_process_seconds": max(r["resources"]["wall_seconds_since_start"] for r in results),
                "allocated_device_seconds": sum(r["resources"]["wall_seconds_since_start"] for r in results),
                "dollars": None,
                "dollars_note": "no price on the embedded local cluster (cloud prices arrive with infra)",
            },
        }

    def used(role: str, arm: str) -> dict[str, Any] | None:
        """The first complete attempt: retries are listed, never substituted for it."""
        for a in evaluations.get(role, {}).get(arm, []):
            if a["complete"]:
                return a
        return None

    base = selection["baseline"]
    accuracy, comparisons, gates, failures = {}, {}, [], {}
    test_base = used("test", base)
    for arm in [base, *cands]:
        a = used("test", arm)
        if a:
            accuracy[arm] = {"cases": len(a["answers"]), "correct": sum(x["correct"] for x in a["answers"]),
                             "accuracy": sum(x["correct"] for x in a["answers"]) / len(a["answers"]),
                             "attempts": len(evaluations["test"][arm])}
            if "failures" in a["summary"]:  # its reasons re-checked, and the summary's counts equal, by verify
                wrong = [x for x in a["answers"] if not x["correct"]]
                failures[arm] = breakdown([x["reason"] for x in wrong], [x.get(FIELDS_WRONG, []) for x in wrong])
    conf = acc.get("confidence", 0.99)

    def paired(a_arm: str, b_arm: str) -> dict[str, Any] | None:
        a, b = used("test", a_arm), used("test", b_arm)
        if not (a and b):
            return None
        bmap = {x["case_id"]: x["correct"] for x in b["answers"]}
        xs = [bool(x["correct"]) for x in a["answers"]]
        ys = [bool(bmap[x["case_id"]]) for x in a["answers"]]
        pa = {p["probe"]: p["loss"] for p in b["probes"]}
        out = {"accuracy_change": paired_bounds(xs, ys, conf).as_dict(),
               "mcnemar_greater": mcnemar_exact_greater(xs, ys).as_dict()}
        if len(a["probes"]) >= 2:
            out["retention_loss_change"] = paired_bounds([p["loss"] for p in a["probes"]],
                                                         [pa[p["probe"]] for p in a["probes"]], conf).as_dict()
        return out

    primary = selection["primary"]
    for arm in cands:
        c = paired(arm, base) if test_base else None
        if c:
            comparisons[f"{arm} vs {base}"] = c
    p = comparisons.get(f"{primary} vs {base}")
    if p:
        gain = p["accuracy_change"]["mean_difference"] * 100
        gates.append({"gate": f"gain ≥ {acc['min_gain_pp']} pp", "value": gain,
                      "passed": gain >= acc["min_gain_pp"]})
        gates.append({"gate": f"McNemar p ≤ {acc['p_max']}", "value": p["mcnemar_greater"]["p_value"],
                      "passed": p["mcnemar_greater"]["p_value"] <= acc["p_max"]})
        if "retention_loss_change" in p:
            up = p["retention_loss_change"]["upper"]
            gates.append({"gate": f"retention upper bound ≤ +{acc['retention_max_nats']} nats",
                          "value": up, "passed": up <= acc["retention_max_nats"]})
    if acc.get("noninferiority_vs") and used("test", primary) and used("test", acc["noninferiority_vs"]):
        ni = paired(primary, acc["noninferiority_vs"])
        comparisons[f"{primary} vs {acc['noninferiority_vs']}"] = ni
        lo = ni["accuracy_change"]["lower"] * 100
        gates.append({"gate": f"noninferiority lower bound ≥ {acc['noninferiority_pp']} pp vs "
                              f"{acc['noninferiority_vs']}", "value": lo, "passed": lo >= acc["noninferiority_pp"]})
    if acc.get("max_bytes_ratio_vs") and acc["max_bytes_ratio_vs"] in arms and primary in arms:
        r = arms[primary]["payload_bytes_per_update"] / arms[acc["max_bytes_ratio_vs"]]["payload_bytes_per_update"]
        gates.append({"gate": f"bytes ≤ {acc['max_bytes_ratio']} × {acc['max_bytes_ratio_vs']}", "value": r,
                      "passed": r <= acc["max_bytes_ratio"]})
        if acc.get("max_active_ratio"):
            ra = (arms[primary]["costs"]["active_training_seconds"]
                  / arms[acc["max_bytes_ratio_vs"]]["costs"]["active_training_seconds"])
            gates.append(not_comparable(
                {"gate": f"active time ≤ {acc['max_active_ratio']} × {acc['max_bytes_ratio_vs']}",
                 "value": ra, "passed": ra <= acc["max_active_ratio"]}, (primary, acc["max_bytes_ratio_vs"]), on_shared))
    if acc.get("min_speedup_vs") and acc["min_speedup_vs"] in arms and primary in arms:
        for k in ("active_training_seconds", "whole_process_seconds"):
            sp = arms[acc["min_speedup_vs"]]["costs"][k] / arms[primary]["costs"][k]
            gates.append(not_comparable({"gate": f"{k.split('_')[0]} speedup ≥ {acc['min_speedup']}", "value": sp,
                                         "passed": sp >= acc["min_speedup"]}, (primary, acc["min_speedup_vs"]),
                                        on_shared))

    gates += unevaluated_gates(acc, primary, base, skipped, {g["gate"] for g in gates})

    gates += ([not_evaluated(g, f"{SERVING_PROBE} {skipped[SERVING_PROBE]}")
               for g in serving_gate_names(requests_of(prepared))]
              if v.serving is None and SERVING_PROBE in skipped else serving_gates(v.serving))
    reach = by_gate(v.attainability)

    try:  # evidence that passed its checks yet holds a value of the wrong type is still refused as evidence
        judged = [Gate.model_validate(labelled(g, reach)) for g in gates]
        return Report(
            experiment=exp["name"], profile=prepared["experiment"]["profile_name"],
            commitments_head=v.entries[-1]["hash"], anchors=v.anchors, selection=selection,
            selection_committed_at_seq=v.selection_entry["seq"],
            arms=arms, accuracy=accuracy, comparisons=comparisons,
            rules=acc, gates=judged, failed_gates=[g.gate for g in judged if g.failed],
            unattainable_failed_gates=[g.gate for g in judged if g.unattainable_failure],
            not_evaluated_gates=[g.gate for g in judged if g.not_evaluated],
            not_comparable_gates=[g.gate for g in judged if g.comparable is False], not_run=skipped,
            shared={k: shared_text(k, s).split(": ", 1)[1] for k, s in on_shared.items()},
            evaluation_attempts={role: {arm: [a["attempt"] for a in att] for arm, att in d.items()}
                                 for role, d in evaluations.items()},
            recovery_comparisons=v.recoveries,
            serving=v.serving, serving_attempts=v.serving_attempts,
            attainability={"source": v.attainability_source, "basis": v.attainability["basis"],
                           "gates": {g["gate"]: g["figures"] for g in v.attainability["gates"]}},
            graces=v.graces, failures=failures, cases=drawn_cases(prepared),
        )
    except ValidationError as e:
        raise EvidenceError(f"report: the trial's evidence does not fit the report: {e}") from None

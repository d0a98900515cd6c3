"""The report, recomputed from raw evidence in a trial home — or refused when the evidence disagrees.

Checks, in order (the first failure stops the report with a message; nothing is changed or removed):
  1. the commitments log's hash chain; the selection committed before every test evaluation; every
     prepared input against the hash in the committed prepared.json;
  2. every selected model against its receipt and the digest the selection names; every candidate's
     rank results against the hashes committed in candidates.json, each result belonging to its rank;
  3. each rank's documents per update against the committed global schedule (its contiguous slice)
     and, for DiLoCo, its outer steps against the sync schedule (every H updates and the last);
  4. every evaluation attempt's files against its receipt; every raw answer re-checked strictly
     against the committed task answers, and the recorded verdict must match;
  5. recovery comparison receipts found under the home, against their own digests;
  6. the first committed serving probe (evidence/serving.py): its receipt, the fixed workload, the
     attempt bound, and every stored figure against its own per-request records.
Then: accuracy per arm, paired gains (exact one-sided McNemar p, one-sided bounds), retention bounds,
the serving phases (throughput ratio, failover overhead, token and model identity), the
experiment's gates — each listed as passed or failed, the selection unchanged — and costs kept
apart: active training, checkpoint, startup and whole-process seconds, allocated device-seconds,
dollars where a price is known (none on the local cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evidence.anchors import AnchorError, verify_anchors
from evidence.attempts import attempt_number, attempts
from evidence.canonical import (EvidenceFileError, canonical_sha256, file_sha256, json_bytes, read_json,
                                read_jsonl, write_bytes_atomic)
from evidence.checker import check_answer
from evidence.commitments import CommitmentLog
from evidence.covered import guard_writes
from evidence.inputs import changed_input, global_losses, load_cases
from evidence.placement import SERVING_PROBE, committed_placement, not_evaluated, not_run, unevaluated_gates
from evidence.receipts import verify_receipt
from evidence.schedule import due_after as schedule_due
from evidence.serving import ServingEvidenceError, check_probe
from evidence.serving import GATES as SERVING_GATES
from evidence.serving import gates as serving_gates
from evidence.stats import mcnemar_exact_greater, paired_bounds


class EvidenceError(RuntimeError):
    """Inconsistent evidence: the report is not produced; the message names what and where."""


def _check_sequence(log: CommitmentLog) -> tuple[list[dict], dict]:
    try:
        entries = log.entries()  # re-verifies the hash chain
    except Exception as e:  # noqa: BLE001
        raise EvidenceError(f"commitments log: {e}") from None
    sel = [e for e in entries if e["kind"] == "selection"]
    if not sel:
        raise EvidenceError("no committed selection: run select before evaluation and report")
    for e in entries:
        if e["kind"] == "test-evaluation" and e["seq"] < sel[0]["seq"]:
            raise EvidenceError(f"test evaluation (entry {e['seq']}) was committed before the selection")
    for e in entries:  # every committed file still has its committed hash (evaluations: checked below,
        if not e["kind"].endswith("-evaluation"):  # attempt by attempt, with their own words)
            try:
                log.verify_subject(e)
            except Exception as err:  # noqa: BLE001
                raise EvidenceError(f"commitments log entry {e['seq']} ({e['kind']}): {err}") from None
    return entries, sel[0]


def _check_ranks(home: Path, cand: dict, schedule: list[list[int]]) -> list[dict]:
    results = []
    for ack in cand["ranks"]:
        p = home / ack["result"]
        if not p.is_file():
            raise EvidenceError(f"{cand['arm']}: rank {ack['rank']} result {p} is missing")
        if file_sha256(p) != ack["sha256"]:
            raise EvidenceError(f"{cand['arm']}: {p} differs from the hash committed in candidates.json")
        res = read_json(p)
        if res["rank"] != ack["rank"]:
            raise EvidenceError(f"{p} is rank {res['rank']}'s result, not rank {ack['rank']}'s")
        results.append(res)
    world = cand["world_size"]
    for res in results:
        if len(res["updates"]) != len(schedule):
            raise EvidenceError(f"{cand['arm']} rank {res['rank']} records {len(res['updates'])} updates; "
                                f"the schedule has {len(schedule)}")
        h = res["numerical_profile"]["arm"].get("sync_every")
        for u, rec in enumerate(res["updates"]):
            docs = schedule[u]
            k = len(docs) // world
            if rec["update"] != u or rec["global_docs"] != docs or \
                    rec["local_docs"] != docs[res["rank"] * k:(res["rank"] + 1) * k]:
                raise EvidenceError(f"{cand['arm']} rank {res['rank']} update {u}: documents deviate "
                                    "from the committed schedule")
            # an arm with a synchronization period H takes an outer step when one is due; every other
            # arm takes none (evidence.schedule: the rule the DiLoCo arm runs by)
            due = bool(h) and schedule_due(u, len(schedule), h)
            if rec["outer_step"] != due:
                raise EvidenceError(f"{cand['arm']} rank {res['rank']} update {u}: outer step "
                                    f"{'missing' if due else 'unscheduled'} (H = {h})")
    return results


def _check_model(d: Path, arm: str, digest: str) -> None:
    """A selected model directory: every file against its receipt, the receipt the one selected."""
    try:
        receipt = read_json(d / "receipt.json")
        got = verify_receipt(d, receipt, what=f"{arm}'s model")
    except Exception as e:  # noqa: BLE001
        raise EvidenceError(str(e)) from None
    if got != digest:
        raise EvidenceError(f"{d / 'receipt.json'}: receipt {got} is not the {digest} the selection names for {arm}")


def _check_attempt(home: Path, d: Path, role: str, arm: str, cases: dict[str, dict],
                   committed: dict[int, dict], log: CommitmentLog, model_receipt: str | None
                   ) -> dict[str, Any]:
    """An attempt counts only as committed: its receipt file is the committed one, its receipt
    names this role, arm and attempt, its summary names the selected model, and it answers every
    case of the role exactly once."""
    n = attempt_number(d)
    receipt_path = d / "receipt.json"
    entry = committed.get(n)
    if entry is None:
        if receipt_path.is_file():
            raise EvidenceError(f"{d}: a finished attempt that was never committed")
        return {"attempt": d.name, "complete": False}  # started, never finished: kept as evidence
    try:
        log.verify_subject(entry)  # receipt.json is the committed file
        receipt = read_json(receipt_path)
        verify_receipt(d, receipt, what=f"evaluation {d.relative_to(home)}", exclude=["started.json"])
    except Exception as e:  # noqa: BLE001
        raise EvidenceError(str(e)) from None
    meta = receipt.get("meta", {})
    if (meta.get("arm"), meta.get("role"), meta.get("attempt")) != (arm, role, n) or \
            entry["data"].get("receipt_digest") != receipt["digest"]:
        raise EvidenceError(f"{d}: its receipt does not belong to {role} attempt {n} of {arm}")
    summary = read_json(d / "summary.json")
    if model_receipt is not None and summary.get("model_receipt") != model_receipt:
        raise EvidenceError(f"{d / 'summary.json'}: scored model {summary.get('model_receipt')} is not "
                            f"the selected {model_receipt}")
    answers = read_jsonl(d / "answers.jsonl")
    want = sorted(cid for cid, c in cases.items() if c["split"] == role)
    got = [a["case_id"] for a in answers]
    if sorted(got) != want:
        raise EvidenceError(f"{d / 'answers.jsonl'}: answers {len(got)} cases, the {role} split has "
                            f"{len(want)} (each exactly once)")
    for a in answers:
        c = cases[a["case_id"]]
        v = check_answer(a["text"], c["schema"], c["answer"]).as_dict()
        if v["correct"] != a["correct"]:
            raise EvidenceError(f"{d / 'answers.jsonl'}: case {a['case_id']} is recorded as "
                                f"{'correct' if a['correct'] else 'wrong'} but re-checks as {v}")
    return {"attempt": d.name, "complete": True, "answers": answers,
            "probes": read_jsonl(d / "probes.jsonl"), "summary": summary}


def build_report(home: str | Path, *, store: str | None = None, trial: str | None = None) -> dict[str, Any]:
    """`store`: where the log's anchors are (default: the store preserved.json names, if any)."""
    home = Path(home)
    log = CommitmentLog(home)
    entries, sel_entry = _check_sequence(log)
    try:
        anchors = verify_anchors(home, entries, store, trial)
    except (AnchorError, EvidenceFileError) as e:
        raise EvidenceError(f"anchors: {e}") from None
    prepared = read_json(home / "prepared.json")  # itself a committed subject, checked above
    bad = changed_input(home, prepared)
    if bad is not None:
        raise EvidenceError(f"prepared input {bad} is missing or differs from its committed hash")
    exp = prepared["experiment"]["experiment"]
    acc = exp["acceptance"]
    selection = read_json(home / "selection.json")
    cands = {c["arm"]: c for c in read_json(home / "candidates.json")["candidates"]}
    skipped = _not_run(home, exp, cands)
    schedule = read_json(home / "inputs" / "schedule.json")["updates"]
    cases = load_cases(home)

    for arm, digest in selection["candidates"].items():  # what was scored and served is still there
        _check_model(home / "runs" / arm / "model", arm, digest)
    arms: dict[str, Any] = {}
    for name, cand in cands.items():
        results = _check_ranks(home, cand, schedule)
        n = len(results[0]["updates"])
        losses = global_losses([r["updates"] for r in results])
        ckpt = [sum(c["publish_seconds"] for c in r.get("checkpoints", {}).get("published", []))
                for r in results]
        t = [r["timers"] for r in results]
        arms[name] = {
            "kind": cand["kind"], "world_size": cand["world_size"], "updates": n,
            "loss_per_update": losses,
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

    evaluations: dict[str, dict[str, Any]] = {}
    # what the log commits and what the disk holds, both: a committed evaluation whose files were
    # removed must stop the report, never shrink it
    found = {(d.parent.name, d.name) for d in (home / "evaluations").glob("*/*") if d.is_dir()}
    found |= {(e["kind"].removesuffix("-evaluation"), str(e["data"].get("arm"))) for e in entries
              if e["kind"].endswith("-evaluation")}
    for role, arm in sorted(found):
        arm_dir = home / "evaluations" / role / arm
        committed = {int(e["data"]["attempt"]): e for e in entries
                     if e["kind"] == f"{role}-evaluation" and e["data"].get("arm") == arm}
        dirs = attempts(arm_dir)
        for n, e in committed.items():
            if arm_dir / f"attempt-{n}" not in dirs:
                raise EvidenceError(f"committed {role} attempt {n} of {arm} is missing: "
                                    f"{arm_dir / f'attempt-{n}'} (log entry {e['seq']})")
        model = (selection["candidates"].get(arm) if arm != selection["baseline"]
                 else prepared["model"]["receipt_digest"])
        checked = [_check_attempt(home, d, role, arm, cases, committed, log, model) for d in dirs]
        if len([a for a in checked if a["complete"]]) > 1:
            for a in checked[1:]:
                if a["complete"] and not a["summary"].get("retry_reason"):
                    raise EvidenceError(f"{arm_dir / a['attempt']}: a second attempt without a "
                                        "recorded retry reason")
        evaluations.setdefault(role, {})[arm] = checked

    def used(role: str, arm: str) -> dict[str, Any] | None:
        """The first complete attempt: retries are listed, never substituted for it."""
        for a in evaluations.get(role, {}).get(arm, []):
            if a["complete"]:
                return a
        return None

    base = selection["baseline"]
    accuracy, comparisons, gates = {}, {}, []
    test_base = used("test", base)
    for arm in [base, *cands]:
        a = used("test", arm)
        if a:
            accuracy[arm] = {"cases": len(a["answers"]), "correct": sum(x["correct"] for x in a["answers"]),
                             "accuracy": sum(x["correct"] for x in a["answers"]) / len(a["answers"]),
                             "attempts": len(evaluations["test"][arm])}
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
            gates.append({"gate": f"active time ≤ {acc['max_active_ratio']} × {acc['max_bytes_ratio_vs']}",
                          "value": ra, "passed": ra <= acc["max_active_ratio"]})
    if acc.get("min_speedup_vs") and acc["min_speedup_vs"] in arms and primary in arms:
        for k in ("active_training_seconds", "whole_process_seconds"):
            sp = arms[acc["min_speedup_vs"]]["costs"][k] / arms[primary]["costs"][k]
            gates.append({"gate": f"{k.split('_')[0]} speedup ≥ {acc['min_speedup']}", "value": sp,
                          "passed": sp >= acc["min_speedup"]})

    gates += unevaluated_gates(acc, primary, base, skipped, {g["gate"] for g in gates})

    recoveries = []
    for f in sorted(home.rglob("recovery-comparison.json")):
        rep = read_json(f)
        if canonical_sha256({k: v for k, v in rep.items() if k != "digest"}) != rep.get("digest"):
            raise EvidenceError(f"{f}: contents differ from its digest")
        recoveries.append({"file": str(f.relative_to(home)), "identical": rep["comparison"]["identical"],
                           "max_abs_diff": rep["comparison"]["max_abs_diff"]})

    serving, serving_attempts = _serving(home, entries, selection, cases)
    gates += ([not_evaluated(g, f"{SERVING_PROBE} {skipped[SERVING_PROBE]}") for g in SERVING_GATES]
              if serving is None and SERVING_PROBE in skipped else serving_gates(serving))

    report = {
        "format": "trial-report-v1", "experiment": exp["name"], "profile": prepared["experiment"]["profile_name"],
        "commitments_head": entries[-1]["hash"], "anchors": anchors, "selection": selection,
        "selection_committed_at_seq": sel_entry["seq"],
        "arms": arms, "accuracy": accuracy, "comparisons": comparisons,
        "gates": gates, "failed_gates": [g["gate"] for g in gates if g["passed"] is False],
        "not_evaluated_gates": [g["gate"] for g in gates if g["passed"] is None], "not_run": skipped,
        "evaluation_attempts": {role: {arm: [a["attempt"] for a in v] for arm, v in d.items()}
                                for role, d in evaluations.items()},
        "recovery_comparisons": recoveries,
        "serving": serving, "serving_attempts": serving_attempts,
    }
    return report


def _not_run(home: Path, exp: dict[str, Any], cands: dict[str, Any]) -> dict[str, str]:
    """What the committed placement did not run (evidence/placement.py); every other trained arm of
    the experiment must be a candidate."""
    try:
        skipped = not_run(committed_placement(home))
    except Exception as e:  # noqa: BLE001 — the placement file changed since it was committed
        raise EvidenceError(f"placement: {e}") from None
    placed = set(cands) | set(skipped)
    missing = [a["name"] for a in exp["arms"] if a["kind"] != "seed" and a["name"] not in placed]
    if missing:
        raise EvidenceError(f"arm(s) {', '.join(missing)} are neither candidates nor not run by the "
                            "committed placement")
    return skipped


def _serving(home: Path, entries: list[dict], selection: dict, cases: dict[str, dict]
             ) -> tuple[dict[str, Any] | None, list[str]]:
    """The first committed probe is the one reported (later ones are listed, never substituted)."""
    committed = [e for e in entries if e["kind"] == "serving"]
    started = attempts(home / "serving")
    names = [d.name for d in started]
    for d in started:
        if (d / "receipt.json").is_file() and not any(e["subject"] == str((d / "receipt.json").relative_to(home))
                                                      for e in committed):
            raise EvidenceError(f"{d}: a finished serving probe that was never committed")
    if not committed:
        return None, names
    try:
        CommitmentLog(home).verify_subject(committed[0])
        arm = selection["serving"]
        comp = check_probe(home, committed[0], sorted(c for c, v in cases.items() if v["split"] == "dev"),
                           {"arm": arm, "receipt_digest": selection["candidates"].get(arm, "")})
    except (ServingEvidenceError, OSError, KeyError) as e:
        raise EvidenceError(f"serving: {e}") from None
    return comp, names


def markdown(rep: dict[str, Any]) -> str:
    lines = [f"# {rep['experiment']} ({rep['profile']}) — trial report", "",
             f"Selection (committed at log entry {rep['selection_committed_at_seq']}, fixed by the rules): "
             f"primary **{rep['selection']['primary']}**, serving {rep['selection']['serving']}.", "",
             _anchors_line(rep.get("anchors")), "",
             "## Gates", "", "| gate | value | result |", "|---|---|---|"]
    for g in rep["gates"]:
        lines.append(f"| {g['gate']} | — | not evaluated: {g['reason']} |" if g["passed"] is None else
                     f"| {g['gate']} | {g['value']:.4g} | {'passed' if g['passed'] else '**FAILED**'} |")
    if rep.get("not_run"):
        lines += ["", "## Not run", "", "Decided from the cluster before anything trained (placement.json, committed): "
                  "never launched, never a candidate, never scored; the gates that need them are not evaluated.", ""]
        lines += [f"- {what}: {why}" for what, why in rep["not_run"].items()]
    lines += ["", "## Test accuracy", "", "| arm | correct / cases | accuracy | attempts |", "|---|---|---|---|"]
    for arm, a in rep["accuracy"].items():
        lines.append(f"| {arm} | {a['correct']} / {a['cases']} | {a['accuracy']:.3f} | {a['attempts']} |")
    lines += ["", "## Paired comparisons", "",
              "| comparison | Δ accuracy | one-sided lower | McNemar p | Δ retention loss upper |", "|---|---|---|---|---|"]
    for k, c in rep["comparisons"].items():
        ret = c.get("retention_loss_change", {}).get("upper")
        lines.append(f"| {k} | {c['accuracy_change']['mean_difference']:+.4f} | {c['accuracy_change']['lower']:+.4f} "
                     f"| {c['mcnemar_greater']['p_value']:.4g} | {'' if ret is None else f'{ret:+.4f}'} |")
    lines += ["", "## Training and costs (kept apart)", "",
              "| arm | ranks | loss first → last | payload B/update | active s | checkpoint s | startup s "
              "| whole-process s | device-seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, a in rep["arms"].items():
        c = a["costs"]
        lines.append(f"| {arm} | {a['world_size']} | {a['loss_per_update'][0]:.4f} → {a['loss_per_update'][-1]:.4f} "
                     f"| {a['payload_bytes_per_update']:,.0f} | {c['active_training_seconds']:.2f} "
                     f"| {c['checkpoint_seconds']:.2f} | {c['startup_seconds']:.2f} | {c['whole_process_seconds']:.2f} "
                     f"| {c['allocated_device_seconds']:.2f} |")
    lines += ["", "Dollars: not applicable on the embedded local cluster (no price).", ""]
    lines += _serving_markdown(rep.get("serving"), rep.get("serving_attempts", []))
    if rep["recovery_comparisons"]:
        lines += ["## Recovery", ""] + [f"- {r['file']}: identical={r['identical']}, max |Δ| = {r['max_abs_diff']}"
                                        for r in rep["recovery_comparisons"]] + [""]
    return "\n".join(lines)


def _anchors_line(a: dict[str, Any] | None) -> str:
    if a is None:
        return "Commitments log: hash chain checked; no evidence store was known, so its anchors were not."
    return (f"Commitments log: {a['anchored']} of {a['entries']} entries match their anchors in {a['store']}"
            + (f"; entries {a['not_anchored']} were not anchored." if a["not_anchored"] else "."))


def _serving_markdown(sv: dict[str, Any] | None, attempts: list[str]) -> list[str]:
    if sv is None:
        return ["## Serving", "", "No committed serving probe." + (f" Started: {', '.join(attempts)}." if attempts else ""), ""]
    out = ["## Serving", "",
           f"{sv['attempt']} ({len(attempts)} probe attempt(s)); {sv['replicas']} replicas; stopped for the failure "
           f"phase: {(sv.get('stopped') or {}).get('replica')}.", "",
           "| phase | answered | failed | retries | wall s | req/s | p50 s | p90 s | p99 s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for p, f in sv["phases"].items():
        lat = f["latency_seconds"]
        cell = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
        out.append(f"| {p} | {f['completed']}/{f['requests']} | {f['failed']} | {f['retries']} | {f['wall_seconds']:.2f} "
                   f"| {cell(f['throughput_rps'])} | {cell(lat['p50'])} | {cell(lat['p90'])} | {cell(lat['p99'])} |")
    out.append("")
    if "throughput_ratio_replicas_vs_single" in sv:
        out.append(f"- throughput, {sv['replicas']} replicas / 1 replica: {sv['throughput_ratio_replicas_vs_single']:.3f}")
    if "failover" in sv:
        fo = sv["failover"]
        out.append(f"- failover: {fo['extra_retries']} extra retries, p50 latency {fo['extra_latency_p50_seconds']:+.3f} s, "
                   f"p90 {fo['extra_latency_p90_seconds']:+.3f} s, wall × {fo['wall_ratio_failure_vs_replicas']:.3f}")
    out.append(f"- tokens: {sv['tasks_answered']} tasks, {len(sv['tasks_with_differing_tokens'])} with differing "
               f"tokens; model identities: {len(sv['model_identities'])} (selected: {sv['model_matches_selection']})")
    return out + [""]


def plots(rep: dict[str, Any], out_dir: Path, stem: str) -> list[str]:
    """PNG figures beside the Markdown: loss per update, bytes per update, accuracy with one-sided
    bounds, costs. Drawn from the report's own numbers (nothing else is read)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}-{name}.png", dpi=110)
        plt.close(fig)
        names.append(f"{stem}-{name}.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, a in rep["arms"].items():
        ax.plot(range(1, len(a["loss_per_update"]) + 1), a["loss_per_update"], label=arm)
    ax.set_xlabel("update")
    ax.set_ylabel("global weighted response loss")
    ax.legend(fontsize=8)
    save(fig, "loss")

    fig, ax = plt.subplots(figsize=(6, 3))
    arms = list(rep["arms"])
    ax.bar(arms, [rep["arms"][a]["payload_bytes_per_update"] / 1e6 for a in arms])
    ax.set_ylabel("logical payload MB / update / rank")
    save(fig, "bytes")

    if rep["accuracy"]:
        fig, ax = plt.subplots(figsize=(6, 3))
        accs = list(rep["accuracy"])
        ax.bar(accs, [rep["accuracy"][a]["accuracy"] for a in accs])
        base = rep["selection"]["baseline"]
        for i, a in enumerate(accs):
            c = rep["comparisons"].get(f"{a} vs {base}")
            if c:  # the one-sided lower bound of the gain, drawn from the seed's accuracy
                lo = rep["accuracy"][base]["accuracy"] + c["accuracy_change"]["lower"]
                ax.plot([i - 0.3, i + 0.3], [lo, lo], color="black")
        ax.set_ylabel("test exact accuracy (bar: lower bound)")
        ax.set_ylim(0, 1)
        save(fig, "accuracy")

    fig, ax = plt.subplots(figsize=(6, 3))
    keys = ("active_training_seconds", "checkpoint_seconds", "startup_seconds", "whole_process_seconds")
    width = 0.2
    for k_i, k in enumerate(keys):
        ax.bar([i + k_i * width for i in range(len(arms))], [rep["arms"][a]["costs"][k] for a in arms],
               width, label=k.replace("_seconds", "").replace("_", " "))
    ax.set_xticks([i + 1.5 * width for i in range(len(arms))], arms)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    save(fig, "costs")

    if rep.get("serving"):
        ph = rep["serving"]["phases"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(7, 3))
        a1.bar(list(ph), [f["throughput_rps"] or 0 for f in ph.values()])
        a1.set_ylabel("answered requests / s")
        for q in ("p50", "p90", "p99"):
            a2.plot(list(ph), [f["latency_seconds"][q] or 0 for f in ph.values()], marker="o", label=q)
        a2.set_ylabel("latency s (retries included)")
        a2.legend(fontsize=7)
        save(fig, "serving")
    return names


def _write(rep: dict[str, Any], output: Path) -> None:
    """Render every file the report makes, then write them — unless any would replace a file of
    evidence (`evidence.covered`): then nothing is written."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        figures = plots(rep, Path(tmp), output.stem)
        writes = {output.parent / n: (Path(tmp) / n).read_bytes() for n in figures}
    md = markdown(rep) + "\n## Figures\n\n" + "".join(f"![{n}]({n})\n\n" for n in figures)
    writes = {output: json_bytes(rep), **writes, output.with_suffix(".md"): md.encode("utf-8")}
    for path, data in guard_writes(writes).items():
        write_bytes_atomic(path, data)


def write_report(home: str | Path, output: str | Path, *, store: str | None = None,
                 trial: str | None = None) -> dict[str, Any]:
    """Build the report and write it to `output` (with report.md and the figures beside it)."""
    rep = build_report(home, store=store, trial=trial)
    _write(rep, Path(output))
    return rep


def write_report_numbered(home: str | Path, output: str | Path, *, store: str | None = None,
                          trial: str | None = None) -> tuple[dict[str, Any], Path]:
    """As `write_report`, but when `output` is evidence that this report would change (a report.json
    preserved before the evidence grew), to the next free `<stem>-<n>`: built once, written once."""
    from evidence.covered import CoveredFileError

    rep, output = build_report(home, store=store, trial=trial), Path(output)
    for n in range(1, 1000):
        out = output if n == 1 else output.with_name(f"{output.stem}-{n}{output.suffix}")
        try:
            _write(rep, out)
            return rep, out
        except CoveredFileError:
            continue
    raise EvidenceError(f"{output}: no free report name beside it")

"""The report's first step: every check of a trial home's evidence, in the order the report
promises (evidence/report/__init__.py); the first failure stops it with EvidenceError naming what and
where. What passes is handed on as `Verified`: the evidence itself, read once and checked, so that
the statistics (`compute`) read nothing from disk and raise nothing about evidence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evidence.anchors import AnchorError, verify_anchors
from evidence.attempts import attempt_number, attempts
from evidence.canonical import EvidenceFileError, canonical_bytes, file_sha256, read_json, read_jsonl
from evidence.grace import read_graces
from evidence.checker import check_answer, failure_counts, fields_wrong
from evidence.commitments import CommitmentLog
from evidence.errors import UserError
from evidence.inputs import changed_input, load_cases, user_id
from evidence.attainability import ATTAINABILITY, analyse, disagreement
from evidence.placement import PlacementRecord, Shared, committed_placement, not_run, shared

SHARED_GPUS_ENV = "TRIAL_SHARED_GPUS"  # what a rank records of its placement (training/sharing.py)
from evidence.receipts import verify_receipt
from evidence.report.recovery import COMPARISON as RECOVERY_COMPARISON, recovery_verdict, summary_line
from evidence.schedule import due_after as schedule_due
from evidence.serving import ServingEvidenceError, check_probe, committed_levels, requests_of


class EvidenceError(UserError, RuntimeError):
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
    check_answers(d / "answers.jsonl", answers, cases, role)
    if "failures" in summary:  # kept since the report breaks failures down: a summary before then has none
        got = failure_counts(a["reason"] for a in answers if not a["correct"])
        if summary["failures"] != got:
            raise EvidenceError(f"{d / 'summary.json'}: its failures {json.dumps(summary['failures'], sort_keys=True)} "
                                f"are not its answers' {json.dumps(got, sort_keys=True)}")
    return {"attempt": d.name, "complete": True, "answers": answers,
            "probes": read_jsonl(d / "probes.jsonl"), "summary": summary}


ANSWER_KEYS = ("case_id", "text", "correct", "reason")  # what every answer record has held (training/evaluate.py)


def check_answers(path: Path, answers: list[dict[str, Any]], cases: dict[str, dict], role: str) -> None:
    """An attempt's answer records (`path`: answers.jsonl) against the committed cases: every case of
    the role answered exactly once; each raw answer re-checked strictly, its recorded verdict (right or
    wrong, and the reason) the re-check's; and the user's id, where a record carries one (`id`, since
    the answers kept it), the one inputs/tasks.jsonl gives that case. A record without `id` is one
    written before, or of a case without one: accepted as it always was."""
    for n, a in enumerate(answers, 1):
        missing = [k for k in ANSWER_KEYS if k not in a]
        if missing:
            raise EvidenceError(f"{path}:{n}: an answer record without {', '.join(missing)}")
    want = sorted(cid for cid, c in cases.items() if c["split"] == role)
    got = [a["case_id"] for a in answers]
    if sorted(got) != want:
        raise EvidenceError(f"{path}: answers {len(got)} cases, the {role} split has "
                            f"{len(want)} (each exactly once)")
    for a in answers:
        c = cases[a["case_id"]]
        v = check_answer(a["text"], c["schema"], c["answer"]).as_dict()
        if v["correct"] != a["correct"]:
            raise EvidenceError(f"{path}: case {a['case_id']} is recorded as "
                                f"{'correct' if a['correct'] else 'wrong'} but re-checks as {v}")
        if v["reason"] != a["reason"]:
            raise EvidenceError(f"{path}: case {a['case_id']} is recorded with reason {a['reason']!r} "
                                f"but re-checks as {v['reason']!r}")
        if not v["correct"] and isinstance(c["schema"], dict):  # in memory only: what the report counts per field
            a[FIELDS_WRONG] = fields_wrong(a["text"], c["schema"], c["answer"])
        if "id" in a:
            uid = user_id(c)
            if uid is None or canonical_bytes(a["id"]) != canonical_bytes(uid):
                raise EvidenceError(f"{path}: case {a['case_id']} is recorded with id {json.dumps(a['id'])}, but "
                                    f"inputs/tasks.jsonl's case {a['case_id']} has "
                                    + (f"id {json.dumps(uid)}" if uid is not None else "no id of the task file's"))


FIELDS_WRONG = "_fields_wrong"
"""The key `check_answers` adds, in memory, to a wrong object answer's record: every field it gets wrong."""


@dataclass(frozen=True)
class Verified:
    """A trial home's evidence after every check passed: what `compute` turns into the report."""

    entries: list[dict[str, Any]]  # the commitments log, its hash chain re-verified
    selection_entry: dict[str, Any]  # the first committed selection
    anchors: dict[str, Any] | None  # the log against its anchors in the store (None: no store known)
    prepared: dict[str, Any]  # prepared.json: the experiment, its profile and acceptance rules
    selection: dict[str, Any]
    candidates: dict[str, dict[str, Any]]  # arm → its candidates.json entry
    not_run: dict[str, str]  # what the committed placement did not run → why
    shared: dict[str, Shared]  # what it ran on GPUs shared on purpose (arm, or the probe) → how
    results: dict[str, list[dict[str, Any]]]  # arm → its ranks' results, each against the schedule
    evaluations: dict[str, dict[str, list[dict[str, Any]]]]  # role → arm → its attempts, re-checked
    recoveries: list[dict[str, Any]]  # recovery comparison receipts, each against its digest
    serving: dict[str, Any] | None  # the first committed serving probe's figures (None: no probe)
    serving_attempts: list[str]
    attainability: dict[str, Any]  # what each gate can reach at this profile (evidence/attainability.py)
    attainability_source: str  # where it came from: the committed record, or prepared.json
    graces: list[dict[str, Any]] = field(default_factory=list)  # time after the deadline granted (evidence/grace.py)

    @property
    def experiment(self) -> dict[str, Any]:
        return self.prepared["experiment"]["experiment"]


def verify(home: str | Path, *, store: str | None = None, trial: str | None = None) -> Verified:
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
    selection = read_json(home / "selection.json")
    cands = {c["arm"]: c for c in read_json(home / "candidates.json")["candidates"]}
    skipped = _not_run(home, exp, cands)
    schedule = read_json(home / "inputs" / "schedule.json")["updates"]
    cases = load_cases(home)

    for arm, digest in selection["candidates"].items():  # what was scored and served is still there
        _check_model(home / "runs" / arm / "model", arm, digest)
    results = {name: _check_ranks(home, cand, schedule) for name, cand in cands.items()}

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

    recoveries = recovery_comparisons(home)
    serving, serving_attempts = _serving(home, entries, selection, cases, requests_of(prepared),
                                         committed_levels(prepared))
    attainable, source = _attainability(home, entries, prepared, results)
    return Verified(entries=entries, selection_entry=sel_entry, anchors=anchors, prepared=prepared,
                    selection=selection, candidates=cands, not_run=skipped, results=results,
                    shared=_shared(home, results),
                    evaluations=evaluations, recoveries=recoveries, serving=serving,
                    serving_attempts=serving_attempts, attainability=attainable, attainability_source=source,
                    graces=[g.model_dump(mode="json") for g in read_graces(home)])


def recovery_comparisons(home: Path) -> list[dict[str, Any]]:
    """Every recovery-comparison.json under the home, read as the recovery trial's own report reads it
    (evidence/report/recovery.py: its digest checked, a damaged one refused by name), so both say the
    same verdict: identical, max |Δ|, and the one-line summary the report shows."""
    out = []
    for f in sorted(home.rglob(RECOVERY_COMPARISON)):
        try:
            v = recovery_verdict(f, relative_to=home)
        except EvidenceFileError as e:
            raise EvidenceError(str(e)) from None
        out.append({"file": v.comparison_file, "identical": v.recovered.identical,
                    "max_abs_diff": v.recovered.max_abs_diff, "summary": summary_line(v)})
    return out


def _attainability(home: Path, entries: list[dict], prepared: dict[str, Any],
                   results: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], str]:
    """What each gate can reach at this profile, recomputed from prepared.json (and the cluster the
    placement names). A home that committed its analysis before training (attainability.json, its
    hash checked with every committed file) must agree with the recomputation — verdicts and
    figures, gate by gate — and, where it says the ranks shared this machine's cores, with the core
    count every rank recorded. A home without one (trained before it was recorded) gets it computed."""
    placement = committed_placement(home)  # verified already by _not_run
    committed = [e for e in entries if e["kind"] == "attainability"]
    if not committed:
        cluster = None if placement is None else {"source": placement.cluster.source, "cores": None}
        return (analyse(prepared["experiment"], cluster, shared_cores=_on_one_machine(placement)),
                "computed from prepared.json: this home committed no attainability record before training")
    entry = committed[0]
    where = f"{ATTAINABILITY} (log entry {entry['seq']})"
    try:
        rec = read_json(home / entry["subject"])
        cluster = rec["basis"]["cluster"]
    except (EvidenceFileError, KeyError, TypeError) as e:
        raise EvidenceError(f"attainability: {where}: {e}") from None
    if placement is not None and (cluster or {}).get("source") != placement.cluster.source:
        raise EvidenceError(f"attainability: {where} analyses a {(cluster or {}).get('source')} cluster; the "
                            f"committed placement ran on a {placement.cluster.source} one")
    fresh = analyse(prepared["experiment"], cluster)
    why = disagreement(rec, fresh)
    if why:
        raise EvidenceError(f"attainability: {where} disagrees with what the committed prepared.json gives: {why}")
    cores = (cluster or {}).get("cores")
    if cores is not None:  # recorded only where the ranks shared the controller's machine's cores
        for arm, ranks in results.items():
            for r in ranks:
                got = (r.get("runtime") or {}).get("cpu_count")
                if got is not None and got != cores:
                    raise EvidenceError(f"attainability: {where} says the ranks shared {cores} CPU cores; "
                                        f"{arm} rank {r['rank']} recorded {got}")
    return fresh, f"committed before training in {where}, recomputed from prepared.json and equal"


def _on_one_machine(placement: PlacementRecord | None) -> bool:
    """Whether a home's ranks all ran on the controller's machine, for a home whose committed record
    does not say (trained before attainability was recorded): its placement's cluster is the embedded
    local one, "local" being placement.json's own word for it (orchestrate/placement.py writes it)."""
    return placement is not None and placement.cluster.source == "local"


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


def _shared(home: Path, results: dict[str, list[dict[str, Any]]]) -> dict[str, Shared]:
    """What ran on shared GPUs, by the committed placement, which every rank's own record must
    confirm: a rank records the TRIAL_SHARED_GPUS it was started with (training/runtime.py), so a
    placement edited after the fact, or ranks started otherwise than placed, are refused."""
    on_shared = shared(committed_placement(home))  # verified already by _not_run
    for arm, ranks in results.items():
        want = str(on_shared[arm].gpus) if arm in on_shared else None
        got = sorted({str(((r.get("runtime") or {}).get("env") or {}).get(SHARED_GPUS_ENV)) for r in ranks})
        if got != [str(want)]:
            raise EvidenceError(f"{arm}: the committed placement " + (f"shares {want} GPU(s) between its ranks"
                                if want else "gives each rank a device of its own") +
                                f", but its ranks recorded {SHARED_GPUS_ENV}={', '.join(got)}")
    return on_shared


def _serving(home: Path, entries: list[dict], selection: dict, cases: dict[str, dict], requests: int,
             levels: tuple[int, ...] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
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
                           {"arm": arm, "receipt_digest": selection["candidates"].get(arm, "")},
                           requests=requests, levels=levels)
    except (ServingEvidenceError, OSError, KeyError) as e:
        raise EvidenceError(f"serving: {e}") from None
    return comp, names

"""select → test → report on a smoke trial, and the tampering the report must catch."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from conftest import SMOKE_ARMS as ARMS
from conftest import run_cli, score
from evidence.canonical import read_json, read_jsonl
from evidence.report import EvidenceError, compute, verify


def evaluate(home, arm, seed, *extra):
    return run_cli("-m", "training", "evaluate", "--home", str(home), "--arm", arm, "--role", "test",
                   "--model-dir", str(seed), *extra)


def report(home, out):
    return run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))


@pytest.fixture(scope="session")
def selected(tmp_path_factory, trained, tiny_seed):
    """The trained home selected and its three arms scored on the test tasks, the seed not yet: the state
    `scored` continues from, and a crash while scoring the seed starts from (copy before altering)."""
    home = tmp_path_factory.mktemp("report") / "selected"
    shutil.copytree(trained, home)
    r = evaluate(home, "seed", tiny_seed)
    assert r.returncode == 2 and "selection" in r.stderr  # no scoring before the selection
    r = run_cli("-m", "training", "select", "--home", str(home))
    assert r.returncode == 0, r.stderr
    score(home, ARMS, tiny_seed)
    return home


@pytest.fixture(scope="session")
def scored(tmp_path_factory, selected, tiny_seed):
    home = tmp_path_factory.mktemp("report") / "scored"
    shutil.copytree(selected, home)
    score(home, ["seed"], tiny_seed)
    return home


@pytest.fixture
def copy(scored, tmp_path):
    dst = tmp_path / "home"
    shutil.copytree(scored, dst)
    return dst


def test_full_trial_report(copy, tmp_path):
    r = report(copy, tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    rep = read_json(tmp_path / "r.json")
    assert rep["selection"]["primary"] == "clean-single"
    assert set(rep["accuracy"]) == {"seed", *ARMS}
    assert all(a["cases"] == 32 for a in rep["accuracy"].values())
    # the gates are listed with their values; failures are reported, the selection is unchanged
    assert {g["gate"] for g in rep["gates"]} >= {"gain ≥ 5.0 pp", "McNemar p ≤ 0.01"}
    assert rep["failed_gates"] == [g["gate"] for g in rep["gates"] if not g["passed"]]
    from evidence.placement import rule_gates  # what a not-run primary would leave unevaluated: these names

    acc = read_json(copy / "prepared.json")["experiment"]["experiment"]["acceptance"]
    named = [g for g, _ in rule_gates(acc, "clean-single", "seed")]
    assert named == [g["gate"] for g in rep["gates"]][:3]
    # recomputed from raw answers: the accuracy equals the answers file's verdicts
    answers = [json.loads(x) for x in (copy / "evaluations" / "test" / "clean-single" / "attempt-1"
                                       / "answers.jsonl").read_text().splitlines()]
    assert rep["accuracy"]["clean-single"]["correct"] == sum(a["correct"] for a in answers)
    costs = rep["arms"]["clean-pair"]["costs"]
    assert costs["allocated_device_seconds"] >= costs["whole_process_seconds"] >= costs["active_training_seconds"] > 0
    # trained without `orchestrate run`, the home has no committed attainability record: it is computed
    # from prepared.json, said so, and every gate carries it; at 32 cases each could have passed
    assert rep["attainability"]["source"].startswith("computed from prepared.json")
    assert all(g["attainable"] is True for g in rep["gates"]) and rep["unattainable_failed_gates"] == []
    mc = next(g for g in rep["gates"] if g["gate"] == "McNemar p ≤ 0.01")
    assert mc["attainability"].startswith("32 test cases: needs at least 7 discordant pairs, all for clean-single")
    md = (tmp_path / "r.md").read_text()
    assert "## Gates" in md and "clean-pair" in md
    assert "Attainability: computed from prepared.json" in md
    for fig in ("loss", "bytes", "accuracy", "costs"):
        png = tmp_path / f"r-{fig}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"r-{fig}.png" in md


def refused(home, tmp_path, needle):
    out = tmp_path / "refused.json"
    r = report(home, out)
    assert r.returncode == 2, r.stdout
    err = " ".join(r.stderr.split())
    assert needle in err, err
    assert not out.exists()


def test_edited_raw_answer_is_caught(copy, tmp_path):
    p = copy / "evaluations" / "test" / "seed" / "attempt-1" / "answers.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[0]["text"] = json.dumps({"edited": True})
    p.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    refused(copy, tmp_path, "answers.jsonl")


def test_swapped_rank_result_is_caught(copy, tmp_path):
    a = copy / "runs" / "clean-pair" / "rank-0" / "result.json"
    b = copy / "runs" / "clean-pair" / "rank-1" / "result.json"
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)
    refused(copy, tmp_path, "differs from the hash committed in candidates.json")


def test_altered_schedule_is_caught(copy, tmp_path):
    p = copy / "inputs" / "schedule.json"
    s = read_json(p)
    s["updates"][0][0], s["updates"][0][1] = s["updates"][0][1], s["updates"][0][0]
    p.write_text(json.dumps(s))
    refused(copy, tmp_path, "schedule.json is missing or differs from its committed hash")


def test_deleted_evaluation_attempt_is_caught(copy, tmp_path):
    shutil.rmtree(copy / "evaluations" / "test" / "clean-pair" / "attempt-1")
    refused(copy, tmp_path, "committed test attempt 1 of clean-pair is missing")


def test_selection_after_test_scoring_is_caught(copy, tmp_path):
    """A test evaluation entry placed before the selection in the log (forged by hand, with a valid
    hash chain, since the log itself refuses to append it) stops the report: replaying the log's
    sequencing rules catches it."""
    from evidence.commitments import CommitmentLog, _entry_hash

    home = copy
    log = CommitmentLog(home)
    entries = log.entries()
    sel = next(e for e in entries if e["kind"] == "selection")
    test = next(e for e in entries if e["kind"] == "test-evaluation")
    # rewrite the chain with the test entry moved in front of the selection
    order = [e for e in entries if e is not test]
    order.insert(order.index(sel), test)
    prev = entries[0]["prev"]
    lines = []
    for i, e in enumerate(order):
        e = {**e, "seq": i, "prev": prev}
        e.pop("hash")
        e["hash"] = _entry_hash(e)
        prev = e["hash"]
        lines.append(json.dumps(e, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    log.path.write_text("\n".join(lines) + "\n")
    refused(home, tmp_path, "out of sequence: 'test-evaluation' needs a 'selection' commitment first")


def test_second_test_attempt_needs_the_flag(copy, tiny_seed, tmp_path):
    r = evaluate(copy, "clean-single", tiny_seed)
    assert r.returncode == 2 and "--retry" in " ".join(r.stderr.split())
    r = evaluate(copy, "clean-single", tiny_seed, "--retry", "re-run after a host reboot")
    assert r.returncode == 0, r.stderr
    attempts = sorted(p.name for p in (copy / "evaluations" / "test" / "clean-single").iterdir())
    assert attempts == ["attempt-1", "attempt-2"]  # both kept
    r = report(copy, tmp_path / "r.json")
    assert r.returncode == 0
    rep = read_json(tmp_path / "r.json")
    assert rep["accuracy"]["clean-single"]["attempts"] == 2  # the first attempt is the one used
    # an unflagged second attempt slipped in by hand is refused by the report
    second = copy / "evaluations" / "test" / "clean-single" / "attempt-2" / "summary.json"
    s = read_json(second)
    s["retry_reason"] = None
    second.write_text(json.dumps(s))
    refused(copy, tmp_path, "summary.json")


def test_another_arms_attempt_copied_over_is_caught(copy, tmp_path):
    """Re-receipted or copied evaluation files cannot stand in for the committed attempt."""
    dst = copy / "evaluations" / "test" / "clean-single" / "attempt-1"
    shutil.rmtree(dst)
    shutil.copytree(copy / "evaluations" / "test" / "clean-pair" / "attempt-1", dst)
    refused(copy, tmp_path, "committed file changed")


def test_a_gate_without_its_evidence_is_shown_not_dropped(selected, tmp_path, tiny_seed):
    """The seed's only test attempt never finished (a crash mid-scoring, as the first GPU study's
    scoring did): the primary gates are listed as not evaluated, saying why, instead of vanishing;
    once another attempt is scored (its retry reason recorded), they are evaluated."""
    home = tmp_path / "home"
    shutil.copytree(selected, home)
    started = home / "evaluations" / "test" / "seed" / "attempt-1"
    started.mkdir(parents=True)
    (started / "started.json").write_text(json.dumps({"arm": "seed", "role": "test", "attempt": 1}))
    r = report(home, tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    rep = read_json(tmp_path / "r.json")
    gates = {g["gate"]: g for g in rep["gates"]}
    for name in ("gain ≥ 5.0 pp", "McNemar p ≤ 0.01", "retention upper bound ≤ +0.02 nats"):
        assert gates[name]["passed"] is None and "clean-single and seed is not in the home" in gates[name]["reason"]
        assert name in rep["not_evaluated_gates"] and name not in rep["failed_gates"]
    score(home, ["seed"], tiny_seed, retry="attempt-1 did not finish")
    assert report(home, tmp_path / "r2.json").returncode == 0
    rep = read_json(tmp_path / "r2.json")
    assert rep["accuracy"]["seed"]["attempts"] == 2
    assert {g["gate"] for g in rep["gates"] if g["passed"] is not None} >= {"gain ≥ 5.0 pp", "McNemar p ≤ 0.01"}


def test_evidence_of_the_wrong_type_is_refused_as_evidence(copy):
    """A value that passed the checks but does not fit the report (a reason that is not text) is the
    evidence's fault: refused as such (the CLI's exit 2), not a traceback."""
    v = verify(copy)
    compute(v)  # the trial as it is fits
    with pytest.raises(EvidenceError, match=r"(?s)does not fit the report.*not_run"):
        compute(dataclasses.replace(v, not_run={**v.not_run, "some-arm": 3}))


def test_why_answers_failed_is_counted_from_the_answers(copy, tmp_path):
    """Each scored arm's wrong test answers by the checker's reason and field, in report.json and report.md;
    a built-in study's answer records carry no id (its cases have none of a task file's)."""
    from evidence.report.compute import breakdown

    assert report(copy, tmp_path / "r.json").returncode == 0
    rep = read_json(tmp_path / "r.json")
    assert set(rep["failures"]) == set(rep["accuracy"])
    md = (tmp_path / "r.md").read_text()
    assert "## Why answers failed" in md
    for arm, f in rep["failures"].items():
        rows = read_jsonl(copy / "evaluations" / "test" / arm / "attempt-1" / "answers.jsonl")
        assert not any("id" in r for r in rows)
        assert f == breakdown([r["reason"] for r in rows if not r["correct"]])
        assert f["wrong"] == rep["accuracy"][arm]["cases"] - rep["accuracy"][arm]["correct"]
        assert f"- {arm}: {f['wrong']} of {rep['accuracy'][arm]['cases']} wrong" in md


def test_a_home_scored_before_the_breakdown_reports_as_it_did(copy, tmp_path):
    """Summaries written before `failures` was kept: the report has no breakdown, and is otherwise the same
    (the log rewritten to commit the older summaries moves its head, nothing else)."""
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    assert report(copy, tmp_path / "new" / "r.json").returncode == 0
    new = read_json(tmp_path / "new" / "r.json")
    for d in sorted((copy / "evaluations" / "test").glob("*/attempt-*")):
        recommit(copy, d, lambda s: {k: v for k, v in s.items() if k != "failures"})
    r = report(copy, tmp_path / "old" / "r.json")
    assert r.returncode == 0, r.stderr
    old = read_json(tmp_path / "old" / "r.json")
    assert "failures" in new and "failures" not in old
    assert {k: v for k, v in old.items() if k != "commitments_head"} == \
        {k: v for k, v in new.items() if k not in ("failures", "commitments_head")}
    md = (tmp_path / "old" / "r.md").read_text()
    assert "Why answers failed" not in md
    new_md = (tmp_path / "new" / "r.md").read_text()
    start = new_md.index("\n\n## Why answers failed\n")
    assert md == new_md[:start] + new_md[new_md.index("\n\n## ", start + 2):]  # that section alone is new


def recommit(home, d, edit_summary) -> None:
    """Rewrite an evaluation attempt's summary.json and commit it as `evaluate` would have (a new receipt, its log
    entry and the chain from there rehashed): evidence as another version of the code could have written it."""
    from evidence.canonical import canonical_bytes, file_sha256, write_json_atomic
    from evidence.commitments import GENESIS, CommitmentLog, _entry_hash
    from evidence.receipts import make_receipt

    write_json_atomic(d / "summary.json", edit_summary(read_json(d / "summary.json")))
    receipt = make_receipt(d, meta=read_json(d / "receipt.json")["meta"], exclude=["started.json"])
    write_json_atomic(d / "receipt.json", receipt)
    subject = str((d / "receipt.json").relative_to(home))
    log = CommitmentLog(home)
    prev, lines = GENESIS, []
    for e in log.entries():
        if e["subject"] == subject:
            e = {**e, "sha256": file_sha256(d / "receipt.json"),
                 "data": {**e["data"], "receipt_digest": receipt["digest"]}}
        e = {k: v for k, v in e.items() if k != "hash"} | {"prev": prev}
        e["hash"] = prev = _entry_hash(e)
        lines.append(canonical_bytes(e))
    log.path.write_bytes(b"\n".join(lines) + b"\n")

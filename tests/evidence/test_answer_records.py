"""The answer records of a user's own study: the id its task file gave each case carried into
answers.jsonl (and nowhere else), checked against the committed case by the report; `training check
--case` by that id; and why answers failed, counted from the records, per reason and per field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli, score
from evidence.canonical import read_json, read_jsonl
from evidence.checker import check_answer
from evidence.commitments import CommitmentLog
from evidence.report.compute import breakdown
from evidence.report.render import failures_markdown
from evidence.report.verify import EvidenceError, check_answers
from test_report import recommit
from training.evaluate import answer_record

STUDY = '''
name = "ids"
description = "cases with ids of their own"
generator_seed = 3
task_file = "cases.jsonl"
global_batch = 8
lr = 1e-3
serving_arm = "clean"

[[arms]]
name = "seed"
kind = "seed"

[[arms]]
name = "clean"
kind = "single"

[acceptance]
primary = "clean"
min_gain_pp = 5.0

[profiles.smoke]
seed = "tiny"
tasks = 8
replay = 8
dev = 2
test = 6
probes = 4
updates = 4
max_context = 320
replay_steps = [2, 3]
'''

OLD_KEYS = {"case_id", "family", "heldout_variant", "text", "token_ids", "correct", "reason"}


def own_cases() -> list[dict]:
    """16 cases labelled by split: object answers (two fields) in test, every one with an id but the third
    (a string or, for the fifth, an integer id); sums elsewhere."""
    rows = []
    for i in range(6):
        row = {"prompt": f"Weigh parcel {i}. Reply with JSON.", "answer": {"total": 10 + i, "unit": "kg"},
               "split": "test"}
        if i != 2:
            row["id"] = 105 if i == 4 else f"parcel-{i}"
        rows.append(row)
    rows += [{"prompt": f"What is {i} + 1?", "answer": i + 1, "split": "dev", "id": f"dev-{i}"} for i in range(2)]
    rows += [{"prompt": f"What is {i} + 2?", "answer": i + 2, "split": "train"} for i in range(8)]
    return rows


@pytest.fixture(scope="module")
def scored_own(tmp_path_factory, tiny_seed) -> Path:
    """The study prepared, a selection of the seed alone committed by hand (no arm trained: nothing else
    is needed to score the seed), and the seed scored on the test cases by `evaluate` itself. Read only."""
    from training.config import resolve
    from training.prepare import prepare

    root = tmp_path_factory.mktemp("own-ids")
    (root / "config").mkdir()
    (root / "config" / "ids.toml").write_text(STUDY, encoding="utf-8")
    (root / "config" / "cases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in own_cases()))
    home = root / "home"
    prepare(resolve("ids", "smoke", root / "config"), home, tiny_seed)
    (home / "candidates.json").write_text(json.dumps({"candidates": []}))
    (home / "selection.json").write_text(json.dumps({"baseline": "seed", "candidates": {}}))
    log = CommitmentLog(home)
    log.append("candidates", "candidates.json")
    log.append("selection", "selection.json")
    score(home, ["seed"], tiny_seed)
    return home


def attempt(home: Path) -> Path:
    return home / "evaluations" / "test" / "seed" / "attempt-1"


def test_answers_carry_the_task_files_id_only_where_it_gave_one(scored_own):
    from training.prepare import load_cases

    cases = load_cases(scored_own)
    rows = read_jsonl(attempt(scored_own) / "answers.jsonl")
    assert len(rows) == 6
    by_prompt = {cases[r["case_id"]]["prompt"]: r for r in rows}
    for i in range(6):
        r = by_prompt[f"Weigh parcel {i}. Reply with JSON."]
        if i == 2:  # no id in the file: the record is what it always was
            assert set(r) == OLD_KEYS
        else:
            assert set(r) == OLD_KEYS | {"id"} and r["id"] == (105 if i == 4 else f"parcel-{i}")
    # the summary keeps the wrong answers by reason, counted from the records
    summary = read_json(attempt(scored_own) / "summary.json")
    wrong = [r["reason"] for r in rows if not r["correct"]]
    assert sum(summary["failures"].values()) == len(wrong) == 6 - summary["correct"]
    assert all(summary["failures"][x] == wrong.count(x) for x in wrong)
    check_answers(attempt(scored_own) / "answers.jsonl", rows, cases, "test")  # as the report checks them


def test_a_generated_case_keeps_its_record_as_before(smoke_home):
    """A case of the generated families (its question names no task file) gets no `id`, whatever its question holds."""
    from training.prepare import load_cases

    case = next(c for c in load_cases(smoke_home).values() if c["split"] == "test")
    row = answer_record(case, "{}", [1, 2], check_answer("{}", case["schema"], case["answer"]))
    assert set(row) == OLD_KEYS
    assert "id" not in answer_record({**case, "question": {**case["question"], "id": "x"}}, "{}", [1],
                                     check_answer("{}", case["schema"], case["answer"]))


def records(home: Path) -> tuple[list[dict], dict]:
    from training.prepare import load_cases

    return read_jsonl(attempt(home) / "answers.jsonl"), load_cases(home)


def test_a_record_without_its_id_is_accepted_as_before(scored_own):
    """Answers written before the id was kept carry none: they verify as they always did."""
    rows, cases = records(scored_own)
    old = [{k: v for k, v in r.items() if k != "id"} for r in rows]
    assert old != rows
    check_answers(Path("answers.jsonl"), old, cases, "test")


def test_a_record_whose_id_disagrees_is_refused_by_name(scored_own):
    rows, cases = records(scored_own)
    i = next(n for n, r in enumerate(rows) if r.get("id") == "parcel-0")
    cid = rows[i]["case_id"]
    with pytest.raises(EvidenceError, match=f'case {cid} is recorded with id "parcel-9", but inputs/tasks.jsonl\'s '
                                            f'case {cid} has id "parcel-0"'):
        check_answers(Path("answers.jsonl"), [*rows[:i], {**rows[i], "id": "parcel-9"}, *rows[i + 1:]], cases, "test")
    # the same text as another type is another id (5 is not "5")
    j = next(n for n, r in enumerate(rows) if r.get("id") == 105)
    with pytest.raises(EvidenceError, match='recorded with id "105", but .* has id 105'):
        check_answers(Path("answers.jsonl"), [*rows[:j], {**rows[j], "id": "105"}, *rows[j + 1:]], cases, "test")
    k = next(n for n, r in enumerate(rows) if "id" not in r)
    with pytest.raises(EvidenceError, match=f"case {rows[k]['case_id']} is recorded with id \"parcel-2\", but .* "
                                            "has no id of the task file's"):
        check_answers(Path("answers.jsonl"), [*rows[:k], {**rows[k], "id": "parcel-2"}, *rows[k + 1:]], cases, "test")


def test_a_recorded_reason_or_a_missing_key_is_refused_by_name(scored_own):
    rows, cases = records(scored_own)
    i = next(n for n, r in enumerate(rows) if not r["correct"])
    with pytest.raises(EvidenceError, match=f"case {rows[i]['case_id']} is recorded with reason 'wrong_value:unit' "
                                            f"but re-checks as '{rows[i]['reason']}'"):
        check_answers(Path("answers.jsonl"), [*rows[:i], {**rows[i], "reason": "wrong_value:unit"}, *rows[i + 1:]],
                      cases, "test")
    with pytest.raises(EvidenceError, match=r"answers.jsonl:2: an answer record without reason"):
        check_answers(Path("answers.jsonl"), [rows[0], {k: v for k, v in rows[1].items() if k != "reason"},
                                              *rows[2:]], cases, "test")


def check(home: Path, case: str, text: str):
    return run_cli("-m", "training", "check", "--home", str(home), "--case", case, stdin=text)


def test_check_takes_the_task_files_id_or_the_case_id(scored_own):
    rows, cases = records(scored_own)
    cid = next(r["case_id"] for r in rows if r.get("id") == "parcel-1")
    right = json.dumps(cases[cid]["answer"])
    by_id = check(scored_own, "parcel-1", right)
    assert by_id.returncode == 0, by_id.stderr
    assert json.loads(by_id.stdout) == {"case": cid, "id": "parcel-1", "correct": True, "reason": "ok"}
    by_case = check(scored_own, cid, '{"total": 0, "unit": "kg"}')
    assert json.loads(by_case.stdout) == {"case": cid, "id": "parcel-1", "correct": False, "reason": "wrong_value:total"}
    num = check(scored_own, "105", right)  # an integer id, as a command line writes it
    assert json.loads(num.stdout)["id"] == 105 and json.loads(num.stdout)["case"] != cid
    unknown = check(scored_own, "parcel-99", right)
    said = " ".join(unknown.stderr.split())
    assert unknown.returncode == 2
    assert "no case 'parcel-99'" in said and "a case id (e.g. test-00000)" in said
    assert "or the id your task file gave a case (e.g. " in said


def test_check_refuses_an_id_that_names_several_cases(scored_own, tmp_path):
    """A home prepared before ids had to be unique may hold one id twice: the id is refused, naming the cases."""
    from training.__main__ import _case
    from training.prepare import PrepareError, load_cases

    cases = load_cases(scored_own)
    a, b = sorted(c for c in cases if cases[c]["split"] == "test" and cases[c]["question"]["id"] is not None)[:2]
    twice = {**cases, b: {**cases[b], "question": {**cases[b]["question"], "id": cases[a]["question"]["id"]}}}
    with pytest.raises(PrepareError, match=f"the id '{cases[a]['question']['id']}' is given to 2 cases in .*"
                                           rf"\({a}, {b}\): name one by its case id"):
        _case(twice, str(cases[a]["question"]["id"]), scored_own)
    assert _case(twice, b, scored_own) is twice[b]  # each still by its case id
    # a home without ids of its own says so, with an example of each form
    plain = {k: {**c, "question": {"sku": "K-1"}} for k, c in cases.items()}
    with pytest.raises(PrepareError, match=r"this home's cases have none: e.g. \"q-17\""):
        _case(plain, "q-17", scored_own)


def test_why_answers_failed_per_reason_and_field():
    """Counted from the checker's own verdicts of object answers: each kind of reason, and per field."""
    schema, expected = {"total": "int", "unit": "str"}, {"total": 12, "unit": "kg"}
    texts = (['{"total": 11, "unit": "kg"}'] * 3 + ['{"total": 12, "unit": "lb"}'] * 2
             + ['{"total": 12}', "twelve kg", "twelve kg", '{"total": "12", "unit": "kg"}', '{"total": 12, "unit": "kg"}'])
    verdicts = [check_answer(t, schema, expected) for t in texts]
    got = breakdown([v.reason for v in verdicts if not v.correct])
    assert got == {"wrong": 9, "reasons": {"wrong_value": 5, "missing_key": 1, "malformed_json": 2, "wrong_type": 1},
                   "fields": {"wrong_value": {"total": 3, "unit": 2}, "missing_key": {"unit": 1},
                              "wrong_type": {"total": 1}}}
    # a number answer's wrong_value names no field, beside an object's that do
    mixed = breakdown(["wrong_value", "wrong_value:total"])
    assert mixed["reasons"] == {"wrong_value": 2} and mixed["fields"] == {"wrong_value": {"total": 1}}
    md = failures_markdown({"single": got, "mixed": mixed, "seed": breakdown([])},
                           {"single": {"cases": 10}, "seed": {"cases": 10}})
    assert md[:3] == ["", "## Why answers failed", ""]
    assert ("- single: 9 of 10 wrong — wrong_value 5 (total 3, unit 2), malformed_json 2, missing_key 1 (unit 1), "
            "wrong_type 1 (total 1)") in md
    assert "- mixed: 2 wrong — wrong_value 2 (total 1, no field 1)" in md
    assert "- seed: 0 of 10 wrong" in md
    # in the accuracy table's order (a report.json's keys come back sorted), an arm not in it last
    assert [x.split(":")[0] for x in md if x.startswith("- ")] == ["- single", "- seed", "- mixed"]
    assert failures_markdown({}, {}) == []  # a report without a breakdown: no section


def test_many_keys_are_counted_not_all_named():
    """extra_key names what the answer wrote: past six keys on a line the rest are counted; a long or odd key is quoted."""
    reasons = [f"extra_key:k{i}" for i in range(8)] + ["extra_key:" + "x" * 40] * 3 + ["extra_key:a,b"] * 2
    (line,) = [x for x in failures_markdown({"a": breakdown(reasons)}, {}) if x.startswith("- a")]
    assert line == f'- a: 13 wrong — extra_key 13 ("{"x" * 21}…" 3, "a,b" 2, k0 1, k1 1, k2 1, k3 1, 4 more keys 4)'


def test_the_summary_must_count_what_the_answers_say(scored_own, tmp_path):
    """The report reads summary.json's `failures` (where kept) against the answers: a count that differs is refused."""
    from evidence.report.verify import _check_attempt
    from training.prepare import load_cases

    home = tmp_path / "home"
    shutil.copytree(scored_own, home)
    log = CommitmentLog(home)
    committed = {1: next(e for e in log.entries() if e["kind"] == "test-evaluation")}
    d = attempt(home)
    model = read_json(home / "prepared.json")["model"]["receipt_digest"]
    ok = _check_attempt(home, d, "test", "seed", load_cases(home), committed, log, model)
    assert ok["complete"] and ok["summary"]["failures"]
    recommit(home, d, lambda s: s | {"failures": {**s["failures"], "not_a_number": 1}})
    committed = {1: next(e for e in CommitmentLog(home).entries() if e["kind"] == "test-evaluation")}
    with pytest.raises(EvidenceError, match=r"summary.json: its failures .*not_a_number.* are not its answers'"):
        _check_attempt(home, d, "test", "seed", load_cases(home), committed, CommitmentLog(home), model)


def test_every_wrong_field_of_an_object_answer_is_counted_not_only_the_first():
    """The checker names an object answer's first failing field; the report also counts, per field, every
    wrong answer that gets it wrong (a unit wrong beside a wrong total was counted nowhere)."""
    from evidence.checker import fields_wrong
    from evidence.report.compute import breakdown

    schema, want = {"total": "int", "unit": "str"}, {"total": 26, "unit": "g"}
    assert fields_wrong('{"total": 12, "unit": "kg"}', schema, want) == ["total", "unit"]
    assert fields_wrong('{"total": "26"}', schema, want) == ["total", "unit"]
    assert fields_wrong("12 kg", schema, want) == [] and fields_wrong("12", "number", 26) == []
    got = breakdown(["wrong_value:total", "wrong_value:total", "malformed_json"], [["total", "unit"], ["total"], []])
    assert got["fields"] == {"wrong_value": {"total": 2}} and got["wrong_fields"] == {"total": 2, "unit": 1}
    assert "wrong_fields" not in breakdown(["wrong_value"], [[]])

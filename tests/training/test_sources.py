"""The task sources: the user's JSONL read line by line (every refusal names its line), split and
damaged as documented; a prepared home commits the file's hash and scores its cases with their own
schemas; the generated families' homes keep their form."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evidence.canonical import read_json
from training.config import ConfigError, load_experiment, resolve
from training.prepare import PrepareError, load_cases, prepare
from training.sources import JsonlFile, TaskFileError

COUNTS = {"train": 6, "dev": 2, "test": 4}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def sums(n: int, **extra) -> list[dict]:
    return [{"prompt": f"What is {i} + {i + 1}?", "answer": 2 * i + 1, **extra} for i in range(n)]


def test_schemas_follow_the_answer_and_splits_come_from_the_seed(tmp_path):
    rows = sums(10) + [{"prompt": "Capital of France?", "answer": "Paris"},
                       {"prompt": "Totals?", "answer": {"total": 3, "unit": "kg", "tags": ["a"]}}]
    src = JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)
    cases = src.cases(COUNTS)
    assert [c["split"] for c in cases] == ["train"] * 6 + ["dev"] * 2 + ["test"] * 4
    by_prompt = {c["prompt"]: c for c in cases}
    assert by_prompt["Capital of France?"]["schema"] == "text" and by_prompt["Capital of France?"]["target"] == "Paris"
    assert by_prompt["Totals?"]["schema"] == {"total": "int", "unit": "str", "tags": "list[str]"}
    assert by_prompt["What is 3 + 4?"]["schema"] == "number" and by_prompt["What is 3 + 4?"]["target"] == "7"
    again = JsonlFile(tmp_path / "t.jsonl", seed=1).cases(COUNTS)
    other = JsonlFile(tmp_path / "t.jsonl", seed=2).cases(COUNTS)
    assert again == cases and [c["prompt"] for c in other] != [c["prompt"] for c in cases]
    assert src.describe()["used"] == COUNTS and src.describe()["unused"] == 0


def test_a_files_own_splits_are_kept_and_the_surplus_is_counted(tmp_path):
    rows = ([{**r, "split": "train"} for r in sums(8)]
            + [{"prompt": f"dev {i}", "answer": i, "split": "dev"} for i in range(2)]
            + [{"prompt": f"test {i}", "answer": i, "split": "test"} for i in range(5)])
    src = JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)
    cases = src.cases(COUNTS)
    assert all(c["prompt"].startswith("test ") for c in cases if c["split"] == "test")
    assert src.describe()["split_by"] == "file" and src.describe()["unused"] == 3
    # a home prepared before the draw was recorded keeps the rule it had: the first cases in file order
    old = JsonlFile(tmp_path / "t.jsonl", seed=1, legacy=True)
    kept = old.cases(COUNTS)
    assert [c["prompt"] for c in kept if c["split"] == "test"] == [f"test {i}" for i in range(4)]
    assert [c["question"]["line"] for c in kept if c["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert "draw" not in old.describe() and src.describe()["draw"]["rule"] == "seeded"
    with pytest.raises(TaskFileError, match=r"too few cases for the profile \(dev: 2 of 3\)"):
        JsonlFile(tmp_path / "t.jsonl", seed=1).cases({**COUNTS, "dev": 3})


@pytest.mark.parametrize("rows,match", [
    (["not json"], "line 1: not JSON"),
    ([{"prompt": "a", "answer": ""}], "line 1: an empty \"text\" answer"),
    ([{"prompt": "a", "answer": "odd", "wrong_answer": "even\n"}], "line 1: a \"text\" wrong_answer may not begin or end"),
    ([[1, 2]], "line 1: expected an object"),
    ([{"prompt": "a", "answer": 1, "hint": "x"}], "line 1: unknown key.s. hint"),
    ([{"prompt": "", "answer": 1}], "line 1: \"prompt\" must be a non-empty string"),
    ([{"prompt": "a"}], "line 1: no \"answer\""),
    ([{"prompt": "a", "answer": None}], "line 1: the answer's schema cannot be told"),
    ([{"prompt": "a", "answer": {"x": 1.5}}], "line 1: the answer's schema cannot be told"),
    ([{"prompt": "a", "answer": 1, "schema": "json"}], "line 1: \"schema\" \"json\" is none of"),
    ([{"prompt": "a", "answer": "1", "schema": "number"}], r"line 1: the answer fails its own schema \(not_a_number\)"),
    ([{"prompt": "a", "answer": 1, "schema": "text"}], "line 1: a \"text\" answer must be a string"),
    ([{"prompt": "a", "answer": " Paris"}], "line 1: a \"text\" answer may not begin or end with whitespace"),
    ([{"prompt": "a", "answer": 4, "wrong_answer": 4.0}], "line 1: \"wrong_answer\" is accepted as correct"),
    ([{"prompt": "a", "answer": 4, "wrong_answer": "5"}], r"line 1: \"wrong_answer\" is not an answer of the case's schema \(not_a_number\)"),
    ([{"prompt": "a", "answer": {"n": 1}, "wrong_answer": {"m": 1}}], r"not an answer of the case's schema \(missing_key:n\)"),
    ([{"prompt": "a", "answer": 1, "split": "valid"}], "line 1: \"split\" must be one of train, dev, test, not \"valid\""),
    ([{"prompt": "a", "answer": {"n": 1, "size": {"w": 2}}}], "line 1: .*its field \"size\" holds an object"),
    ([{"prompt": "a", "answer": 1, "id": "x"}, {"prompt": "b", "answer": 2, "id": "x"}],
     "line 2: the id \"x\" of line 1 again"),
    ([{"prompt": "a", "answer": 1, "id": ["x"]}], "line 1: \"id\" must be a non-empty string or an integer"),
    ([{"prompt": "a", "answer": 1}, "", {"prompt": "a", "answer": 2}], "line 3: the prompt of line 1 again"),
    ([{"prompt": "a", "answer": 1, "split": "test"}, {"prompt": "b", "answer": 2}],
     r"1 of 2 cases give a \"split\" \(line 2 does not\)"),
])
def test_every_refused_line_is_named(tmp_path, rows, match):
    with pytest.raises(TaskFileError, match=match):
        JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)


def test_lines_end_at_newlines_only_and_a_byte_order_mark_is_read(tmp_path):
    """JSON strings may hold U+2028 or U+0085 unescaped (json.dumps(ensure_ascii=False) writes them so):
    splitting on every Unicode line break refused such a line as broken JSON, with the wrong line number."""
    rows = [{"prompt": f"Say\u2028{i}\u0085now", "answer": i} for i in range(3)] + ['{"prompt": "x", "answer": 1, "hint": 2}']
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\r\n"
                                          for r in rows).encode())
    with pytest.raises(TaskFileError, match="line 4: unknown key"):
        JsonlFile(f, seed=1)
    f.write_bytes(f.read_bytes().rsplit(b"\r\n", 2)[0] + b"\r\n")
    assert [c["prompt"] for c in JsonlFile(f, seed=1).rows] == [f"Say\u2028{i}\u0085now" for i in range(3)]


def test_too_few_cases_and_an_unreadable_file_are_refused(tmp_path):
    with pytest.raises(TaskFileError, match=r"has 11 cases; the profile needs 6 train \+ 2 dev \+ 4 test = 12"):
        JsonlFile(write(tmp_path / "t.jsonl", sums(11)), seed=1).cases(COUNTS)
    (tmp_path / "bad.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(TaskFileError, match="unreadable"):
        JsonlFile(tmp_path / "bad.jsonl", seed=1)


def test_wrong_answers_feed_the_damaged_control_or_it_is_refused(tmp_path):
    rows = sums(12, wrong_answer=-1)
    src = JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)
    cases = src.cases(COUNTS)
    wrong = src.damage(cases, 3, seed=1, required=True)
    assert len(wrong) == 3 and set(wrong.values()) == {-1} and all(cases[i]["split"] == "train" for i in wrong)
    assert not any("wrong_answer" in c for c in cases)  # committed only where the control trains on it
    none = JsonlFile(write(tmp_path / "n.jsonl", sums(12)), seed=1)
    cases = none.cases(COUNTS)
    assert none.damage(cases, 3, seed=1, required=False) == {}
    with pytest.raises(TaskFileError, match="wrong answers for 3 training cases, and 0 of the training cases"):
        none.damage(cases, 3, seed=1, required=True)


# -- the file in an experiment, prepared --------------------------------------------------------
STUDY = '''
name = "own"
description = "own cases"
generator_seed = 5
task_file = "cases.jsonl"
global_batch = 8
lr = 1e-3
serving_arm = "clean"
{extra}

[[arms]]
name = "seed"
kind = "seed"

[[arms]]
name = "clean"
kind = "single"
{arms}

[acceptance]
primary = "clean"
min_gain_pp = 5.0

[profiles.smoke]
seed = "tiny"
tasks = 24
replay = 8
dev = 4
test = 8
probes = 4
updates = 4
max_context = 320
replay_steps = [2, 3]
{profile}
'''


def study(tmp_path: Path, rows: list, *, extra: str = "", arms: str = "", profile: str = "") -> Path:
    d = tmp_path / "config"
    d.mkdir(exist_ok=True)
    (d / "own.toml").write_text(STUDY.format(extra=extra, arms=arms, profile=profile), encoding="utf-8")
    write(d / "cases.jsonl", rows)
    return d


def mixed(n: int) -> list[dict]:
    return [{"prompt": f"Is {i} even or odd?", "answer": "even" if i % 2 == 0 else "odd",
             "wrong_answer": "odd" if i % 2 == 0 else "even"} if i % 2 else
            {"prompt": f"What is {i} + 1?", "answer": i + 1, "wrong_answer": i + 2} for i in range(n)]


def test_a_prepared_home_commits_the_file_and_its_cases(tmp_path, tiny_seed):
    d = study(tmp_path, mixed(40), arms='[[arms]]\nname = "damaged"\nkind = "single"\ndata = "damaged"')
    res = prepare(resolve("own", "smoke", d), tmp_path / "h", tiny_seed)
    p = res["prepared"]
    ts = p["task_source"]
    assert ts["kind"] == "jsonl" and ts["file"] == "cases.jsonl" and ts["cases"] == 40 and ts["unused"] == 4
    assert ts["sha256"] == __import__("hashlib").sha256((d / "cases.jsonl").read_bytes()).hexdigest()
    assert p["experiment"]["experiment"]["task_file"] == "cases.jsonl"
    assert p["corruption"]["count"] == 6  # round(0.25 × 24), each from the file's own wrong answers
    cases = load_cases(tmp_path / "h")
    damaged = [c for c in cases.values() if "damaged_answer" in c]
    assert len(damaged) == 6 and all(c["split"] == "train" for c in damaged)
    for c in damaged:  # the file's wrong answer, written as the model is taught to write an answer
        assert c["damaged_target"] == (c["damaged_answer"] if c["schema"] == "text" else json.dumps(c["damaged_answer"]))
    assert {c["family"] for c in cases.values()} == {"jsonl"}
    # a changed file is another study: the home refuses it, naming what it holds
    write(d / "cases.jsonl", mixed(41))
    with pytest.raises(PrepareError, match=r"already holds different prepared inputs .*; its task file was "
                                           r"cases.jsonl \(sha256 \w{12}…\), this run's is cases.jsonl"):
        prepare(resolve("own", "smoke", d), tmp_path / "h", tiny_seed)


def test_a_damaged_arm_without_wrong_answers_is_refused_before_anything_is_written(tmp_path, tiny_seed):
    rows = [{k: v for k, v in r.items() if k != "wrong_answer"} for r in mixed(40)]
    d = study(tmp_path, rows, arms='[[arms]]\nname = "damaged"\nkind = "single"\ndata = "damaged"')
    with pytest.raises(PrepareError, match="remove the damaged arm"):
        prepare(resolve("own", "smoke", d), tmp_path / "h", tiny_seed)
    assert not (tmp_path / "h").exists()  # nothing written: not even the home prepare made (#55)


@pytest.mark.parametrize("where,text,named", [
    ("extra", "heldout_test_fraction = 0.5", "heldout_test_fraction"),
    ("profile", "records = [3, 5]", "profiles.smoke.records"),
])
def test_what_only_generated_families_use_is_refused_with_a_task_file(tmp_path, where, text, named):
    d = study(tmp_path, mixed(40), **{where: text})
    with pytest.raises(ConfigError, match=f"{named} shape.s. the generated task families"):
        load_experiment("own", d)


def test_the_generated_cases_are_those_the_families_made_before_the_sources():
    """cooperative-learning's smoke cases, written as prepare writes inputs/tasks.jsonl, hash to the file the
    code before the task sources wrote (306ec79): the generated source is the same generator, the same
    random draws in the same order, the same damaged answers."""
    import hashlib

    from training.prepare import task_rows

    _, rows, damaged = task_rows(resolve("cooperative-learning", "smoke"))
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    assert len(damaged) == 24
    assert hashlib.sha256(text.encode()).hexdigest() == "10d161dc50411991e4e9c607444492a428fc5b58b1d09be5e2adb680fc4efe1c"


def test_the_generated_families_homes_keep_their_form(smoke_home):
    p = read_json(smoke_home / "prepared.json")
    assert "task_source" not in p and "task_file" not in p["experiment"]["experiment"]


def test_a_replay_file_splits_lines_as_a_task_file_does(tmp_path):
    from training.replay import load_jsonl

    msgs = [{"role": "user", "content": "Say\u2028hi"}, {"role": "assistant", "content": "hi\u0085there"}]
    f = tmp_path / "r.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"messages": msgs}, ensure_ascii=False) + "\r\n").encode())
    assert [r["messages"] for r in load_jsonl(f)] == [msgs]


# -- a file judged whole, before anything trains (#55) --------------------------------------------
@pytest.mark.unit
def test_every_bad_line_is_found_in_one_pass_and_the_refusal_is_capped(tmp_path):
    """A file with 39 repeated prompts took 39 rounds of fix-and-validate: every line is judged in one
    pass now, the refusal lists the first 20 and counts the rest, and keeps every finding."""
    from training.sources import FINDINGS_SHOWN

    rows = sums(60)
    for i in range(1, 40):
        rows[i] = {**rows[i], "prompt": rows[0]["prompt"]}
    rows[45] = "not json"
    with pytest.raises(TaskFileError) as e:
        JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)
    lines = str(e.value).splitlines()
    assert lines[0] == f"task file {tmp_path / 't.jsonl'}: 40 problems (the first 20 below, 20 more); fix every one, then validate again:"
    assert len(lines) == 1 + FINDINGS_SHOWN and lines[1].startswith("  line 2: the prompt of line 1 again")
    assert [f.line for f in e.value.findings] == [*range(2, 41), 46]  # every one, in line order
    assert e.value.findings[-1].what.startswith("not JSON")


@pytest.mark.unit
def test_an_empty_file_is_refused_by_name(tmp_path):
    for body in (b"", b"\n\n  \n", b"\xef\xbb\xbf"):
        (tmp_path / "t.jsonl").write_bytes(body)
        with pytest.raises(TaskFileError, match=r"t.jsonl: it holds no cases \(it is empty, or only blank lines\)"):
            JsonlFile(tmp_path / "t.jsonl", seed=1)


@pytest.mark.unit
def test_answers_a_family_checks_differently_are_said_with_their_lines(tmp_path):
    """A bare number among text answers was accepted without a word and checked by another rule than
    its neighbours. It is used as written (a family may mean to mix), and said by name, with its lines;
    a line that gives its "schema" means it, and another family is another matter."""
    rows = ([{"prompt": f"Is {i} even or odd?", "answer": "odd" if i % 2 else "even"} for i in range(6)]
            + [{"prompt": "What is 2 + 2?", "answer": 4},
               {"prompt": "What is 2 + 3?", "answer": 5, "schema": "number"},
               {"prompt": "What is 3 + 3?", "answer": 6, "family": "sums"}])
    src = JsonlFile(write(tmp_path / "t.jsonl", rows), seed=1)
    assert len(src.rows) == 9 and [w.line for w in src.warnings] == [7]
    assert src.warnings[0].what.startswith("family 'jsonl' mixes how answers are checked: text ×6, number ×1 "
                                           "(number on line(s) 7)")
    assert src.checks() == {"jsonl": {"number": 1, "number (given)": 1, "text": 6}, "sums": {"number": 1}}
    assert JsonlFile(write(tmp_path / "u.jsonl", rows[:6] + rows[7:]), seed=1).warnings == []


def test_every_case_is_measured_against_the_context_before_anything_is_written(tmp_path, tiny_seed):
    """A test case far over max_context passed prepare, every arm trained, then scoring asked for
    terabytes. Every case of the file is measured now — the chat template applied, its answer and
    wrong answer, each split — in the pass that judges its lines, and refused before anything trains."""
    rows = mixed(40)
    rows[6] = {**rows[6], "prompt": "word " * 2000}
    rows[29] = {**rows[29], "prompt": "many " * 400}
    rows[33] = {**rows[33], "answer": 1, "wrong_answer": 2}  # a line refused for itself, in the same pass
    rows[33]["prompt"] = rows[0]["prompt"]
    d = study(tmp_path, rows)
    with pytest.raises(PrepareError) as e:
        prepare(resolve("own", "smoke", d), tmp_path / "h", tiny_seed)
    lines = str(e.value).splitlines()
    assert lines[0].endswith("cases.jsonl: 3 problems; fix every one, then validate again:")
    assert re.fullmatch(r"  line 7: [\d,]+ tokens as a document \(chat template, answer, end token\), over max_context "
                        r"320: shorten it, or raise max_context in profile smoke", lines[1]), lines[1]
    assert lines[2].startswith("  line 30: ") and lines[3].startswith("  line 34: the prompt of line 1 again")
    assert not (tmp_path / "h" / "prepared.json").exists() and not (tmp_path / "h" / "inputs").exists()


def test_a_file_without_dev_cases_runs_with_dev_0_and_no_probe(tmp_path, tiny_seed):
    """A train/test-only file could not be used: dev had to be at least 1, and the remedy the message gave
    was refused. dev = 0 is a profile now, said in the refusal; the serving probe, whose requests are dev
    cases, is placed as not run with that reason (and so reported), everything else runs."""
    from orchestrate.placement import NO_DEV, local_devices, placement_record

    rows = [{**r, "split": "train" if i < 28 else "test"} for i, r in enumerate(mixed(40))]
    d = study(tmp_path, rows)
    with pytest.raises(PrepareError, match=r"\(dev: 0 of 4\): add cases or lower the profile's tasks, dev and test; "
                                           r"a file without dev cases runs with the profile's dev = 0"):
        prepare(resolve("own", "smoke", d), tmp_path / "h", tiny_seed)
    (d / "own.toml").write_text((d / "own.toml").read_text().replace("dev = 4", "dev = 0"))
    cfg = resolve("own", "smoke", d)
    p = prepare(cfg, tmp_path / "h", tiny_seed)["prepared"]
    assert p["splits"] == {"train": 24, "dev": 0, "test": 8}
    rec = placement_record(cfg, local_devices(None, "cpu"))
    assert not rec.serving.runs and rec.serving.reason == NO_DEV and all(a.runs for a in rec.arms)


def graded(n_per: dict[str, int]) -> list[dict]:
    """A file sorted by difficulty within each split, as a researcher's export often is: the easy cases first."""
    rows = []
    for split, n in n_per.items():
        for i in range(n):
            fam = ("easy", "mid", "hard")[min(2, 3 * i // n)] if split != "dev" else "mid"
            rows.append({"prompt": f"{split} case {i}", "answer": i, "split": split, "family": fam,
                         "id": f"{split}-{i}"})
    return rows


def test_a_labelled_file_is_drawn_per_split_and_family_never_taken_in_file_order(tmp_path):
    """The first cases of a sorted file are not the study: each split is drawn, each family its share,
    by the generator seed; the same draw on every run and machine (pinned here: a change to the rule
    would move every later home's cases), another seed another draw."""
    path = write(tmp_path / "t.jsonl", graded({"train": 300, "dev": 30, "test": 300}))
    counts = {"train": 100, "dev": 10, "test": 100}
    src = JsonlFile(path, seed=7)
    cases = src.cases(counts)
    test = [c for c in cases if c["split"] == "test"]
    fams = {f: sum(c["family"] == f for c in test) for f in ("easy", "mid", "hard")}
    assert fams == {"easy": 34, "mid": 33, "hard": 33}  # 100 of 300 by family, a remainder to the first written
    lines = [c["question"]["line"] for c in test]
    assert lines == sorted(lines) and lines != list(range(331, 431))  # file order kept, first 100 not taken
    assert max(lines) > 600  # the hard end of the file is in the study
    draw = src.describe()["draw"]
    assert draw == {"rule": "seeded", "seed": 7, "stratified_by": "family",
                    "from": {"train": 300, "dev": 30, "test": 300},
                    "families": {"train": {"easy": [34, 100], "mid": [33, 100], "hard": [33, 100]},
                                 "dev": {"mid": [10, 30]},
                                 "test": {"easy": [34, 100], "mid": [33, 100], "hard": [33, 100]}}}
    assert [c["question"]["id"] for c in test[:5]] == ['test-2', 'test-5', 'test-10', 'test-11', 'test-13']
    assert JsonlFile(path, seed=7).cases(counts) == cases
    assert [c["question"]["id"] for c in JsonlFile(path, seed=8).cases(counts)] != [c["question"]["id"] for c in cases]


def test_pinned_ids_are_the_exact_cases_or_refused_with_every_problem(tmp_path):
    path = write(tmp_path / "t.jsonl", graded({"train": 8, "dev": 3, "test": 6}))
    pins = tmp_path / "ids.json"
    pins.write_text(json.dumps({"train": [f"train-{i}" for i in (7, 1, 3, 0, 5, 2)], "dev": ["dev-2", "dev-0"],
                                "test": ["test-5", "test-0", "test-3", "test-1"]}))
    src = JsonlFile(path, seed=1, pinned=pins)
    cases = src.cases(COUNTS)
    assert [c["question"]["id"] for c in cases if c["split"] == "train"] == [f"train-{i}" for i in (7, 1, 3, 0, 5, 2)]
    assert src.describe()["draw"]["rule"] == "pinned" and src.describe()["draw"]["file"] == "ids.json"
    pins.write_text(json.dumps({"train": ["train-1", "train-1", "test-0", "nope", 5], "dev": ["dev-0", "dev-1"],
                                "test": ["test-0", "test-1", "test-2", "test-3"]}))
    with pytest.raises(TaskFileError) as e:
        JsonlFile(path, seed=1, pinned=pins).cases(COUNTS)
    said = str(e.value)
    assert "train pins 5 case(s) and the profile takes 6 (tasks = 6)" in said
    assert 'the id "train-1" is pinned already' in said and 'the id "test-0" is a test case' in said
    assert 'train: the id "nope" is no case\'s id' in said and "the id 5 is no case's id" in said


def test_a_home_prepared_before_the_draw_keeps_its_rule(tmp_path, tiny_seed, monkeypatch):
    """A labelled file's cases as the code before the draw took them (its first cases in file order) hash
    to what that code wrote (b53b2ff, the same study); a home whose prepared.json records no `draw` is
    prepared again by that rule, unchanged, while a new home of the same study is drawn."""
    import hashlib

    import training.prepare as tp

    rows = [{**r, "split": "train" if i < 30 else "dev" if i < 36 else "test"} for i, r in enumerate(mixed(48))]
    d = study(tmp_path, rows)
    cfg = resolve("own", "smoke", d)
    _, old_rows, damaged = tp.task_rows(cfg, legacy=True)
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in old_rows)
    assert len(damaged) == 6
    assert hashlib.sha256(text.encode()).hexdigest() == "95cc500a3e5c4413480cdf199f80f4a19f3cf384b441c0030cc505270d80a0bd"
    with monkeypatch.context() as m:  # a home as that code prepared it: no draw recorded
        m.setattr(tp, "drawn_before", lambda home: True)
        before = prepare(cfg, tmp_path / "old", tiny_seed)["prepared"]
    assert "draw" not in before["task_source"]
    again = prepare(cfg, tmp_path / "old", tiny_seed)
    assert again["status"] == "unchanged"
    new = prepare(cfg, tmp_path / "new", tiny_seed)["prepared"]
    assert new["task_source"]["draw"]["rule"] == "seeded" and new["inputs"]["tasks.jsonl"] != before["inputs"]["tasks.jsonl"]


def test_a_home_prepared_before_ids_were_checked_keeps_its_ids(tmp_path):
    """A file the code before (b53b2ff) accepted — ids repeated, or not strings or integers — still reads as
    it did for a home prepared then (`legacy`), so that home runs on; a new one refuses them by line."""
    rows = [{"prompt": f"q{i}", "answer": i, "id": v} for i, v in enumerate(["a", "a", 1.5, "", True, None, [1]])]
    path = write(tmp_path / "t.jsonl", rows)
    assert [c["id"] for c in JsonlFile(path, seed=1, legacy=True).rows] == ["a", "a", 1.5, "", True, None, [1]]
    with pytest.raises(TaskFileError) as e:
        JsonlFile(path, seed=1)
    assert "5 problems" in str(e.value) and 'line 2: the id "a" of line 1 again' in str(e.value)

"""`orchestrate remove --unpreserved` (#55): a run that fails before preservation no longer takes its
experiment's name with it. The home is discarded after saying what goes (and asking, or --yes); its
anchors stay in the store with a release record beside them, so the same name runs again from the same
--trials folder and its new home verifies. What was preserved stays untouchable; a refused run leaves
nothing behind.

And a researcher iterating on their own study (#67): a changed study under a name already used, or a
name a store holds, is refused by `validate` and `run` alike before anything is written (no seed copy,
no home, no lock, no record), naming the command that works — which then works; `remove` and `remove
--unpreserved` never send to each other; the cases are judged before the model is copied."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
from pathlib import Path

import pytest
from conftest import run_cli, signal_cli_when

from evidence.anchors import AnchorError, anchor_log
from evidence.commitments import CommitmentLog
from evidence.stores import open_store, preserve
from training.hold import hold, lock_path

STUDY = """name = "my-study"
description = "a study of our own, let go after a failed run and run again"
generator_seed = 7
task_file = "../../cases.jsonl"
global_batch = 8
lr = 1e-2
warmup = 2
serving_arm = "single"

[[arms]]
name = "seed"
kind = "seed"

[[arms]]
name = "single"
kind = "single"

[acceptance]
primary = "single"
min_gain_pp = 5.0

[profiles.smoke]
seed = "tiny"
tasks = 24
dev = 4
test = 8
replay = 8
probes = 8
updates = 8
max_context = 320
replay_steps = [2, 4]
serving_requests = 8

[profiles.local]
base = "smoke"
seed = "local"                   # the model given with --model-dir
"""


def case(i: int) -> str:
    return json.dumps({"prompt": f"What is {i} + {i + 3}? Reply with the number only.", "answer": 2 * i + 3,
                       "wrong_answer": 2 * i + 4}) + "\n"


@pytest.fixture
def study(tmp_path, tiny_seed, monkeypatch) -> Path:
    """A researcher's folder: the experiment, its 36 cases, the tiny seed; `orchestrate` finds the
    experiment through TRIAL_CONFIG_DIR (inherited by every CLI the test starts)."""
    folder = tmp_path / "my-study"
    (folder / "config" / "experiments").mkdir(parents=True)
    (folder / "config" / "experiments" / "my-study.toml").write_text(STUDY)
    (folder / "cases.jsonl").write_text("".join(case(i) for i in range(36)))
    shutil.copytree(tiny_seed, folder / "seeds" / "tiny")
    monkeypatch.setenv("TRIAL_CONFIG_DIR", str(folder / "config" / "experiments"))
    return folder


def run_args(study: Path) -> tuple[str, ...]:
    return ("-m", "orchestrate", "run", "my-study", "--profile", "smoke", "--trials", str(study / "trials"),
            "--seeds", str(study / "seeds"))


def interrupted_run(study: Path) -> None:
    """`orchestrate run`, stopped (SIGTERM, as Ctrl-C or a scheduler would) once training has begun:
    prepared and anchored, never preserved."""
    beat = study / "trials" / "my-study-smoke" / "runs" / "single" / "rank-0" / "heartbeat.json"
    run, err = signal_cli_when(beat, signal.SIGTERM, *run_args(study), timeout=300)
    assert run.returncode != 0 and "Traceback" not in err, err
    assert not (study / "trials" / "my-study-smoke" / "preserved.json").exists()


def flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def tree(folder: Path, locks: bool = True) -> list[tuple[str, int, int]]:
    """Every path under `folder` (lock files, empty folders and hidden ones included) with its size and
    modification time: what a command that writes nothing leaves as it was. `locks=False`: without the
    lock files beside homes that are there (they say only who held the home last) and the folders'
    times their coming changes."""
    return sorted((str(p.relative_to(folder)), p.lstat().st_size if p.is_file() else 0,
                   p.lstat().st_mtime_ns if locks or not p.is_dir() else 0)
                  for p in folder.rglob("*") if (locks or not p.name.endswith(".lock")) and not seed_hold(p, folder))


def seed_hold(p: Path, folder: Path) -> bool:
    """A built-in seed's lock file: `run` verifies the seed (made once, kept for every run) before it judges the
    study, and the hold rewrites who held it last — nothing of a trial."""
    rel = p.relative_to(folder).parts
    return len(rel) == 2 and rel[0] == "seeds" and p.name.endswith(".lock")


def named(said: str, command: str = "run") -> tuple[str, ...]:
    """The `orchestrate COMMAND …` a refusal names, as arguments for `run_cli`."""
    found = re.search(rf"`orchestrate {command} ([^`]*)`", said)
    assert found, said
    return ("-m", "orchestrate", command, *shlex.split(found.group(1)))


def test_a_home_never_preserved_is_let_go_and_its_name_runs_again(study):
    trials, home = study / "trials", study / "trials" / "my-study-smoke"
    interrupted_run(study)
    store = open_store(f"file://{trials / 'store'}")
    (first,) = {k.split("/")[2] for k in store.list("anchors/my-study-smoke/")}
    commitments = len(CommitmentLog(home).entries())
    anchors = store.list("anchors/")

    # the user fixes their task file: the home is another study now, and its name is held
    (study / "cases.jsonl").write_text("".join(case(i) for i in range(37)))
    before = tree(study)
    r = run_cli(*run_args(study))
    assert r.returncode == 2 and f"error: {home} holds another study, never preserved: its task file was " \
        "cases.jsonl (36 cases" in flat(r) and "now cases.jsonl (37 cases" in flat(r), flat(r)
    assert f"`orchestrate remove --unpreserved --home {home}`" in flat(r)
    assert tree(study) == before  # refused before anything is written: the home stays as it was
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    assert r.returncode == 2 and "has not been preserved" in flat(r), flat(r)
    assert f"orchestrate remove --unpreserved --home {home}" in flat(r)

    files = [p for p in home.rglob("*") if p.is_file()]
    mb = sum(p.stat().st_size for p in files) / 1e6
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--yes", "--home", str(home))
    said = flat(r)
    assert r.returncode == 0, said
    says = f"discard {home}: {len(files)} files, {mb:,.1f} MB, {commitments} commitment(s) — deleted from this machine"
    released = f"file://{trials / 'store'}/anchors/my-study-smoke/{first}/"
    assert says in said and f"release trial my-study-smoke's anchors {released}" in said, said
    assert said.index(says) < said.index("discarded ")  # said before it is done
    record = f"released/my-study-smoke/{first}.json"
    assert f"released in file://{trials / 'store'}/: file://{trials / 'store'}/{record}" in said
    assert not home.exists() and not lock_path(home).exists()
    assert store.list("anchors/") == anchors  # the store keeps every anchor: released, not deleted
    rec = json.loads((trials / "store" / record).read_text())
    assert (rec["prefix"], rec["files"], rec["home"]) == (f"anchors/my-study-smoke/{first}/", len(files), str(home))
    assert rec["reason"] == "discarded unpreserved by orchestrate remove --unpreserved"

    # the same name, from the same --trials folder: prepared, anchored anew, verified
    interrupted_run(study)
    assert {k.split("/")[2] for k in store.list("anchors/my-study-smoke/")} - {first}
    assert json.loads((home / "prepared.json").read_text())["task_source"]["cases"] == 37
    r = run_cli("-m", "evidence", "verify", "--home", str(home))
    assert r.returncode == 0, r.stderr
    assert "commitments match their anchors" in r.stderr
    assert "the store also holds 1 released chain(s) of trial my-study-smoke" in r.stderr


def test_a_refused_run_leaves_nothing_behind(study):
    """A task file prepare refuses: no home folder, no lock file, under --trials; likewise for `python -m
    training prepare`. A home that was there before the refusal stays."""
    (study / "cases.jsonl").write_text("".join(case(i) for i in range(36)) + '{"prompt": "x", "answer": 1, "bogus": 2}\n')
    r = run_cli(*run_args(study))
    assert r.returncode == 2 and "line 37: unknown key(s) bogus" in flat(r), flat(r)
    assert not (study / "trials").exists()  # not even the --trials folder it made
    home = study / "by-hand"
    args = ("-m", "training", "prepare", "--experiment", "my-study", "--profile", "smoke", "--home", str(home),
            "--model-dir", str(study / "seeds" / "tiny"))
    r = run_cli(*args)
    assert r.returncode == 2 and "unknown key(s) bogus" in flat(r) and not home.exists(), flat(r)
    home.mkdir()
    r = run_cli(*args)
    assert r.returncode == 2 and home.is_dir()  # the user's folder, not prepare's to remove


def anchored_home(trials: Path, name: str = "my-study-smoke") -> CommitmentLog:
    """A home whose log is anchored in the store beside it, as `orchestrate run` leaves one after prepare."""
    home = trials / name
    home.mkdir(parents=True)
    (home / "prepared.json").write_text('{"inputs": {}}')
    log = CommitmentLog(home)
    log.append("prepare", "prepared.json")
    anchor_log(home, open_store(f"file://{trials / 'store'}"))
    return log


def test_what_was_preserved_or_is_held_is_never_discarded(tmp_path):
    """Refused, naming why, with nothing changed: a preserved home; a home whose trial the store holds a
    preservation of (its record deleted); a home a run holds; a path that is no trial home; a damaged
    release record in the store."""
    trials = tmp_path / "trials"
    log = anchored_home(trials)
    home, url = log.home, f"file://{trials / 'store'}"

    def files() -> list[tuple[Path, bytes]]:  # a lock file beside a home that is there says only who held it
        return sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*")
                      if p.is_file() and not p.name.endswith(".lock"))

    def refused(*extra: str) -> str:
        before = files()
        r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--home", str(home), *extra)
        assert r.returncode == 2 and "refused:" in r.stderr and "Traceback" not in r.stderr, flat(r)
        assert files() == before  # nothing changed
        return flat(r)

    with hold(home, "trial home"):
        assert "is held by pid" in refused()
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home), "--store", url)
    assert r.returncode == 2 and "--store" in flat(r) and "only with --unpreserved" in flat(r)
    release = trials / "store" / "released" / "my-study-smoke" / f"{log.entries()[0]['hash']}.json"
    release.parent.mkdir(parents=True)
    release.write_text('{"format": "commitment-anchors-release-v1"}')
    assert f"{release}: damaged, not an anchors release" in refused()
    release.unlink()
    preserve(home, url, trial="my-study-smoke")
    assert "has been preserved (preserved.json)" in refused() and f"orchestrate remove --home {home}" in refused()
    (home / "preserved.json").unlink()  # the home is still the trial preserved: its log is the chain preserved
    said = refused()
    assert f"{home} is trial my-study-smoke as {url}/ preserved it" in said, said
    assert f"`orchestrate preserve --home {home}` preserves it again" in said
    assert "is trial my-study-smoke as" in refused("--store", url)
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))  # `remove` names the same way out
    assert r.returncode == 2 and f"`orchestrate preserve --home {home}` preserves it again" in flat(r), flat(r)
    for args in (named(said, "preserve"), named(said, "remove")):  # which works: preserved again, then removed
        r = run_cli(*args)
        assert r.returncode == 0, flat(r)
    assert not home.exists()
    other = tmp_path / "elsewhere" / "my-study-smoke"  # its own folder's store has no anchors of it
    other.mkdir(parents=True)
    home = other
    assert "is not a trial home (no commitments.jsonl or prepared.json in it)" in refused()
    assert "an empty folder you may remove yourself" in refused()


def test_a_home_deleted_by_hand_lets_its_name_go_too(tmp_path):
    """The way into #55: a home deleted by hand left its anchors holding the name; `remove --unpreserved`
    on its path releases them, and a new log of that name then anchors."""
    trials = tmp_path / "trials"
    log = anchored_home(trials)
    shutil.rmtree(log.home)
    fresh = anchored_home(tmp_path / "again")  # (another store) a new log, to anchor in the first one later
    with pytest.raises(AnchorError, match="already holds the anchors of another log .* `orchestrate remove --unpreserved --home HOME`"):
        anchor_log(fresh.home, open_store(f"file://{trials / 'store'}"))
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--yes", "--home", str(log.home))
    assert r.returncode == 0 and f"discard {log.home}: gone already" in flat(r), flat(r)
    assert "release trial my-study-smoke's anchors" in flat(r) and not lock_path(log.home).exists()
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--yes", "--home", str(log.home))
    assert r.returncode == 2 and "is not a trial home" in flat(r)  # nothing of that name is left to let go
    assert "holds no anchors of trial my-study-smoke" in flat(r)
    assert anchor_log(fresh.home, open_store(f"file://{trials / 'store'}"))["added"] == 1


def test_a_changed_study_under_a_name_used_before_is_refused_before_anything_is_written(study):
    """#67, as the user met it. (A) a preserved study, its task file changed: `validate` and `run` refuse
    alike, naming what changed and a run that works, and the run writes nothing at all. (B) its home
    removed (preserved, so its name stays taken in the store): refused again before anything is
    written — before, the run prepared a new home, was refused at anchoring and left it half made — and
    the command the refusal names runs the changed study."""
    trials, home = study / "trials", study / "trials" / "my-study-smoke"
    run = (*run_args(study), "--no-serve")  # (the probe changes nothing here, and takes a third of a run)
    r = run_cli(*run)
    assert r.returncode == 0 and (home / "preserved.json").is_file(), flat(r)
    validate = ("-m", "orchestrate", "validate", "my-study", "--profile", "smoke", "--seeds", str(study / "seeds"),
                "--trials", str(trials))
    assert f"home {home}: prepared with this study, preserved" in flat(run_cli(*validate))

    (study / "cases.jsonl").write_text("".join(case(i) for i in range(37)))  # one more case
    before = tree(study)
    for args in (validate, run):
        r = run_cli(*args)
        said = flat(r)
        assert r.returncode == 2 and "Traceback" not in said, said
        assert said[said.find("error:"):].startswith(f"error: {home} holds another study, preserved: its task file was cases.jsonl "
                               "(36 cases, sha256 "), said
        assert f"`orchestrate run my-study --profile smoke --seeds {study / 'seeds'} " in said  # (run's: --no-serve)
        assert f" --trials {trials}-2`" in said
        assert "or under a new name (a new profile, or a new experiment name)" in said
        assert tree(study) == before  # no seed, no lock, no record, nothing in the store

    # (B) the preserved home removed: its name is the store's for good, and any new home of it is refused
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    assert r.returncode == 0 and not home.exists(), flat(r)
    before = tree(study)
    for args in (validate, run):
        r = run_cli(*args)
        said = flat(r)
        assert r.returncode == 2 and said[said.find("error:"):].startswith(f"error: trial name my-study-smoke is taken in file://{trials}"
                                                     "/store/: a trial of that name was preserved there"), said
        assert "--store URL" in said and "or under a new name" in said and f"its home {home} is gone" in said
        assert tree(study) == before and not home.exists() and not lock_path(home).exists()
    quiet = tree(study, locks=False)  # (its hold on the path that is gone comes and goes)
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--yes", "--home", str(home))
    assert r.returncode == 2 and f"refused: {home} is gone: nothing to discard" in flat(r), flat(r)
    assert "--trials OTHER" in flat(r) and tree(study, locks=False) == quiet
    assert not home.exists() and not lock_path(home).exists()

    r = run_cli(*named(said))  # the run the refusal names: a new trials folder, with its own store
    assert r.returncode == 0, flat(r)
    assert json.loads((study / "trials-2" / "my-study-smoke" / "prepared.json").read_text())["task_source"]["cases"] == 37
    assert (study / "trials-2" / "my-study-smoke" / "preserved.json").is_file()


def half_made(trials: Path) -> Path:
    """The state #67's sequence B left with the code before it: a preserved trial removed from this
    machine (its index in the store), then a new home of the same name prepared and committed, its log
    refused at anchoring (another chain of that name in the store)."""
    log = anchored_home(trials)
    preserve(log.home, f"file://{trials / 'store'}", trial="my-study-smoke")
    r = run_cli("-m", "orchestrate", "remove", "--home", str(log.home))
    assert r.returncode == 0, flat(r)
    (log.home / "prepared.json").parent.mkdir()
    (log.home / "prepared.json").write_text('{"inputs": {"changed": true}}')
    CommitmentLog(log.home).append("prepare", "prepared.json")
    with pytest.raises(AnchorError, match="already holds the anchors of another log"):
        anchor_log(log.home, open_store(f"file://{trials / 'store'}"))
    return log.home


def test_remove_and_remove_unpreserved_never_send_to_each_other(tmp_path):
    """A home never preserved whose trial name the store holds a preservation of: `remove` sends to
    `remove --unpreserved` (and not to `preserve`, which could not anchor it there), which discards it,
    releasing nothing: the name stays taken, and it says with what commands to run again."""
    trials = tmp_path / "trials"
    home = half_made(trials)
    url = f"file://{trials / 'store'}"
    store_before = tree(trials / "store")
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    said = flat(r)
    assert r.returncode == 2 and f"refused: {home} has not been preserved (no preserved.json); {url} holds a " \
        "preservation of another trial my-study-smoke" in said, said
    assert "it cannot be preserved there" in said and f"`orchestrate preserve --home {home}`" not in said
    assert home.is_dir()
    r = run_cli(*named(said, "remove"), "--yes")  # what `remove` named: it succeeds
    said = flat(r)
    assert r.returncode == 0, said
    assert f"discard {home}: 3 files" in said and f"keep {url}/ holds a preservation of trial my-study-smoke" in said
    assert f"discarded {home}: 3 files" in said and f"nothing released — the name stays taken in {url}/" in said
    assert "--trials OTHER" in said and "--store URL" in said
    assert not home.exists() and not lock_path(home).exists()
    assert tree(trials / "store") == store_before  # no release record: a preserved chain is never released


def test_remove_unpreserved_asks_before_it_deletes(tmp_path):
    """What goes is said, then asked: no answer (stdin not a terminal, at its end) refuses, saying --yes;
    "n" keeps everything (exit 1); "y" deletes and releases."""
    trials = tmp_path / "trials"
    home = anchored_home(trials).home
    args = ("-m", "orchestrate", "remove", "--unpreserved", "--home", str(home))
    before = tree(tmp_path, locks=False)
    r = run_cli(*args)
    assert r.returncode == 2 and f"discard {home}: 3 files" in flat(r), flat(r)
    assert f"delete? [y/N]: refused: {home} not deleted: no answer on stdin — pass --yes" in flat(r)
    assert tree(tmp_path, locks=False) == before
    r = run_cli(*args, stdin="n\n")
    assert r.returncode == 1 and f"kept {home}: nothing deleted, nothing released" in flat(r), flat(r)
    assert tree(tmp_path, locks=False) == before
    r = run_cli(*args, stdin="y\n")
    assert r.returncode == 0 and f"discarded {home}: 3 files" in flat(r) and not home.exists(), flat(r)
    assert list((trials / "store" / "released" / "my-study-smoke").glob("*.json"))
    r = run_cli("-m", "orchestrate", "remove", "--yes", "--home", str(home))  # plain remove asks nothing
    assert r.returncode == 2 and "--yes is used only with --unpreserved" in flat(r)


def test_the_cases_are_judged_before_the_model_is_copied(study, tiny_seed):
    """A profile with seed = "local" imports --model-dir under --seeds (a copy of the model): a task file
    that prepare refuses is refused before it, leaving no copy — not even the seeds folder."""
    mine = study / "my-model"
    shutil.copytree(tiny_seed, mine)
    (mine / "receipt.json").unlink()  # a Hugging Face directory of one's own: imported, with a receipt
    (study / "cases.jsonl").write_text("".join(case(i) for i in range(36)) + '{"prompt": "x", "answer": 1, "bogus": 2}\n')
    seeds = study / "local-seeds"
    args = ("-m", "orchestrate", "run", "my-study", "--profile", "local", "--model-dir", str(mine),
            "--trials", str(study / "trials"), "--seeds", str(seeds))
    before = tree(study)
    r = run_cli(*args)
    assert r.returncode == 2 and "line 37: unknown key(s) bogus" in flat(r), flat(r)
    assert tree(study) == before and not seeds.exists()


def test_a_profile_left_out_is_said_to_be_the_default(study):
    """`--profile` not given: the default, cpu, which this experiment lacks — said as such, with its
    profiles; a profile given that it lacks keeps its words."""
    for cmd in ("run", "validate", "gates"):
        r = run_cli("-m", "orchestrate", cmd, "my-study")
        assert r.returncode == 2 and "experiment my-study has no profile 'cpu' (the default; pass --profile: " \
            "local, smoke)" in flat(r), (cmd, flat(r))
    r = run_cli("-m", "orchestrate", "validate", "my-study", "--profile", "cpu")
    assert r.returncode == 2 and "experiment my-study has no profile 'cpu' (profiles: local, smoke)" in flat(r), flat(r)


def test_each_home_is_judged_with_the_command_that_works(tmp_path):
    """`judge_names`, state by state, reading only: a home prepared with this study goes on; another
    experiment digest or replay is named, old then new, with `remove --unpreserved` for a home never
    preserved; a home deleted by hand leaves its name held until the command named lets it go; with a
    store given, a new trials folder alone would not do, so it is named with another store."""
    from orchestrate.names import NameRefused, Planned, Where, judge_names

    trials = tmp_path / "trials"
    url = f"file://{trials / 'store'}"
    where = Where(trials=trials, store=url, store_given=False, rerun=["my-study", "--profile", "smoke"])
    home = anchored_home(trials).home
    ts = {"kind": "jsonl", "file": "cases.jsonl", "cases": 36, "sha256": "b" * 64, "used": {}, "unused": 0}
    (home / "prepared.json").write_text(json.dumps({"experiment_digest": "a" * 64, "task_source": ts,
                                                    "replay_source": {"kind": "generated"}}))
    same = Planned(home=home, digest="a" * 64, task_source={**ts, "unused": 3})  # (the counts are the profile's)
    assert judge_names([same], where) == [f"{home}: prepared with this study — a run goes on from it"]
    replay = tmp_path / "replay.jsonl"
    replay.write_text("{}\n")
    with pytest.raises(NameRefused) as e:
        judge_names([same.model_copy(update={"digest": "c" * 64, "replay": replay})], where)
    said = str(e.value)
    assert said.startswith(f"{home} holds another study, never preserved: its experiment resolved to digest "
                           "aaaaaaaaaaaa…, now cccccccccccc… (the experiment's TOML or its profile changed); its "
                           "replay was generated, now the file replay.jsonl (sha256 "), said
    assert f"`orchestrate remove --unpreserved --home {home}`" in said and f"--trials {trials}-2`" in said
    with pytest.raises(NameRefused, match=r"--trials \S+-2 --store URL`"):  # a store given: it goes with the run
        judge_names([same.model_copy(update={"digest": "c" * 64})], where.model_copy(update={"store_given": True}))
    # the changed study already run in the folder a refusal named: that folder is named again, not a third one
    sibling = Path(f"{trials}-2") / home.name
    sibling.mkdir(parents=True)
    (sibling / "prepared.json").write_text(json.dumps({"experiment_digest": "c" * 64, "task_source": ts,
                                                       "replay_source": {"kind": "generated"}}))
    with pytest.raises(NameRefused) as e:
        judge_names([same.model_copy(update={"digest": "c" * 64})], where)
    assert f"in {trials}-2, whose my-study-smoke holds this study already (a run there goes on from it): " \
           f"`orchestrate run my-study --profile smoke --trials {trials}-2`" in str(e.value), str(e.value)
    with pytest.raises(NameRefused, match=r"--trials \S+-3`"):  # a third study: a folder of its own
        judge_names([same.model_copy(update={"digest": "d" * 64})], where)
    shutil.rmtree(sibling.parent)

    shutil.rmtree(home)  # as a user deletes a home by hand
    with pytest.raises(NameRefused) as e:
        judge_names([same], where)
    said = str(e.value)
    assert said.startswith(f"{url}/ holds the anchors of an earlier trial my-study-smoke (1 anchor(s), never "
                           f"preserved), whose home {home} is gone"), said
    r = run_cli(*named(said, "remove"), "--yes")
    assert r.returncode == 0 and "the name may be run again" in flat(r), flat(r)
    assert judge_names([same], where) == [f"{home}: to be made; {url}/ holds only released anchors of trial "
                                          "my-study-smoke"]

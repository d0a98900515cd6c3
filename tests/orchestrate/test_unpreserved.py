"""`orchestrate remove --unpreserved` (#55): a run that fails before preservation no longer takes its
experiment's name with it. The home is discarded after saying what goes; its anchors stay in the store
with a release record beside them, so the same name runs again from the same --trials folder and its
new home verifies. What was preserved stays untouchable; a refused run leaves nothing behind."""

from __future__ import annotations

import json
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


def test_a_home_never_preserved_is_let_go_and_its_name_runs_again(study):
    trials, home = study / "trials", study / "trials" / "my-study-smoke"
    interrupted_run(study)
    store = open_store(f"file://{trials / 'store'}")
    (first,) = {k.split("/")[2] for k in store.list("anchors/my-study-smoke/")}
    commitments = len(CommitmentLog(home).entries())
    anchors = store.list("anchors/")

    # the user fixes their task file: the home is another study now, and its name is held
    (study / "cases.jsonl").write_text("".join(case(i) for i in range(37)))
    r = run_cli(*run_args(study))
    assert r.returncode == 2 and "a changed task file is another study" in flat(r), flat(r)
    assert "orchestrate remove --unpreserved --home HOME" in flat(r)
    assert (home / "prepared.json").is_file()  # a home that was there stays as it was
    r = run_cli("-m", "orchestrate", "remove", "--home", str(home))
    assert r.returncode == 2 and "has not been preserved" in flat(r), flat(r)
    assert f"orchestrate remove --unpreserved --home {home}" in flat(r)

    files = [p for p in home.rglob("*") if p.is_file()]
    mb = sum(p.stat().st_size for p in files) / 1e6
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--home", str(home))
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
    (home / "preserved.json").unlink()
    assert "holds 1 preservation index(es) of trial my-study-smoke" in refused()
    assert "holds 1 preservation index(es)" in refused("--store", url)
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
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--home", str(log.home))
    assert r.returncode == 0 and f"discard {log.home}: gone already" in flat(r), flat(r)
    assert "release trial my-study-smoke's anchors" in flat(r) and not lock_path(log.home).exists()
    r = run_cli("-m", "orchestrate", "remove", "--unpreserved", "--home", str(log.home))
    assert r.returncode == 2 and "is not a trial home" in flat(r)  # nothing of that name is left to let go
    assert "holds no anchors of trial my-study-smoke" in flat(r)
    assert anchor_log(fresh.home, open_store(f"file://{trials / 'store'}"))["added"] == 1

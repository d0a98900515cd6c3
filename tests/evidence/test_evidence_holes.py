"""The holes a hostile user found in a finished smoke trial (issue: evidence that cannot be quietly
lost or overwritten), each tried the way that user tried it: with the commands, on a real trial."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time: what 'nothing changed' compares.
    As `root.rglob("*")` sees them (symlinked directories not entered, a link to a file counted as the
    file), with one stat each and no Path objects: the damage sweep takes two snapshots per damage. Names
    relative to `root` come from `os.path.relpath` once per directory, not once per file."""
    out = {}
    top = os.fspath(root)
    for d, _, names in os.walk(top):
        rel = os.path.relpath(d, top)
        prefix = "" if rel == "." else rel + os.sep
        for n in names:
            try:
                st = os.stat(os.path.join(d, n))
            except OSError:  # a dangling link: not a file, as `is_file()` says
                continue
            if stat.S_ISREG(st.st_mode):
                out[prefix + n] = (st.st_size, st.st_mtime_ns)
    return dict(sorted(out.items()))


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def trial(finished_trial, tmp_path) -> Path:
    """A copy of the finished smoke trial's home, its preservation record pointing at a copy of the
    store (what the commands read when no store is named)."""
    dst = tmp_path / "trials" / finished_trial.home.name
    shutil.copytree(finished_trial.home, dst, symlinks=True)
    shutil.copytree(finished_trial.store, tmp_path / "trials" / "store")
    rec_path = dst / "preserved.json"
    rec = json.loads(rec_path.read_text())
    rec["store"] = f"file://{tmp_path / 'trials' / 'store'}/"
    from evidence.canonical import canonical_sha256

    rec["digest"] = canonical_sha256({k: v for k, v in rec.items() if k != "digest"})
    rec_path.write_text(json.dumps(rec))
    return dst


def report(home: Path, out: Path) -> subprocess.CompletedProcess:
    return run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))


def test_a_deleted_evaluation_stops_the_report_and_keeps_the_last_one(trial):
    """1. Before: the report was rebuilt without the deleted arm (exit 0), its gates gone."""
    before = {p: (trial / p).read_bytes() for p in ("report.json", "report.md")}
    shutil.rmtree(trial / "evaluations" / "test" / "seed")
    r = report(trial, trial / "report.json")
    assert r.returncode == 2, r.stdout
    assert "committed test attempt 1 of seed is missing" in words(r.stderr) and "Traceback" not in r.stderr
    assert {p: (trial / p).read_bytes() for p in before} == before  # the earlier report stands


@pytest.mark.parametrize("target, cover", [
    ("commitments.jsonl", "the commitments log"),
    ("selection.json", "(selection)"),
    ("evaluations/test/seed/attempt-1/answers.jsonl", "the receipt evaluations/test/seed/attempt-1/receipt.json"),
    ("inputs/schedule.json", "prepared.json's input hashes"),
    ("prepare-record.json", "the preservation index"),
])
def test_the_report_never_writes_over_evidence(trial, target, cover):
    """2. Before: `--output commitments.jsonl` replaced the log."""
    before = snapshot(trial)
    r = report(trial, trial / target)
    assert r.returncode == 2, r.stdout
    said = words(r.stderr)
    assert f"{trial / target} is evidence covered by" in said and cover in said and "nothing was written" in said
    assert snapshot(trial) == before


def test_no_output_may_replace_a_homes_evidence(trial, tmp_path):
    """2, wherever the user points an output: at another home's log, at the preservation record, at a
    checkpoint manifest (not covered by a receipt, but part of the home), or `run --record` at the log."""
    other = tmp_path / "other"
    shutil.copytree(trial, other, ignore=shutil.ignore_patterns("runs", "inputs", "evaluations", "logs", "serving"))
    manifest = next(trial.glob("runs/single/rank-0/manifests/*.json"))
    before, before_other = snapshot(trial), snapshot(other)
    for target in (other / "commitments.jsonl", trial / "preserved.json", manifest):
        r = report(trial, target)
        assert r.returncode == 2 and "nothing was written" in words(r.stderr), (target, r.stderr)
    r = run_cli("-m", "orchestrate", "run", "no-such-arm", "--record", str(trial / "commitments.jsonl"))
    assert r.returncode == 2
    assert snapshot(trial) == before and snapshot(other) == before_other


@pytest.mark.parametrize("damage, words_", [
    (lambda b: b[: len(b) // 2], "damaged, not valid JSON"),
    (lambda b: json.dumps({k: v for k, v in json.loads(b).items() if k != "index"}).encode(), "damaged, no 'index'"),
    (lambda b: b.replace(b'"files": ', b'"files": 1'), "differ from its own digest"),
])
def test_down_refuses_a_damaged_preservation_record(trial, damage, words_):
    """3. Before: a JSONDecodeError or KeyError traceback."""
    rec = trial / "preserved.json"
    rec.write_bytes(damage(rec.read_bytes()))
    r = run_cli("-m", "orchestrate", "down", "--home", str(trial))
    said = words(r.stderr)
    assert r.returncode == 2 and f"{rec}" in said and words_ in said and "Traceback" not in said, said


def test_error_text_keeps_its_brackets(tmp_path):
    """5. Before: rich took `[a-z0-9]` for markup and the pattern printed as `^{2,40}$`."""
    from conftest import example_stack

    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--no-quota", "--stack",
                str(example_stack(tmp_path, trial="Not_A_Name")))
    assert r.returncode == 2 and "^[a-z0-9][a-z0-9-]{2,40}$" in r.stderr, r.stderr


def test_two_runs_on_one_home(finished_trial):
    """7. A second `orchestrate run` in the same trials folder while the first trains is refused at
    once, naming the first; the first finishes untouched (no attempt of it set aside)."""
    second, first = finished_trial.second, finished_trial.first
    said = words(second.stderr)
    assert second.returncode == 2, second.stderr
    assert f"is held by pid {finished_trial.first_pid}" in said and "since" in said and "orchestrate run" in said
    assert "Traceback" not in said
    assert first.returncode == 0, first.stderr
    assert "moved to" not in first.stderr  # nothing set aside
    assert not list(finished_trial.home.glob("runs/*/attempts"))


def test_two_seed_materializations_at_once(tmp_path):
    """7. Two runs making the same seed at once: one makes it, the other waits, then verifies it
    (before: `Directory not empty` on the second's rename)."""
    out = tmp_path / "seeds" / "tiny"
    cmd = [sys.executable, "-m", "training", "seed", "--kind", "tiny", "--out", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    res = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], res
    digests = {json.loads(o)["receipt_digest"] for o, _ in res}
    assert len(digests) == 1
    assert sum("waiting: seed" in e for _, e in res) == 1, res  # they did overlap: one waited for the other
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tiny.tmp")]


def test_a_live_rank_is_never_set_aside(tmp_path):
    """7. The set-aside of an unfinished attempt refuses while a rank of it still runs."""
    from training.errors import TrainError
    from training.runs import set_aside_unfinished

    rank = tmp_path / "runs" / "single" / "rank-0"
    rank.mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "training", "train",
                             "--home", str(tmp_path)])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "training", "train",
                              "--home", str(tmp_path / "another-home")])
    try:
        (rank / "heartbeat.json").write_text(json.dumps({"pid": live.pid, "update": 3, "time": time.time()}))
        try:
            set_aside_unfinished(tmp_path, "single", 1)
        except TrainError as e:
            assert f"still running (pid {live.pid})" in str(e)
        else:  # once, under three workers (#34), with no cause known: what live_rank read, if it happens again
            def read(f: str) -> object:
                try:
                    return os.readlink(f"/proc/{live.pid}/{f}") if f == "cwd" else \
                        Path(f"/proc/{live.pid}/{f}").read_bytes()[:300]
                except OSError as e:
                    return e

            pytest.fail(f"a live rank was set aside: poll {live.poll()}, "
                        f"{ {f: read(f) for f in ('cmdline', 'stat', 'cwd')} }")
        assert rank.is_dir()
        from training.runs import live_rank

        (rank / "heartbeat.json").write_text(json.dumps({"pid": other.pid, "update": 3, "time": time.time()}))
        assert live_rank(rank) is None  # a rank of another home at that pid is not this one's
        (rank / "heartbeat.json").write_text(json.dumps({"pid": live.pid, "update": 3, "time": time.time()}))
    finally:
        for p in (live, other):
            p.kill()
            p.wait()
    assert set_aside_unfinished(tmp_path, "single", 1)  # gone: its files are set aside, not deleted
    assert (tmp_path / "runs" / "single" / "attempts" / "rank-0.1" / "heartbeat.json").is_file()

"""The controller's deadline and transfer guard, the one "resumable" rule, the rule for taking a
host's commitments log back (only as a verified extension of the controller's), and a scoring left
on a host collected rather than run again."""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import time

import pytest

from evidence.commitments import LOG_NAME, CommitmentLog
from orchestrate.cluster import local_cluster
from orchestrate.guard import COUNTERS, Guard, parse_counters
from orchestrate.launch.local import launch_group, local_launch
from orchestrate.launch.supervise import supervise
from orchestrate.transport import LocalTransport, TransportError
from training.runs import latest_common


def test_deadline_margin():
    now = [1_000_000.0]
    deadline = dt.datetime.fromtimestamp(now[0] + 900, dt.timezone.utc)
    g = Guard(deadline=deadline, margin_s=600, clock=lambda: now[0])
    assert g() is None and g.active
    now[0] += 301  # 9.98 minutes left
    said = g()
    assert said and "min away" in said and "10 min before" in said
    with pytest.raises(ValueError, match="timezone"):
        Guard(deadline=dt.datetime(2030, 1, 1))


def test_transfer_counter_over_the_fraction():
    reads = iter([100, 850, None, 901])
    g = Guard(counters={"host-1": lambda: next(reads)}, limit_bytes=1000, fraction=0.9)
    assert g() is None and g() is None and g() is None  # 100, 850, a host that did not answer
    said = g()
    assert said and said.startswith("host-1 has moved 901 bytes") and g.last == {"host-1": 901}
    assert not Guard().active and not Guard(counters={"h": lambda: 1}).active  # no limit: nothing to guard


def test_counter_command_reads_this_machine():
    r = LocalTransport().run(COUNTERS)
    assert r.status == 0 and parse_counters(r.stdout) is not None and parse_counters("x") is None


def test_a_guard_stops_the_group_and_is_not_restarted(tmp_path):
    """Two ranks that would run a minute; the guard speaks after 1 s: both stopped by pid, no restart."""
    t0 = time.monotonic()
    guard = lambda: "test guard" if time.monotonic() - t0 > 1.0 else None  # noqa: E731
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    attempts = supervise(local_launch(argv, 2, guard=guard), log_root=tmp_path / "logs", max_restarts=1)
    assert len(attempts) == 1
    res = attempts[0]
    assert not res.ok and res.reason == "guard" and res.guard == "test guard" and res.first_failure is None
    assert res.failure_text() == "stopped by the controller's guard: test guard"
    assert all(c is not None and c != 0 for c in res.codes) and time.monotonic() - t0 < 20
    ok = launch_group([sys.executable, "-c", "pass"], 2, log_dir=tmp_path / "ok", guard=lambda: None)
    assert ok.ok and ok.reason is None


def test_latest_common_needs_identical_manifests():
    assert latest_common([{8: "a", 16: "b"}, {8: "a", 16: "b"}]) == 16
    assert latest_common([{8: "a", 16: "b"}, {8: "a", 16: "c"}]) == 8  # differing content: not common
    assert latest_common([{8: "a", 16: "b"}, {16: "b"}]) == 16
    assert latest_common([{8: "a"}, {}]) is None and latest_common([]) is None


@pytest.fixture()
def pulled(smoke_home, tmp_path):
    """A controller home and a 'host' copy of it, reached through the local transport."""
    from orchestrate.backends.ssh import SshBackend

    home, host_root = tmp_path / "controller", tmp_path / "host"
    shutil.copytree(smoke_home, home)
    shutil.copytree(smoke_home, host_root / "home")
    cluster = local_cluster(1, host_root, "file:///unused")
    return home, host_root / "home", SshBackend(cluster, home, home, wheel_dir=tmp_path)


def host_commits_a_note(remote, commit: bool = True) -> None:
    """The 'host' writes runs/note.json and (optionally) commits it, as rank 0 commits its profile."""
    (remote / "runs").mkdir()
    (remote / "runs" / "note.json").write_text("{}")
    if commit:
        CommitmentLog(remote).append("numerical-profile", "runs/note.json", {"arm": "x"})


def test_a_host_log_that_extends_ours_is_taken(pulled):
    home, remote, pl = pulled
    host_commits_a_note(remote)
    before = (home / LOG_NAME).read_bytes()
    with pytest.raises(TransportError, match="did not come back with the committed hash"):
        pl._collect_verified({0: "inputs"})  # the new entry's file was not among what came back
    assert (home / LOG_NAME).read_bytes() == before and not (home / "runs").exists()
    assert pl._collect_verified({0: "runs"}) == (1, 1)
    assert (home / LOG_NAME).read_bytes() == (remote / LOG_NAME).read_bytes()
    assert (home / "runs" / "note.json").read_text() == "{}"
    assert pl._collect_verified({0: "runs"}) == (1, 0)  # nothing new
    CommitmentLog(home).append("numerical-profile", "runs/note.json", {"arm": "y"})
    assert pl._collect_verified({0: "runs"}) == (1, 0)  # the controller is ahead: nothing to take
    assert not list(home.glob(".incoming-*"))


def test_a_host_log_that_rewrites_ours_is_refused(pulled):
    home, remote, pl = pulled
    host_commits_a_note(remote, commit=False)
    lines = (remote / LOG_NAME).read_text().splitlines(keepends=True)
    (remote / LOG_NAME).write_text(lines[0].replace('"prepare"', '"prepare" ') + "".join(lines[1:]))
    before = (home / LOG_NAME).read_bytes()
    with pytest.raises(TransportError, match="does not extend the controller's"):
        pl._collect_verified({0: "runs"})
    assert (home / LOG_NAME).read_bytes() == before and not (home / "runs").exists()  # nothing moved in


def test_a_host_log_with_a_forged_entry_is_refused(pulled):
    from evidence.commitments import CommitmentError

    home, remote, pl = pulled
    host_commits_a_note(remote)
    text = (remote / LOG_NAME).read_text()
    (remote / LOG_NAME).write_text(text[:text.rindex('"arm":"x"')] + '"arm":"z"' + text[text.rindex('"arm":"x"') + 9:])
    with pytest.raises(CommitmentError, match="hash mismatch"):
        pl._collect_verified({0: "runs"})
    assert not (home / "runs").exists()


def test_listed_paths_stay_inside_what_was_asked():
    from orchestrate.remote import KEEP_ON_HOST, safe_relative

    assert safe_relative("runs/a/rank-0/result.json", "runs/a") == "runs/a/rank-0/result.json"
    for bad in ("runs/a/../../commitments.jsonl", "/etc/passwd", "runs/ab/x", "inputs/x", "runs/a/x\nrm"):
        with pytest.raises(TransportError, match="refusing a listed path"):
            safe_relative(bad, "runs/a")
    assert KEEP_ON_HOST.search("runs/a/rank-0/checkpoints/step-000016/model.safetensors")
    assert not KEEP_ON_HOST.search("runs/a/rank-0/checkpoints/step-000016/receipt.json")
    assert not KEEP_ON_HOST.search("runs/a/rank-0/manifests/step-16.json")


def test_a_polled_counter_never_blocks_its_caller():
    """The guard consults a counter read in its own thread: while a read hangs (a host that stopped
    answering), the caller gets the last value at once, and later answers replace it."""
    import threading

    from orchestrate.guard import Polled

    values, gate, first_done, hanging = iter([100, 200]), threading.Event(), threading.Event(), threading.Event()

    def read():
        if first_done.is_set():
            hanging.set()
            gate.wait(30)  # the second read hangs until released
        v = next(values, None)
        first_done.set()
        return v

    polled = Polled(read, every_s=0.05)
    try:
        deadline = time.monotonic() + 5
        while polled() != 100 and time.monotonic() < deadline:  # the first answer has landed
            time.sleep(0.01)
        assert hanging.wait(5)  # the second read is in progress, and hangs
        t0 = time.monotonic()
        seen = [polled() for _ in range(20)]
        assert time.monotonic() - t0 < 0.5 and set(seen) == {100}  # the hanging read holds nothing up
        g = Guard(counters={"h": polled}, limit_bytes=150, fraction=1.0)
        assert g() is None
        gate.set()
        deadline = time.monotonic() + 5
        while polled() != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert polled() == 200 and g() and "has moved 200 bytes" in g()
        polled.close()
        polled._thread.join(5)
        assert not polled._thread.is_alive()  # closed: the thread ends after its current read
    finally:
        gate.set()
        polled.close()


def test_a_guarded_placement_polls_its_hosts_counters(tmp_path):
    """SshBackend's guard reads each guarded host's counters in a thread of its own (here through
    the local transport: this machine's own counters), and closing the placement ends those threads."""
    from orchestrate.backends.ssh import SshBackend

    c = local_cluster(2, tmp_path, "file:///unused")
    c = c.model_copy(update={"guarded_ranks": [1], "transfer_guard_bytes": 1e18})
    pl = SshBackend(c, tmp_path, tmp_path, wheel_dir=tmp_path)
    try:
        assert list(pl.guard.counters) == ["local-1"] and len(pl.polled) == 1
        deadline = time.monotonic() + 10
        while pl.polled[0]() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(pl.polled[0](), int) and pl.guard() is None and pl.guard.last["local-1"] > 0
    finally:
        pl.close()
    pl.polled[0]._thread.join(10)
    assert not pl.polled[0]._thread.is_alive()


def test_a_scoring_that_finished_on_the_host_is_collected_not_run_again(pulled):
    """The controller stopped after rank 0's host had scored an arm but before it collected the
    result: the next `evaluate` takes the host's summary, receipt and log entry (verified), and does
    not score again."""
    from evidence.canonical import write_json_atomic

    home, remote, pl = pulled
    for name in ("candidates.json", "selection.json"):  # committed on the controller, then on the host
        write_json_atomic(home / name, {"arms": ["single"]})
    log = CommitmentLog(home)
    log.append("candidates", "candidates.json", {})
    log.append("selection", "selection.json", {"primary": "single"})
    for name in ("candidates.json", "selection.json", LOG_NAME):
        shutil.copyfile(home / name, remote / name)
    out = remote / "evaluations" / "test" / "single" / "attempt-1"
    summary = {"arm": "single", "role": "test", "attempt": 1, "model_receipt": "m", "cases": 32, "correct": 3,
               "accuracy": 0.09375, "probe_mean_loss": 7.5, "max_new_tokens": 86, "seconds": 0.5,
               "scoring": {"device": "cpu", "batch": 16, "generation_dtype": "float32", "generation_seconds": 0.4,
                           "generated_tokens": 2752, "cases_per_second": 80.0, "generated_tokens_per_second": 6880.0,
                           "probe_seconds": 0.02, "load_seconds": 0.03},
               "retry_reason": None}
    write_json_atomic(out / "summary.json", summary)
    write_json_atomic(out / "receipt.json", {"digest": "d"})
    CommitmentLog(remote).append("test-evaluation", "evaluations/test/single/attempt-1/receipt.json",
                                 {"arm": "single", "attempt": 1})
    pl.digest = "staged"  # staging is not what this is about
    got = pl.evaluate(home, "single", "test", seed_dir=home)
    # the host's summary itself: a scoring run here would have failed on these inputs or counted anew
    assert got.model_dump(mode="json") == summary
    for name in ("summary.json", "receipt.json"):
        assert (home / "evaluations/test/single/attempt-1" / name).read_bytes() == (out / name).read_bytes()
    assert (home / LOG_NAME).read_bytes() == (remote / LOG_NAME).read_bytes()  # the entry came with it
    assert CommitmentLog(home).entries()[-1]["kind"] == "test-evaluation"
    assert not list(home.glob(".incoming-*"))

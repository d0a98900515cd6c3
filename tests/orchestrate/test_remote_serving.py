"""The serving probe on SSH hosts (two network namespaces with real sshd, root only): one replica per
host, started over SSH from the host's own copy of the selected model, bound to the host's private
address and reached through SSH port forwards; the three phases with one replica really killed on
its host; and nothing of the replicas left on the hosts afterwards — after a probe that finished, one
interrupted halfway, replicas that would not start, and a controller SIGKILLed (the replicas' lease on it
runs out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import proc_state, run_cli, serving_processes
from evidence.canonical import read_json
from evidence.commitments import CommitmentLog
from evidence.serving import PHASES, check_probe
from machinery.netns import NetnsHosts, netns_cluster
from orchestrate.backends.ssh import SshBackend, SshReplicas
from orchestrate.serving import ProbeError, replicas_probe
from orchestrate.wheelhouse import build_wheelhouse

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(2, tmp_path_factory.mktemp("netns-serving")) as hs:
        yield hs


@pytest.fixture(scope="module")
def selected_home(tmp_path_factory, trained) -> Path:
    """Every smoke arm trained here and the selection committed: the controller's home."""
    home = tmp_path_factory.mktemp("remote-serving") / "home"
    shutil.copytree(trained, home)
    r = run_cli("-m", "training", "select", "--home", str(home))
    assert r.returncode == 0, r.stderr
    return home


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("serving-wheels"))


@pytest.fixture(scope="module")
def staged(hosts, selected_home, tiny_seed, wheels, tmp_path_factory) -> tuple[str, list[dict]]:
    """The two hosts staged once for this module's placements (about 20 s each time on an idle machine):
    every placement below stages the same bytes (a copy of the same selected home, the same seed and
    wheels), and staging itself is tests/orchestrate/test_remote.py's. Its digest and host reports."""
    home = tmp_path_factory.mktemp("staged") / "home"
    shutil.copytree(selected_home, home)
    pl = SshBackend(netns_cluster(hosts, "file:///unused", python=sys.executable), home, tiny_seed,
                         wheel_dir=wheels)
    try:
        pl.devices("cpu")  # stages every host and reads its report
        return pl.digest, pl.reports
    finally:
        pl.close()


@pytest.fixture
def placement(hosts, selected_home, tiny_seed, wheels, staged, tmp_path):
    """A copy of the selected home, its placement on the two hosts, which are as `staged` left them."""
    home = tmp_path / "home"
    shutil.copytree(selected_home, home)
    desc = netns_cluster(hosts, "file:///unused", python=sys.executable)
    pl = SshBackend(desc, home, tiny_seed, wheel_dir=wheels)
    pl.digest, pl.reports = staged  # what its own staging would have found: the same bytes are there
    try:
        yield home, pl
    finally:
        pl.close()


def ns_pids(hosts: NetnsHosts) -> dict[str, set[int]]:
    """Every pid inside each host's namespace, by host name (`ip netns pids`)."""
    out = {}
    for h in hosts.hosts:
        p = subprocess.run(["ip", "netns", "pids", h.namespace], capture_output=True, text=True, check=True)
        out[f"ns-{h.index}"] = {int(x) for x in p.stdout.split()}
    return out


def ancestors(pid: int) -> set[int]:
    """The pid's parents up to init, from /proc."""
    seen = set()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        seen.add(pid)
    return seen


def on_hosts(hosts: NetnsHosts) -> list[tuple[str, int]]:
    """Live `training serve` processes inside the hosts' namespaces."""
    return serving_processes({f"ns-{h.index}": h.namespace for h in hosts.hosts})


def gone(pid: int) -> bool:
    return proc_state(pid) in (None, "Z")


def test_replicas_on_the_hosts_serve_the_three_phases(hosts, placement):
    home, pl = placement
    made: list[SshReplicas] = []
    seen: dict[str, object] = {}

    def make() -> SshReplicas:
        made.append(pl.replicas(home, "clean-pair", 2))
        return made[0]

    def say(m: str) -> None:
        if m.startswith("warmup:"):  # the replicas run now: where, and whose children are they?
            reps, inside = made[0], ns_pids(hosts)
            seen["pids"] = {r.host.name: r.pid for r in reps.replicas}
            seen["inside"] = all(r.pid in inside[r.host.name] for r in reps.replicas)
            seen["not_ours"] = all(os.getpid() not in ancestors(r.pid) for r in reps.replicas)
            seen["bound"] = [r.t.run(f"ss -Htln 'sport = :{r.port}'").stdout for r in reps.replicas]
        if m.startswith("stopped "):
            seen["stopped_gone"] = gone(seen["pids"]["ns-1"])

    res = replicas_probe(home, "clean-pair", 2, make, say=say)
    assert seen["inside"] and seen["not_ours"], seen  # in the hosts' namespaces, not children of the controller
    assert seen["pids"]["ns-0"] != seen["pids"]["ns-1"]
    for k, listening in enumerate(seen["bound"]):  # bound to the host's private address only
        assert [line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()] == [hosts.hosts[k].address], \
            listening
    assert seen["stopped_gone"]  # confirmed gone before the failure phase began

    d = home / "serving" / "attempt-1"
    plan = read_json(d / "plan.json")
    assert plan["replicas"] == ["replica-0.ns-0", "replica-1.ns-1"]
    assert plan["stopped"]["replica"] == "replica-1.ns-1" and plan["stopped"]["host"] == "ns-1"
    assert plan["stopped"]["pid"] == seen["pids"]["ns-1"] and plan["stopped"]["signal"] == "SIGKILL"
    ph, n = res["phases"], plan["requests"]
    assert n == 16 and plan["levels"] == [1, 4]  # the committed smoke profile's workload and sweep
    # one replica per host, each on its host's CPU: no two share a device
    assert [(p["host"], p["device"], p["shares_device_with"]) for p in plan["placement"]] == [
        ("ns-0", "cpu", []), ("ns-1", "cpu", [])]
    for c in plan["levels"]:
        assert [ph[f"{p}-c{c}"]["completed"] for p in PHASES] == [n, n, n]
        assert ph[f"replicas-c{c}"]["per_endpoint_answers"] == {"replica-0.ns-0": n // 2, "replica-1.ns-1": n // 2}
        assert ph[f"failure-c{c}"]["per_endpoint_answers"] == {"replica-0.ns-0": n}
        assert ph[f"failure-c{c}"]["retries"] == n // 2
        for r in read_json(d / f"failure-c{c}.json")["requests"]:
            if len(r["attempts"]) > 1:  # routed to the killed replica first: no connection, then the survivor
                assert r["attempts"][0]["endpoint"] == "replica-1.ns-1" and r["attempts"][0]["status"] is None
                assert r["attempts"][1]["endpoint"] == "replica-0.ns-0" and r["attempts"][1]["status"] == 200
    assert res["tasks_answered"] == 16 and res["tasks_with_differing_tokens"] == []
    sel = read_json(home / "selection.json")
    assert [m.split("/")[0] for m in res["model_identities"]] == [sel["candidates"]["clean-pair"]]
    # the same evidence as the local probe: committed, and what the report recomputes agrees
    entry = CommitmentLog(home).latest("serving")
    dev = sorted(f"dev-{i:05d}" for i in range(16))
    comp = check_probe(home, entry, dev, {"arm": "clean-pair", "receipt_digest": sel["candidates"]["clean-pair"]},
                       requests=n, levels=(1, 4))
    assert comp["tasks_with_differing_tokens"] == [] and comp["replicas"] == 2
    # every replica stopped on exit, its log brought back; nothing of theirs left on the hosts
    assert all(gone(p) for p in seen["pids"].values()) and on_hosts(hosts) == []
    assert not made[0].replicas[0].forward._thread.is_alive()
    logs = home / "logs" / "serving"
    assert "replica-0.ns-0: clean-pair" in (logs / "replica-0.ns-0.log").read_text()


@pytest.mark.parametrize("where", ["say", "stop"])
def test_an_interrupted_probe_leaves_nothing_on_the_hosts(hosts, placement, where):
    """Ctrl-C halfway (from the progress callback after the first phase), or an error from stopping a
    replica: the probe ends, and every replica's pid is gone from the hosts."""
    home, pl = placement
    made: list[SshReplicas] = []
    pids: dict[str, int] = {}

    def make() -> SshReplicas:
        reps = pl.replicas(home, "clean-pair", 2)
        if where == "stop":
            def kill(k: int) -> dict:
                raise RuntimeError("stopping failed")
            reps.kill = kill  # type: ignore[method-assign]
        made.append(reps)
        return reps

    def say(m: str) -> None:
        if m.startswith("warmup:"):
            pids.update({r.host.name: r.pid for r in made[0].replicas})
            assert {n for n, _ in on_hosts(hosts)} == {"ns-0", "ns-1"}
        if m.startswith("single:") and where == "say":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt if where == "say" else RuntimeError):
        replicas_probe(home, "clean-pair", 2, make, say=say)
    assert len(pids) == 2 and all(gone(p) for p in pids.values()), pids
    assert on_hosts(hosts) == []
    assert CommitmentLog(home).latest("serving") is None  # nothing committed from a probe that did not end


def test_replicas_that_will_not_start_are_named_and_stopped(hosts, placement):
    home, pl = placement
    with pytest.raises(ProbeError, match="needs 3 replicas of clean-pair, one per host, and the cluster has 2"):
        pl.replicas(home, "clean-pair", 3)
    with pytest.raises(ProbeError, match=r"(?s)replica-0\.ns-0 exited on ns-0 before listening.*not servable"):
        with pl.replicas(home, "damaged-single", 2):
            pass
    assert on_hosts(hosts) == []


SERVING_CONTROLLER = """
import sys, time
from pathlib import Path
from orchestrate.cluster import load
from orchestrate.backends.ssh import SshBackend
pl = SshBackend(load(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), wheel_dir=Path(sys.argv[4]))
with pl.replicas(Path(sys.argv[2]), "clean-pair", 2) as reps:
    print("serving", *[r.pid for r in reps.replicas], flush=True)
    time.sleep(600)
"""


def test_a_dead_controllers_replicas_stop_when_their_lease_runs_out(hosts, selected_home, tiny_seed, wheels,
                                                                   tmp_path):
    """The controller is SIGKILLed while its replicas serve: nothing stops them by pid any more, but
    their lease on it (5 s here) goes unrenewed, and each replica stops itself, saying why."""
    home = Path(shutil.copytree(selected_home, tmp_path / "home"))
    cluster = tmp_path / "cluster.json"
    desc = netns_cluster(hosts, "file:///unused", python=sys.executable).model_copy(update={"controller_lease_s": 5.0})
    from orchestrate.cluster import save

    save(desc, cluster)
    ctl = subprocess.Popen([sys.executable, "-c", SERVING_CONTROLLER, str(cluster), str(home), str(tiny_seed),
                            str(wheels)], cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        line = ctl.stdout.readline()
        assert line.startswith("serving"), line + ctl.stdout.read()
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(12)  # more than two lease lengths while the controller lives: renewed, still serving
        assert all(not gone(p) for p in pids) and len(on_hosts(hosts)) == 2
    finally:
        ctl.kill()
        ctl.communicate()
    killed = time.monotonic()
    while on_hosts(hosts) and time.monotonic() - killed < 60:
        time.sleep(0.2)
    print(f"controller SIGKILLed → its replicas gone after {time.monotonic() - killed:.1f} s (lease 5 s)")
    assert on_hosts(hosts) == [] and all(gone(p) for p in pids)
    logs = [p.read_text() for h in hosts.hosts for p in (h.root / "serving").glob("replica-*.log")]
    assert sum("no controller has renewed this replica's lease" in text for text in logs) >= 2


def test_orchestrate_probe_with_a_cluster_serves_from_its_hosts(hosts, selected_home, tiny_seed, tmp_path):
    """`orchestrate probe --cluster`: the hosts are staged from the seed, the replicas run there."""
    from orchestrate.cluster import save

    home = tmp_path / "trials" / "home"
    shutil.copytree(selected_home, home)
    cluster = save(netns_cluster(hosts, "file:///unused", python=sys.executable), tmp_path / "cluster.json")
    r = run_cli("-m", "orchestrate", "probe", "--home", str(home), "--cluster", str(cluster), "--seeds",
                str(tiny_seed.parent), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    assert "clean-pair: 2 replicas on the hosts (ns-0, ns-1, where its ranks ran)" in err, err[-2000:]
    assert f"replica-1.ns-1 on {hosts.hosts[1].address}:" in err and "stopped replica-1.ns-1" in err
    plan = read_json(home / "serving" / "attempt-1" / "plan.json")
    assert plan["replicas"] == ["replica-0.ns-0", "replica-1.ns-1"] and plan["stopped"]["host"] == "ns-1"
    assert CommitmentLog(home).latest("serving") is not None and on_hosts(hosts) == []

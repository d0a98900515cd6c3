"""Ranks on SSH hosts (network namespaces with real sshd, root only): staging with a hash-locked
wheelhouse installed offline and one environment digest, a real 2-rank gloo training run across the
namespaces collected into the controller's home, a rank's death propagated as its exit status, a
different environment refused, and a host cut off mid-run detected within the bound."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, proc_state
from evidence.canonical import read_json
from machinery.netns import NetnsHosts, netns_cluster
from orchestrate.launch.command import local_argv
from orchestrate.launch.local import launch_group
from orchestrate.launch.ssh import launch_remote_group
from orchestrate.remote import StagingError, collect, stage
from orchestrate.status import trial_status
from orchestrate.transport import TransportError

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True)
    assert len(list(out.glob("trials-*.whl"))) == 1
    return out


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(2, tmp_path_factory.mktemp("netns")) as hs:
        yield hs


def inputs(home: Path, seed: Path) -> dict[str, Path]:
    files = {f"home/{p.relative_to(home)}": p for p in home.rglob("*") if p.is_file()}
    files |= {f"seed/{p.relative_to(seed)}": p for p in seed.rglob("*") if p.is_file()}
    return files


def train_argv(h) -> list[str]:
    return ["-m", "training", "train", "--home", f"{h.root}/home", "--arm", "clean-pair",
            "--model-dir", f"{h.root}/seed", "--threads", "1"]


def clear_runs(cluster):
    for h in cluster.by_rank:
        cluster.transport(h).run(f"rm -rf {h.root}/home/runs {h.root}/rank-*.pid").check("clear")


@pytest.fixture(scope="module")
def staged(hosts, wheels, smoke_home, tiny_seed, tmp_path_factory):
    cluster = netns_cluster(hosts, "file:///unused", python=sys.executable)
    ts = [cluster.transport(h) for h in cluster.by_rank]
    digest = stage(cluster, ts, wheel_dir=wheels, files=inputs(smoke_home, tiny_seed))
    yield cluster, ts, digest
    for t in ts:
        t.close()


def test_staging_gives_one_environment(staged, hosts, smoke_home):
    cluster, ts, digest = staged
    assert len(digest) == 64
    for h, t in zip(cluster.by_rank, ts):  # installed offline from the uploaded wheel, inputs in place
        r = t.run(f"PYTHONPATH={h.root}/site {h.python} -c 'import training, sys; print(training.__file__)'")
        assert r.check("import").stdout.strip() == f"{h.root}/site/training/__init__.py"
        assert t.run(f"sha256sum {h.root}/home/prepared.json").stdout.split()[0] == \
            hashlib.sha256((smoke_home / "prepared.json").read_bytes()).hexdigest()


def test_a_different_environment_is_refused(hosts, wheels, smoke_home, tiny_seed, tmp_path):
    """Host 1 runs the same interpreter with one more distribution on its path: digests differ."""
    extra = tmp_path / "extra"
    (extra / "surprise-1.0.dist-info").mkdir(parents=True)
    (extra / "surprise-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: surprise\nVersion: 1.0\n")
    wrapper = tmp_path / "python-with-extra"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{extra}" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    with pytest.raises(StagingError, match="different environments, nothing trains: ns-0 .*, ns-1 "):
        stage_with_host1_python(hosts, str(wrapper), wheels, smoke_home)


def test_a_host_without_torch_is_refused_by_name(hosts, wheels, smoke_home):
    bare = os.path.join(sys.base_prefix, "bin", "python3")  # same Python, none of our packages
    with pytest.raises(TransportError, match="(?s)ns-1: environment report exited 1: .*No module named 'torch'"):
        stage_with_host1_python(hosts, bare, wheels, smoke_home)


OLD_PYTHON = "/root/.pyenv/versions/3.10.13/bin/python3.10"  # as old as Ubuntu 22.04's python3


@pytest.mark.skipif(not os.path.exists(OLD_PYTHON), reason=f"no Python 3.10 at {OLD_PYTHON} on this machine")
def test_a_host_whose_python_is_too_old_is_refused_before_any_upload(hosts, wheels, smoke_home):
    def uploaded() -> dict[str, float]:
        # bytecode is not an upload: an environment report the previous test's refusal cut short may
        # still be importing on host 0, and writes its .pyc files when it gets there
        return {str(p): p.stat().st_mtime for h in hosts.hosts for p in h.root.rglob("*")
                if p.is_file() and ("wheels" in p.parts or "site" in p.parts or p.name == "prepared.json")
                and "__pycache__" not in p.parts}

    before = uploaded()
    with pytest.raises(StagingError, match=r"ns-1: .*python3\.10 is Python 3\.10\.\d+, the project needs >= 3\.11; "
                                           r"nothing was uploaded"):
        stage_with_host1_python(hosts, OLD_PYTHON, wheels, smoke_home)
    assert uploaded() == before  # not even to host 0, whose Python is fine
    with pytest.raises(StagingError, match=r"ns-1: its interpreter /nonexistent/python3 does not run \(exit 127"):
        stage_with_host1_python(hosts, "/nonexistent/python3", wheels, smoke_home)


def test_the_minimum_python_is_pyprojects():
    import tomllib

    from orchestrate.remote import MIN_PYTHON

    req = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["requires-python"]
    assert req == ">=" + ".".join(map(str, MIN_PYTHON))


def stage_with_host1_python(hosts, python: str, wheels, smoke_home) -> str:
    odd = netns_cluster(hosts, "file:///unused", python=sys.executable)
    odd.hosts[1].python = python
    ts = [odd.transport(h) for h in odd.by_rank]
    try:
        return stage(odd, ts, wheel_dir=wheels, files={"home/prepared.json": smoke_home / "prepared.json"})
    finally:
        for t in ts:
            t.close()


def test_rank_death_propagates_its_status(staged, tmp_path):
    cluster, ts, _ = staged
    clear_runs(cluster)
    res = launch_remote_group(cluster, train_argv, 2, log_dir=tmp_path / "logs", env={"TRIAL_FAULT_KILL": "1:3",
                              "OMP_NUM_THREADS": "1"}, grace_s=5)
    assert not res.ok and res.first_failure == 1 and res.reason == "exit"
    assert res.codes[1] == -9  # killed by SIGKILL on its host: as Popen says it, from the status its wrapper wrote
    assert res.codes[0] != 0  # the survivor was stopped by pid over SSH
    assert "killed after update 3" in (tmp_path / "logs" / "rank-1.log").read_text()
    pid0 = (Path(cluster.by_rank[0].root) / "rank-0.pid").read_text().strip()
    assert subprocess.run(["kill", "-0", pid0], capture_output=True).returncode != 0  # really gone


def test_two_hosts_train_and_collect(staged, smoke_home, tmp_path):
    cluster, ts, _ = staged
    clear_runs(cluster)
    res = launch_remote_group(cluster, train_argv, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"},
                              heartbeats=["home/runs/clean-pair/rank-0/heartbeat.json",
                                          "home/runs/clean-pair/rank-1/heartbeat.json"])
    assert res.ok, res.failure_text()
    home = tmp_path / "home"
    shutil.copytree(smoke_home, home)
    got = collect(cluster, ts, {0: "runs/clean-pair/rank-0", 1: "runs/clean-pair/rank-1"}, home)
    assert "runs/clean-pair/rank-1/result.json" in got
    r0, r1 = (read_json(home / f"runs/clean-pair/rank-{r}/result.json") for r in (0, 1))
    assert r0["digests"]["final_parameters"] == r1["digests"]["final_parameters"]
    # `orchestrate status` reads the same hosts over SSH: both ranks finished their last update
    st = trial_status(cluster, None)
    assert [(h.reachable, h.state, h.arm, h.update) for h in st.hosts] == \
        [(True, "finished", "clean-pair", len(r1["updates"]))] * 2, st.hosts
    assert r1["rank"] == 1 and r1["world_size"] == 2
    assert (tmp_path / "logs" / "rank-0.out").read_text().strip()  # the rank's JSON summary came back


ENV_OUT = "import json, os; print(json.dumps(dict(os.environ)))"
POLICY = ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "LOCAL_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
          "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TRIAL_X")


def test_both_spawners_hand_a_rank_the_same_environment(staged, tmp_path):
    """The environment a rank really starts with, on this machine and on an SSH host: the same
    policy (command.process_env), differing only where it says — the device (rank r takes GPU r
    here, a host's own GPU 0 there), the rendezvous address and the hosts' private interface."""
    cluster, _, _ = staged
    extra = {"TRIAL_X": "1", "OMP_NUM_THREADS": "1"}
    here = launch_group(local_argv(["-c", ENV_OUT]), 2, log_dir=tmp_path / "here", env=extra)
    there = launch_remote_group(cluster, lambda h: ["-c", ENV_OUT], 2, log_dir=tmp_path / "there", env=extra,
                                threads=3)
    assert here.ok and there.ok, (here, there)
    for r in range(2):
        got = [{k: v for k, v in json.loads((tmp_path / d / f"rank-{r}.out").read_text()).items() if k in POLICY}
               for d in ("here", "there")]
        h = cluster.by_rank[r]
        same = {k: got[0].get(k) for k in ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK", "TRIAL_X")}
        assert same == {k: got[1].get(k) for k in same} == {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                                                            "WORLD_SIZE": "2", "RANK": str(r), "TRIAL_X": "1"}
        assert (got[0]["LOCAL_RANK"], got[1]["LOCAL_RANK"]) == (str(r), "0")
        assert (got[0]["MASTER_ADDR"], got[1]["MASTER_ADDR"]) == ("127.0.0.1", cluster.by_rank[0].private_address)
        assert got[1]["GLOO_SOCKET_IFNAME"] == got[1]["NCCL_SOCKET_IFNAME"] == h.interface == "eth0"


SLEEPER_CONTROLLER = """
import sys
from pathlib import Path
from orchestrate.cluster import load
from orchestrate.launch.ssh import launch_remote_group
launch_remote_group(load(sys.argv[1]), lambda h: ["-c", "import time; print('up', flush=True); time.sleep(300)"], 2,
                    log_dir=Path(sys.argv[2]), tag="sleeper")
"""


def test_orchestrate_stop_ends_the_ranks_a_dead_controller_left(staged, tmp_path):
    """A controller SIGKILLed while its group runs: the ranks run on, detached; `orchestrate stop` ends
    them by pid on each host, and says where."""
    from orchestrate.cluster import save
    from orchestrate.launch.ssh import running_ranks

    cluster, _, _ = staged
    path = save(cluster, tmp_path / "cluster.json")
    ctl = subprocess.Popen([sys.executable, "-c", SLEEPER_CONTROLLER, str(path), str(tmp_path / "logs")], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while running_ranks(cluster, 2, "sleeper") != [True, True]:
            assert time.monotonic() < deadline and ctl.poll() is None
            time.sleep(0.2)
    finally:
        ctl.kill()
        ctl.wait()
    time.sleep(1)
    assert running_ranks(cluster, 2, "sleeper") == [True, True]  # the controller's death took no rank
    pids = [int((Path(h.root) / f"rank-{r}.pid").read_text()) for r, h in enumerate(cluster.by_rank)]
    r = subprocess.run([sys.executable, "-m", "orchestrate", "stop", "--cluster", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "stopped a rank on 2 host(s): ns-0, ns-1" in " ".join(r.stderr.split())  # the CLI's words go to stderr
    assert running_ranks(cluster, 2, "sleeper") == [False, False]
    assert all(proc_state(p) is None for p in pids)
    again = subprocess.run([sys.executable, "-m", "orchestrate", "stop", "--cluster", str(path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "stopped a rank on 0 host(s)" in again.stderr


def test_host_cut_off_mid_run_is_detected(staged, hosts, tmp_path):
    cluster, ts, _ = staged
    clear_runs(cluster)
    beat = Path(cluster.by_rank[1].root) / "home/runs/clean-pair/rank-1/heartbeat.json"
    cut_at: list[float] = []

    def cutter():  # as soon as rank 1 has finished an update, its host drops off the network
        deadline = time.monotonic() + 120
        while not beat.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        hosts.cut_off(1)
        cut_at.append(time.time())

    th = threading.Thread(target=cutter)
    th.start()
    try:
        res = launch_remote_group(cluster, train_argv, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"},
                                  unreachable_s=5, grace_s=3)
    finally:
        th.join()
    assert not res.ok and res.first_failure == 1 and res.reason == "unreachable", res
    detected = res.failure_observed_at - cut_at[0]
    print(f"host cut off → failure observed {detected:.2f} s, survivors stopped "
          f"{res.survivors_stopped_at - cut_at[0]:.2f} s (bound: unreachable_s = 5)")
    # the verdict is on the clock: no answer for 5 s, the last answer at most one probe before the cut
    assert 5 - 3.5 < detected < 5 + 3, detected
    assert res.codes[0] != 0  # the reachable survivor was stopped
    st = trial_status(cluster, None)  # the cut-off host shows as such, the other as stopped
    assert [(h.reachable, h.state) for h in st.hosts] == [(True, "stopped"), (False, "unreachable")], st


def test_work_on_all_hosts_ends_at_the_first_failure():
    """One host fails at once while the others would take 30 s: the failure is raised within a second or
    two, and every connection is closed (which is what aborts a transfer still running on it)."""
    from orchestrate.remote import run_on_hosts

    class Conn:
        def __init__(self):
            self.closed = threading.Event()

        def close(self):
            self.closed.set()

    conns = [Conn() for _ in range(4)]

    def work(k: int) -> int:
        if k == 3:
            raise StagingError("host 3 refused")
        conns[k].closed.wait(30)  # a long upload, until its connection goes
        return k

    t0 = time.monotonic()
    with pytest.raises(StagingError, match="host 3 refused"):
        run_on_hosts(work, [0, 1, 2, 3], conns)
    assert time.monotonic() - t0 < 3 and all(c.closed.is_set() for c in conns)
    assert run_on_hosts(lambda k: k * 2, [0, 1, 2], []) == [0, 2, 4]


def test_the_hosts_wheel_holds_the_sources_as_they_are_now(tmp_path):
    """setuptools builds in place and never clears build/lib: a module removed since an earlier
    build must not ride along to the hosts in the next wheel."""
    import zipfile

    from orchestrate.wheelhouse import build_wheelhouse

    root = Path(__file__).resolve().parents[2]
    stale = root / "build" / "lib" / "orchestrate" / "removed_since_test.py"
    made = [d for d in (root / "build", root / "build" / "lib", stale.parent) if not d.exists()]
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("RAN = True\n")
    try:
        (wheel,) = build_wheelhouse(tmp_path / "wheels").glob("trials-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
    finally:
        stale.unlink()
        for d in reversed(made):
            d.rmdir()
    assert "orchestrate/backends/ssh.py" in names and "orchestrate/launch/command.py" in names
    assert "orchestrate/removed_since_test.py" not in names


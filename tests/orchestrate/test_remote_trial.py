"""A trial's arm on network-namespace hosts with real sshd (root only): an arm that outlives a SIGKILLed
controller, one whose controller is starved of CPU and cut off for 60 s; and the controller's transfer
guard stopping a group from real interface counters. The whole `orchestrate run` on four hosts (staged, trained
one rank per host, the operator's Ctrl-C and the next run attaching, scored on rank 0's host, served from
the hosts, preserved) is tests/orchestrate/test_aws_loop.py's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, cpu_seconds, proc_state
from evidence.canonical import read_json
from evidence.commitments import LOG_NAME
from machinery.netns import NetnsHosts, netns_cluster
from orchestrate.cluster import save
from orchestrate.launch.ssh import running_ranks

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    # a tiny-seed update lasts milliseconds: each rests 0.4 s more (training/faults.py), as a larger model's
    # would, so that the guard and the controllers here act while the arm runs, as they would on hours
    with NetnsHosts(4, tmp_path_factory.mktemp("netns4"), env={"TRIAL_FAULT_SLOW_S": "0.4"}) as hs:
        yield hs


def test_transfer_guard_stops_a_group_from_host_counters(hosts, tiny_seed, smoke_home, tmp_path):
    """Host 1's guard is set four gradients (FP32, the seed's parameter count) above what it has moved
    so far; a 2-rank run all-reduces one gradient per update, so the controller stops the group within a
    few updates, before it finishes."""
    from orchestrate.guard import Guard, Polled, host_bytes
    from orchestrate.launch.ssh import launch_remote_group
    from orchestrate.remote import stage
    from orchestrate.wheelhouse import build_wheelhouse

    desc = netns_cluster(hosts, "file:///unused", python=sys.executable)
    ts = [desc.transport(h) for h in desc.by_rank]
    polled = None
    try:
        files = {f"home/{p.relative_to(smoke_home)}": p for p in smoke_home.rglob("*") if p.is_file()}
        files |= {f"seed/{p.relative_to(tiny_seed)}": p for p in tiny_seed.rglob("*") if p.is_file()}
        stage(desc, ts[:2], wheel_dir=build_wheelhouse(tmp_path / "wheels"), files=files)
        read = host_bytes(ts[1])
        start = read()
        assert start is not None and start > 0
        margin = 4 * 4 * read_json(tiny_seed / "receipt.json")["meta"]["parameters"]
        polled = Polled(read, every_s=0.2, name="ns-1")
        guard = Guard(counters={"ns-1": polled}, limit_bytes=start + margin, fraction=1.0)
        argv = lambda h: ["-m", "training", "train", "--home", f"{h.root}/home", "--arm", "clean-pair",  # noqa: E731
                          "--model-dir", f"{h.root}/seed", "--threads", "1"]
        res = launch_remote_group(desc, argv, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"},
                                  guard=guard, grace_s=5)
        assert not res.ok and res.reason == "guard" and res.guard.startswith("ns-1 has moved"), res
        assert guard.last["ns-1"] > start + margin
        rank0 = Path(desc.by_rank[0].root) / "home/runs/clean-pair/rank-0"
        assert not (rank0 / "result.json").exists()  # stopped before the run could finish
        if (rank0 / "heartbeat.json").exists():
            assert json.loads((rank0 / "heartbeat.json").read_text())["update"] < 16
    finally:
        if polled is not None:
            polled.close()
        for t in ts:
            t.close()


CONTROLLER = """
import sys
from pathlib import Path
from orchestrate.cluster import load
from orchestrate.backends.ssh import SshBackend
from training.prepare import require_prepared
from training.train import resolved_from_prepared
cluster, home, seed, wheels = load(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
pl = SshBackend(cluster, home, seed, wheel_dir=wheels, say=print)
try:
    arm = resolved_from_prepared(require_prepared(home)).arm("clean-pair")
    pl.devices("cpu")  # the hosts staged first, as `orchestrate run` places the arms before it trains
    print("placed", flush=True)
    res = pl.train(home, arm, max_restarts=0, echo=print)
    print("attempts", *[a.ok for a in res], flush=True)
    print("ok" if res and res[-1].ok else "failed", flush=True)
finally:
    pl.close()
"""


def throttled(ctl: subprocess.Popen, run_s: float = 0.001, period_s: float = 0.1) -> threading.Thread:
    """Starve `ctl` of CPU until it exits, as a CPU limit throttles a cgroup (cpu.max "1000 100000": 1 ms per
    100-ms period, then nothing until the next; Linux's Documentation/scheduler/sched-bwc.rst): stopped for
    all but `run_s` of every `period_s`, whatever else runs on the machine. `send_signal` polls first, so a
    process already reaped is never signalled."""
    def cycle() -> None:
        try:
            while ctl.poll() is None:
                ctl.send_signal(signal.SIGCONT)
                time.sleep(run_s)
                ctl.send_signal(signal.SIGSTOP)
                time.sleep(period_s - run_s)
        finally:
            ctl.send_signal(signal.SIGCONT)

    th = threading.Thread(target=cycle, daemon=True)
    th.start()
    return th


def test_an_arm_outlives_its_controller(hosts, tiny_seed, smoke_home, tmp_path):
    """The ranks run detached on their hosts. A controller starved of CPU for the whole arm declares nothing
    and finishes it (the reference arm: its ranks run on, undisturbed). An arm finished on the hosts but never
    collected is collected by the next run, not run again. A controller cut off from every host for 60 s
    mid-arm (its packets dropped both ways, the hosts still reaching each other) declares nothing and
    finishes the arm. A controller SIGKILLed mid-arm leaves the ranks running; once their lease on it runs
    out they stop at their next group checkpoint, and the next controller resumes from it. Every arm ends
    with the reference's final parameters, and no rank process is left. (Ctrl-C and the next run attaching
    to the arm still running: tests/orchestrate/test_aws_loop.py.)"""
    from orchestrate.backends.ssh import SshBackend
    from orchestrate.wheelhouse import build_wheelhouse
    from training.prepare import require_prepared
    from training.train import resolved_from_prepared

    desc = netns_cluster(hosts, "file:///unused", python=sys.executable)
    cluster = save(desc, tmp_path / "cluster.json")
    wheels = build_wheelhouse(tmp_path / "wheels")
    roots = [Path(h.root) for h in desc.by_rank[:2]]
    beat = roots[1] / "home/runs/clean-pair/rank-1/heartbeat.json"
    arm = resolved_from_prepared(require_prepared(smoke_home)).arm("clean-pair")

    def clear_hosts() -> None:  # the hosts share this machine's filesystem
        for root in roots:
            shutil.rmtree(root / "home" / "runs", ignore_errors=True)

    def train(pl: SshBackend, home: Path) -> tuple[list, list[str]]:
        said: list[str] = []
        pl.say = said.append
        return pl.train(home, arm, max_restarts=0, echo=said.append), said

    def final(home: Path) -> str:
        return read_json(home / "runs/clean-pair/rank-0/result.json")["digests"]["final_parameters"]

    def mid_arm(deadline_s: float = 180) -> None:  # rank 1 has finished an update, the arm has not ended
        deadline = time.monotonic() + deadline_s
        while not beat.exists():
            assert time.monotonic() < deadline, "rank 1 never finished an update"
            time.sleep(0.05)
        assert not (roots[0] / "home/runs/clean-pair/rank-0/result.json").exists()

    def none_left() -> None:
        assert running_ranks(desc, 2, "clean-pair") == [False, False]
        for r, root in enumerate(roots):
            assert proc_state(int((root / f"rank-{r}.pid").read_text())) is None

    clear_hosts()
    home = Path(shutil.copytree(smoke_home, tmp_path / "home"))
    pl = SshBackend(desc, home, tiny_seed, wheel_dir=wheels)
    try:
        before = (home / LOG_NAME).read_bytes()
        # the reference arm, its controller (a process of its own) starved of CPU for the whole arm: 1 % of a
        # CPU from the moment it has placed the arm. (#34: two busy loops at nice -19 starved it before, and
        # burned a CPU for as long as the arm ran)
        reaped = os.times()  # the CPU of this process's children reaped so far
        ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(cluster), str(home), str(tiny_seed),
                                str(wheels)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            staged = []
            for line in ctl.stdout:  # what staging said, until the arm is placed
                staged.append(line)
                if line.startswith("placed"):
                    break
            assert staged and staged[-1].startswith("placed"), "".join(staged)
            t0, placed = time.monotonic(), cpu_seconds(ctl.pid)
            th = throttled(ctl)
            out, _ = ctl.communicate(timeout=900)
            th.join()
            wall, spent = time.monotonic() - t0, os.times()
        finally:
            if ctl.poll() is None:
                ctl.kill()
                ctl.communicate()
        said = out.splitlines()
        cpu = (spent.children_user - reaped.children_user) + (spent.children_system - reaped.children_system) \
            - placed  # the controller's whole life (counted once it is reaped) less what it used to get placed
        print(f"starved controller: the arm took {wall:.1f} s, the controller {cpu:.2f} s of CPU in it; its own "
              f"words: {[s for s in said if 'answer' in s or 'unreachable' in s]}")
        assert "attempts True" in said and "ok" in said, out[-3000:]  # no false verdict: one attempt, no restart
        assert cpu < 0.1 * wall  # starved: its CPU time a small share of the arm's
        expected = final(home)
        after = (home / LOG_NAME).read_bytes()
        assert after.startswith(before) and after != before  # rank 0's numerical-profile came back

        # the controller stopped after the hosts finished the arm but before it collected it: the next
        # run finds every rank's result on the hosts and only collects (a relaunch would be refused there).
        # This placement has not staged the hosts yet: as a new controller, it stages them first, which must
        # leave rank 0's log on its host alone (it holds the arm's commitments, not yet collected)
        shutil.rmtree(home / "runs")
        (home / LOG_NAME).write_bytes(before)
        attempts, said = train(pl, home)
        assert attempts == [] and (home / LOG_NAME).read_bytes() == after, said
        assert "clean-pair already finished on the hosts; collecting it" in said
        assert [read_json(home / f"runs/clean-pair/rank-{r}/result.json")["rank"] for r in range(2)] == [0, 1]
        assert not list((home / "runs/clean-pair").rglob("checkpoints/step-*/*.safetensors"))  # stayed on hosts
        assert list((home / "runs/clean-pair").rglob("checkpoints/step-*/receipt.json"))

        # the controller cut off from every host for 60 s once rank 1 has finished an update
        clear_hosts()  # the same home again, as it was before that arm
        shutil.rmtree(home / "runs")
        (home / LOG_NAME).write_bytes((smoke_home / LOG_NAME).read_bytes())
        cut: list[float] = []

        def cutter() -> None:
            mid_arm()
            hosts.cut_controller()
            cut.append(time.monotonic())
            time.sleep(60)
            hosts.cut_controller(False)
            cut.append(time.monotonic())

        th = threading.Thread(target=cutter)
        th.start()
        try:
            t0 = time.monotonic()
            attempts, said = train(pl, home)
        finally:
            th.join()
        print(f"controller cut off for {cut[1] - cut[0]:.1f} s: the arm took {time.monotonic() - t0:.1f} s "
              f"and ended {time.monotonic() - cut[1]:.1f} s after the cut; the controller's own words: "
              f"{[s for s in said if 'answer' in s or 'unreachable' in s]}")
        assert cut[1] - cut[0] >= 60
        assert [a.ok for a in attempts] == [True] and final(home) == expected, said
        assert any("no host of the group has answered" in s for s in said), said  # told, not condemned
        none_left()
    finally:
        pl.close()

    clear_hosts()  # the controller SIGKILLed, the ranks run on; their lease on it runs out (5 s here, paused
    home = Path(shutil.copytree(smoke_home, tmp_path / "killed"))  # past it) and they stop at checkpoint 8
    short = save(desc.model_copy(update={"controller_lease_s": 5.0}), tmp_path / "short-lease.json")
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(short), str(home), str(tiny_seed), str(wheels)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        mid_arm()
    finally:
        ctl.kill()
        out, _ = ctl.communicate()
    assert "ok" not in out.split(), out
    assert running_ranks(desc, 2, "clean-pair") == [True, True]  # the controller's death took no rank
    pids = [int((root / f"rank-{r}.pid").read_text()) for r, root in enumerate(roots)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(6)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 120
    while any(running_ranks(desc, 2, "clean-pair")):
        assert time.monotonic() < deadline, "the ranks ran on without a controller"
        time.sleep(0.5)
    for r, root in enumerate(roots):
        assert (root / f"rank-{r}.status").read_text().strip() == "4"  # training/lease.py's CONTROLLER_GONE_EXIT
        assert "stopped after group checkpoint step 8, which every rank holds" in " ".join(
            (root / f"rank-{r}.err").read_text().split())
        assert not (root / f"home/runs/clean-pair/rank-{r}/result.json").exists()
    pl = SshBackend(desc, home, tiny_seed, wheel_dir=wheels)
    try:
        attempts, said = train(pl, home)  # the next controller resumes from checkpoint 8
    finally:
        pl.close()
    assert [a.ok for a in attempts] == [True] and final(home) == expected, said
    assert not any("attaching" in s for s in said)
    assert read_json(home / "runs/clean-pair/rank-1/result.json")["checkpoints"]["restored"]["step"] == 8
    none_left()

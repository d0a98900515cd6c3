"""`orchestrate run` on four network-namespace hosts with real sshd (root only): staged, trained one
rank per host, collected, scored on rank 0's host, served from the hosts (one replica each, reached
over SSH forwards), reported and preserved — and the
controller's transfer guard stopping a group from real interface counters."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_cli, serving_processes
from evidence.canonical import file_sha256, read_json
from evidence.commitments import LOG_NAME, CommitmentLog
from orchestrate.cluster import netns_cluster, save
from orchestrate.netns import NetnsHosts

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(4, tmp_path_factory.mktemp("netns4")) as hs:
        yield hs


def test_orchestrate_run_on_ssh_hosts(hosts, tiny_seed, tmp_path):
    desc = netns_cluster(hosts, f"file://{tmp_path / 'store'}", python=sys.executable)
    cluster = save(desc, tmp_path / "cluster.json")
    r = run_cli("-m", "orchestrate", "run", "diloco-four", "--profile", "smoke", "--trials",
                str(tmp_path / "trials"), "--seeds", str(tiny_seed.parent), "--cluster", str(cluster),
                timeout=900)  # prepare, stage 4 hosts, 3 arms, 4 evaluations, serving: ~5 min on 2 cores
    assert r.returncode == 0, r.stderr[-4000:]
    err = " ".join(r.stderr.split())
    assert "cluster" in err and "netns, 4 host(s)" in err and "staged ns-3" in err
    home = tmp_path / "trials" / "local-training-windows-smoke"
    rep = read_json(home / "report.json")
    assert set(rep["accuracy"]) == {"seed", "single", "ddp-four", "diloco-four"}
    for arm, world in (("single", 1), ("ddp-four", 4), ("diloco-four", 4)):
        for rank in range(world):  # every rank ran on its own host; the controller holds a verified copy
            rel = f"runs/{arm}/rank-{rank}/result.json"
            on_host = Path(desc.by_rank[rank].root) / "home" / rel
            assert file_sha256(home / rel) == file_sha256(on_host)
            assert (home / "logs" / arm / "attempt-1" / f"rank-{rank}.log").stat().st_size > 0
        assert not (Path(desc.by_rank[1].root) / "home" / "runs" / arm / "rank-0").exists()
    # scoring ran on rank 0's host and its commitments came back: the controller's log continues
    # host 0's (then adds the serving probe, which the controller ran against the hosts' replicas)
    host0 = Path(desc.by_rank[0].root) / "home"
    assert (home / LOG_NAME).read_bytes().startswith((host0 / LOG_NAME).read_bytes())
    on_host = [e["kind"] for e in CommitmentLog(host0).entries()]
    assert on_host.count("numerical-profile") == 3 and on_host.count("test-evaluation") == 4
    assert [e["kind"] for e in CommitmentLog(home).entries()][len(on_host):] == ["serving"]
    assert (host0 / "evaluations" / "test" / "diloco-four" / "attempt-1" / "summary.json").is_file()
    # the serving arm's replicas ran on its ranks' hosts, one each, from the hosts' own model copies
    assert "diloco-four: 4 replicas on the hosts (ns-0, ns-1, ns-2, ns-3" in err
    names = [f"replica-{k}.ns-{k}" for k in range(4)]
    plan = read_json(home / "serving" / "attempt-1" / "plan.json")
    assert plan["replicas"] == names and plan["stopped"]["replica"] == names[3] and plan["stopped"]["host"] == "ns-3"
    answered = {r["response"]["replica"] for r in read_json(home / "serving" / "attempt-1" / "replicas.json")["requests"]
                if r["outcome"] == "ok"}
    assert answered == set(names)
    for k in range(1, 4):  # the model came to hosts that trained no rank 0, and was verified there
        assert (Path(desc.by_rank[k].root) / "home/runs/diloco-four/model/receipt.json").is_file()
        assert "replica-" in (home / "logs" / "serving" / f"{names[k]}.log").read_text()
    assert serving_processes({f"ns-{h.index}": h.namespace for h in hosts.hosts}) == []
    assert [g["passed"] for g in rep["gates"] if g["gate"].startswith("serving")] == [True, True, True]
    preserved = read_json(home / "preserved.json")
    assert preserved["store"] == f"file://{tmp_path / 'store'}/"
    # the checkpoint payloads stayed on the hosts, and each host preserved its own into the same index
    index = read_json(tmp_path / "store" / preserved["index"], kind=None)
    on_hosts = {rel: f for rel, f in index["files"].items() if rel.startswith("hosts/")}
    assert {f["verified_by"] for f in on_hosts.values()} == {"ns-0", "ns-1", "ns-2", "ns-3"}
    payload = "runs/ddp-four/rank-1/checkpoints/step-000016/state.bin"
    assert not (home / payload).exists() and f"hosts/ns-1/{payload}" in on_hosts
    assert on_hosts[f"hosts/ns-1/{payload}"]["sha256"] == file_sha256(Path(desc.by_rank[1].root) / "home" / payload)
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 0, r.stderr
    # a host's payload gone from the store: teardown refuses, naming it
    obj = tmp_path / "store" / "objects" / "sha256" / on_hosts[f"hosts/ns-1/{payload}"]["sha256"][:2] / \
        on_hosts[f"hosts/ns-1/{payload}"]["sha256"]
    obj.rename(obj.with_suffix(".moved"))
    r = run_cli("-m", "orchestrate", "down", "--home", str(home))
    assert r.returncode == 2 and f"hosts/ns-1/{payload}: object" in " ".join(r.stderr.split()), r.stderr
    obj.with_suffix(".moved").rename(obj)
    # preserving the home without the hosts is refused: its receipts name payloads only they hold
    copy = shutil.copytree(home, tmp_path / "copy" / home.name, ignore=shutil.ignore_patterns("preserved.json", ".lock"))
    r = run_cli("-m", "orchestrate", "preserve", "--home", str(copy), "--store", f"file://{tmp_path / 'store2'}")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "checkpoint payload(s) the home's receipts name are on the hosts" in said, said
    r = run_cli("-m", "orchestrate", "preserve", "--home", str(copy), "--store", f"file://{tmp_path / 'store2'}",
                "--cluster", str(cluster))
    assert r.returncode == 0, r.stderr
    r = run_cli("-m", "orchestrate", "down", "--home", str(copy))
    assert r.returncode == 0, r.stderr
    # or, with a reason (a host that is gone), without them: the index says what was left and why
    lost = shutil.copytree(home, tmp_path / "lost" / home.name, ignore=shutil.ignore_patterns("preserved.json"))
    r = run_cli("-m", "orchestrate", "preserve", "--home", str(lost), "--store", f"file://{tmp_path / 'store3'}",
                "--leave-host-payloads", "ns-1 was lost")
    assert r.returncode == 0, r.stderr
    left = read_json(tmp_path / "store3" / read_json(lost / "preserved.json")["index"], kind=None)["host_payloads_left"]
    assert left["reason"] == "ns-1 was lost" and payload in left["paths"]


def test_transfer_guard_stops_a_group_from_host_counters(hosts, tiny_seed, smoke_home, tmp_path):
    """Host 1's guard is set 20 MB above what it has moved so far; a 2-rank run all-reduces about
    13 MB per update, so the controller stops the group within a few updates, before it finishes."""
    from orchestrate.guard import Guard, Polled, host_bytes
    from orchestrate.launch.ssh import launch_remote_group
    from orchestrate.remote import stage
    from orchestrate.trial import build_wheelhouse

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
        polled = Polled(read, every_s=0.2, name="ns-1")
        guard = Guard(counters={"ns-1": polled}, limit_bytes=start + 20e6, fraction=1.0)
        argv = lambda h: ["-m", "training", "train", "--home", f"{h.root}/home", "--arm", "clean-pair",  # noqa: E731
                          "--model-dir", f"{h.root}/seed", "--threads", "1"]
        res = launch_remote_group(desc, argv, 2, log_dir=tmp_path / "logs", env={"OMP_NUM_THREADS": "1"},
                                  guard=guard, grace_s=5)
        assert not res.ok and res.reason == "guard" and res.guard.startswith("ns-1 has moved"), res
        assert guard.last["ns-1"] > start + 20e6
        rank0 = Path(desc.by_rank[0].root) / "home/runs/clean-pair/rank-0"
        assert not (rank0 / "result.json").exists()  # stopped before the run could finish
        if (rank0 / "heartbeat.json").exists():
            assert json.loads((rank0 / "heartbeat.json").read_text())["update"] < 16
    finally:
        if polled is not None:
            polled.close()
        for t in ts:
            t.close()


def test_a_finished_arm_left_on_the_hosts_is_collected_not_rerun(hosts, tiny_seed, smoke_home, tmp_path):
    """The controller stops after the hosts finished an arm but before it collected it: the next run
    finds every rank's result on the hosts and only collects (a relaunch would be refused there)."""
    from orchestrate.trial import RemotePlacement, build_wheelhouse
    from training.prepare import require_prepared
    from training.train import resolved_from_prepared

    desc = netns_cluster(hosts, "file:///unused", python=sys.executable)
    home = tmp_path / "home"
    shutil.copytree(smoke_home, home)
    arm = resolved_from_prepared(require_prepared(home)).arm("clean-pair")
    pl = RemotePlacement(desc, home, tiny_seed, wheel_dir=build_wheelhouse(tmp_path / "wheels"))
    try:
        for h, t in zip(desc.by_rank, pl.ts):  # earlier tests trained on these hosts
            t.run(f"rm -rf {h.root}/home/runs").check("clear")
        before = (home / LOG_NAME).read_bytes()
        first = pl.train(home, arm, max_restarts=0, echo=lambda line: None)
        assert first and first[-1].ok
        after = (home / LOG_NAME).read_bytes()
        assert after.startswith(before) and after != before  # rank 0's numerical-profile came back
        shutil.rmtree(home / "runs")  # as if the controller had stopped before collecting
        (home / LOG_NAME).write_bytes(before)
        again = pl.train(home, arm, max_restarts=0, echo=lambda line: None)
        assert again == [] and (home / LOG_NAME).read_bytes() == after
        for r in range(2):
            assert read_json(home / f"runs/clean-pair/rank-{r}/result.json")["rank"] == r
        assert not list((home / "runs/clean-pair").rglob("checkpoints/step-*/*.safetensors"))  # stayed on hosts
        assert list((home / "runs/clean-pair").rglob("checkpoints/step-*/receipt.json"))
    finally:
        pl.close()

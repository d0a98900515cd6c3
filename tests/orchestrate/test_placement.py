"""Placement before launch: an arm whose ranks cannot each get a GPU (or a host) is not run, the
others are; the decision is committed before anything trains and the report shows what needs the
missing arms as not evaluated."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run_cli, score
from evidence.canonical import read_json
from orchestrate.cluster import ClusterError
from orchestrate.placement import hosts_devices, local_devices, place, visible_gpus
from training.config import resolve


def decide(experiment: str, d, device: str = "cuda"):
    exp = resolve(experiment, "smoke").experiment
    out = place(exp.arms, exp.serving_arm, device, d)
    return {r.arm: r.reason for r in out.arms}, out.serving


def test_one_gpu_runs_the_single_arms_and_reports_the_pair():
    arms, serving = decide("cooperative-learning", local_devices(None, "cuda", {"TRIAL_GPUS": "1"}))
    assert arms == {"clean-single": None, "damaged-single": None,
                    "clean-pair": "not run: needs 2 GPUs, the cluster has 1"}
    assert not serving.runs and serving.reason == (
        "not run: its arm clean-pair is not run (needs 2 GPUs, the cluster has 1)")
    # batched-learning: the primary arm itself is not run; the rules are not changed by it
    arms, _ = decide("batched-learning", local_devices(None, "cuda", {"TRIAL_GPUS": "1"}))
    assert arms == {"single": None, "powersgd-pair": "not run: needs 2 GPUs, the cluster has 1"}


def test_enough_gpus_run_everything_and_four_rank_arms_need_four():
    arms, serving = decide("cooperative-learning", local_devices(None, "cuda", {"TRIAL_GPUS": "2"}))
    assert set(arms.values()) == {None} and serving.runs and serving.replicas == 2
    arms, serving = decide("local-training-windows", local_devices(None, "cuda", {"TRIAL_GPUS": "2"}))
    assert arms == {"single": None, "ddp-four": "not run: needs 4 GPUs, the cluster has 2",
                    "diloco-four": "not run: needs 4 GPUs, the cluster has 2"}
    # the four-rank serving arm is not run, so neither is its probe (it would need four replicas' GPUs)
    assert serving.reason.startswith("not run: its arm diloco-four is not run")


def test_cpu_profiles_need_no_gpu_but_still_need_host_slots():
    arms, serving = decide("local-training-windows", local_devices(None, "cpu"), device="cpu")
    assert set(arms.values()) == {None} and serving.runs
    arms, _ = decide("cooperative-learning", local_devices(1, "cpu"), device="cpu")
    assert arms["clean-pair"] == "not run: needs 2 hosts, the cluster has 1" and arms["clean-single"] is None


def test_no_gpu_at_all_is_an_error_not_a_list_of_skips():
    with pytest.raises(ClusterError, match="has no GPU"):
        decide("cooperative-learning", local_devices(None, "cuda", {"TRIAL_GPUS": "0"}))


def test_ssh_hosts_give_one_gpu_per_rank():
    """One rank per host on its GPU 0: a host without a GPU cannot hold a rank; the probe's replicas
    run one per host too, so they need as many hosts with a GPU (the controller's GPUs do not count)."""
    d = hosts_devices("pulumi", [1, 0, 2, 1], controller_gpus=1, gpus_from="test")
    arms, serving = decide("local-training-windows", d)
    assert arms["ddp-four"] == "not run: needs 4 GPUs, the cluster has 3"
    arms, serving = decide("cooperative-learning", d)
    assert arms["clean-pair"] == ("not run: needs 2 GPUs, the cluster has 3 (one rank per host, and rank 1's "
                                  "host has none)")
    d = hosts_devices("pulumi", [1, 1], controller_gpus=None, gpus_from="test")
    arms, serving = decide("cooperative-learning", d)
    assert arms["clean-pair"] is None and serving.reason is None  # two hosts with a GPU: two replicas
    exp = resolve("cooperative-learning", "smoke").experiment  # a one-rank serving arm still needs 2 replicas
    out = place(exp.arms, "clean-single", "cpu", hosts_devices("pulumi", [1], None, "test"))
    assert out.serving.reason == "not run: needs 2 hosts (one replica per host), the cluster has 1"
    out = place(exp.arms, "clean-single", "cuda", hosts_devices("pulumi", [1, 0], None, "test"))
    assert out.serving.reason == ("not run: needs 2 GPUs (one replica per host, on its first GPU), and "
                                        "rank 1's host has none")
    assert place(exp.arms, "clean-single", "cpu", hosts_devices("pulumi", [1, 0], None, "test")).serving.runs
    with pytest.raises(ClusterError, match="rank 0's host has no GPU"):
        decide("cooperative-learning", hosts_devices("pulumi", [0, 1], 2, "test"))


def test_gpu_count_override():
    assert visible_gpus({"TRIAL_GPUS": "3"}) == (3, "TRIAL_GPUS")
    with pytest.raises(ClusterError, match="TRIAL_GPUS='two' is not a whole number"):
        visible_gpus({"TRIAL_GPUS": "two"})
    n, src = visible_gpus({})
    assert src == "torch.cuda.device_count()" and n >= 0


def test_a_rank_without_a_gpu_of_its_own_refuses(monkeypatch):
    """The second line of defence: a rank launched anyway onto a machine with too few GPUs refuses
    (exit 2, never restarted) instead of sharing GPU 0 and meeting the first rank's device lock."""
    import torch

    from training.errors import DeviceBusy, RuntimeSetupError
    from training.runtime import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeSetupError, match="LOCAL_RANK=1 has no GPU of its own: 1 visible") as e:
        pick_device("cuda", 1)
    assert not isinstance(e.value, DeviceBusy)  # exit 2, not the busy GPU's 75 (which is restarted)


def test_placement_is_committed_once_and_a_later_cluster_must_honour_it(home_copy, smoke_home, tmp_path,
                                                                        monkeypatch):
    from evidence.commitments import CommitmentLog
    from evidence.placement import committed_placement, not_run
    from orchestrate.placement import commit_placement

    monkeypatch.setattr("orchestrate.placement.trial_device", lambda cfg: "cuda")  # the smoke home as a GPU one
    cfg = resolve("cooperative-learning", "smoke")
    gpus = lambda n: local_devices(None, "cuda", {"TRIAL_GPUS": str(n)})  # noqa: E731
    rec, now = commit_placement(cfg, home_copy, gpus(1))
    assert now and committed_placement(home_copy) == rec
    assert not_run(rec) == {"clean-pair": "not run: needs 2 GPUs, the cluster has 1",
                            "serving probe": "not run: its arm clean-pair is not run (needs 2 GPUs, the cluster has 1)"}
    assert [e["kind"] for e in CommitmentLog(home_copy).entries()] == ["prepare", "placement"]
    # a later run on more GPUs keeps the home's placement (no second entry; the pair stays not run)
    assert commit_placement(cfg, home_copy, gpus(2)) == (rec, False)
    assert len(CommitmentLog(home_copy).entries()) == 2
    # a home placed on two GPUs, run again on one: the pair it runs is unfinished, so it is refused
    # before anything launches; once the pair has finished there, scoring and reporting may go on
    other = tmp_path / "other"
    shutil.copytree(smoke_home, other)
    two, _ = commit_placement(cfg, other, gpus(2))
    assert not_run(two) == {}
    with pytest.raises(ClusterError, match="committed placement runs clean-pair .2 ranks., which is not finished"):
        commit_placement(cfg, other, gpus(1), probed=True)
    with pytest.raises(ClusterError, match="committed placement runs the serving probe"):
        commit_placement(cfg, other, gpus(1), finished={"clean-pair"})
    assert commit_placement(cfg, other, gpus(1), finished={"clean-pair"}, probed=True) == (two, False)


@pytest.fixture(scope="module")
def primary_not_run(tmp_path_factory, trained, tiny_seed):
    """The trained smoke trial, with a committed placement that did not run the primary arm."""
    from evidence.canonical import write_json_atomic
    from evidence.commitments import CommitmentLog

    home = tmp_path_factory.mktemp("placement") / "home"
    shutil.copytree(trained, home)
    why = "not run: needs 2 GPUs, the cluster has 1"  # as if clean-single needed two (the words are the test's)
    write_json_atomic(home / "placement.json", {
        "format": "trial-placement-v1", "experiment": "cooperative-learning", "profile": "smoke", "device": "cuda",
        "cluster": {"source": "local", "hosts": None, "gpus_per_host": [1], "controller_gpus": 1, "gpus_from": "test"},
        "arms": [{"arm": "clean-single", "kind": "single", "world_size": 1, "runs": False, "reason": why},
                 {"arm": "damaged-single", "kind": "single", "world_size": 1, "runs": True, "reason": None},
                 {"arm": "clean-pair", "kind": "ddp", "world_size": 2, "runs": True, "reason": None}],
        "serving": {"arm": "clean-pair", "replicas": 2, "runs": True, "reason": None}})
    CommitmentLog(home).append("placement", "placement.json", {"not_run": ["clean-single"]})
    r = run_cli("-m", "training", "select", "--home", str(home))
    assert r.returncode == 0, r.stderr
    score(home, ("seed", "damaged-single", "clean-pair"), tiny_seed)
    return home


def test_the_primary_arm_not_run_leaves_its_gates_not_evaluated(primary_not_run, tmp_path, tiny_seed):
    home = primary_not_run
    sel = read_json(home / "selection.json")
    assert sel["primary"] == "clean-single"  # the rules, unchanged
    assert set(sel["candidates"]) == {"damaged-single", "clean-pair"} and sel["not_run"] == {
        "clean-single": "not run: needs 2 GPUs, the cluster has 1"}
    r = run_cli("-m", "training", "evaluate", "--home", str(home), "--arm", "clean-single", "--role", "test",
                "--model-dir", str(tiny_seed))
    assert r.returncode == 2 and "not in the committed selection" in r.stderr  # never scored
    out = tmp_path / "r.json"
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))
    assert r.returncode == 0, r.stderr
    rep = read_json(out)
    assert rep["not_run"] == {"clean-single": "not run: needs 2 GPUs, the cluster has 1"}
    gates = {g["gate"]: g for g in rep["gates"]}
    for name in ("gain ≥ 5.0 pp", "McNemar p ≤ 0.01", "retention upper bound ≤ +0.02 nats"):
        g = gates[name]
        assert (g["value"], g["passed"], g["evaluated"]) == (None, None, False)
        assert g["reason"] == "clean-single not run: needs 2 GPUs, the cluster has 1"
        assert name in rep["not_evaluated_gates"] and name not in rep["failed_gates"]
    assert "clean-single" not in rep["accuracy"] and "clean-single" not in rep["arms"]
    assert "damaged-single vs seed" in rep["comparisons"]  # the arms that ran are compared as always
    assert rep["failed_gates"] == [g["gate"] for g in rep["gates"] if g["passed"] is False]
    md = (tmp_path / "r.md").read_text()
    assert "| gain ≥ 5.0 pp | — | not evaluated: clean-single not run: needs 2 GPUs, the cluster has 1 |" in md
    assert "## Not run" in md and "- clean-single: not run: needs 2 GPUs, the cluster has 1" in md


def test_an_edited_placement_stops_the_report(primary_not_run, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(primary_not_run, home)
    p = home / "placement.json"
    rec = read_json(p)
    rec["arms"][0]["reason"] = "not run: it did badly"
    p.write_text(json.dumps(rec))
    out = tmp_path / "r.json"
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))
    assert r.returncode == 2 and "(placement): committed file changed" in " ".join(r.stderr.split())
    assert not out.exists()


def test_no_serve_is_committed_and_a_later_run_cannot_drop_a_committed_probe(home_copy):
    """`orchestrate run --no-serve`: the probe is not run, for a reason the placement commits (the
    report then shows the serving gates not evaluated with it); on a home whose committed placement
    runs the probe, --no-serve is refused by name rather than ignored (#33)."""
    import dataclasses

    from evidence.placement import SERVING_PROBE, not_run
    from orchestrate.placement import NO_SERVE, commit_placement

    cfg = resolve("cooperative-learning", "smoke")
    d = local_devices(None, "cpu")
    _, serving = decide("cooperative-learning", dataclasses.replace(d, no_serve=True), device="cpu")
    assert not serving.runs and serving.reason == NO_SERVE
    other = home_copy.parent / "other"
    shutil.copytree(home_copy, other)
    rec, now = commit_placement(cfg, home_copy, dataclasses.replace(d, no_serve=True))
    assert now and rec.cluster.no_serve is True and not_run(rec) == {SERVING_PROBE: NO_SERVE}
    assert read_json(home_copy / "placement.json") == rec.model_dump(mode="json")
    again, now = commit_placement(cfg, home_copy, d)  # a later run without it: the committed decision stands
    assert not now and not_run(again) == {SERVING_PROBE: NO_SERVE}
    rec, _ = commit_placement(cfg, other, d)  # committed with the probe, which has not run yet
    assert rec.serving.runs
    with pytest.raises(ClusterError, match="--no-serve cannot change a placement committed at the home's first run"):
        commit_placement(cfg, other, dataclasses.replace(d, no_serve=True))


def test_no_serve_on_a_home_older_than_committed_placements_is_refused(home_copy):
    """A home whose candidates were committed before placements were (every arm and the probe run) has no
    placement to commit --no-serve in: it was silently ignored there; now refused by name (#33)."""
    from conftest import QuietProgress as Quiet
    from evidence.commitments import CommitmentLog
    from orchestrate.stages.train import place_arms

    class Here:
        shared_cores = True
        devices = staticmethod(lambda device: local_devices(None, "cpu"))

    cfg = resolve("cooperative-learning", "smoke")
    (home_copy / "candidates.json").write_text("{}")
    CommitmentLog(home_copy).append("candidates", "candidates.json", {})
    with pytest.raises(ClusterError, match="--no-serve: .* committed its candidates before placements were committed"):
        place_arms(cfg, home_copy, Here(), Quiet(), no_serve=True)
    assert place_arms(cfg, home_copy, Here(), Quiet()) == {} and not (home_copy / "placement.json").exists()
    for kind in ("selection", "serving"):  # its probe has run: --no-serve would leave out nothing
        (home_copy / f"{kind}.json").write_text("{}")
        CommitmentLog(home_copy).append(kind, f"{kind}.json", {})
    assert place_arms(cfg, home_copy, Here(), Quiet(), no_serve=True) == {}

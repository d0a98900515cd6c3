"""Ranks that share GPUs on purpose (`orchestrate run --share-gpus`): placed and committed as such,
launched by the controller as one job through gloo, trained exactly as the ordinary path trains them,
and reported with every learning gate evaluated and every timing gate marked not comparable.

On this machine (no GPU) the co-located path is the controller's real one — the committed placement
read by LocalBackend, TRIAL_SHARED_GPUS and the job's name in every rank's environment, gloo, the
rank's own record of it — with the tensors on the CPU; the GPU machine runs the same equivalence with
the ranks on one GPU (tests/training/test_arms.py under TRIAL_TEST_DEVICE=cuda, tests/dist_worker.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import gpus, run_cli, score, train_as_placed
from evidence.canonical import read_json
from evidence.placement import SharedRanks, SharedReplicas
from orchestrate.cluster import ClusterError
from orchestrate.placement import commit_placement, committed_share, local_devices, place
from training.config import resolve

ATOL = 5e-5  # the exact-objective tolerance of tests/training/test_arms.py


def test_sharing_places_every_arm_on_one_gpu_and_says_so():
    exp = resolve("local-training-windows", "smoke").experiment
    rec = place(exp.arms, exp.serving_arm, "cuda", gpus(1, share=True))
    rows = {r.arm: r for r in rec.arms}
    assert all(r.runs for r in rows.values())
    assert rows["single"].shared is None  # one rank, one GPU: nothing shared
    assert rows["ddp-four"].shared == rows["diloco-four"].shared == SharedRanks(ranks=4, gpus=1)
    assert rec.serving.runs and rec.serving.shared == SharedReplicas(replicas=4, gpus=1)
    # two GPUs: four ranks still share them; the pair of another experiment does not need to
    assert {r.arm: r.shared for r in place(exp.arms, exp.serving_arm, "cuda", gpus(2, True)).arms} == {
        "single": None, "ddp-four": SharedRanks(ranks=4, gpus=2), "diloco-four": SharedRanks(ranks=4, gpus=2)}
    coop = resolve("cooperative-learning", "smoke").experiment
    assert all(r.shared is None for r in place(coop.arms, coop.serving_arm, "cuda", gpus(2, True)).arms)
    # the default is unchanged: not run, nothing shared
    rows = {r.arm: r for r in place(exp.arms, exp.serving_arm, "cuda", gpus(1)).arms}
    assert rows["ddp-four"].reason == "not run: needs 4 GPUs, the cluster has 1" and rows["ddp-four"].shared is None
    # a CPU profile has no GPU to share; no GPU at all is still an error
    assert all(r.shared is None for r in place(exp.arms, exp.serving_arm, "cpu",
                                               local_devices(None, "cpu", share_gpus=True)).arms)
    with pytest.raises(ClusterError, match="has no GPU"):
        place(exp.arms, exp.serving_arm, "cuda", gpus(0, share=True))


def test_a_shared_placement_is_committed_and_a_later_run_must_share_too(ltw_home, tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrate.placement.trial_device", lambda cfg: "cuda")
    home = tmp_path / "home"
    shutil.copytree(ltw_home, home)
    cfg = resolve("local-training-windows", "smoke")
    rec, now = commit_placement(cfg, home, gpus(1, share=True))
    assert now and rec.cluster.share_gpus is True
    assert (committed_share(home, "ddp-four"), committed_share(home, "single"), committed_share(home)) == (1, None, 1)
    with pytest.raises(ClusterError, match=r"runs ddp-four \(4 ranks\) \(it shares GPUs there: run with --share-gpus\)"):
        commit_placement(cfg, home, gpus(1), finished={"single"})


def test_share_gpus_is_refused_on_ssh_hosts(tmp_path):
    from orchestrate.backends import make_backend

    class Desc:
        source, deadline = "hosts", None

    with pytest.raises(ClusterError, match="--share-gpus shares this machine's GPUs.*one rank per host"):
        make_backend(Desc(), tmp_path, tmp_path, tmp_path, None, None, share_gpus=True)


def final(home: Path, arm: str) -> dict[str, torch.Tensor]:
    return load_file(str(home / "runs" / arm / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def ltw_pair(tmp_path_factory, ltw_home, tiny_seed, finished_trial):
    """local-training-windows/smoke with its four ranks sharing one GPU as placed (the co-located path),
    beside the same experiment trained by `orchestrate run diloco-four --profile smoke` on the ordinary
    path (the session's `finished_trial`, a rank per process as always), from the same committed inputs."""
    home = tmp_path_factory.mktemp("share") / "shared"
    shutil.copytree(ltw_home, home)
    ordinary = finished_trial.home
    same = ("model", "inputs", "schedule", "experiment_digest")
    a, b = read_json(home / "prepared.json"), read_json(ordinary / "prepared.json")
    assert {k: a[k] for k in same} == {k: b[k] for k in same}, "the two homes were prepared differently"
    with pytest.MonkeyPatch.context() as mp:
        train_as_placed(home, ["single", "ddp-four", "diloco-four"], tiny_seed, 1, True, mp)
    return {"shared": home, "ordinary": ordinary}


@pytest.fixture(scope="module")
def powersgd_pair(tmp_path_factory, batched_home, tiny_seed, powersgd_trained):
    """batched-learning/smoke's powersgd-pair with its two ranks sharing one GPU as placed, beside the
    session's `powersgd_trained`: the same committed inputs trained on the ordinary path (a rank per
    process, no GPU shared; read only)."""
    home = tmp_path_factory.mktemp("share-psgd") / "shared"
    shutil.copytree(batched_home, home)
    with pytest.MonkeyPatch.context() as mp:
        train_as_placed(home, ["powersgd-pair"], tiny_seed, 1, True, mp)
    return {"shared": home, "ordinary": powersgd_trained}


@pytest.mark.parametrize("arm,world", [("ddp-four", 4), ("diloco-four", 4), ("powersgd-pair", 2)])
def test_the_co_located_path_trains_what_the_ordinary_path_trains(ltw_pair, powersgd_pair, arm, world):
    homes = powersgd_pair if arm == "powersgd-pair" else ltw_pair
    runs = {k: [read_json(h / "runs" / arm / f"rank-{r}" / "result.json") for r in range(world)]
            for k, h in homes.items()}
    # each rank was launched as placed, and recorded it
    assert {r["runtime"]["env"]["TRIAL_SHARED_GPUS"] for r in runs["shared"]} == {"1"}
    assert len({r["runtime"]["env"]["TRIAL_DEVICE_JOB"] for r in runs["shared"]}) == 1  # one job
    assert {r["runtime"]["env"]["TRIAL_SHARED_GPUS"] for r in runs["ordinary"]} == {None}
    a, b = final(homes["shared"], arm), final(homes["ordinary"], arm)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= ATOL, f"{arm}: max |Δ| {worst}"
    for k in ("shared", "ordinary"):  # replicas of each group agree exactly
        assert len({r["digests"]["final_parameters"] for r in runs[k]}) == 1
    la = [u["loss_sum_local"] for u in runs["shared"][0]["updates"]]
    lb = [u["loss_sum_local"] for u in runs["ordinary"][0]["updates"]]
    assert la == pytest.approx(lb, rel=1e-6)


@pytest.fixture(scope="module")
def shared_report(tmp_path_factory, ltw_pair, tiny_seed):
    """The shared home selected, scored and reported by `python -m evidence report` from its evidence."""
    home = tmp_path_factory.mktemp("share-report") / "home"
    shutil.copytree(ltw_pair["shared"], home)
    assert run_cli("-m", "training", "select", "--home", str(home)).returncode == 0
    score(home, ("seed", "single", "ddp-four", "diloco-four"), tiny_seed)
    out = home.parent / "report.json"
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))
    assert r.returncode == 0, r.stderr
    return home, read_json(out), out.with_suffix(".md").read_text()


def test_timing_gates_are_not_comparable_and_every_other_gate_is_evaluated(shared_report):
    home, rep, md = shared_report
    gates = {g["gate"]: g for g in rep["gates"]}
    timing = gates["active time ≤ 0.5 × ddp-four"]
    assert timing["passed"] is None and timing["comparable"] is False and isinstance(timing["value"], float)
    assert timing["reason"] == ("not comparable: diloco-four: 4 ranks shared 1 GPU; ddp-four: 4 ranks shared 1 GPU")
    assert rep["not_comparable_gates"] == ["active time ≤ 0.5 × ddp-four"]
    assert "active time ≤ 0.5 × ddp-four" not in rep["failed_gates"] + rep["not_evaluated_gates"]
    for name in ("gain ≥ 5.0 pp", "McNemar p ≤ 0.01", "retention upper bound ≤ +0.02 nats",
                 "noninferiority lower bound ≥ -3.0 pp vs ddp-four", "bytes ≤ 0.125 × ddp-four"):
        assert gates[name]["passed"] in (True, False) and gates[name]["value"] is not None, name
    assert rep["shared"] == {"ddp-four": "4 ranks shared 1 GPU", "diloco-four": "4 ranks shared 1 GPU",
                             "serving probe": "4 replicas shared 1 GPU"}
    assert (f"| active time ≤ 0.5 × ddp-four | {timing['value']:.4g} | not comparable: diloco-four: 4 ranks shared "
            "1 GPU; ddp-four: 4 ranks shared 1 GPU |") in md
    assert "## GPUs shared on purpose" in md


def test_a_placement_the_ranks_did_not_run_by_is_refused(trained, tiny_seed, tmp_path, monkeypatch):
    """The report believes a placement only where every rank's own record agrees: cooperative-learning's
    pair, trained with a GPU per rank, under a committed placement that says its ranks shared one, is
    refused by name."""
    home = tmp_path / "home"
    shutil.copytree(trained, home)
    monkeypatch.setattr("orchestrate.placement.trial_device", lambda c: "cuda")
    rec, _ = commit_placement(resolve("cooperative-learning", "smoke"), home, gpus(1, share=True))
    assert [r.arm for r in rec.arms if r.shared] == ["clean-pair"]
    assert run_cli("-m", "training", "select", "--home", str(home)).returncode == 0
    score(home, ("seed", "clean-single"), tiny_seed)
    out = tmp_path / "r.json"
    r = run_cli("-m", "evidence", "report", "--home", str(home), "--output", str(out))
    assert r.returncode == 2 and not out.exists()
    assert ("clean-pair: the committed placement shares 1 GPU(s) between its ranks, but its ranks recorded "
            "TRIAL_SHARED_GPUS=None") in " ".join(r.stderr.split())

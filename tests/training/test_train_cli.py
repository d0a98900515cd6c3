"""`python -m training train` end to end on prepared smoke homes, ranks as real processes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_ranks
from evidence.canonical import read_json
from evidence.commitments import CommitmentLog

TRAIN = [sys.executable, "-m", "training", "train"]


def train_argv(home, arm, seed):
    return [*TRAIN, "--home", str(home), "--arm", arm, "--model-dir", str(seed)]


def results(home, arm, world):
    return [read_json(home / "runs" / arm / f"rank-{r}" / "result.json") for r in range(world)]


def test_single_and_pair(trained, tiny_seed, tmp_path):
    """clean-single and clean-pair as `python -m training train` ran them, one process per rank: the
    session's `trained` home ran exactly these commands (conftest.py), so its copy is read here rather
    than trained again."""
    home = Path(shutil.copytree(trained, tmp_path / "home"))
    (single,), pair = results(home, "clean-single", 1), results(home, "clean-pair", 2)
    prepared = read_json(home / "prepared.json")
    schedule = read_json(home / "inputs" / "schedule.json")["updates"]

    # replicas agree, and the final model on disk is what they agreed on
    assert pair[0]["digests"]["final_parameters"] == pair[1]["digests"]["final_parameters"]
    from training.seed import verify_seed

    receipt = verify_seed(home / "runs" / "clean-pair" / "model")
    assert receipt["meta"]["parameters_sha256"] == pair[0]["digests"]["final_parameters"]
    assert receipt["digest"] == pair[0]["model"]["receipt_digest"] and pair[1]["model"] is None

    # both numerical profiles were committed before training, and match what the ranks used
    entries = {e["subject"]: e for e in CommitmentLog(home).entries() if e["kind"] == "numerical-profile"}
    for arm, res in (("clean-single", single), ("clean-pair", pair[0])):
        e = entries[f"runs/{arm}/numerical-profile.json"]
        assert e["data"]["profile_digest"] == res["digests"]["numerical_profile"]

    # the global and local assignments follow the committed schedule
    for u, docs in enumerate(schedule):
        assert single["updates"][u]["global_docs"] == docs
        half = len(docs) // 2
        assert pair[0]["updates"][u]["local_docs"] == docs[:half]
        assert pair[1]["updates"][u]["local_docs"] == docs[half:]
        assert pair[0]["updates"][u]["weighted_targets_global"] == \
            prepared["schedule"]["weighted_targets_per_update"][u]

    # same start, same objective: the first update's global loss agrees with the single arm's
    first = sum(r["updates"][0]["loss_sum_local"] for r in pair) / pair[0]["updates"][0]["weighted_targets_global"]
    assert first == pytest.approx(single["updates"][0]["loss"], rel=1e-6)

    # one dense FP32 gradient reduction per update, measured at the collective
    n = pair[0]["parameters"]
    for rec in pair[0]["updates"]:
        assert rec["comm"]["gradient"]["payload_bytes"] == 4 * n
        assert rec["comm"]["gradient"]["ring_wire_bytes"] == pytest.approx(4 * n * 2 * 1 / 2)
    assert single["comm"]["training_payload_bytes"] == 0
    t = pair[0]["timers"]
    assert t["training_loop_seconds"] >= t["updates_seconds"] > 0
    # host counters are recorded around the loop; the ranks' gloo traffic crossed loopback
    assert pair[0]["network"]["delta"]["lo"]["rx_bytes"] >= 0
    assert pair[0]["network"]["delta"]["lo"]["tx_bytes"] > 0

    # a finished rank is never overwritten
    code, out = run_ranks(train_argv(home, "clean-single", tiny_seed), 1)[0]
    assert code == 2 and "already exists" in out


def test_numerical_profile_disagreement_stops_both_ranks(home_copy, tiny_seed):
    res = run_ranks(train_argv(home_copy, "clean-pair", tiny_seed), 2,
                    rank_env={1: {"NCCL_ALGO": "Tree"}})
    for code, out in res:
        assert code == 2, out
        out = " ".join(out.split())
        assert "disagree on the numerical-profile digest" in out
        assert "rank 0 has" in out and "rank 1 has" in out
    assert not (home_copy / "runs" / "clean-pair" / "rank-0" / "result.json").exists()
    assert not [e for e in CommitmentLog(home_copy).entries() if e["kind"] == "numerical-profile"]


def test_refusals(home_copy, tiny_seed, tmp_path):
    cases = [
        (train_argv(home_copy, "seed", tiny_seed), 1, "nothing to train"),
        (train_argv(home_copy, "clean-pair", tiny_seed), 1, "WORLD_SIZE=1"),
        (train_argv(home_copy, "no-such-arm", tiny_seed), 1, "no arm 'no-such-arm'"),
        (train_argv(tmp_path / "empty", "clean-single", tiny_seed), 1, "prepare"),
    ]
    bad_seed = tmp_path / "seed"
    shutil.copytree(tiny_seed, bad_seed)
    (bad_seed / "config.json").write_text((bad_seed / "config.json").read_text() + " ")
    cases.append((train_argv(home_copy, "clean-single", bad_seed), 1, "config.json"))
    for argv, world, needle in cases:
        (code, out), = run_ranks(argv, world)
        assert code == 2, out
        assert needle in " ".join(out.split()), out
        assert "Traceback" not in out


def test_ddp_four_and_diloco_four(finished_trial):
    """ddp-four and diloco-four as `python -m training train` ran them, four processes each: the session's
    `finished_trial` (`orchestrate run diloco-four --profile smoke` on the embedded local cluster) launched
    that command for every rank (with `--threads`, the controller's share of the cores) on
    local-training-windows/smoke, so its results are read here rather than trained again (read only). Each
    arm trained in one attempt: a group the supervisor restarted would not be what this test checks."""
    assert finished_trial.first.returncode == 0, finished_trial.first.stderr[-3000:]
    home = finished_trial.home
    for arm in ("ddp-four", "diloco-four"):
        assert sorted(p.name for p in (home / "logs" / arm).iterdir()) == ["attempt-1"]
    ddp, dil = results(home, "ddp-four", 4), results(home, "diloco-four", 4)
    for group in (ddp, dil):
        assert len({r["digests"]["final_parameters"] for r in group}) == 1
    h = dil[0]["numerical_profile"]["arm"]["sync_every"]
    updates = len(dil[0]["updates"])
    assert h == 4 and sum(r["outer_step"] for r in dil[0]["updates"]) == updates // h
    # logical payload per update: DiLoCo / DDP is exactly 1/H
    ratio = (dil[0]["comm"]["training_payload_bytes_per_update"]
             / ddp[0]["comm"]["training_payload_bytes_per_update"])
    assert ratio == 1 / h
    # DiLoCo workers keep their own local documents and normalize by their own targets
    for r, res in enumerate(dil):
        rec = res["updates"][0]
        assert rec["local_docs"] == rec["global_docs"][2 * r:2 * r + 2]
        assert rec["loss_local"] == pytest.approx(rec["loss_sum_local"] / rec["weighted_targets_local"])


def test_powersgd_pair(powersgd_trained):
    """powersgd-pair as `python -m training train` ran it, a process per rank: the session's
    `powersgd_trained` (conftest.py) was trained so by the controller's LocalBackend (with the threads it
    gives a rank), and is read here; test_share_gpus.py compares it with the co-located path."""
    home = powersgd_trained
    pair = results(home, "powersgd-pair", 2)
    assert pair[0]["digests"]["final_parameters"] == pair[1]["digests"]["final_parameters"]
    recs = pair[0]["updates"]
    assert [r["powersgd_compressed"] for r in recs] == [u >= 4 for u in range(len(recs))]
    # microbatches of 8 over each rank's local batch of 16, longest documents first
    from training.corpus import Corpus

    lengths = Corpus.load(home / "inputs" / "train.safetensors").lengths
    for res in pair:
        for r in res["updates"]:
            assert r["microbatches"] == [8, 8]
            ran = [d for mb in r["microbatch_docs"] for d in mb]
            assert sorted(ran) == sorted(r["local_docs"])
            assert [lengths[d] for d in ran] == sorted((lengths[d] for d in ran), reverse=True)


def test_partly_finished_group_is_set_aside_whole(tmp_path):
    from training.runs import set_aside_unfinished

    rd = tmp_path / "runs" / "clean-pair"
    (rd / "rank-0").mkdir(parents=True)
    (rd / "rank-0" / "result.json").write_text("{}")
    (rd / "rank-1").mkdir()
    (rd / "rank-1" / "partial.bin").write_text("x")
    (rd / "attempts").mkdir()
    (rd / "attempts" / "rank-0.7").mkdir()  # an earlier attempt: numbering continues after it
    assert set_aside_unfinished(tmp_path, "clean-pair", 2)
    assert not (rd / "rank-0").exists() and not (rd / "rank-1").exists()
    assert (rd / "attempts" / "rank-0.8" / "result.json").is_file()
    assert (rd / "attempts" / "rank-1.1" / "partial.bin").is_file()
    # a wholly finished group is left alone
    for r in range(2):
        (rd / f"rank-{r}").mkdir()
        (rd / f"rank-{r}" / "result.json").write_text("{}")
    assert not set_aside_unfinished(tmp_path, "clean-pair", 2)
    assert (rd / "rank-0" / "result.json").is_file()

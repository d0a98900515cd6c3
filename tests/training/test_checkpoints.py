"""Group checkpoints and coordinated recovery, with real rank processes killed mid-run.

One session fixture trains clean-pair (2 ranks, checkpoints at 8 and 16) to the end, another is
killed after update 11 (so only step 8 is published); each test damages a copy of the latter in one
way and checks that resuming refuses, or recovers exactly, without deleting anything.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from conftest import built_once, run_ranks
from evidence.canonical import file_sha256, read_json

ARM = "clean-pair"


def argv(home, seed, *extra):
    return [sys.executable, "-m", "training", "train", "--home", str(home), "--arm", ARM,
            "--model-dir", str(seed), *extra]


def rank_dir(home, r):
    return home / "runs" / ARM / f"rank-{r}"


def files(home):
    """Every file under the run, with its hash: the 'nothing deleted' check."""
    root = home / "runs" / ARM
    return {str(p.relative_to(root)): file_sha256(p) for p in root.rglob("*") if p.is_file()
            and p.name not in ("heartbeat.json",)}


@pytest.fixture
def full_pair(trained):
    """clean-pair trained uninterrupted: the session's `trained` home ran exactly `argv(home, seed)` for
    it (conftest.py), so that home is the reference rather than a second run of the same command.
    Read-only, as there."""
    return trained


@pytest.fixture(scope="session")
def killed_pair(tmp_path_factory, smoke_home, tiny_seed):
    """clean-pair with rank 1 SIGKILLed after update 11, once per test run (not per xdist worker);
    read-only: tests resume copies (`killed`)."""
    def build(d):
        home = d / "killed"
        shutil.copytree(smoke_home, home)
        res = run_ranks(argv(home, tiny_seed), 2, env={"TRIAL_FAULT_KILL": "1:11"})
        assert res[1][0] == -9, res[1][1]  # rank 1 died by SIGKILL; rank 0 lost its peer
        assert res[0][0] != 0
        for r in range(2):
            assert (rank_dir(home, r) / "manifests" / "step-000008.json").is_file()
            assert not (rank_dir(home, r) / "result.json").exists()

    return built_once(tmp_path_factory, "killed-pair", build) / "killed"


@pytest.fixture
def killed(killed_pair, tmp_path):
    dst = tmp_path / "home"
    shutil.copytree(killed_pair, dst)
    return dst


def resume(home, seed, env=None):
    res = run_ranks(argv(home, seed, "--resume"), 2, env=env)
    return [(c, " ".join(o.split())) for c, o in res]


def test_resume_is_exact(killed, full_pair, tiny_seed):
    # rank 1 comes back on a replacement host: the hostname is recorded, not part of the identity
    host = rank_dir(killed, 1) / "checkpoints" / "step-000008" / "host.json"
    host.write_text(json.dumps({"hostname": "replacement-host", "pid": 1}))
    res = resume(killed, tiny_seed, env={"TRIAL_IO_BASELINE": "1"})
    assert all(c == 0 for c, _ in res), res
    for r in range(2):
        assert read_json(rank_dir(full_pair, r) / "result.json")["checkpoints"]["io"] is None  # not asked for
        got, want = read_json(rank_dir(killed, r) / "result.json"), read_json(rank_dir(full_pair, r) / "result.json")
        assert got["checkpoints"]["restored"]["step"] == 8
        assert got["digests"]["final_parameters"] == want["digests"]["final_parameters"]
        # the journal carries the updates before the restart: all 16, same losses
        assert [u["loss_sum_local"] for u in got["updates"]] == [u["loss_sum_local"] for u in want["updates"]]
        io = got["checkpoints"]["io"]
        assert io["plain_write_bytes"] > 0 and io["restore_seconds"] > 0
    from training.checkpoint.compare import compare_states
    from training.checkpoint.group import load_rank_state

    for r in range(2):
        a, _ = load_rank_state(rank_dir(killed, r), 16, r)
        b, _ = load_rank_state(rank_dir(full_pair, r), 16, r)
        cmp = compare_states(a, b)
        assert cmp["identical"] and cmp["max_abs_diff"] == 0.0, cmp
        assert cmp["optimizer"]["tensors"] > 0 and cmp["rng"]["tensors"] == 2


def test_compare_states_sees_a_single_changed_element(full_pair):
    from training.checkpoint.compare import compare_states
    from training.checkpoint.group import load_rank_state

    a, _ = load_rank_state(rank_dir(full_pair, 0), 16, 0)
    b, _ = load_rank_state(rank_dir(full_pair, 0), 16, 0)
    name = next(iter(b["model"]))
    b["model"][name].view(-1)[7] += 1e-3
    b["rng"]["python"] = (3, b["rng"]["python"][1][:-1] + (7,), None)
    cmp = compare_states(a, b)
    assert not cmp["identical"]
    assert cmp["model"]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    assert cmp["rng"]["mismatches"]


def test_corrupt_byte_stops_naming_rank_and_file(killed, tiny_seed):
    state = rank_dir(killed, 1) / "checkpoints" / "step-000008" / "state.bin"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    before = files(killed)
    # rank 1 refuses its own checkpoint (2), rank 0 stops because rank 1 failed (3)
    res = resume(killed, tiny_seed)
    assert [code for code, _ in res] == [3, 2], res
    assert "another rank failed" in res[0][1]
    out = resume(killed, tiny_seed)[1][1]  # again: rank 1 refuses the same damage the same way
    assert "rank 1" in out and "state.bin" in out and "no other step is substituted" in out
    assert files(killed) == before  # nothing deleted or rewritten


def test_a_torn_receipt_is_refused_by_name_and_not_restarted(killed, tiny_seed, tmp_path):
    """A checkpoint receipt cut short (a torn write, a full disk) is damaged evidence: the rank that
    meets it refuses naming the file (exit 2), and the supervisor does not restart the group into the
    same refusal. Before, json's error killed the rank with exit 1 and the group was restarted."""
    from orchestrate.launch.local import local_launch
    from orchestrate.launch.supervise import supervise

    receipt = rank_dir(killed, 1) / "checkpoints" / "step-000008" / "receipt.json"
    receipt.write_bytes(receipt.read_bytes()[:57])
    before = files(killed)
    said: list[str] = []
    hb = [rank_dir(killed, r) / "heartbeat.json" for r in range(2)]
    attempts = supervise(local_launch(argv(killed, tiny_seed, "--resume"), 2, heartbeats=hb),
                         log_root=tmp_path / "logs", max_restarts=1, echo=said.append)
    assert len(attempts) == 1 and attempts[0].refused == 1, said
    assert attempts[0].codes[1] == 2  # its peer exits 3, or is stopped first if rank 1 is quicker
    text = " ".join(attempts[0].logs[1].read_text().split())  # the refusing rank's own words
    assert f"{receipt}: damaged, not valid JSON" in text and "Traceback" not in text, text
    assert files(killed) == before  # nothing deleted or rewritten


def test_manifest_missing_on_one_host_stops(killed, tiny_seed):
    (rank_dir(killed, 0) / "manifests" / "step-000008.json").unlink()
    before = files(killed)
    res = resume(killed, tiny_seed)
    for code, out in res:
        assert code == 2 and "no checkpoint step has an identical manifest on every rank" in out, out
    assert files(killed) == before


def test_another_ranks_directory_is_refused(killed, tiny_seed):
    a, b, t = rank_dir(killed, 0), rank_dir(killed, 1), rank_dir(killed, 0).with_name("swap")
    a.rename(t)
    b.rename(a)
    t.rename(b)
    before = files(killed)
    res = resume(killed, tiny_seed)
    assert all(code == 2 for code, _ in res), res
    assert "rank 0" in res[0][1] and "holds rank 1's checkpoint" in res[0][1]
    assert files(killed) == before


def test_half_published_step_is_not_used_and_is_kept(killed, full_pair, tiny_seed):
    """A kill during publication leaves the next step's manifest on some ranks only (and maybe a
    hidden partial directory). Restart uses the common step, moves the rest to orphaned/."""
    src, dst = rank_dir(full_pair, 0), rank_dir(killed, 0)
    shutil.copytree(src / "checkpoints" / "step-000016", dst / "checkpoints" / "step-000016")
    shutil.copy2(src / "manifests" / "step-000016.json", dst / "manifests" / "step-000016.json")
    (rank_dir(killed, 1) / "checkpoints" / ".step-000016.partial").mkdir()
    (rank_dir(killed, 1) / "checkpoints" / ".step-000016.partial" / "state.bin").write_bytes(b"half")
    res = resume(killed, tiny_seed)
    assert all(c == 0 for c, _ in res), res
    assert read_json(dst / "result.json")["checkpoints"]["restored"]["step"] == 8
    orphaned = dst / "orphaned" / "attempt-1"
    assert (orphaned / "manifests" / "step-000016.json").is_file()
    assert (orphaned / "checkpoints" / "step-000016" / "state.bin").is_file()
    assert (rank_dir(killed, 1) / "orphaned" / "attempt-1" / "checkpoints" / ".step-000016.partial"
            / "state.bin").read_bytes() == b"half"
    full = read_json(rank_dir(full_pair, 0) / "result.json")["digests"]["final_parameters"]
    assert read_json(dst / "result.json")["digests"]["final_parameters"] == full


def test_resume_without_checkpoints_says_so(home_copy, tiny_seed):
    res = resume(home_copy, tiny_seed)
    assert all(c == 2 and "nothing to resume" in o for c, o in res), res


def supervised_with_fault(smoke_home, tmp_path, tiny_seed, fault: str):
    """A copy of the smoke home trained by the supervisor, the first attempt with TRIAL_FAULT_KILL."""
    from orchestrate.launch.local import local_launch
    from orchestrate.launch.supervise import supervise

    home = tmp_path / "home"
    shutil.copytree(smoke_home, home)
    hb = [rank_dir(home, r) / "heartbeat.json" for r in range(2)]
    return home, supervise(local_launch(argv(home, tiny_seed), 2, heartbeats=hb), log_root=home / "logs",
                           max_restarts=1, first_env={"TRIAL_FAULT_KILL": fault})


def test_supervisor_restarts_the_group_after_a_kill(smoke_home, tmp_path, tiny_seed, full_pair):
    home, attempts = supervised_with_fault(smoke_home, tmp_path, tiny_seed, "0:11")
    assert [a.ok for a in attempts] == [False, True]
    first = attempts[0]
    assert first.first_failure == 0 and first.reason == "exit" and first.codes[0] == -9
    killed_at = read_json(rank_dir(home, 0) / "fault.json")["at"]
    assert 0 <= first.survivors_stopped_at - killed_at < 15  # observed and stopped within a bound
    got = read_json(rank_dir(home, 1) / "result.json")
    assert got["checkpoints"]["restored"]["step"] == 8
    want = read_json(rank_dir(full_pair, 1) / "result.json")
    assert got["digests"]["final_parameters"] == want["digests"]["final_parameters"]
    assert (home / "logs" / "attempt-1" / "rank-0.log").is_file()
    assert (home / "logs" / "attempt-2" / "rank-0.log").is_file()


def test_a_rank_that_refuses_its_inputs_is_not_restarted(tmp_path, tiny_seed):
    """Ranks that refuse their own inputs (a home never prepared) exit 2; a restart would meet the same
    refusal after loading everything again, so the supervisor stops after one attempt and says why.
    A group that failed otherwise is restarted."""
    from orchestrate.launch.local import local_launch
    from orchestrate.launch.supervise import supervise

    said: list[str] = []
    attempts = supervise(local_launch(argv(tmp_path / "never-prepared", tiny_seed), 2), log_root=tmp_path / "logs",
                         max_restarts=1, echo=said.append)
    assert len(attempts) == 1 and attempts[0].reason == "exit" and attempts[0].refused is not None
    assert "no 'prepare' commitment" in attempts[0].failure_text()
    assert any(s.startswith(f"not restarted: rank {attempts[0].refused} refused") for s in said), said
    other = supervise(local_launch([sys.executable, "-c", "raise SystemExit(1)"], 2), log_root=tmp_path / "logs-1",
                      max_restarts=1)
    assert len(other) == 2 and all(a.refused is None and not a.ok for a in other)


def test_heartbeat_timeout_stops_a_hung_group(tmp_path):
    """A rank that stops making progress (here: sleeps) is treated as failed and stopped."""
    from orchestrate.launch.local import launch_group

    hb = [tmp_path / f"hb{r}" for r in range(2)]
    script = ("import os, sys, time, pathlib; r = int(os.environ['RANK']); "
              f"p = pathlib.Path({str(tmp_path)!r}) / f'hb{{r}}'; p.write_text('0'); "
              "time.sleep(0.5 if r else 60); p.write_text('1'); time.sleep(0 if r else 60)")
    res = launch_group([sys.executable, "-c", script], 2, log_dir=tmp_path / "logs", heartbeats=hb,
                       stale_s=2.0, grace_s=2.0)
    assert not res.ok and res.reason == "heartbeat" and res.first_failure == 0
    assert res.survivors_stopped_at - res.failure_observed_at < 5
    assert json.dumps(res.codes)  # every process has an exit status: none left running


def test_recovery_trial_command(tmp_path, tiny_seed):
    """`orchestrate recovery-trial` at smoke scale: 4 DiLoCo ranks, checkpoints at 8 and 16, rank 1
    killed after update 11, restart from 8; every rank's final state identical to the
    uninterrupted run's (model, Adam moments, RNG, outer parent and momentum). The seeds folder holds a
    copy of the session's tiny seed (verified, not built again: building it is test_seed.py's)."""
    from conftest import run_cli

    shutil.copytree(tiny_seed, tmp_path / "seeds" / "tiny")
    out = tmp_path / "trial"
    r = run_cli("-m", "orchestrate", "recovery-trial", "--profile", "smoke", "--from-step", "8",
                "--kill-after", "11", "--out", str(out), "--seeds", str(tmp_path / "seeds"))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = read_json(out / "recovery-comparison.json")
    c = rep["comparison"]
    assert c["identical"] and c["max_abs_diff"] == 0.0 and c["final_parameter_digests_equal"]
    assert rep["resumed_from"] == [8, 8, 8, 8]
    for rank in c["ranks"]:
        assert rank["outer"]["tensors"] > 0 and rank["optimizer"]["tensors"] > 0
    f = rep["failure"]
    assert f["observed_rank"] == 1 and f["reason"] == "exit"
    assert 0 <= f["kill_to_survivors_stopped_seconds"] < 15
    # the control (#57): the same checkpoint resumed without a kill equals the uninterrupted run too, and
    # neither run parts from it at any update
    assert rep["control"]["comparison"]["identical"] and rep["control"]["parting"]["update"] is None
    assert rep["parting"] == {"update": None, "rank": None, "a": None, "b": None} and rep["deterministic"] is False
    assert "control (resumed without a kill) vs the uninterrupted run: max |Δ| = 0.0; IDENTICAL" in r.stdout + r.stderr
    # the verdict a reader reads (#57): rendered beside the comparison, named on the console, and recomputed
    # from the comparison alone by `python -m evidence recovery-report`, which writes nothing new
    said = json.loads(r.stdout.splitlines()[-1])
    assert said["markdown"] == str(out / "recovery-report.md") and f"report: {out / 'recovery-report.md'}" in r.stdout + r.stderr
    md = (out / "recovery-report.md").read_text()
    assert "**Identical: every rank's final state equals the uninterrupted run's, tensor for tensor.**" in md
    assert "| kill | rank 1 after update 11: failure observed " in md and "| resumed from | step 8 (each rank: 8, 8, 8, 8) |" in md
    assert "- IDENTICAL: max |Δ| = 0.0 over " in md and "| deterministic | no — the profile does not set" in md
    again = run_cli("-m", "evidence", "recovery-report", "--out", str(out))
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1])["written"] == [], again.stderr


def test_kill_while_a_manifest_is_published(smoke_home, tmp_path, tiny_seed, full_pair):
    """Rank 1 dies after the step-16 receipts are exchanged, before its manifest is written: the
    restart resumes from 8 (the last step published everywhere), keeps the half-published step under
    orphaned/, and ends where the uninterrupted run did."""
    home, attempts = supervised_with_fault(smoke_home, tmp_path, tiny_seed, "1:16:publish")
    assert [a.ok for a in attempts] == [False, True]
    assert "while publishing step 16" in read_json(rank_dir(home, 1) / "fault.json")["what"]
    for r in range(2):
        got = read_json(rank_dir(home, r) / "result.json")
        assert got["checkpoints"]["restored"]["step"] == 8
        assert got["digests"]["final_parameters"] == \
            read_json(rank_dir(full_pair, r) / "result.json")["digests"]["final_parameters"]
    # rank 1 had written and receipted its step-16 state but no manifest: kept, not deleted
    kept = rank_dir(home, 1) / "orphaned" / "attempt-1" / "checkpoints" / "step-000016" / "state.bin"
    assert kept.is_file()


def test_compare_states_never_calls_nan_identical():
    from training.checkpoint.compare import compare_states

    a, b = {"model": {"w": torch.tensor([1.0, 2.0])}}, {"model": {"w": torch.tensor([float("nan"), 2.0])}}
    assert not compare_states(a, b)["identical"] and not compare_states(b, a)["identical"]
    assert compare_states(b, b)["identical"]  # the same NaN on both sides is the same state
    assert not compare_states({"model": {"w": torch.tensor([0.0])}},
                              {"model": {"w": torch.tensor([-0.0])}})["identical"]


class _Mark:
    """Counts its own unpicklings (in this process)."""

    loaded = 0

    def __init__(self):
        self.v = 1  # a state, so unpickling calls __setstate__

    def __setstate__(self, state):
        type(self).loaded += 1


def test_save_hashed_round_trips_the_state_and_its_digest_is_the_files(tmp_path):
    """The receipt takes the tree digest computed while writing: it must be the file's own. What loads back
    must be the state bit for bit: large tensors (written raw, from the device when there is one) in
    every dtype, a tied pair still tied, a non-contiguous view, the small tensors and objects kept in
    the pickled skeleton, a state_dict's metadata."""
    from collections import OrderedDict

    import numpy as np

    from evidence.canonical import TREE_PIECE, file_tree_sha256
    from training.checkpoint.state_file import CHUNK, MAGIC, load_state, save_hashed
    from training.errors import CheckpointError

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(3)
    big = torch.randn(CHUNK // 4 + 12345, generator=g).to(dev)  # spans two staging chunks
    tied = torch.randn(700, 600, generator=g).to(dev, torch.bfloat16)
    model = OrderedDict(embed=tied, head=tied, big=big, t=torch.randn(900, 400, generator=g).t().to(dev))
    model._metadata = OrderedDict({"": {"version": 1}})
    state = {"model": model, "step": 7, "scalar": torch.tensor(3.5),
             "adam": {0: {"exp_avg": torch.randn(300_000, generator=g, dtype=torch.float64)}},
             "ints": (torch.arange(400_000, dtype=torch.int64), [torch.ones(5, dtype=torch.bool)]),
             "numpy": np.random.RandomState(5).get_state(), "none": None}
    entry = save_hashed(state, tmp_path / "state.bin")
    assert entry["piece_bytes"] == TREE_PIECE and (tmp_path / "state.bin").stat().st_size > TREE_PIECE
    digest = entry["sha256_tree"]
    assert digest == file_tree_sha256(tmp_path / "state.bin") == file_tree_sha256(tmp_path / "state.bin", threads=1)
    got = load_state(tmp_path / "state.bin")
    assert got["step"] == 7 and got["none"] is None and got["model"]._metadata == model._metadata
    assert list(got["model"]) == list(model)
    for a, b in [(got["model"][k], model[k]) for k in model] + [
            (got["scalar"], state["scalar"]), (got["adam"][0]["exp_avg"], state["adam"][0]["exp_avg"]),
            (got["ints"][0], state["ints"][0]), (got["ints"][1][0], state["ints"][1][0])]:
        assert a.device.type == "cpu" and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(-1).view(torch.uint8) if a.is_floating_point() else a,
                           b.cpu().contiguous().view(-1).view(torch.uint8) if b.is_floating_point() else b.cpu())
    assert got["model"]["embed"] is got["model"]["head"]  # written once, tied again
    assert isinstance(got["ints"], tuple) and got["numpy"][0] == "MT19937"
    assert np.array_equal(got["numpy"][1], state["numpy"][1])
    # a flipped byte in either piece changes the digest (what the receipt re-checks)
    raw = (tmp_path / "state.bin").read_bytes()
    for at in (100, len(raw) - 100):
        flipped = bytearray(raw)
        flipped[at] ^= 1
        (tmp_path / "flipped.bin").write_bytes(flipped)
        assert file_tree_sha256(tmp_path / "flipped.bin") != digest
        # loading with the receipt's entry checks the digest during the one read, and refuses
        # before the skeleton is unpickled
        with pytest.raises(CheckpointError, match="differs from its receipt"):
            load_state(tmp_path / "flipped.bin", expect=entry)
    # the refusal comes before the skeleton is unpickled: a skeleton whose unpickling leaves a mark
    marked = {"mark": _Mark(), "big": torch.randn(CHUNK // 4, generator=g)}
    mentry = save_hashed(marked, tmp_path / "marked.bin")
    mraw = bytearray((tmp_path / "marked.bin").read_bytes())
    mraw[-5] ^= 1  # in the tensor's bytes, after the skeleton and table were read
    (tmp_path / "marked.bin").write_bytes(mraw)
    _Mark.loaded = 0
    with pytest.raises(CheckpointError, match="differs from its receipt"):
        load_state(tmp_path / "marked.bin", expect=mentry)
    assert _Mark.loaded == 0
    load_state(tmp_path / "marked.bin")  # the control: unchecked, the mark is unpickled
    assert _Mark.loaded == 1
    with pytest.raises(CheckpointError, match="not a tree digest"):
        load_state(tmp_path / "state.bin", expect={"sha256": digest})
    got_checked = load_state(tmp_path / "state.bin", expect=entry)
    assert torch.equal(got_checked["model"]["big"], got["model"]["big"]) and got_checked["step"] == 7
    # a table damaged so that it asks for more than the file holds: refused before any allocation
    import struct

    n_skel, n_tab = struct.unpack("<QQ", raw[len(MAGIC):len(MAGIC) + 16])
    at = len(MAGIC) + 16 + n_skel
    table = json.loads(raw[at:at + n_tab])
    table[0]["nbytes"] *= 10**6
    table[0]["shape"] = [table[0]["nbytes"] // getattr(torch, table[0]["dtype"]).itemsize]
    tab = json.dumps(table).encode()
    (tmp_path / "table.bin").write_bytes(raw[:len(MAGIC)] + struct.pack("<QQ", n_skel, len(tab))
                                         + raw[len(MAGIC) + 16:at] + tab + raw[at + n_tab:])
    with pytest.raises(CheckpointError, match="tensor table does not fit the file"):
        load_state(tmp_path / "table.bin", expect=entry)

    # many large tensors (a long table in the header): every one lands where the table says
    from training.checkpoint.state_file import INLINE_MAX

    many = {i: torch.full((INLINE_MAX + 7 * i,), i % 251, dtype=torch.uint8) for i in range(97)}
    save_hashed(many, tmp_path / "many.bin")
    assert all(torch.equal(v, many[k]) for k, v in load_state(tmp_path / "many.bin").items())

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_hashed({"bad": Unpicklable()}, tmp_path / "bad.bin")


def test_tree_digest_is_the_sha256_of_its_pieces_digests(tmp_path):
    """Recomputable by anyone: sha256 of each piece, then sha256 of those digests in order; the
    streaming form (bytes arriving in pieces that straddle leaves) gives the same digest."""
    import hashlib
    import os

    from evidence.canonical import TreeSha256, file_tree_sha256

    data = os.urandom(10_000)
    (tmp_path / "f").write_bytes(data)
    want = hashlib.sha256(b"".join(hashlib.sha256(data[i:i + 4096]).digest()
                                   for i in range(0, len(data), 4096))).hexdigest()
    assert file_tree_sha256(tmp_path / "f", piece=4096) == want
    tree = TreeSha256(piece=4096, threads=3)
    for a, b in ((0, 1), (1, 4095), (4095, 9000), (9000, 10_000)):
        tree.update(data[a:b])
    assert tree.hexdigest() == want
    tree.close()
    assert want != hashlib.sha256(data).hexdigest()


def test_a_deferred_file_keeps_its_size_and_entry_checks(tmp_path):
    """verify_receipt(defer=) skips only the deferred file's digest (its reader checks it): a
    changed size, or an entry whose piece_bytes is not a positive integer, still stops it."""
    from evidence.receipts import ReceiptError, make_receipt, receipt_digest, verify_receipt

    (tmp_path / "state.bin").write_bytes(b"x" * 1000)
    (tmp_path / "other.json").write_text("{}")
    receipt = make_receipt(tmp_path, meta={"kind": "t"}, hashed={"state.bin": {"sha256_tree": "0" * 64, "piece_bytes": 64}})
    verify_receipt(tmp_path, receipt, defer=["state.bin"])  # the (wrong) tree digest is not looked at
    with pytest.raises(ReceiptError, match="altered"):
        verify_receipt(tmp_path, receipt)
    (tmp_path / "state.bin").write_bytes(b"x" * 999)
    with pytest.raises(ReceiptError, match="999 bytes"):
        verify_receipt(tmp_path, receipt, defer=["state.bin"])
    (tmp_path / "state.bin").write_bytes(b"x" * 1000)
    receipt["files"]["state.bin"]["piece_bytes"] = 0
    receipt["digest"] = receipt_digest(receipt)
    with pytest.raises(ReceiptError, match="piece_bytes"):
        verify_receipt(tmp_path, receipt, defer=["state.bin"])


@pytest.mark.parametrize("codes, first, reason, refused", [
    ([2, -15], 0, "exit", 0),        # rank 0 refused; the supervisor stopped rank 1
    ([2, 3], 1, "exit", 0),          # rank 1, stopped by rank 0's failure, was seen first
    ([3, 2, -9], 0, "exit", 1),      # the same with a third rank stopped
    ([3, -9], 0, "exit", None),      # no refusal among the others: a restart may help
    ([3, 2, 1], 0, "exit", None),    # two possible causes: not only a refusal
    ([1, 2], 0, "exit", None),       # a crash came first
    ([75, -15], 0, "exit", None),    # a busy GPU may be released
    ([2, -15], 0, "heartbeat", None),
    ([-15, -15], None, "guard", None),
])
def test_what_counts_as_a_refusal(codes, first, reason, refused):
    from orchestrate.launch.supervise import GroupResult

    res = GroupResult(codes=codes, logs=[], seconds=0.0, first_failure=first, reason=reason)
    assert res.refused == refused

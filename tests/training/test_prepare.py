"""prepare: determinism, disjointness, counts and weights, the previous-home proof, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from evidence.canonical import canonical_sha256, read_json
from evidence.commitments import CommitmentLog
from training.config import resolve
from training.corpus import Corpus
from training.prepare import PrepareError, load_cases, prepare, require_prepared
from training.seed import SeedError


def _listing(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def test_prepared_is_deterministic(smoke_home, tiny_seed, tmp_path):
    again = prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h2", tiny_seed)
    a, b = read_json(smoke_home / "prepared.json"), again["prepared"]
    assert canonical_sha256(a) == canonical_sha256(b)
    for name in a["inputs"]:
        assert (smoke_home / "inputs" / name).read_bytes() == (tmp_path / "h2" / "inputs" / name).read_bytes()


def test_splits_disjoint_and_heldout_only_in_test(smoke_home):
    cases = load_cases(smoke_home)
    by = {}
    for c in cases.values():
        by.setdefault(c["split"], []).append(c)
    ids = {s: {c["task_id"] for c in v} for s, v in by.items()}
    prompts = {s: {c["prompt"] for c in v} for s, v in by.items()}
    for a in ids:
        for b in ids:
            if a < b:
                assert not ids[a] & ids[b] and not prompts[a] & prompts[b]
    assert not any(c["heldout_variant"] for c in by["train"] + by["dev"])
    held = [c for c in by["test"] if c["heldout_variant"]]
    assert len({c["variant"] for c in held}) >= 2 and len(held) == len(by["test"]) // 2
    fams = {c["family"] for c in by["test"]}
    assert fams == {"lookup", "filter", "invoice", "priority"}


def test_counts_weights_and_schedule(smoke_home):
    p = read_json(smoke_home / "prepared.json")
    cfg = resolve("cooperative-learning", "smoke")
    clean = Corpus.load(smoke_home / "inputs" / "train.safetensors")
    damaged = Corpus.load(smoke_home / "inputs" / "train-damaged.safetensors")
    n_tasks = cfg.profile.tasks
    assert len(clean) == n_tasks + cfg.profile.replay
    assert (clean.weights[:n_tasks] == 8).all() and (clean.weights[n_tasks:] == 1).all()
    assert p["counts"]["weighted_targets"] == int((clean.targets * clean.weights).sum())
    assert p["counts"]["task"]["weighted_targets"] == 8 * p["counts"]["task"]["target_tokens"]
    share = p["counts"]["task"]["target_tokens"] / p["counts"]["target_tokens"]
    assert abs(p["counts"]["task_share_of_targets"] - share) < 1e-6
    sched = read_json(smoke_home / "inputs" / "schedule.json")["updates"]
    assert len(sched) == cfg.profile.updates and all(len(u) == 8 for u in sched)
    flat = [i for u in sched for i in u]
    assert sorted(flat) == list(range(len(clean))) * cfg.epochs
    per_update = p["schedule"]["weighted_targets_per_update"]
    assert per_update == [int(clean.weighted_targets[u].sum()) for u in sched]
    assert sum(per_update) == p["counts"]["weighted_targets"] * cfg.epochs
    # the damaged corpus differs exactly at the recorded documents, and only in the response
    docs = [json.loads(l) for l in open(smoke_home / "inputs" / "documents.jsonl")]
    marked = [d["index"] for d in docs if d["damaged"]]
    assert len(marked) == p["corruption"]["count"] == round(0.25 * n_tasks)
    assert [docs[i]["source"] for i in marked] == p["corruption"]["task_ids"]
    for i in range(len(clean)):
        same = np.array_equal(clean.doc(i), damaged.doc(i))
        assert same is (i not in marked)
        k = clean.prompt_lens[i]
        assert np.array_equal(clean.doc(i)[:k], damaged.doc(i)[:k])


def test_targets_are_the_response_and_end_of_turn(smoke_home, tiny_seed):
    from training.seed import load_tokenizer

    tok = load_tokenizer(tiny_seed)
    clean = Corpus.load(smoke_home / "inputs" / "train.safetensors")
    cases = load_cases(smoke_home)
    row = cases["train-00000"]
    ids = clean.doc(0).tolist()
    k = int(clean.prompt_lens[0])
    assert tok.decode(ids[k:]) == row["target"] + "<|im_end|>"
    gen_prompt = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}],
                                         tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids[:k]) == gen_prompt


def test_rerun_is_noop_and_other_inputs_refused(home_copy, smoke_home, tiny_seed):
    before = (home_copy / "commitments.jsonl").read_bytes()
    res = prepare(resolve("cooperative-learning", "smoke"), home_copy, tiny_seed)
    assert res["status"] == "unchanged"
    assert (home_copy / "commitments.jsonl").read_bytes() == before
    with pytest.raises(PrepareError, match="already holds different prepared inputs"):
        prepare(resolve("local-training-windows", "smoke"), home_copy, tiny_seed,
                previous_home=str(smoke_home))
    assert (home_copy / "commitments.jsonl").read_bytes() == before


def test_previous_home_proof(smoke_home, tiny_seed, tmp_path):
    res = prepare(resolve("local-training-windows", "smoke"), tmp_path / "ltw", tiny_seed,
                  previous_home=str(smoke_home))
    proof = res["prepared"]["previous"]
    assert proof["experiment"] == "cooperative-learning"
    assert proof["overlapping_identities"] == 0 and proof["previous_task_identities"] == 144
    assert proof["prepared_sha256"] == CommitmentLog(smoke_home).latest("prepare")["sha256"]


def test_overlapping_previous_home_refused_and_nothing_written(smoke_home, tiny_seed, tmp_path):
    home = tmp_path / "again"
    with pytest.raises(PrepareError, match="overlaps this experiment"):
        prepare(resolve("cooperative-learning", "smoke"), home, tiny_seed,
                previous_home=str(smoke_home))
    assert _listing(home) == []


def test_uncommitted_or_tampered_previous_home_refused(home_copy, tiny_seed, tmp_path):
    with open(home_copy / "inputs" / "tasks.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(PrepareError, match="previous-home"):
        prepare(resolve("local-training-windows", "smoke"), tmp_path / "x", tiny_seed,
                previous_home=str(home_copy))
    assert _listing(tmp_path / "x") == []


def test_altered_seed_refused_naming_the_file(tiny_seed, tmp_path):
    import shutil

    seed = tmp_path / "seed"
    shutil.copytree(tiny_seed, seed)
    with open(seed / "tokenizer.json", "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(SeedError, match="tokenizer.json"):
        prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", seed)
    assert _listing(tmp_path / "h") == []
    (seed / "config.json").unlink()
    with pytest.raises(SeedError, match="config.json"):
        prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", seed)


def test_wrong_seed_kind_for_profile(tiny_seed, tmp_path):
    with pytest.raises(PrepareError, match="'smollm2-135m' seed"):
        prepare(resolve("cooperative-learning", "cpu"), tmp_path / "h", tiny_seed)


def test_user_replay_file(tiny_seed, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Say the number {i}."},
                          {"role": "assistant", "content": f"The number is {i}."}]} for i in range(60)]
    f = tmp_path / "replay.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", tiny_seed,
                  replay_file=str(f))
    p = res["prepared"]
    assert p["replay_source"]["kind"] == "user-jsonl" and p["replay_source"]["rows"] == 60
    used = [json.loads(l)["id"] for l in open(tmp_path / "h" / "inputs" / "replay.jsonl")]
    probes = [json.loads(l)["id"] for l in open(tmp_path / "h" / "inputs" / "probes.jsonl")]
    assert len(used) == 32 and len(probes) == 8 and not set(used) & set(probes)


@pytest.mark.parametrize("content,match", [
    ("not json\n", "line 1"),
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', "line 1"),
    (b"\xff\xfe\x00garbage", "unreadable"),
])
def test_bad_replay_file(tiny_seed, tmp_path, content, match):
    from training.replay import ReplayFileError

    f = tmp_path / "replay.jsonl"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ReplayFileError, match=match):
        prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", tiny_seed,
                replay_file=str(f))
    assert _listing(tmp_path / "h") == []


def test_too_few_replay_rows(tiny_seed, tmp_path):
    f = tmp_path / "replay.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "a"},
                                          {"role": "assistant", "content": "b"}]}) + "\n")
    with pytest.raises(PrepareError, match="1 usable conversations"):
        prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", tiny_seed,
                replay_file=str(f))


def test_later_stages_refuse_without_commitment_or_with_changed_inputs(home_copy):
    require_prepared(home_copy)
    sched = home_copy / "inputs" / "schedule.json"
    sched.write_text(sched.read_text().replace("[", "[ ", 1))
    with pytest.raises(PrepareError, match="schedule.json"):
        require_prepared(home_copy)
    (home_copy / "commitments.jsonl").unlink()
    with pytest.raises(PrepareError, match="no 'prepare' commitment"):
        require_prepared(home_copy)


def test_interrupted_prepare_leaves_home_untouched(tiny_seed, tmp_path, monkeypatch):
    import training.prepare as tp

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tp.corpus_mod, "schedule", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare(resolve("cooperative-learning", "smoke"), tmp_path / "h", tiny_seed)
    assert _listing(tmp_path / "h") == []


def test_heldout_variants_cover_every_family(smoke_home):
    test = [c for c in load_cases(smoke_home).values() if c["split"] == "test"]
    for fam in ("lookup", "filter", "invoice", "priority"):
        mine = [c for c in test if c["family"] == fam]
        held = [c for c in mine if c["heldout_variant"]]
        assert held and len(held) < len(mine), fam


def test_declared_previous_is_required_and_must_match(smoke_home, tiny_seed, tmp_path):
    with pytest.raises(PrepareError, match="must not repeat any task of cooperative-learning"):
        prepare(resolve("local-training-windows", "smoke"), tmp_path / "a", tiny_seed)
    with pytest.raises(PrepareError, match="holds cooperative-learning.*local-training-windows"):
        prepare(resolve("batched-learning", "smoke"), tmp_path / "b", tiny_seed,
                previous_home=str(smoke_home))
    assert not (tmp_path / "a").exists() and _listing(tmp_path / "b") == []


def test_inconsistent_home_refused_before_any_change(home_copy, tiny_seed):
    from evidence.canonical import file_sha256

    (home_copy / "prepared.json").unlink()
    before = {p: file_sha256(home_copy / p) for p in _listing(home_copy) if (home_copy / p).is_file()}
    with pytest.raises(PrepareError, match="commitment but no prepared.json"):
        prepare(resolve("cooperative-learning", "smoke"), home_copy, tiny_seed)
    after = {p: file_sha256(home_copy / p) for p in _listing(home_copy) if (home_copy / p).is_file()}
    assert before == after


def test_a_replay_file_reaches_the_trained_experiment_and_is_never_dropped(tiny_seed, tmp_path):
    """`orchestrate run --replay FILE` prepares the chain with the user's replay for the experiment it
    trains (the earlier ones keep theirs: they are prepared for their tasks only); a later run without
    the file is refused, saying so, rather than preparing other inputs (#33)."""
    from training.config import lineage
    from training.prepare import prepare_chain

    rows = [{"messages": [{"role": "user", "content": f"Say the number {i}."},
                          {"role": "assistant", "content": f"The number is {i}."}]} for i in range(60)]
    f = tmp_path / "replay.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    chain = lineage("local-training-windows", "smoke")
    home_of = lambda c: tmp_path / c.experiment.name  # noqa: E731
    got = {c.experiment.name: res["prepared"]["replay_source"]["kind"]
           for c, _, res in prepare_chain(chain, home_of, tiny_seed, replay_file=str(f))}
    assert got == {"cooperative-learning": "generated", "local-training-windows": "user-jsonl"}
    with pytest.raises(PrepareError, match=r"its replay was the file replay.jsonl \(sha256 .*\), this run's is "
                                           r"generated \(every run of a home must give the same `--replay`, or none\)"):
        list(prepare_chain(chain, home_of, tiny_seed))

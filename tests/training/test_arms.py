"""The arms against independent references, with real multi-process gloo (2 and 4 ranks).

DDP and PowerSGD's dense phase must reproduce the single-process objective (parameters, Adam
moments, loss and grad norm) when ranks hold unequal target counts; DiLoCo must reproduce four
independent local trainers joined by the outer formula computed here, not by the code under test.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from conftest import built_once, run_worker
from dist_cases import case
from dist_worker import CUDA, device, to_cpu, train_state
from training.comm import chunk_plan
from training.diloco import apply_update
from training.objective import weighted_targets
from training.results import global_losses
from training.trainer import Trainer, TrainSpec

LR = 1e-3  # large enough that parameters move well past rounding in a few updates
# 5 % of one update's size. Adam divides by √v, so an element whose gradient nearly cancels turns a
# reordering's rounding into a visible step difference, and how large depends on the kernels the
# machine picks for the ranks' microbatches against the reference's: the worst element of 3.1M
# differed by 5.3e-6 on one CPU, by 1.6e-5 on an AVX-512/AMX Xeon (the same figure for the code
# before and after a change), and by 2.3e-5 on CUDA (2 × H200, NCCL, fp32). A changed objective
# moves elements by ≥ 1e-3, 20 × the tolerance (test_tolerance_detects_a_changed_objective keeps
# that margin honest).
ATOL = 5e-5
CHANGED = 1e-3  # the least a changed objective moves some element (checked below)

JOBS_2 = [
    {"name": "ddp-unequal", "type": "train", "case": "unequal", "kind": "ddp", "microbatch": 3},
    {"name": "ddp-concentrated", "type": "train", "case": "concentrated", "kind": "ddp", "microbatch": 3},
    {"name": "ddp-reversed", "type": "train", "case": "reversed", "kind": "ddp", "microbatch": 3},
    {"name": "psgd-dense", "type": "train", "case": "unequal", "kind": "powersgd", "microbatch": 3,
     "powersgd_rank": 4, "dense_warmup": 4},
    # PowerSGD through torch's hook and through ours with the batched Cholesky QR (training/powersgd.py)
    *[{"name": f"psgd-compressed-{o}", "type": "train", "case": "unequal", "kind": "powersgd",
       "microbatch": 3, "powersgd_rank": 2, "dense_warmup": 2, "powersgd_orthogonalization": o}
      for o in ("torch", "cholesky-qr2")],
    # packed rows, two per forward (the remainder alone), under DDP's no_sync accumulation
    {"name": "ddp-rows", "type": "train", "case": "unequal", "kind": "ddp", "pack": True, "pack_tokens": 48,
     "pack_rows": 2},
    {"name": "barrier", "type": "barrier"},
    *[{"name": f"psgd-resume-{o}", "type": "resume", "case": "unequal", "kind": "powersgd",
       "microbatch": 3, "powersgd_rank": 2, "dense_warmup": 2, "at": 3, "powersgd_orthogonalization": o}
      for o in ("torch", "cholesky-qr2")],
    {"name": "agree-same", "type": "agree", "what": "prepared-input", "digests": ["ab" * 32] * 2},
    {"name": "agree-differ", "type": "agree", "what": "numerical-profile",
     "digests": ["ab" * 32, "cd" * 32]},
]
JOBS_4 = [
    {"name": "ddp-4", "type": "train", "case": "unequal-4", "kind": "ddp", "microbatch": 1},
    {"name": "diloco", "type": "train", "case": "unequal-4", "kind": "diloco", "microbatch": 1,
     "sync_every": 2, "outer_lr": 0.7, "outer_momentum": 0.9},
    {"name": "outer", "type": "outer", "sizes": [5, 40, 3], "chunk_bytes": 32, "lr": 0.7,
     "momentum": 0.9, "deltas": [0.01, -0.02]},
    *[{"name": f"mean-{cb}", "type": "chunked-mean", "sizes": [1, 7, 33, 1000, 5], "chunk_bytes": cb}
      for cb in (4, 64, 1 << 20)],
]


# Each job runs once per test run (`built_once`), not once per xdist worker that reaches it; read-only.
@pytest.fixture(scope="session")
def two(tmp_path_factory, tiny_seed):
    return built_once(tmp_path_factory, "arms-2", lambda d: run_worker(d, tiny_seed, 2, JOBS_2)) / "worker-2"


@pytest.fixture(scope="session")
def four(tmp_path_factory, tiny_seed):
    return built_once(tmp_path_factory, "arms-4", lambda d: run_worker(d, tiny_seed, 4, JOBS_4)) / "worker-4"


def load(out, name, world):
    return [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in range(world)]


def single(tiny_seed, name, *, microbatch=None, plan=None, corpus=None, weights=None, warm_up=False, **spec):
    """The single-process reference; `spec` adds TrainSpec options (compile, pack); `warm_up` runs
    the trainer's compile warm-up pass first."""
    from transformers import AutoModelForCausalLM

    c, p = case(name)
    corpus, plan = corpus or c, plan or p
    if weights is not None:
        corpus.weights[:] = weights
    with cpu_inductor() if spec.get("compile") else nullcontext():
        model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32).to(device())
        tr = Trainer(model, corpus, TrainSpec(kind="single", plan=plan, lr=LR, microbatch=microbatch, **spec),
                     device(), pad_id=2)
        if warm_up:
            rng = torch.get_rng_state()
            tr.compile_warm_up()
            assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in tr.params)
        return to_cpu(train_state(tr, [tr.step() for _ in plan]))


def cpu_inductor():
    """On CPU, Inductor's C++ kernels written as scalar loops (`cpp.simdlen = 1`) rather than with its
    vector classes. Compiling is still all of it — Dynamo's graphs, AOTAutograd's backward, Inductor's
    lowering and fusion, g++, loading — and the padding, packing and parameter names under test are ours
    either way; what the suite stops compiling is Inductor's own vectorized CPU code, which no shipped
    profile uses (compile = true only in the CUDA profiles, where Triton writes the kernels). The seven compile tests took 113.7 and
    121.5 core-seconds with vector kernels, 86.2 and 85.5 without (cold cache, alternating; bench/results/
    2026-12-05-cpu-cuts-2cpu/). On CUDA nothing changes."""
    if CUDA:
        return nullcontext()
    import torch._inductor.config as inductor

    return inductor.patch({"cpp.simdlen": 1})


def max_diff(a: dict, b: dict) -> float:
    d = max(float((a["params"][k] - b["params"][k]).abs().max()) for k in a["params"])
    for k in a["adam"]:
        for m in ("exp_avg", "exp_avg_sq"):
            d = max(d, float((a["adam"][k][m] - b["adam"][k][m]).abs().max()))
    return d


def assert_matches_single(ranks: list[dict], ref: dict) -> None:
    assert len({r["digest"] for r in ranks}) == 1, "replicas of one group must agree exactly"
    assert max_diff(ranks[0], ref) < ATOL
    for k, st in ranks[0]["adam"].items():
        assert st["step"] == ref["adam"][k]["step"]
    losses = global_losses([r["records"] for r in ranks])
    for got, rec in zip(losses, ref["records"]):
        assert got == pytest.approx(rec["loss"], rel=1e-6)
    for rec, want in zip(ranks[0]["records"], ref["records"]):
        assert rec["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("name", ["ddp-unequal", "ddp-concentrated", "ddp-reversed"])
def test_ddp_two_ranks_equals_single(two, tiny_seed, name):
    ranks = load(two, name, 2)
    cname = name.split("-", 1)[1]
    corpus, plan = case(cname)
    # the case really has unequal target counts between the ranks of every update
    for r0, r1 in (([d for d in p[:4]], [d for d in p[4:]]) for p in plan):
        assert weighted_targets(corpus, r0) != weighted_targets(corpus, r1)
    # and each rank's local batch of 4 ends in a partial microbatch of 1 (microbatch 3)
    assert all(rec["microbatches"] == [3, 1] for rec in ranks[0]["records"])
    ref = single(tiny_seed, cname, microbatch=8)
    assert_matches_single(ranks, ref)


def test_reversed_assignment_gives_the_same_model(two):
    a, b = load(two, "ddp-concentrated", 2), load(two, "ddp-reversed", 2)
    for u in range(4):  # the heavy documents moved from rank 0 to rank 1
        assert set(a[0]["records"][u]["local_docs"]) == set(b[1]["records"][u]["local_docs"])
        assert set(a[0]["records"][u]["local_docs"]) != set(b[0]["records"][u]["local_docs"])
    assert max_diff(a[0], b[0]) < ATOL


def test_tolerance_detects_a_changed_objective(two, tiny_seed):
    """Guard against a vacuous tolerance: equal token weights (1 everywhere) must fail ATOL."""
    ref = single(tiny_seed, "concentrated", microbatch=8)
    flat = single(tiny_seed, "concentrated", microbatch=8, weights=1)
    assert max_diff(ref, flat) > CHANGED >= 20 * ATOL
    # and a per-rank (local) normalization, which is DiLoCo's inner objective, is not DDP's
    _, plan = case("concentrated")
    local_only = single(tiny_seed, "concentrated", plan=[p[:4] for p in plan])
    assert max_diff(ref, local_only) > CHANGED


def test_ddp_four_ranks_equals_single(four, tiny_seed):
    ranks = load(four, "ddp-4", 4)
    assert all(rec["microbatches"] == [1, 1] for rec in ranks[0]["records"])
    assert_matches_single(ranks, single(tiny_seed, "unequal-4", microbatch=3))


def test_padding_and_prompt_masks_do_not_leak(tiny_seed):
    """The same update with every document alone (no padding) or all padded together."""
    a = single(tiny_seed, "unequal", microbatch=1)
    b = single(tiny_seed, "unequal", microbatch=8)
    assert max_diff(a, b) < ATOL


def test_powersgd_dense_warmup_is_ddp_bit_for_bit(two):
    dense, ddp = load(two, "psgd-dense", 2), load(two, "ddp-unequal", 2)
    assert not any(r["powersgd_compressed"] for r in dense[0]["records"])
    assert dense[0]["digest"] == ddp[0]["digest"] == dense[1]["digest"]


@pytest.mark.parametrize("ortho", ["torch", "cholesky-qr2"])
def test_powersgd_compresses_after_warmup_and_replicas_agree(two, ortho):
    ranks = load(two, f"psgd-compressed-{ortho}", 2)
    recs = ranks[0]["records"]
    assert [r["powersgd_compressed"] for r in recs] == [False, False, True, True]
    dense_bytes = recs[0]["comm"]["gradient"]["payload_bytes"]
    numel = sum(p.numel() for k, p in ranks[0]["params"].items())
    assert dense_bytes == numel * 4
    for r in recs[2:]:
        assert 0 < r["comm"]["gradient"]["payload_bytes"] < dense_bytes
    assert ranks[0]["digest"] == ranks[1]["digest"]
    # over gloo, PowerSGD runs on one DDP bucket (see trainer.bucket_cap_mb for why)
    assert recs[-1]["ddp_bucket_bytes"] == [dense_bytes]


def test_powersgd_orthogonalizations_compress_alike(two):
    """The Cholesky QR gives another orthonormal basis of the same span, and the compressed gradient
    P·Pᵀ·M does not depend on the basis: the same bytes sent, the same gradient norms and losses to
    rounding. Rounding here is FP32 over the 2,048-row embedding: its compressed gradient differs by
    ~1e-4 (relative) between any two orthogonalizations, torch's own Gram-Schmidt and Householder
    QR included. (Parameters are not compared: Adam turns rounding in a near-zero gradient element
    into a step of up to lr; tests/training/test_powersgd.py compares the gradients themselves.)"""
    a, b = load(two, "psgd-compressed-torch", 2)[0], load(two, "psgd-compressed-cholesky-qr2", 2)[0]
    assert [r["comm"]["gradient"]["payload_bytes"] for r in a["records"]] == \
        [r["comm"]["gradient"]["payload_bytes"] for r in b["records"]]
    for x, y in zip(a["records"], b["records"]):
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3)
        assert x["loss_sum_local"] == pytest.approx(y["loss_sum_local"], rel=1e-5)


def test_a_failed_rank_keeps_its_own_error_and_stops_its_peers(two):
    healthy, failed = load(two, "barrier", 2)
    assert healthy["error"] == "PeerFailed" and "another rank failed at a test step" in healthy["message"]
    assert failed == {"returned": True}  # the failing rank goes on to raise its own error


@pytest.mark.parametrize("ortho", ["torch", "cholesky-qr2"])
def test_powersgd_resume_in_the_compressed_phase_is_exact(two, ortho):
    """Fresh model, fresh DDP, state restored after 3 updates (error feedback included): the same
    final parameters as the uninterrupted run, on both ranks. Without the bucket warm-up pass the
    error feedback would meet a different bucket layout."""
    ranks = load(two, f"psgd-resume-{ortho}", 2)
    for r in ranks:
        assert r["resumed"] == r["uninterrupted"]
    assert ranks[0]["uninterrupted"] == ranks[1]["uninterrupted"]
    # the control: skipping the warm-up pass breaks exactness (NOTES' PowerSGD resume pitfall)
    assert all(r["resumed_without_warmup"] != r["uninterrupted"] for r in ranks)


def test_digest_agreement(two):
    same = load(two, "agree-same", 2)
    assert all("error" not in r for r in same)
    for r in load(two, "agree-differ", 2):
        assert r["error"] == "DigestMismatch"
        assert "ab" * 32 in r["message"] and "cd" * 32 in r["message"]
        assert "rank 0" in r["message"] and "rank 1" in r["message"]


def test_diloco_equals_four_local_trainers_and_the_outer_formula(four, tiny_seed):
    """Reference: four single-process trainers on the local documents (local normalization), and
    the outer step written out here from the formula, applied every H = 2 updates."""
    from transformers import AutoModelForCausalLM

    ranks = load(four, "diloco", 4)
    assert len({r["digest"] for r in ranks}) == 1
    corpus, plan = case("unequal-4")
    workers = []
    for r in range(4):
        m = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32)
        workers.append(Trainer(m, corpus, TrainSpec(kind="single", plan=[p[2 * r:2 * r + 2] for p in plan],
                                                    lr=LR, microbatch=1), torch.device("cpu"), pad_id=2))
    names = [n for n, _ in workers[0].model.named_parameters()]
    x = {n: p.detach().clone() for n, p in workers[0].model.named_parameters()}
    v = {n: torch.zeros_like(t) for n, t in x.items()}
    eta, mu = 0.7, 0.9
    for u in range(4):
        for w in workers:
            w.step()
        if (u + 1) % 2 == 0:
            ys = [dict(w.model.named_parameters()) for w in workers]
            for n in names:
                d = sum(x[n] - y[n].detach() for y in ys) / 4
                v[n] = mu * v[n] + d
                x[n] = x[n] - eta * (d + mu * v[n])
            for w in workers:
                with torch.no_grad():
                    for n, p in w.model.named_parameters():
                        p.copy_(x[n])
    for n in names:
        torch.testing.assert_close(ranks[0]["params"][n], x[n], atol=ATOL, rtol=0)
    # each worker kept its own Adam moments: compare rank 2's with reference worker 2's
    st = workers[2].optimizer.state
    for n, p in workers[2].model.named_parameters():
        torch.testing.assert_close(ranks[2]["adam"][n]["exp_avg"], st[p]["exp_avg"], atol=ATOL, rtol=0)
    assert not torch.equal(ranks[0]["adam"][names[0]]["exp_avg"], ranks[2]["adam"][names[0]]["exp_avg"])
    # logical payload: one full FP32 delta per H updates, exactly 1/H of DDP's per-update gradient
    ddp = load(four, "ddp-4", 4)[0]["ledger"]["gradient"]["payload_bytes"]
    outer = ranks[0]["ledger"]["outer-delta"]["payload_bytes"]
    assert outer * 2 == ddp
    assert sum(1 for r in ranks[0]["records"] if r["outer_step"]) == 2


def test_outer_step_formula_and_sign(four):
    ranks = load(four, "outer", 4)
    start = ranks[0]["start"]
    eta, mu = 0.7, 0.9
    x = [t.clone() for t in start]
    v = [torch.zeros_like(t) for t in start]
    for k, delta in enumerate([0.01, -0.02]):
        d = 2.5 * delta  # mean over r of (r + 1)·δ, r = 0…3
        before = [t.clone() for t in x]
        for i in range(len(x)):
            v[i] = mu * v[i] + d
            x[i] = x[i] - eta * (d + mu * v[i])
        for r in ranks:
            for i in range(len(x)):
                torch.testing.assert_close(r["rounds"][k]["params"][i], x[i], atol=1e-6, rtol=0)
                torch.testing.assert_close(r["rounds"][k]["v"][i], v[i], atol=1e-7, rtol=0)
        if k == 0:
            # workers descended (y < x): the parent must move the same way, and further than the
            # workers' mean endpoint x − 2.5δ because of the Nesterov look-ahead η(1 + μ) = 1.33
            for b, a in zip(before, x):
                assert torch.all(a < b)
                assert torch.all(a < b - d)
    # first step by hand for one element: v = d, x = x0 − η(d + μd)
    x0 = float(start[0][0])
    assert float(ranks[0]["rounds"][0]["params"][0][0]) == pytest.approx(x0 - 0.7 * 0.025 * 1.9, abs=1e-6)


def test_apply_update_in_place():
    x, v, d = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.5])
    apply_update(x, v, d, 0.7, 0.9)
    assert float(v) == pytest.approx(0.5) and float(x) == pytest.approx(1 - 0.7 * (0.5 + 0.45))


@pytest.mark.parametrize("cb", [4, 64, 1 << 20])
def test_chunked_mean_covers_every_element(four, cb):
    from dist_worker import values

    sizes = [1, 7, 33, 1000, 5]
    want = [sum(values(r, sizes)[i] for r in range(4)) / 4 for i in range(len(sizes))]
    for r in load(four, f"mean-{cb}", 4):
        for got, exp in zip(r["mean"], want):
            assert not torch.isnan(got).any()
            torch.testing.assert_close(got, exp, atol=1e-6, rtol=0)
        assert r["sent"] == sum(sizes) * 4
        covered = sorted((i, s, e) for i, s, e in r["pieces"])
        assert covered == sorted((p.index, p.start, p.end) for c in chunk_plan(sizes, max(1, cb // 4))
                                 for p in c)


def test_chunk_plan_bounds():
    plan = chunk_plan([10, 3, 20], 8)
    assert all(sum(p.end - p.start for p in c) <= 8 for c in plan)
    assert [sum(p.end - p.start for p in c) for c in plan] == [8, 8, 8, 8, 1]
    elems = [(p.index, k) for c in plan for p in c for k in range(p.start, p.end)]
    assert elems == [(i, k) for i, n in enumerate([10, 3, 20]) for k in range(n)]
    assert all(p.offset + p.end - p.start <= 8 for c in plan for p in c)
    with pytest.raises(ValueError):
        chunk_plan([1], 0)


def test_compiled_step_matches_eager(tiny_seed):
    """`compile = true` (torch.compile of the decoder, widths padded to 256) trains the same model:
    within the tolerance of a reordering, and under the same parameter names (checkpoints, digests)."""
    eager = single(tiny_seed, "unequal", microbatch=3)
    compiled = single(tiny_seed, "unequal", microbatch=3, compile=True)
    assert list(compiled["params"]) == list(eager["params"])
    assert max_diff(compiled, eager) < ATOL
    for a, b in zip(compiled["records"], eager["records"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_compile_warm_up_changes_nothing(tiny_seed, compiled):
    """The warm-up pass before the timed loop (train.py runs it under compile) leaves no gradient,
    moves no generator and applies nothing: the run that follows is the same, bit for bit."""
    plain = single(tiny_seed, "unequal", microbatch=3, compile=compiled)
    warmed = single(tiny_seed, "unequal", microbatch=3, warm_up=True, compile=compiled)
    assert max_diff(plain, warmed) == 0.0
    assert [r["loss_sum_local"] for r in plain["records"]] == [r["loss_sum_local"] for r in warmed["records"]]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_packed_step_matches_padded(tiny_seed, compiled):
    """`pack = true` (each microbatch's documents in one row; FlexAttention on CUDA, SDPA's document
    mask on CPU) trains the same model as padded microbatches, within the reordering tolerance."""
    if CUDA and not compiled:  # refused by name rather than failing deep in Inductor
        with pytest.raises(ValueError, match="needs compile"):
            single(tiny_seed, "unequal", microbatch=3, pack=True)
        return
    eager = single(tiny_seed, "unequal", microbatch=3)
    packed = single(tiny_seed, "unequal", microbatch=3, pack=True, compile=compiled)
    assert list(packed["params"]) == list(eager["params"])
    assert max_diff(packed, eager) < ATOL
    for a, b in zip(packed["records"], eager["records"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_ddp_with_packed_rows_per_forward_equals_single(two, tiny_seed):
    """DDP whose ranks run two packed rows per forward (and a remainder row alone) reproduces the
    single-process objective, as with padded microbatches."""
    if CUDA:
        pytest.skip("packed rows on CUDA need compile (check_pack); the 2-rank jobs run eager")
    ranks = load(two, "ddp-rows", 2)
    assert any(len(rec["microbatches"]) > 1 for rec in ranks[0]["records"])
    assert_matches_single(ranks, single(tiny_seed, "unequal", microbatch=8))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_packed_rows_per_forward_train_as_one_row_per_forward(tiny_seed, compiled):
    """`pack_rows` (several fixed-width packed rows in one forward, the remainder one by one) trains
    the same model as one row per forward, within the reordering tolerance; under compile its warm-up
    compiles both shapes and still changes nothing (`single(warm_up=True)` checks)."""
    if CUDA and not compiled:
        pytest.skip("packed rows on CUDA need compile (check_pack)")
    one = single(tiny_seed, "unequal", pack=True, pack_tokens=64, compile=compiled)
    rows = single(tiny_seed, "unequal", pack=True, pack_tokens=64, pack_rows=3, compile=compiled,
                  warm_up=compiled)
    counts = [(len(a["microbatches"]), len(b["microbatches"])) for a, b in zip(one["records"], rows["records"])]
    assert all(n_rows == r // 3 + r % 3 for r, n_rows in counts), counts  # groups of 3, then singles
    assert any(r >= 3 for r, _ in counts) and any(r % 3 for r, _ in counts), counts
    assert max_diff(rows, one) < ATOL
    for a, b in zip(rows["records"], one["records"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)


def test_outer_step_on_this_device_matches_the_formula():
    """One process, one rank: the outer step where the trainer runs it (on CUDA: pinned x and v,
    the update on the GPU, copies back asynchronously) gives the formula's x and v, two rounds in a
    row (the second reads the x and v the first copied back), across chunk boundaries."""
    import torch.distributed as dist

    from training.diloco import OuterNesterov

    dev = device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", store=dist.HashStore(),
                            rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(3)
        start = [torch.randn(n, generator=g) for n in (5, 40, 3)]
        params = [torch.nn.Parameter(t.to(dev)) for t in start]
        outer = OuterNesterov(params, 0.7, 0.9, chunk_bytes=64)  # 16 elements per collective
        x = [t.clone() for t in start]
        v = [torch.zeros_like(t) for t in start]
        for step in range(2):
            steps = [torch.randn(t.shape, generator=g) * 0.01 for t in start]
            with torch.no_grad():
                for p, s in zip(params, steps):
                    p.sub_(s.to(dev))  # the worker's local progress y = x − s
            assert outer.step() == sum(t.numel() for t in start) * 4
            # x and v first, read on the CPU straight after step() returns, before anything waits
            # for the GPU: step() itself must have waited for the copies back
            got_x, got_v = [t.clone() for t in outer.x], [t.clone() for t in outer.v]
            for i, s in enumerate(steps):
                v[i] = 0.9 * v[i] + s  # d = x − y = s (one rank)
                x[i] = x[i] - 0.7 * (s + 0.9 * v[i])
                torch.testing.assert_close(got_x[i], x[i], atol=1e-6, rtol=0)
                torch.testing.assert_close(got_v[i], v[i], atol=1e-6, rtol=0)
                torch.testing.assert_close(params[i].detach().cpu(), x[i], atol=1e-6, rtol=0)
    finally:
        dist.destroy_process_group()

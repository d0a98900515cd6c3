"""The replica's engine (training/engine.py): a request's tokens and logits, bit for bit, are the same
alone and beside neighbours joining and leaving mid-decode, in whichever slot it lands, at every batch
shape the engine is built with; its greedy tokens are transformers' `generate()`'s, for every architecture
it serves; it refuses what it cannot run before serving anything.

Run by tests/training/test_engine.py in a process of its own with ATen's default CPU kernels (the engine
refuses others on a CPU); on the GPU, `TRIAL_TEST_DEVICE=cuda` runs this file directly."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tiny_architectures import CONFIGS, build, drive, table_row
from training.architecture import SERVED, unservable
from training.engine import Engine, EngineError

CPU = torch.device("cpu")


@pytest.fixture
def tiny(tiny_seed):
    """Loaded per test: an engine takes its model over (its attention becomes the engine's)."""
    return AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32).eval()


@pytest.fixture
def wider():
    """A random Llama wider than the tiny seed (matmuls of several blocks per row and column, grouped
    heads 8/2) — where a kernel picked per shape would show."""
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=3,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def prompts(model, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    v = model.config.vocab_size
    return [[rng.randrange(3, v) for _ in range(rng.randrange(5, 70))] for _ in range(n)]


run = drive  # step the engine by hand: schedule = (step at which it arrives, prompt, new tokens)


@pytest.mark.parametrize("slots,bucket", [(1, 1), (2, 1), (3, 16), (8, 1), (8, 16)])
@pytest.mark.parametrize("which", ["tiny", "wider"])
def test_a_request_is_computed_as_if_alone_whatever_joins_and_leaves(slots, bucket, which, request):
    model = request.getfixturevalue(which)
    engine = Engine(model, slots=slots, max_len=96, eos=set(), device=CPU, bucket=bucket)
    ps = prompts(model, 10, seed=slots)
    alone = {i: run(engine, [(0, p, 12)])[0] for i, p in enumerate(ps)}
    for trial in range(3):  # arrivals at random steps, budgets that end them at different steps
        rng = random.Random(100 * slots + trial)
        schedule = [(rng.randrange(0, 20), p, rng.randrange(1, 13)) for p in ps]
        together = run(engine, schedule)
        slots_seen = {a.slot for a in together.values()}
        for i, got in together.items():
            ref = alone[i]
            n = len(got.tokens)
            assert got.tokens == ref.tokens[:n], (which, slots, trial, i)
            for k in range(n):  # the prefill's logits (k = 0) and every decode step's, bit for bit
                assert torch.equal(got.logits[k], ref.logits[k]), (which, slots, trial, i, k)
        if slots > 1:
            assert len(slots_seen) > 1  # requests did land in other slots than the one they had alone


@pytest.mark.parametrize("bucket", [1, 16])
def test_its_greedy_tokens_are_generates(tiny, bucket):
    """Prefilled at its own length (CPU's default) or padded to a bucket (CUDA's, for its graphs)."""
    refs = []
    for p in prompts(tiny, 4, seed=7):  # before the engine takes the model over
        with torch.no_grad():
            refs.append(tiny.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, pad_token_id=2,
                                      eos_token_id=[2], output_logits=True, return_dict_in_generate=True))
    engine = Engine(tiny, slots=4, max_len=128, eos={2}, device=CPU, bucket=bucket)
    for p, g in zip(prompts(tiny, 4, seed=7), refs):
        want = g.sequences[0, len(p):].tolist()
        got = run(engine, [(0, p, 16)])[0]
        assert got.tokens == want[:len(got.tokens)] and len(got.tokens) == len(want)
        assert max((a - b.float()).abs().max().item() for a, b in zip(got.logits, g.logits)) < 1e-4


def test_an_answer_ends_at_its_first_end_token_or_its_budget(tiny):
    engine = Engine(tiny, slots=2, max_len=64, eos=set(), device=CPU)
    p = prompts(tiny, 1, seed=3)[0]
    free = run(engine, [(0, p, 8)])[0].tokens
    assert len(free) == 8
    stop = free[3]
    engine.eos = {stop}
    ended = run(engine, [(0, p, 8)])[0].tokens
    assert ended == free[:free.index(stop) + 1]  # the end token included, as one-at-a-time generation returns it


def test_the_engine_thread_answers_concurrent_submitters_as_if_each_were_alone(tiny):
    engine = Engine(tiny, slots=3, max_len=96, eos=set(), device=CPU)
    ps = prompts(tiny, 9, seed=11)
    alone = [run(engine, [(0, p, 10)])[0].tokens for p in ps]
    engine.start()
    try:
        out: dict[int, list[int]] = {}

        def ask(i: int) -> None:
            out[i] = engine.submit(ps[i], 10).result(timeout=60).tokens

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(ps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [out[i] for i in range(len(ps))] == alone
    finally:
        engine.close()
    with pytest.raises(EngineError, match="stopped"):
        engine.submit(ps[0], 4)


def test_what_it_cannot_run_is_refused_by_name(tiny):
    base = tiny.config.to_dict()
    assert unservable(base) is None
    assert "model_type is 'bert'" in unservable({**base, "model_type": "bert"})
    assert "auto_map" in unservable({**base, "auto_map": {"AutoModelForCausalLM": "modeling_mine.Mine"}})
    assert "encoder-decoder" in unservable({**base, "model_type": "t5", "is_encoder_decoder": True})
    assert "'dynamic'" in unservable({**base, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4,
                                                                   "factor": 2.0}})
    assert "'longrope'" in unservable({**base, "model_type": "phi3", "rope_parameters": None,
                                       "rope_scaling": {"type": "longrope"}})
    assert "'longrope'" in unservable({**base, "model_type": "phi3", "rope_scaling": {"type": "su"}})  # its legacy name
    assert "bidirectionally" in unservable({**base, "model_type": "gemma2", "use_bidirectional_attention": True})
    assert unservable({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}) is None
    with pytest.raises(EngineError, match="learned position table has 256"):
        Engine(build("gpt2"), slots=1, max_len=300, eos=set(), device=CPU)
    with pytest.raises(EngineError, match="exceeds the engine's 32 positions"):
        Engine(tiny, slots=1, max_len=32, eos=set(), device=CPU).submit(list(range(3, 30)), 8)
    with pytest.raises(EngineError, match="key/value cache .* lower serving_slots"):
        Engine(tiny, slots=256, max_len=2**24, eos=set(), device=CPU)


def test_the_served_table_is_the_tested_one():
    """A model type is served because a tiny model of it passed below, not because it resembles one."""
    assert {kind for kind, _ in CONFIGS.values()} == set(SERVED)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_architecture_served_gives_generates_tokens_and_is_computed_as_if_alone(name):
    row = table_row(name, CPU)
    assert row["differ"] == 0 and row["equal_to_generate"] + row["near_ties"] == row["requests"], row
    assert row["bit_identical_beside_neighbours"] == row["requests"] and row["slots_used"] > 1, row


def test_an_attention_argument_the_engine_does_not_implement_is_refused_by_name():
    """gpt-oss's attention sinks (`s_aux`) and the like: refused when the engine starts, not computed wrong."""
    from transformers.models.llama import modeling_llama

    model = build("llama")
    real = modeling_llama.LlamaAttention.forward

    def with_sinks(self, *a, **kw):
        return real(self, *a, **kw, s_aux=torch.zeros(4))

    modeling_llama.LlamaAttention.forward = with_sinks
    try:
        with pytest.raises(EngineError, match="passes s_aux, which the engine's attention does not implement"):
            Engine(model, slots=2, max_len=32, eos=set(), device=CPU)
    finally:
        modeling_llama.LlamaAttention.forward = real


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device (the lent GPU: bench/serving_gpu.sh)")
@pytest.mark.parametrize("slots", [4, 64])
def test_on_cuda_the_replayed_graph_computes_a_request_as_if_alone(slots, wider):
    """The same property where kernels are picked per shape by cuBLAS and the decode step is a replayed
    CUDA graph: bit for bit, neighbours joining and leaving."""
    model = LlamaForCausalLM(wider.config).eval()
    model.load_state_dict(wider.state_dict())
    ps = prompts(model, 12, seed=slots)
    engine = Engine(model.cuda(), slots=slots, max_len=96, eos=set(), device=torch.device("cuda"),
                    prompt_lengths=[len(p) for p in ps[:6]])  # the others' buckets prefill without a graph
    assert engine.graph is not None and engine.prefills
    alone = {i: run(engine, [(0, p, 12)])[0] for i, p in enumerate(ps)}
    rng = random.Random(slots)
    together = run(engine, [(rng.randrange(0, 20), p, rng.randrange(1, 13)) for p in ps])
    for i, got in together.items():
        assert got.tokens == alone[i].tokens[:len(got.tokens)]
        assert all(torch.equal(a, b) for a, b in zip(got.logits, alone[i].logits)), i
    assert len({a.slot for a in together.values()}) > 1


def test_nothing_an_earlier_request_left_in_a_slot_reaches_the_next(tiny):
    """A slot's stale keys and values are masked out — and a masked NaN would still poison `p @ v`
    (0 × NaN is NaN) — so a request admitted to a slot starts from a clean one."""
    engine = Engine(tiny, slots=1, max_len=96, eos=set(), device=CPU)
    p = prompts(tiny, 1, seed=5)[0]
    ref = run(engine, [(0, p, 6)])[0]
    with torch.inference_mode():  # the cache was made under it
        for t in (*engine.cache.k, *engine.cache.v):
            t[0].fill_(float("nan"))
    got = run(engine, [(0, p, 6)])[0]
    assert got.tokens == ref.tokens and all(torch.equal(a, b) for a, b in zip(got.logits, ref.logits))


def test_a_step_that_fails_fails_its_requests_and_the_engine_goes_on(tiny, monkeypatch):
    """A decode step that raises (on a GPU: an out-of-memory, a kernel fault) fails the requests decoding in
    it — their clients may retry — and the next requests are answered as if nothing had happened."""
    engine = Engine(tiny, slots=2, max_len=96, eos=set(), device=CPU)
    ps = prompts(tiny, 3, seed=9)
    alone = [run(engine, [(0, p, 6)])[0].tokens for p in ps]
    real, calls = engine._decode, {"n": 0}

    def once() -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real()

    monkeypatch.setattr(engine, "_decode", once)
    failed = [engine.submit(p, 6) for p in ps[:2]]
    while not all(f.done() for f in failed):
        engine.step()
    assert all("illegal memory access" in str(f.exception()) for f in failed)
    assert all(r is None for r in engine.active)  # their slots are free again
    assert [run(engine, [(0, p, 6)])[0].tokens for p in ps] == alone


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_compiled_the_engine_keeps_generates_tokens_and_a_request_alone(name):
    """The decode step and the prefill through inductor (as on CUDA; here its C++ backend): the same
    properties, a prefill of every bucket from one compilation of a dynamic prompt length."""
    row = table_row(name, CPU, compile=True, bucket=8)
    assert row["compiled"] and row["differ"] == 0, row
    assert row["bit_identical_beside_neighbours"] == row["requests"] and row["slots_used"] > 1, row


def test_served_in_bfloat16_the_rotary_frequencies_stay_fp32_and_the_properties_hold():
    """A profile's serving_dtype = "bfloat16": parameters cast, buffers (the rotary `inv_freq`) kept FP32 as
    `from_pretrained(dtype=...)` keeps them; near-ties counted at bf16's gap."""
    from training.engine import cast_for_serving

    model = cast_for_serving(build("qwen2"), torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    row = table_row("qwen2", CPU, dtype=torch.bfloat16)
    assert row["dtype"] == "bfloat16" and row["differ"] == 0, row
    assert row["bit_identical_beside_neighbours"] == row["requests"], row

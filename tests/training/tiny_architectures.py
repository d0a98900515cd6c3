"""A tiny random model of each architecture the serving engine serves (training/architecture.py's
`SERVED`), each exercising what sets it apart: biases, q/k norms, sliding windows shorter than the
prompts, soft-capping, learned positions, multipliers, `llama3` rotary. Used by the engine's tests and by
bench/architecture_table.py (on the CPU and on a GPU)."""

from __future__ import annotations

from typing import Any

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {  # name: (model_type, config)
    "llama": ("llama", COMMON),
    "llama3-rope": ("llama", {**COMMON, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2": ("qwen2", COMMON),
    "qwen3": ("qwen3", {**COMMON, "head_dim": 32}),
    "mistral": ("mistral", {**COMMON, "sliding_window": 8}),
    "phi3": ("phi3", {**COMMON, "num_key_value_heads": 4, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}),
    "gemma": ("gemma", {**COMMON, "head_dim": 16}),
    "gemma2": ("gemma2", {**COMMON, "head_dim": 16, "sliding_window": 8, "attn_logit_softcapping": 5.0,
                          "final_logit_softcapping": 3.0}),
    "gpt2": ("gpt2", {"vocab_size": 512, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256,
                      "bos_token_id": 1, "eos_token_id": 1}),
    "olmo2": ("olmo2", {**COMMON, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}),
    "starcoder2": ("starcoder2", {**COMMON, "bos_token_id": 1, "eos_token_id": 1}),
    "granite": ("granite", {**COMMON, "embedding_multiplier": 2.0, "residual_multiplier": 0.5,
                            "attention_multiplier": 0.2, "logits_scaling": 4.0}),
}


def build(name: str, seed: int = 0) -> Any:
    """The named tiny model, randomly initialised from `seed` (FP32, eval mode)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, kw = CONFIGS[name]
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **kw), dtype=torch.float32).eval()


def prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def drive(engine: Any, schedule: list[tuple[int, list[int], int]]) -> dict[int, Any]:
    """Step the engine by hand: schedule = (step at which it arrives, prompt, new tokens)."""
    futures, step = {}, 0
    pending = sorted(enumerate(schedule), key=lambda x: x[1][0])
    while pending or not all(f.done() for f in futures.values()):
        while pending and pending[0][1][0] <= step:
            i, (_, p, n) = pending.pop(0)
            futures[i] = engine.submit(p, n, keep_logits=True)
        engine.step()
        step += 1
    return {i: f.result() for i, f in futures.items()}


def table_row(name: str, device: Any, *, slots: int = 3, n: int = 6, new: int = 12, dtype: Any = None,
              **engine_kw: Any) -> dict:
    """One architecture against transformers' own `generate()` (greedy, its default attention, on the same
    device) and against itself: each request alone, then all of them arriving at random steps with random
    budgets (neighbours joining and leaving). Counts, so a table can print them and a test assert them."""
    import random
    import time

    import torch

    from training.engine import Engine, cast_for_serving, compare_tokens

    model = build(name).to(device)
    if dtype is not None:  # as the replica serves a profile's serving_dtype (training/serve.py)
        cast_for_serving(model, dtype)
    ps = prompts(model.config.vocab_size, n, seed=len(name))
    want = []
    with torch.no_grad():
        for p in ps:
            g = model.generate(torch.tensor([p], device=device), max_new_tokens=new, do_sample=False,
                               pad_token_id=0, eos_token_id=None, min_new_tokens=new)
            want.append(g[0, len(p):].tolist())
    t = time.perf_counter()
    engine = Engine(model, slots=slots, max_len=64, eos=set(), device=device,
                    prompt_lengths=[len(p) for p in ps], **engine_kw)
    built = time.perf_counter() - t
    alone = {i: drive(engine, [(0, p, new)])[0] for i, p in enumerate(ps)}
    verdicts = [compare_tokens(alone[i].tokens, alone[i].logits, want[i], engine.dtype) for i in range(n)]
    rng = random.Random(7)
    together = drive(engine, [(rng.randrange(0, 10), p, rng.randrange(1, new + 1)) for p in ps])
    bits = sum(got.tokens == alone[i].tokens[:len(got.tokens)]
               and all(torch.equal(a, b) for a, b in zip(got.logits, alone[i].logits)) for i, got in together.items())
    return {"architecture": name, "model_type": model.config.model_type, "device": str(device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "requests": n, "equal_to_generate": verdicts.count("equal"), "near_ties": verdicts.count("near-tie"),
            "differ": verdicts.count("differs"), "bit_identical_beside_neighbours": bits,
            "slots_used": len({a.slot for a in together.values()}), "engine_seconds": round(built, 2),
            "compiled": engine.compiled, "cuda_graph": engine.graph is not None}

"""Scoring: batched greedy generation gives the tokens one-at-a-time generation gives (CPU, FP32)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model_and_cases(smoke_home, tiny_seed):
    import torch
    from transformers import AutoModelForCausalLM

    from training.prepare import load_cases
    from training.seed import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32).eval()
    tok = load_tokenizer(tiny_seed)
    cases = [c for c in load_cases(smoke_home).values() if c["split"] == "test"]
    return model, tok, cases


def test_batched_answers_equal_one_at_a_time_token_for_token(model_and_cases):
    """A sample of test cases whose prompts differ in length (so every batch is left-padded), answered
    one at a time and in batches of 12 and 5 (a last, partial batch): the same tokens, row by row. The
    tiny seed never emits an end token, so every row is compared over the whole generation budget."""
    import torch

    from training.evaluate import generate_answers, generation_budget, prompt_text

    model, tok, cases = model_and_cases
    sample = cases[:12]
    lengths = [len(tok(prompt_text(tok, c), add_special_tokens=False)["input_ids"]) for c in sample]
    assert max(lengths) - min(lengths) >= 20, lengths  # real padding in every batch
    budget = generation_budget(tok, sample)
    cpu = torch.device("cpu")
    one = generate_answers(model, tok, sample, batch=1, max_new_tokens=budget, device=cpu)
    assert all(len(a) == budget for a in one)
    for b in (12, 5):
        assert generate_answers(model, tok, sample, batch=b, max_new_tokens=budget, device=cpu) == one


def test_the_comparison_sees_broken_batching(model_and_cases):
    """The same comparison catches batching that is wrong: right padding without the mask's positions
    (what a batch gets if padding is put on the wrong side) changes the shorter prompts' answers."""
    import torch

    from training.evaluate import answer_tokens, eos_ids, generate_answers, generation_budget, prompt_text

    model, tok, cases = model_and_cases
    sample = cases[:12]
    budget = generation_budget(tok, sample)
    one = generate_answers(model, tok, sample, batch=1, max_new_tokens=budget, device=torch.device("cpu"))
    tok.padding_side = "right"
    enc = tok([prompt_text(tok, c) for c in sample], add_special_tokens=False, return_tensors="pt", padding=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=budget, do_sample=False, pad_token_id=tok.pad_token_id)
    tok.padding_side = "left"
    eos = eos_ids(model, tok)
    wrong = [answer_tokens(seq, eos) for seq in gen[:, enc["input_ids"].shape[1]:].tolist()]
    assert wrong != one


def test_answer_tokens_stop_at_the_first_end_token():
    from training.evaluate import answer_tokens

    assert answer_tokens([5, 6, 2, 2, 2], {2}) == [5, 6, 2]
    assert answer_tokens([5, 6, 7], {2}) == [5, 6, 7]
    assert answer_tokens([9, 3, 4], {3, 4}) == [9, 3]


def test_a_tokenizer_without_a_pad_token_still_batches(model_and_cases):
    """A seed saved by transformers 5.17 (the H200's) has no pad token: scoring then pads with the end
    token (masked), and the answers are the ones a tokenizer with a pad token gives (before, the first
    GPU study's scoring stopped at 'Asking to pad but the tokenizer does not have a padding token')."""
    import copy

    import torch

    from training.evaluate import generate_answers, generation_budget

    model, tok, cases = model_and_cases
    sample = cases[:6]
    budget = generation_budget(tok, sample)
    cpu = torch.device("cpu")
    want = generate_answers(model, tok, sample, batch=3, max_new_tokens=budget, device=cpu)
    bare = copy.deepcopy(tok)
    bare.pad_token = None
    assert bare.pad_token_id is None
    assert generate_answers(model, bare, sample, batch=3, max_new_tokens=budget, device=cpu) == want

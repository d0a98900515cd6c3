"""Tokenized documents with prompt/response masks and token weights.

A document is a conversation; only its final assistant turn is supervised. The prompt is the chat
template applied to every earlier turn with the generation prompt (what the model sees when it is
asked), and the response is the assistant text followed by the end-of-turn token, so the model
learns to stop. Prompt and response are tokenized separately, so the boundary is exact.

Every target token of a task document weighs `weights.task` (8), of a replay document
`weights.replay` (1). The loss denominator for an update is the global sum of weighted targets over
that update's documents — computed here once, from the committed schedule, for every arm.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from safetensors.numpy import load_file, save_file


@dataclass
class Corpus:
    """Flat token storage: document i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray  # int32
    offsets: np.ndarray  # int64, n + 1
    prompt_lens: np.ndarray  # int32
    weights: np.ndarray  # int32, per document (per target token)

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def targets(self) -> np.ndarray:
        return self.lengths - self.prompt_lens

    @property
    def weighted_targets(self) -> np.ndarray:
        return self.targets * self.weights

    def save(self, path: str | Path) -> None:
        save_file({"tokens": self.tokens, "offsets": self.offsets,
                   "prompt_lens": self.prompt_lens, "weights": self.weights}, str(path),
                  metadata={"format": "trial-corpus-v1"})

    @classmethod
    def load(cls, path: str | Path) -> "Corpus":
        t = load_file(str(path))
        return cls(t["tokens"], t["offsets"], t["prompt_lens"], t["weights"])


def prompt_texts(tok: Any, conversations: Sequence[list[dict[str, str]]]) -> list[str]:
    return [tok.apply_chat_template(list(m[:-1]), tokenize=False, add_generation_prompt=True)
            for m in conversations]


def build(tok: Any, conversations: Sequence[list[dict[str, str]]], weights: Sequence[int]) -> Corpus:
    """Tokenize conversations whose last turn is the assistant's."""
    if any(m[-1]["role"] != "assistant" for m in conversations):
        raise ValueError("every document must end with an assistant turn")
    eos = tok.eos_token_id
    prompts = tok(prompt_texts(tok, conversations), add_special_tokens=False)["input_ids"]
    responses = tok([m[-1]["content"] for m in conversations], add_special_tokens=False)["input_ids"]
    docs = [p + r + [eos] for p, r in zip(prompts, responses)]
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    flat = np.fromiter((t for d in docs for t in d), dtype=np.int32, count=int(offsets[-1]))
    return Corpus(flat, offsets, np.array([len(p) for p in prompts], dtype=np.int32),
                  np.asarray(weights, dtype=np.int32))


def token_lengths(tok: Any, conversations: Sequence[list[dict[str, str]]]) -> list[int]:
    """Whole-document token counts, used to keep documents inside the context before building."""
    c = build(tok, conversations, [1] * len(conversations))
    return c.lengths.tolist()


def schedule(n_docs: int, updates: int, global_batch: int, seed: int | str) -> list[list[int]]:
    """The fixed global document order: whole shuffled passes, chunked into updates."""
    total = updates * global_batch
    if total % n_docs:
        raise ValueError(f"{updates} × {global_batch} is not a whole number of passes over {n_docs}")
    order: list[int] = []
    for epoch in range(total // n_docs):
        perm = list(range(n_docs))
        random.Random(f"schedule/{seed}/{epoch}").shuffle(perm)
        order.extend(perm)
    return [order[u * global_batch:(u + 1) * global_batch] for u in range(updates)]


def update_weighted_targets(corpus: Corpus, plan: list[list[int]]) -> list[int]:
    w = corpus.weighted_targets
    return [int(w[idx].sum()) for idx in plan]

"""Synthetic corpora and schedules shared by the multi-process tests and their in-process references.

Each case is built deterministically from its name, so a rank process and the pytest process that
checks it construct identical inputs without passing tensors around.
"""

from __future__ import annotations

import numpy as np

from training.corpus import Corpus


def synthetic_corpus(specs: list[tuple[int, int, int]], seed: int) -> Corpus:
    """specs: (length, prompt_len, weight) per document; tokens are random ids in [3, 1000)."""
    rng = np.random.default_rng(seed)
    lengths = [n for n, _, _ in specs]
    offsets = np.zeros(len(specs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    tokens = rng.integers(3, 1000, size=int(offsets[-1]), dtype=np.int32)
    return Corpus(tokens, offsets, np.array([p for _, p, _ in specs], dtype=np.int32),
                  np.array([w for _, _, w in specs], dtype=np.int32))


def case(name: str) -> tuple[Corpus, list[list[int]]]:
    """(corpus, plan) for a named case; plans have 4 updates of 8 documents."""
    base = {"unequal-4": "unequal", "reversed": "concentrated"}.get(name, name)
    rng = np.random.default_rng(sum(map(ord, base)))
    if name in ("unequal", "unequal-4"):
        # lengths, prompt lengths and weights all vary; every update mixes them
        specs = [(int(rng.integers(12, 48)), int(rng.integers(3, 10)), int(rng.choice([1, 8])))
                 for _ in range(16)]
        plan = [list(map(int, rng.permutation(16)[:8])) for _ in range(4)]
        return synthetic_corpus(specs, 11), plan
    if name in ("concentrated", "reversed"):
        # documents 0-7: long answers, weight 8; 8-15: short answers, weight 1. Each update puts
        # all the weight on the first half of its list (rank 0 of two); "reversed" flips the list,
        # so the same documents land on the other rank.
        specs = ([(int(rng.integers(36, 48)), 4, 8) for _ in range(8)]
                 + [(int(rng.integers(8, 14)), 6, 1) for _ in range(8)])
        plan = []
        for u in range(4):
            heavy = [int(x) for x in rng.permutation(8)[:4]]
            light = [8 + int(x) for x in rng.permutation(8)[:4]]
            plan.append(heavy + light)
        if name == "reversed":
            plan = [list(reversed(p)) for p in plan]
        return synthetic_corpus(specs, 12), plan
    raise KeyError(name)

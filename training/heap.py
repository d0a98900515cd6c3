"""What a process loads once and keeps to its end (torch, transformers' model code, the model), kept out of the
cyclic garbage collector's sight (`long_lived`); and a block whose many allocations all die with it, run without
the collector (`paused`, which `long_lived` builds on: a seed's conversion).

Importing torch and transformers' Llama code leaves about 600,000 tracked container objects alive for the
rest of the process. CPython's collector traverses all of them at each full collection: six times during
those imports alone (0.2 s each on a 2-core test machine), and again whenever a rank's training loop, a
replica's answers or a scoring pass has allocated enough to trigger one. `long_lived()` pauses the
collector for the block that loads them and then `gc.freeze()`s everything alive: frozen objects sit in a
permanent generation that no later collection visits. Reference counting still frees them (checked: a
Llama model loaded in the block and used to generate is freed by its last reference, collector or not);
only a cycle among them that dies later is never reclaimed, and the libraries' modules do not die before
the process. In a process that calls it more than once (a controller scoring arm after arm in its own
process), each call freezes what is alive then; each model still goes with its last reference.

Measured (`bench/rank_cpu.py`, bench/results/2026-12-04-heap-2cpu/): a tiny-seed smoke rank's user CPU
5.57 s before, 3.80 s after (means of five runs each, alternating).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Run the block with the collector paused, and resume it as it was. For a block that allocates a great
    many objects that die with it (a seed's conversion: a GGUF file read field by field into millions of small
    arrays), each collection the allocations trigger traverses what is alive and finds almost nothing to
    reclaim; reference counting frees them all the same, and the first collection after the block reclaims
    any cycle among them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def long_lived() -> Iterator[None]:
    """Run the block with the collector paused (`paused`); everything alive when it ends is frozen before the
    collector resumes (a block that raises freezes too: what it loaded stays loaded)."""
    with paused():
        try:
            yield
        finally:
            gc.freeze()

"""When a periodic synchronization falls due: after every H-th update, and after the last.

The last update always synchronizes so that every rank ends on the same model, whatever H. The
rule lives here, at the bottom of the import graph, because three readers must agree on it and one
of them may hold only `evidence`: the DiLoCo arm runs by it (`training.arms.diloco`), the plan prices
its synchronizations from it (through that arm), and the report checks every recorded outer step
against it.
"""

from __future__ import annotations


def due_after(update: int, updates: int, every: int) -> bool:
    """Whether update `update` (0-based) of `updates` ends with a synchronization."""
    if every < 1:
        raise ValueError(f"a synchronization period must be at least 1 update, not {every}")
    return (update + 1) % every == 0 or update + 1 == updates


def count(updates: int, every: int) -> int:
    """How many synchronizations `updates` updates hold."""
    return sum(due_after(u, updates, every) for u in range(updates))

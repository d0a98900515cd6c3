"""One process, the reference objective: Σ over the update's documents of their loss, over W (the
update's weighted targets), then clipping and AdamW. Every other kind is measured against it."""

from __future__ import annotations

from training.arms.base import ArmKind


class Single(ArmKind):
    name = "single"
    min_ranks = 1
    max_ranks = 1


KIND = Single()

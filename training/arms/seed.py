"""The untrained seed: the baseline every trained arm is measured against. Nothing trains it."""

from __future__ import annotations

from training.arms.base import ArmKind


class Seed(ArmKind):
    name = "seed"
    trains = False
    min_ranks = 1
    max_ranks = 1


KIND = Seed()

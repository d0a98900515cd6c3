"""Arm kinds: one module each (its settings, rank rule, loss scaling, reduction or outer step,
sync schedule, extra checkpoint state and profile keys), one registry that the config, the trainer,
the checkpoints and the plan read.

Adding a kind: a module beside these with a `KIND` (an `ArmKind` subclass's instance), and one line
below. Its settings go in its own `Settings` model; an experiment's arm gives them as flat keys
(`training.config.Arm`). Importing this package never imports torch.
"""

from __future__ import annotations

from training.arms import ddp, diloco, powersgd, seed, single
from training.arms.base import ArmKind, Settings

KINDS: dict[str, ArmKind] = {k.name: k for k in (
    seed.KIND,
    single.KIND,
    ddp.KIND,
    diloco.KIND,
    powersgd.KIND,
)}

# every kind's extra checkpoint state, in registry order: a rank checkpoint holds each key (None where
# its kind has no such state), so every checkpoint has one shape
CHECKPOINT_PARTS: tuple[str, ...] = tuple(k.checkpoint_part for k in KINDS.values() if k.checkpoint_part)


def kind(name: str) -> ArmKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown arm kind {name!r} (kinds: {', '.join(KINDS)})") from None


__all__ = ["ArmKind", "CHECKPOINT_PARTS", "KINDS", "Settings", "kind"]

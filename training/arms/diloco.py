"""DiLoCo: each rank trains alone on its share (its loss over its own weighted targets, no
per-update synchronization), and every H updates and after the last the ranks take one outer
Nesterov step on the mean of their deltas (`training.diloco.OuterNesterov`). Each rank keeps its
own Adam moments; the outer momentum is this kind's extra checkpoint state.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evidence import schedule
from training.arms.base import ArmKind, Settings


class DiLoCoSettings(Settings):
    sync_every: int = Field(ge=1)  # H
    outer_lr: float
    outer_momentum: float


class DiLoCoKind(ArmKind):
    name = "diloco"
    settings_model = DiLoCoSettings
    profile_scaled = ("sync_every",)
    checkpoint_part = "outer"
    plan_needs = {"sync_every": "DiLoCo's H, the updates between outer steps"}

    def outer_step_after(self, update: int, updates: int, settings: Any) -> bool:
        return schedule.due_after(update, updates, settings.sync_every)

    def synchronizations(self, updates: int, settings: Any) -> int:
        return schedule.count(updates, settings.sync_every)

    def loss_scale(self, world_size: int, w_local: float, w_global: float) -> float:
        return 1.0 / w_local

    def make_outer(self, params: list, settings: DiLoCoSettings, chunk_bytes: int) -> Any:
        # start-up: torch ~1.5 s; arm kinds are read by every orchestrate command (training/arms/base.py)
        from training.diloco import OuterNesterov

        return OuterNesterov(params, settings.outer_lr, settings.outer_momentum, chunk_bytes=chunk_bytes)

    def outer_step(self, state: Any) -> None:
        state.step()

    def state_dict(self, state: Any) -> Any:
        return state.state_dict()

    def load_state_dict(self, state: Any, saved: Any, device: Any) -> None:
        state.load_state_dict(saved)

    def profile_keys(self, settings: DiLoCoSettings, choice: dict[str, Any]) -> dict[str, Any]:
        return {"sync_every": settings.sync_every}


KIND = DiLoCoKind()

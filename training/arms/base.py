"""What every arm kind is: its settings, its rank rule, its schedule and its hooks into the trainer.

A kind subclasses `ArmKind` and overrides only what differs from a plain single-process step (one
engine, the loss weighted by the update's global targets, no synchronization, no extra state).
Importing a kind must not import torch: the plan (`infra`) reads the same registry on a controller
that never trains. torch is imported inside the methods the trainer calls.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


class Settings(BaseModel):
    """A kind's own settings (none by default); subclasses declare theirs as fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ArmKind:
    name: ClassVar[str]
    settings_model: ClassVar[type[Settings]] = Settings
    # settings a profile may override for every arm of the kind (they scale with the number of updates)
    profile_scaled: ClassVar[tuple[str, ...]] = ()
    trains: ClassVar[bool] = True
    min_ranks: ClassVar[int] = 2
    max_ranks: ClassVar[int | None] = None
    # gradients reduced across ranks inside every update's backward (a DDP engine)
    reduces_each_update: ClassVar[bool] = False
    # the key of this kind's extra state in a rank's checkpoint (None: it has none)
    checkpoint_part: ClassVar[str | None] = None
    # what the plan must be told about an arm of this kind: stack setting → why
    plan_needs: ClassVar[dict[str, str]] = {}

    # ------------------------------------------------------------------ configuration

    def settings(self, values: dict[str, Any]) -> Settings:
        """The kind's settings from the values given (None taken as unset); a missing or wrong one is
        a ValueError naming the kind and each field."""
        given = {k: v for k, v in values.items() if v is not None}
        try:
            return self.settings_model(**given)
        except ValidationError as e:
            what = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors())
            raise ValueError(f"the {self.name} arm's settings: {what}") from None

    def check_world(self, world_size: int) -> None:
        if world_size < self.min_ranks:
            raise ValueError(f"the {self.name} arm needs at least {self.min_ranks} rank"
                             f"{'s' if self.min_ranks > 1 else ''}, not {world_size}")
        if self.max_ranks is not None and world_size > self.max_ranks:
            raise ValueError(f"the {self.name} arm runs on at most {self.max_ranks} process"
                             f"{'es' if self.max_ranks > 1 else ''}, not {world_size}")

    def foreign(self, values: dict[str, Any]) -> list[str]:
        """Settings given that belong to another kind (a typo'd arm would otherwise run without them)."""
        return [k for k, v in values.items() if v is not None and k not in self.settings_model.model_fields]

    # ------------------------------------------------------------------ schedule (torch-free)

    def outer_step_after(self, update: int, updates: int, settings: Settings) -> bool:
        """Whether an outer synchronization follows update `update`."""
        return False

    def synchronizations(self, updates: int, settings: Any) -> int:
        """How many times the ranks exchange the model's worth of payload in `updates` updates (for
        the plan: `settings` may be any object carrying the kind's fields)."""
        return updates if self.reduces_each_update else 0

    # ------------------------------------------------------------------ the trainer's hooks

    def loss_scale(self, world_size: int, w_local: float, w_global: float) -> float:
        """The factor on this rank's summed loss so the reduced gradient is that of Σ loss / W."""
        return 1.0 / w_global

    def engine_choices(self, settings: Settings, device: Any, model: Any) -> dict[str, Any]:
        """Decisions the kind takes from its settings and the device (committed in the profile)."""
        return {}

    def engine(self, loss: Any, device: Any, settings: Settings, choice: dict[str, Any],
               warming: Callable[[], bool]) -> tuple[Any, Any]:
        """The module each microbatch runs through, and the kind's state (None: none)."""
        return loss, None

    def make_outer(self, params: list, settings: Settings, chunk_bytes: int) -> Any:
        """State the kind adds after the optimizer exists (DiLoCo's outer optimizer); None: none."""
        return None

    def outer_step(self, state: Any) -> None:
        raise NotImplementedError(f"the {self.name} arm has no outer step")

    def update_record(self, state: Any, update: int) -> dict[str, Any]:
        """Kind-specific fields of an update's record. Every kind writes the same keys, so records of
        different arms compare field by field (a DDP arm's says it compressed nothing)."""
        return {"powersgd_compressed": False}

    def state_dict(self, state: Any) -> Any:
        return None

    def load_state_dict(self, state: Any, saved: Any, device: Any) -> None:
        pass

    def profile_keys(self, settings: Settings, choice: dict[str, Any]) -> dict[str, Any]:
        """What the numerical profile records of this kind beyond the arm's own configuration."""
        return {}

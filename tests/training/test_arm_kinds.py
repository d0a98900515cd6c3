"""Arm kinds are components: one registry that the config, the trainer, the plan and the report read.

The last test registers a kind the project does not have, through the registry alone, and shows the
config, the plan and the trainer all take it: the walk a contributor makes to add one.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evidence import schedule
from training.arms import KINDS, kind
from training.arms.single import Single
from training.config import Arm


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValidationError, match="unknown arm kind 'dilocco' \\(kinds: seed, single, ddp, diloco, powersgd\\)"):
        Arm(name="x", kind="dilocco", world_size=4)


def test_an_arm_gives_only_its_own_kinds_settings_and_ranks():
    with pytest.raises(ValidationError, match="arm pair \\(ddp\\) does not take sync_every"):
        Arm(name="pair", kind="ddp", world_size=2, sync_every=4)
    with pytest.raises(ValidationError, match="the single arm runs on at most 1 process, not 2"):
        Arm(name="one", kind="single", world_size=2)
    with pytest.raises(ValidationError, match="the diloco arm needs at least 2 ranks, not 1"):
        Arm(name="d", kind="diloco", world_size=1, sync_every=2, outer_lr=0.7, outer_momentum=0.9)
    Arm(name="d", kind="diloco", world_size=4, sync_every=2, outer_lr=0.7, outer_momentum=0.9)


def test_missing_settings_are_named_field_by_field():
    with pytest.raises(ValueError, match="the diloco arm's settings: outer_lr: Field required; "
                                         "outer_momentum: Field required"):
        kind("diloco").settings({"sync_every": 4, "outer_lr": None})
    with pytest.raises(ValueError, match="dense_warmup: Input should be greater than or equal to 2"):
        kind("powersgd").settings({"powersgd_rank": 4, "dense_warmup": 1})


def test_one_schedule_for_the_trainer_the_plan_and_the_report():
    """DiLoCo's "every H updates and after the last": the trainer's spec, the plan's count and the
    report's rule (evidence.schedule) agree, for H dividing the updates and not."""
    from training.trainer import TrainSpec

    d = KINDS["diloco"]
    for updates, h in ((8, 4), (10, 4), (3, 5), (1, 1)):
        spec = TrainSpec(kind="diloco", plan=[[0, 1]] * updates, lr=1e-3, world_size=2,
                         settings={"sync_every": h, "outer_lr": 0.7, "outer_momentum": 0.9})
        steps = [u for u in range(updates) if spec.syncs_after(u)]
        assert steps == [u for u in range(updates) if schedule.due_after(u, updates, h)]
        assert steps[-1] == updates - 1 and len(steps) == d.synchronizations(updates, spec.settings) \
            == -(-updates // h)
    assert KINDS["ddp"].synchronizations(7, None) == KINDS["powersgd"].synchronizations(7, None) == 7
    assert KINDS["single"].synchronizations(7, None) == 0


class Reversed(Single):
    """A kind the project does not have: one process whose loss is negated (it climbs the loss)."""

    name = "reversed"

    def loss_scale(self, world_size: int, w_local: float, w_global: float) -> float:
        return -1.0 / w_global


def test_a_kind_added_by_one_registry_entry_reaches_config_plan_and_trainer(monkeypatch, tiny_seed):
    import torch
    from transformers import AutoModelForCausalLM

    from dist_cases import case
    from infra.plan import Arm as PlanArm
    from training.trainer import Trainer, TrainSpec

    with pytest.raises(ValidationError):
        Arm(name="up", kind="reversed")
    monkeypatch.setitem(KINDS, "reversed", Reversed())
    Arm(name="up", kind="reversed")
    assert PlanArm(name="up", kind="reversed", world_size=1, updates=3).kind == "reversed"

    corpus, plan = case("unequal")
    losses = {}
    for name in ("single", "reversed"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(tiny_seed), dtype=torch.float32)
        tr = Trainer(model, corpus, TrainSpec(kind=name, plan=plan * 3, lr=1e-3), torch.device("cpu"), pad_id=2)
        losses[name] = [tr.step()["loss"] for _ in range(len(plan) * 3)]
    # the same first loss (same model, same documents); two passes later, on those documents again,
    # one has descended and the other climbed
    again = 2 * len(plan)
    assert losses["single"][0] == losses["reversed"][0]
    assert losses["single"][again] < losses["single"][0] < losses["reversed"][again]

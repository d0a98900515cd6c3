"""The budget's one period starts where the trial's paid hours start, whatever day `pulumi up` runs again.

AWS Budgets moves a budget's start when its TimePeriod.Start changes (UpdateBudget; docs/aws.md #31),
and the spend before the new start drops out of it. The program ran with the day of each `up` as the
start, so an `up` on the next day (a config change, a host replaced) cut the first day's spend out of
the backstop. Through the engine harness: two `up`s of a stack whose paid hours began yesterday register
yesterday; the start is kept as created (ignore_changes), so a deadline moved later in the config
cannot move it either; and the pure rule never puts the start after any `up` the plan lets through."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import yaml

from conftest import public_key
from infra.plan import TrialConfig
from pulumi_engine import pulumi_run

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = dt.datetime(2026, 12, 1, 1, 0, tzinfo=dt.timezone.utc)  # 3 h paid: from 22:00 the day before


def stack(**changes) -> dict:
    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    c = copy.deepcopy(conf["trials:cluster"]) | {"region": conf["aws:region"]}
    return c | {"deadline": DEADLINE.isoformat(), "ssh_public_key": public_key()} | changes


def up(cluster: dict) -> dict:
    """One `pulumi up` of `cluster` through the engine harness (tests/pulumi_engine.py: the program as
    Pulumi's engine starts it, reading the real clock): the budget as registered."""
    d = pulumi_run("up", {"trials:cluster": {k: v for k, v in cluster.items() if k != "region"},
                          "aws:region": cluster["region"]},
                   calls={"aws:ec2/getAmi:getAmi": {"id": "ami-0123456789abcdef0"}})
    assert d.returncode == 0, d.errors
    (budget,) = d.of("aws:budgets/budget:Budget")
    return {"inputs": budget.inputs, "ignore_changes": budget.ignore_changes}


def test_a_later_up_keeps_the_budget_start():
    """Paid hours that began yesterday (a deadline 1 h from now, 30 h paid): every `up` registers the
    day they began — not the day of the `up`, which the program used before and which a later `up`
    would move — and the start is kept as created (ignore_changes)."""
    now = dt.datetime.now(dt.timezone.utc)
    deadline = now.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=2)
    cluster = stack(deadline=deadline.isoformat(), hours=30,
                    budget={"total_usd": 2000, "compute_usd": 600, "transfer_usd": 1300, "storage_other_usd": 100})
    first, later = up(cluster), up(cluster)
    want = (deadline - dt.timedelta(hours=30)).strftime("%Y-%m-%d_00:00")
    assert want != now.strftime("%Y-%m-%d_00:00")  # the case the old program got wrong
    assert first["inputs"]["timePeriodStart"] == later["inputs"]["timePeriodStart"] == want
    assert first["inputs"]["timeUnit"] == "ANNUALLY"
    assert "timePeriodStart" in first["ignore_changes"]  # kept as created, whatever the config says later


def test_the_start_is_never_after_the_first_up():
    """The plan allows an `up` at most `hours` before the deadline: the start (deadline − hours, its day)
    is on or before the day of any `up` the plan lets through."""
    from infra.guards import budget_period_start

    for hours in (0.5, 3, 23.5, 30):
        cfg = TrialConfig.model_validate(stack(hours=hours))
        start = dt.datetime.strptime(budget_period_start(cfg), "%Y-%m-%d_%H:%M").replace(tzinfo=dt.timezone.utc)
        earliest_up = DEADLINE - dt.timedelta(hours=hours)
        assert start <= earliest_up < start + dt.timedelta(days=1)

"""The budget's one period starts where the trial's paid hours start, whatever day `pulumi up` runs again.

AWS Budgets moves a budget's start when its TimePeriod.Start changes (UpdateBudget; docs/aws.md #31),
and the spend before the new start drops out of it. The program ran with the day of each `up` as the
start, so an `up` on the next day (a config change, a host replaced) cut the first day's spend out of
the backstop. Under Pulumi's mocks: two builds of one stack at different `now`, on either side of
midnight, register the same start; and the start is kept as created (ignore_changes), so a deadline
moved later in the config cannot move it either."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from pathlib import Path

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor

from conftest import public_key
from infra.plan import TrialConfig

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = dt.datetime(2026, 12, 1, 1, 0, tzinfo=dt.timezone.utc)  # 3 h paid: from 22:00 the day before


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.budgets: list[dict] = []

    def new_resource(self, args):
        if args.typ == "aws:budgets/budget:Budget":
            self.budgets.append(dict(args.inputs))
        out = dict(args.inputs) | {"arn": f"arn:aws:mock:::{args.name}"}
        if args.typ == "aws:ec2/instance:Instance":
            out |= {"privateIp": "10.42.0.10", "publicIp": "198.18.0.10"}
        return [f"{args.name}-id", out]

    def call(self, args):
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": "ami-0123456789abcdef0"}
        return {}


class Monitor(MockMonitor):
    def __init__(self, mocks) -> None:
        super().__init__(mocks)
        self.ignored: dict[str, list[str]] = {}

    def RegisterResource(self, request):
        self.ignored[request.name] = list(request.ignoreChanges)
        return super().RegisterResource(request)


def stack(**changes) -> dict:
    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    c = copy.deepcopy(conf["trials:cluster"]) | {"region": conf["aws:region"]}
    return c | {"deadline": DEADLINE.isoformat(), "ssh_public_key": public_key()} | changes


def up(cfg: dict, now: dt.datetime) -> tuple[dict, Monitor]:
    """One `pulumi up` of `cfg` at `now` under the mocks: the budget's inputs and what was registered."""
    asyncio.set_event_loop(asyncio.new_event_loop())
    mocks = Mocks()
    monitor = Monitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="trials", stack="test", preview=False, monitor=monitor)
    from infra.program import build

    @pulumi.runtime.test
    def go():
        return pulumi.Output.from_input(build(TrialConfig.model_validate(cfg), now)).apply(lambda _: None)

    go()
    (budget,) = mocks.budgets
    return budget, monitor


def test_a_later_up_on_another_day_keeps_the_budget_start():
    first, _ = up(stack(), DEADLINE - dt.timedelta(hours=3))  # 2026-11-30 22:00
    later, monitor = up(stack(), DEADLINE - dt.timedelta(minutes=30))  # 2026-12-01 00:30: the next day
    assert first["timePeriodStart"] == later["timePeriodStart"] == "2026-11-30_00:00"
    assert first["timeUnit"] == "ANNUALLY"
    assert "timePeriodStart" in monitor.ignored["ltw-four-budget"]  # kept as created, whatever the config says


def test_the_start_is_never_after_the_first_up():
    """The plan allows an `up` at most `hours` before the deadline: the start (deadline − hours, its day)
    is on or before the day of any `up` the plan lets through."""
    from infra.guards import budget_period_start

    for hours in (0.5, 3, 23.5, 30):
        cfg = TrialConfig.model_validate(stack(hours=hours))
        start = dt.datetime.strptime(budget_period_start(cfg), "%Y-%m-%d_%H:%M").replace(tzinfo=dt.timezone.utc)
        earliest_up = DEADLINE - dt.timedelta(hours=hours)
        assert start <= earliest_up < start + dt.timedelta(days=1)

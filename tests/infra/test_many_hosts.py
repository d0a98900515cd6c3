"""Past ten hosts on AWS (#68): a 32-host study keeps a cloud spend stop for every host. A budget holds 10
actions (AWS Budgets' quotas), so the stops of ranks 10g … 10g+9 go on the trial's budget g, each budget on the
same spend (infra/plan.py `budget_group`, infra/guards.py). Walked as the user meets it: `orchestrate plan` of the
stack file, an emulated `up` (tests/pulumi_engine.py, moto's EC2 holding the 32 instances), a destroy before and
after preservation; then a resize of the large trial (hosts added into a new budget, hosts dropped) under the rules
of the earlier issues."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import yaml

from conftest import ROOT, run_cli
from infra.plan import TrialConfig, budget_group, estimate
from pulumi_engine import pulumi_run, teardown_env
from test_failures import preserve_into
from test_infra import CALLS, live, stack_of
from test_outside import a_trial, deleted, in_state, tagged

BUDGET = "aws:budgets/budget:Budget"
ACTION = "aws:budgets/budgetAction:BudgetAction"
ZONES = ["us-east-1c", "us-east-1d", "us-east-1a"]


def big(n: int = 32, **changes) -> dict:
    """The example study with `n` g6e.xlarge hosts: ranks 0-2 in us-east-1c and rank 3 alone in us-east-1d (the
    example's four, which its arms use), the others spread over us-east-1c and us-east-1a; a budget that pays."""
    hosts = [{"rank": r, "instance_type": "g6e.xlarge",
              "zone": "us-east-1c" if r < 3 else "us-east-1d" if r == 3 else ZONES[0 if r % 2 else 2]} for r in range(n)]
    return live(**{"hosts": hosts, "budget": {"total_usd": 400, "compute_usd": 200, "transfer_usd": 80,
                                              "storage_other_usd": 120}, **changes})


def test_a_32_host_plan_prices_its_extra_budgets_and_no_longer_refuses(tmp_path):
    cluster = big()
    stack = tmp_path / "Pulumi.big.yaml"
    stack.write_text(yaml.safe_dump({"config": {"aws:region": "us-east-1",
                                                "trials:cluster": {k: v for k, v in cluster.items() if k != "region"}}}))
    r = run_cli("-m", "orchestrate", "plan", "local-training-windows", "--stack", str(stack), "--no-quota", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    plan = json.loads(r.stdout)
    text = json.dumps(plan)
    assert "3 more action-enabled budget(s) for the spend stops past 10 hosts x 3 d" in text, text[:3000]
    est = estimate(TrialConfig.model_validate(cluster), __import__("datetime").datetime.fromisoformat(
        cluster["deadline"]) - __import__("datetime").timedelta(hours=3))
    (extra,) = [x for x in est.lines if "action-enabled" in x.item]
    # 3 budgets x the calendar days 3 h and 1 stopped day may touch
    assert (extra.quantity, extra.unit_usd, round(extra.usd, 2)) == (9, 0.10, 0.90)
    assert not [p for p in est.problems if "hosts" in p], est.problems
    print("\n" + "\n".join(f"  {x.category:<14} {x.item:<70} ${x.usd:9.2f}" for x in est.lines))
    print(f"  total ${est.total_usd:.2f} of ${est.budget_usd:.2f}")
    # the budget still refuses what it cannot pay: the same 32 hosts on the example's $100
    poor = TrialConfig.model_validate(big(budget={"total_usd": 100, "compute_usd": 24, "transfer_usd": 66,
                                                  "storage_other_usd": 10}))
    assert any(p.startswith("compute: $") for p in estimate(poor, est_start(cluster)).problems)
    # ten hosts: one budget, no extra line (the price of a four-host trial is what it was)
    ten = estimate(TrialConfig.model_validate(big(10)), est_start(cluster))
    assert not [x for x in ten.lines if "action-enabled" in x.item]


def est_start(cluster: dict):
    import datetime as dt

    return dt.datetime.fromisoformat(cluster["deadline"]) - dt.timedelta(hours=3)


@pytest.fixture
def trial(aws):
    with a_trial(aws, "big") as t:
        yield t


def spend_stops(d) -> dict[int, tuple[str, list[str]]]:
    """rank -> (the budget its spend stop is on, the instance ids it stops), as the engine recorded them."""
    out = {}
    for r in d.resources:
        if r.typ == ACTION and r.op != "skipped-create":
            rank = int(r.name.rsplit("-", 1)[1])
            out[rank] = (r.inputs["budgetName"], r.inputs["definition"]["ssmActionDefinition"]["instanceIds"])
    return out


def test_a_32_host_up_covers_every_host_and_a_destroy_keeps_the_rules(aws, trial, tmp_path):
    T, bucket, rules = trial
    cluster = big(trial=T)
    config = stack_of(cluster)
    engine = {"answers": rules, "calls": CALLS, "provider": "moto"}
    up = pulumi_run("up", config, **engine)
    assert up.returncode == 0 and up.failed is None, up.errors
    ids = {int(r.name.rsplit("-", 1)[1]): r.id for r in up.of("aws:ec2/instance:Instance")}
    assert len(ids) == 32 and len(tagged(aws, T)) == 32 and set(ids.values()) == set(tagged(aws, T))
    budgets = {r.inputs["name"] for r in up.of(BUDGET)}
    assert budgets == {f"{T}-budget", f"{T}-budget-1", f"{T}-budget-2", f"{T}-budget-3"}
    stops = spend_stops(up)
    assert sorted(stops) == list(range(32))
    for rank, (budget, stopped) in stops.items():  # each host's own stop, on its rank's budget
        assert stopped == [ids[rank]], rank
        assert budget == (f"{T}-budget" if budget_group(rank) == 0 else f"{T}-budget-{budget_group(rank)}"), rank
    per_budget = Counter(b for b, _ in stops.values())
    assert max(per_budget.values()) <= 10 and sum(per_budget.values()) == 32
    # every host depends on the deadline stop (covered from its first moment), every stop on its host and budget
    deadline = up.named(f"{T}-deadline", "aws:scheduler/schedule:Schedule").urn
    for r in up.of("aws:ec2/instance:Instance"):
        assert deadline in r.dependencies, r.name
    for r in up.of(ACTION):
        budget = next(b for b in up.of(BUDGET) if b.inputs["name"] == r.inputs["budgetName"])
        host = next(h for h in up.of("aws:ec2/instance:Instance") if h.name == f"{T}-rank-{r.name.rsplit('-', 1)[1]}")
        assert {budget.urn, host.urn} <= set(r.dependencies), r.name
    assert up.exports["budget_names"] == [f"{T}-budget", f"{T}-budget-1", f"{T}-budget-2", f"{T}-budget-3"]
    first = up.named(f"{T}-budget", BUDGET).inputs
    for extra in (b for b in up.of(BUDGET) if b.name != f"{T}-budget"):  # the same spend, limit and period
        assert {k: extra.inputs[k] for k in ("costFilters", "limitAmount", "timePeriodStart", "timeUnit")} == \
            {k: first[k] for k in ("costFilters", "limitAmount", "timePeriodStart", "timeUnit")}, extra.name
        assert [(n["notificationType"], n["threshold"]) for n in extra.inputs["notifications"]] == [("ACTUAL", 100)]
    print(f"\n32-host up: {len(ids)} instances, {len(stops)} spend stops on {len(per_budget)} budgets "
          f"({', '.join(f'{b.removeprefix(T)}: {n}' for b, n in sorted(per_budget.items()))})")
    # a destroy before preservation deletes nothing; after it, everything but the evidence
    d = pulumi_run("destroy", config, state=up.state, env=teardown_env(), **engine)
    assert d.failed and "not preserved" in d.failed and deleted(d) == [] and len(tagged(aws, T)) == 32
    preserve_into(aws, bucket, T, tmp_path)
    d = pulumi_run("destroy", config, state=up.state, env=teardown_env(), **engine)
    assert d.failed is None, d.failed
    kept = {s["name"] for s in d.steps if s["outcome"] == "retained"}
    assert tagged(aws, T) == {} and all(n.startswith(f"{T}-evidence") for n in kept), kept
    assert {f"{T}-budget", f"{T}-budget-1", f"{T}-budget-2", f"{T}-budget-3"} <= set(deleted(d))
    assert sum(n.startswith(f"{T}-spend-stop-") for n in deleted(d)) == 32
    print(f"destroy before preservation: refused, 0 deleted; after: {len(deleted(d))} deleted, kept {sorted(kept)}")


def test_a_large_trial_grows_into_a_new_budget_and_shrinks_by_the_earlier_rules(aws, trial, tmp_path):
    T, bucket, rules = trial
    engine = {"answers": rules, "calls": CALLS, "provider": "moto"}
    up = pulumi_run("up", stack_of(big(12, trial=T)), **engine)
    assert up.returncode == 0, up.errors
    assert {r.inputs["name"] for r in up.of(BUDGET)} == {f"{T}-budget", f"{T}-budget-1"}
    # grow to 24: the new ranks' stops on a new budget; no existing stop, budget or host replaced or deleted
    grown = pulumi_run("up", stack_of(big(24, trial=T)), state=up.state, **engine)
    assert grown.returncode == 0, grown.errors
    changed = [o for o in grown.ops if o["op"] in ("replace", "update", "delete-before-replace")]
    assert changed == [] and [s for s in grown.steps if s["outcome"].startswith("deleted")] == []
    assert {r.inputs["name"] for r in grown.of(BUDGET)} == {f"{T}-budget", f"{T}-budget-1", f"{T}-budget-2"}
    assert sorted(spend_stops(grown)) == list(range(24)) and len(tagged(aws, T)) == 24
    # shrinking an unpreserved trial is refused before anything changes (#54's rule): nothing deleted
    shrunk = pulumi_run("up", stack_of(big(12, trial=T)), state=grown.state, **engine)
    assert shrunk.returncode == 1 and shrunk.ops == [] and "would be terminated" in shrunk.errors, shrunk.errors
    assert len(tagged(aws, T)) == 24
    # preserved, the same shrink goes through: ranks 12-23, their stops and the emptied budget 2 deleted
    preserve_into(aws, bucket, T, tmp_path)
    shrunk = pulumi_run("up", stack_of(big(12, trial=T)), state=grown.state, **engine)
    assert shrunk.returncode == 0 and shrunk.failed is None, shrunk.errors or shrunk.failed
    gone = set(deleted(shrunk))
    assert f"{T}-budget-2" in gone and {f"{T}-rank-{r}" for r in range(12, 24)} <= gone
    assert sum(n.startswith(f"{T}-spend-stop-") for n in gone) == 12 and f"{T}-budget-1" not in gone
    assert len(tagged(aws, T)) == 12 and len(in_state(shrunk.state)) == 12

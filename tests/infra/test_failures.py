"""The AWS path when the cloud says no (#54): a first `pulumi up` that fails at each resource in turn, an
`up` that drops or replaces a host, previews — and what a `pulumi destroy --run-program` then does.

How a failed `up` is emulated (tests/pulumi_engine.py, from pulumi/pulumi's `step_executor.go`
`cancelDueToError` and `deployment_executor.go`): the failing create's step fails; steps already applying
run to their end and are recorded; nothing more starts; no delete runs. What exists then depends on which
steps were in flight, so each failure point is walked at both ends of what the engine can leave:
"cancel" — nothing after the failure (the registrations before it, in the program's order) — and "drain" —
everything that does not depend on the failed resource (every step that could have been in flight). Any
state in between is a down-closed set of the same graph, which `test_no_order_of_creates_...` covers
whole.

The walk runs the engine's own rules in this process (`plan_deletes`, `execute`: the functions the
harness's monitor runs) with the program's real registrations and its real hooks (`DeleteCheck`) against
moto's EC2 and S3; `test_the_walk_is_what_the_engine_does` runs chosen points through the whole harness —
the program started as the engine starts it, the create refused by the provider, the destroy's hooks
called over gRPC — and checks it gives the same answers. `bench/failure_sweep.py` runs every point so.
"""

from __future__ import annotations

import copy
import uuid
from types import SimpleNamespace

import pytest

from evidence.stores import preserve
from infra.plan import TrialConfig, budget_group, budget_label
from infra.teardown import DeleteCheck, NotPreserved
from pulumi_engine import (DependencyGraph, Node, StepError, execute, is_provider, plan_deletes, pulumi_run)
from test_destroy import TEARDOWN, live_instances, moto_rules, terminate_trial
from test_infra import CALLS, answers, live, stack_of
from test_teardown import a_home

TRIAL = "ltw-four"
HOST = "aws:ec2/instance:Instance"
KEPT = {"aws:s3/bucket:Bucket", "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
        "aws:s3/bucketPolicy:BucketPolicy"}
CAPACITY = ("InsufficientInstanceCapacity: We currently do not have sufficient g6e.xlarge capacity in the "
            "Availability Zone you requested (us-east-1d).")


def in_account(states: list[dict]) -> list[dict]:
    """The entries that are objects in the account: custom resources other than providers."""
    return [s for s in states if s["custom"] and not is_provider(s["type"])]


# --- what a failed `up` leaves ---------------------------------------------------------------------------

def failed_at(order: list[dict], urn: str, mode: str) -> list[dict]:
    """The state an `up` leaves whose create of `urn` failed: "cancel", the registrations before it;
    "drain", every registration that does not depend on it (`order`: an `up`'s engine states, in order)."""
    if mode == "cancel":
        return order[:[s["urn"] for s in order].index(urn)]
    nodes = [Node(s, "old") for s in order]
    graph = DependencyGraph(nodes)
    (failed,) = [n for n in nodes if n.urn == urn]
    return [n.state for n in nodes if n is not failed and id(failed) not in graph.transitive_dependencies_of(n)]


def no_nulls(v):
    """A state with null values left out: the stack's outputs, exported again by a refused run (infra/held.py
    `keep_previous`), come back without the null keys (a host's unknown public address)."""
    if isinstance(v, dict):
        return {k: no_nulls(x) for k, x in v.items() if x is not None}
    return [no_nulls(x) for x in v] if isinstance(v, list) else v


def coverage(state: list[dict], cfg: TrialConfig, trial: str = TRIAL) -> list[dict]:
    """For each host the state holds: which of its cloud-side stops exist."""
    names = {s["name"] for s in in_account(state)}
    stops_on = {s["name"]: s["inputs"].get("budgetName") for s in state if s["type"] == "aws:budgets/budgetAction:BudgetAction"}
    isolated = set(cfg.isolated_ranks())
    rows = []
    for s in state:
        if s["type"] != HOST:
            continue
        rank = int(s["name"].rsplit("-", 1)[1])
        rows.append({"rank": rank, "deadline": {f"{trial}-deadline", f"{trial}-deadline-stop", f"{trial}-deadline-sweep"}
                     <= names,
                     "transfer": None if rank not in isolated else
                     {f"{trial}-transfer-{rank}-in", f"{trial}-transfer-{rank}-out"} <= names,
                     # its spend stop, on its rank's budget (past ten hosts, one budget per ten ranks: infra/plan.py)
                     "spend": f"{trial}-spend-stop-{rank}" in names and budget_label(trial, budget_group(rank)) in
                     {s["inputs"].get("name") for s in state if s["type"] == "aws:budgets/budget:Budget"} and
                     stops_on.get(f"{trial}-spend-stop-{rank}") == budget_label(trial, budget_group(rank))})
    return rows


# --- a destroy, with the engine's rules and the program's own hooks -----------------------------------

def destroy_here(state: list[dict], teardown: list[dict], check: DeleteCheck) -> tuple[list[dict], str | None]:
    """`pulumi destroy --run-program` of `state`: the teardown program's registrations (`teardown`, its
    engine states) in destroy mode, the delete waves, and each step's before-delete hooks — the program's
    own callables, as its callback server would run them — before the delete."""
    plan = plan_deletes("destroy", state, teardown)
    hooks = {f"{TRIAL}-refuse-unpreserved": check.hook, f"{TRIAL}-destroy-gate": check.hook}

    def apply(n: Node) -> str:
        s = n.state
        for name in s.get("hooks", {}).get("before_delete", []):
            if name not in hooks:
                raise StepError(f'hook "{name}" was not registered')
            try:
                hooks[name](SimpleNamespace(urn=s["urn"], id=s["id"], name=s["name"], type=s["type"],
                                            old_inputs=s["inputs"], old_outputs=s["outputs"],
                                            new_inputs=None, new_outputs=None))
            except NotPreserved as e:
                raise StepError(f'before hook "{name}" failed: {e}') from None
        if s.get("retainOnDelete"):
            return "retained"
        return "deleted" if s["custom"] and not is_provider(s["type"]) else "dropped from the state"

    return execute(plan, apply, continue_on_error=False)


class Account:
    """moto's EC2 holding exactly `n` live hosts of the trial, tagged with `bucket`, as the state says."""

    def __init__(self, aws) -> None:
        self.ec2, self.ids = aws.client("ec2"), []

    def hosts(self, n: int, bucket: str) -> None:
        if self.ids:
            self.ec2.terminate_instances(InstanceIds=self.ids)
        self.ids = [] if n == 0 else [i["InstanceId"] for i in self.ec2.run_instances(
            ImageId="ami-0123456789abcdef0", InstanceType="g6e.xlarge", MinCount=n, MaxCount=n,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": "trial", "Value": TRIAL}, {"Key": "evidence-bucket", "Value": bucket}]}])["Instances"]]


def a_preserved_bucket(aws, tmp_path) -> str:
    bucket = f"sweep-preserved-{uuid.uuid4().hex[:10]}"
    aws.client("s3").create_bucket(Bucket=bucket)
    preserve_into(aws, bucket, TRIAL, tmp_path)
    return bucket


def judge_destroys(aws, states: dict[str, list[dict]], teardown, account: Account, unpreserved: str,
                   preserved: str) -> dict[str, dict]:
    """A destroy of each state before and after preservation. The check's answer depends only on the account:
    whether a host of the trial is live, and whether its bucket is preserved; so the states are destroyed
    grouped by that, each group against the account as it would be and one check (computed once, as in one
    destroy run) — every hook of every state's destroy still runs."""
    out: dict[str, dict] = {}
    for key, state in states.items():
        cloud = {s["urn"] for s in in_account(state)}
        out[key] = {"resources": len(cloud), "hosts": sum(s["type"] == HOST for s in state),
                    "kept": len({s["urn"] for s in in_account(state) if s["type"] in KEPT})}
    for when, bucket in (("before", unpreserved), ("after", preserved)):
        for live in (True, False):
            account.hosts(1 if live else 0, bucket)
            check = DeleteCheck(TRIAL, False, lambda: aws, dry_run=False)
            check.hold(account.ids)  # the live host is one the state holds (as the program registers it)
            for key, state in states.items():
                if bool(out[key]["hosts"]) != live:
                    continue
                steps, error = destroy_here(state, teardown, check)
                out[key][when] = {"deleted": {st["urn"] for st in steps if st["outcome"] == "deleted"},
                                  "retained": {st["urn"] for st in steps if st["outcome"] == "retained"},
                                  "error": error}
    account.hosts(0, "")
    return out


# --- fixtures --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def program():
    """The example stack's `up` (every registration in the engine's order) and the teardown program's
    registrations (`TRIALS_TEARDOWN=1 pulumi destroy --run-program` of an empty state: nothing runs a hook)."""
    cluster = live()
    up = pulumi_run("up", stack_of(cluster), answers=answers(TRIAL), calls=CALLS)
    assert up.returncode == 0 and up.failed is None, up.errors
    td = pulumi_run("destroy", stack_of(cluster), state=[], answers=answers(TRIAL), calls=CALLS, env=TEARDOWN)
    assert td.returncode == 0 and td.record["hook_calls"] == [] and in_account(td.steps) == [], td.errors
    return SimpleNamespace(up=up, order=up.record["engine_states"], teardown=td.record["engine_states"],
                           cfg=TrialConfig.model_validate(cluster), config=stack_of(cluster))


# --- the walk --------------------------------------------------------------------------------------------

def test_no_order_of_creates_leaves_a_host_without_its_deadline_stop(program):
    """Whatever the engine's parallelism, a resource is created only after everything it depends on: every
    state an `up` can leave holds, with each host, everything the host depends on. The deadline stop (the
    schedule and its role's policy) is among every host's dependencies — and it names no host, so it covers
    each one from its first moment. The stops that need a host's id depend on that host and nothing of
    another host."""
    nodes = [Node(s, "old") for s in program.order]
    graph = DependencyGraph(nodes)
    by_name = {n.state["name"]: n for n in nodes if n.state["custom"]}
    hosts = [n for n in nodes if n.state["type"] == HOST]
    assert len(hosts) == 4
    for h in hosts:
        deps = {nodes[i].state["name"] for i, n in enumerate(nodes) if id(n) in graph.transitive_dependencies_of(h)}
        assert {f"{TRIAL}-deadline", f"{TRIAL}-deadline-stop", f"{TRIAL}-deadline-sweep"} <= deps, h  # the schedule, its policies
        assert not any(d.startswith(f"{TRIAL}-rank-") for d in deps)  # no host waits for another
    for stop in [n for name, n in by_name.items() if "-transfer-" in name or "-spend-stop-" in name]:
        deps = {nodes[i].state["name"] for i, n in enumerate(nodes) if id(n) in graph.transitive_dependencies_of(stop)}
        assert len([d for d in deps if d.startswith(f"{TRIAL}-rank-")]) == 1, stop  # its own host alone
    # and in any of those states, whatever a destroy reaches first asks the check before anything is deleted:
    # every resource whose delete does something carries it, in the up's state and in the teardown's
    for states in (program.order, program.teardown):
        for st in in_account(states):
            assert st.get("retainOnDelete") or st["hooks"].get("before_delete") == [f"{TRIAL}-refuse-unpreserved"], st
            assert not st.get("retainOnDelete") or st["type"] in KEPT


@pytest.mark.parametrize("mode", ["cancel", "drain"])
def test_a_first_up_that_fails_at_each_resource(program, aws, tmp_path, mode):
    """Each of the program's 51 creates fails in turn. What exists is covered: every host by the deadline
    stop. A destroy then deletes nothing while a host exists and the trial is unpreserved; with no host
    (the failure came before the first) it deletes what exists but the evidence; after preservation,
    everything but the evidence bucket and what keeps it safe."""
    account = Account(aws)
    unpreserved = f"sweep-empty-{uuid.uuid4().hex[:10]}"
    aws.client("s3").create_bucket(Bucket=unpreserved)
    preserved = a_preserved_bucket(aws, tmp_path)
    points = [s for s in in_account(program.order)]
    assert len(points) == 51
    states = {p["urn"]: failed_at(program.order, p["urn"], mode) for p in points}
    try:
        judged = judge_destroys(aws, states, program.teardown, account, unpreserved, preserved)
    finally:
        account.hosts(0, "")
    rows = []
    for point in points:
        state = states[point["urn"]]
        cov = coverage(state, program.cfg)
        assert all(c["deadline"] for c in cov), (point["name"], cov)
        d = judged[point["urn"]]
        before, after = d["before"], d["after"]
        if d["hosts"]:
            assert before["deleted"] == set() and "is not preserved" in (before["error"] or ""), point["name"]
        else:
            assert before["error"] is None and len(before["deleted"]) == d["resources"] - d["kept"], point["name"]
        assert after["error"] is None, (point["name"], after["error"])
        assert len(after["deleted"]) == d["resources"] - d["kept"] and len(after["retained"]) == d["kept"]
        rows.append((f"{point['type'].split(':')[-1]} {point['name']}", d, cov))
    print(f"\n{mode}: create fails at | exist (hosts) | deadline stop | transfer alarms (isolated) | spend stops | "
          "destroy before preservation: deleted | after: deleted, kept")
    for name, d, cov in rows:
        iso = [c for c in cov if c["transfer"] is not None]
        print(f"  {name:52} {d['resources']:3} ({d['hosts']}) | {sum(c['deadline'] for c in cov)}/{len(cov)} | "
              f"{sum(bool(c['transfer']) for c in iso)}/{len(iso)} | {sum(c['spend'] for c in cov)}/{len(cov)} | "
              f"{len(d['before']['deleted']):2}{' refused' if d['before']['error'] else ''} | "
              f"{len(d['after']['deleted'])}, {len(d['after']['retained'])}")
    with_hosts = [r for r in rows if r[1]["hosts"]]
    print(f"{mode}: {len(rows)} failure points; {len(with_hosts)} leave a host: every one covered by the deadline "
          f"stop, and a destroy before preservation deleted "
          f"{sum(len(r[1]['before']['deleted']) for r in with_hosts)} resources at them")


@pytest.mark.parametrize("name, mode", [(f"{TRIAL}-rank-3", "drain")])  # every point: bench/failure_sweep.py
def test_the_walk_is_what_the_engine_does(program, aws, tmp_path, name, mode):
    """The whole harness at chosen points: the program started as the engine starts it, the provider refusing
    that create, the engine stopping (cancel) or letting in-flight steps finish (drain); then `TRIALS_TEARDOWN=1
    pulumi destroy --run-program` of what it left, its hooks called over gRPC against moto: refused with
    nothing deleted; after preservation, everything but the evidence deleted (the instances terminated).
    The same answers as the walk's."""
    bucket = f"walk-{uuid.uuid4().hex[:10]}"
    rules = moto_rules(bucket)
    try:
        up = pulumi_run("up", program.config, answers=rules, calls=CALLS, provider="moto",
                        faults=[{"name": name, "op": "create", "error": CAPACITY}], after_failure=mode)
        # the deployment failed (the CLI exits non-zero); under "cancel" the program itself was cut off too
        assert up.failed and "InsufficientInstanceCapacity" in up.failed and (mode == "drain" or up.returncode != 0)
        assert [o["name"] for o in up.ops if o["op"] == "failed"] == [name] and up.steps == []  # no delete ran
        state = up.state
        created = {s["urn"] for s in state}
        graph = DependencyGraph([Node(s, "old") for s in state])
        for n in graph.nodes:  # down-closed: nothing exists without what it depends on
            assert all(m.urn in created for m in graph.dependencies_of(n))
        if mode == "drain":
            assert {s["urn"] for s in in_account(state)} == \
                {s["urn"] for s in in_account(failed_at(program.order, next(s["urn"] for s in program.order
                                                                                 if s["name"] == name), "drain"))}
        assert all(c["deadline"] for c in coverage(state, program.cfg))
        hosts = sum(s["type"] == HOST for s in state)
        assert live_instances(aws) == hosts  # the provider made them in moto, tagged

        d = pulumi_run("destroy", program.config, state=state, answers=rules, calls=CALLS, env=TEARDOWN,
                       provider="moto")
        here = destroy_here(state, program.teardown, DeleteCheck(TRIAL, False, lambda: aws, dry_run=False))
        done = {st["urn"] for st in d.steps if st["outcome"] not in ("failed", "not started", "retained")
                and st["custom"] and not is_provider(st["type"])}
        assert done == {st["urn"] for st in here[0] if st["outcome"] == "deleted"}
        assert (d.failed is None) == (here[1] is None) and live_instances(aws) == hosts
        if hosts:
            assert done == set() and "is not preserved" in d.failed
            assert {h["hook"] for h in d.record["hook_calls"] if h["error"]} <= {f"{TRIAL}-refuse-unpreserved",
                                                                                  f"{TRIAL}-destroy-gate"}
            preserve_into(aws, bucket, TRIAL, tmp_path)
            d = pulumi_run("destroy", program.config, state=state, answers=rules, calls=CALLS, env=TEARDOWN,
                           provider="moto")
        assert d.failed is None, d.failed
        outcome = {st["urn"]: st["outcome"] for st in in_account(d.steps)}
        assert {u for u, o in outcome.items() if o == "retained"} == {s["urn"] for s in in_account(state)
                                                                      if s["type"] in KEPT}
        assert len(outcome) == len(in_account(state)) and live_instances(aws) == 0 and d.state == []
    finally:
        terminate_trial(aws)


def test_without_the_hooks_on_every_resource_a_failed_first_up_loses_its_network(program):
    """Why each resource carries the check (the design before #54: the gate and the instances' hooks only).
    A first `up` failed at rank 3: the gate never reached the state, so in the destroy its registration is a
    skipped create; the first waves are the leaves of what exists — the route-table associations, the
    security group's rules, the hosts' stops — all deleted before the instances' own hooks refuse."""
    state = failed_at(program.order, next(s["urn"] for s in program.order if s["name"] == f"{TRIAL}-rank-3"),
                      "drain")
    assert f"{TRIAL}-destroy-gate" not in {s["name"] for s in state}
    before_54 = [s if s["type"] == HOST else {**s, "hooks": {}} for s in copy.deepcopy(program.teardown)]
    plan = plan_deletes("destroy", state, before_54)

    def apply(n: Node) -> str:
        if n.state.get("hooks", {}).get("before_delete") and n.state["type"] == HOST:
            raise StepError("before hook refused: no preservation index")
        return "retained" if n.state.get("retainOnDelete") else "deleted"

    steps, error = execute(plan, apply, continue_on_error=False)
    deleted = {st["name"] for st in steps if st["outcome"] == "deleted" and st["custom"]}
    print(f"\nbefore #54, a destroy after a first up failed at rank 3: {len(deleted)} deleted before a host's hook "
          f"refused: {sorted(deleted)}")
    # the deepest resources go first: the hosts' spend stops (before #64 the network's rules too; the deadline
    # stop's chain now puts the hosts deeper): whatever the depth, something is deleted before a host refuses
    assert error and {f"{TRIAL}-spend-stop-0", f"{TRIAL}-spend-stop-1", f"{TRIAL}-spend-stop-2"} <= deleted
    assert f"{TRIAL}-deadline" not in deleted  # the hosts depend on it now: even so, it outlives them


# --- an `up` that would drop, replace or restart a host -------------------------------------------------

def stand_up(aws, trial: str) -> SimpleNamespace:
    """A four-host trial that is up (as `trial`): its state, its bucket and instances in moto."""
    bucket = f"running-{uuid.uuid4().hex[:10]}"
    rules = moto_rules(bucket, trial)
    cluster = live(trial=trial)
    up = pulumi_run("up", stack_of(cluster), answers=rules, calls=CALLS, provider="moto")
    assert up.returncode == 0 and up.failed is None, up.errors
    return SimpleNamespace(up=up, rules=rules, bucket=bucket, cluster=cluster, trial=trial)


@pytest.fixture(scope="module")
def standing(moto_module):
    """One running trial for the tests whose `up` is refused (they change nothing); its own trial name, since
    the check finds hosts by their tag and this one stays up while the module runs."""
    yield stand_up(moto_module, "ltw-standing")
    terminate_trial(moto_module, "ltw-standing")


@pytest.fixture
def running(aws):
    """A running trial of the test's own, for a test whose `up` goes through."""
    yield stand_up(aws, "ltw-own")
    terminate_trial(aws, "ltw-own")


def changed(cluster: dict, **edit) -> dict:
    c = copy.deepcopy(cluster)
    if "drop" in edit:
        c["hosts"] = [h for h in c["hosts"] if h["rank"] != edit["drop"]]
        c.pop("experiment", None)  # its four-rank arms need the fourth host: three hosts plan the single arm
        c["arms"] = [{"name": "single", "kind": "single", "world_size": 1, "updates": 128}]
    for rank, zone in edit.get("zone", {}).items():
        next(h for h in c["hosts"] if h["rank"] == rank)["zone"] = zone
    for rank, typ in edit.get("type", {}).items():
        next(h for h in c["hosts"] if h["rank"] == rank)["instance_type"] = typ
    c.update(edit.get("set", {}))
    return c


def preserve_into(aws, bucket: str, trial: str, root) -> None:
    """A trial home (a commitment, a result) preserved into the trial's prefix of `bucket`."""
    home = a_home(root, "local-training-windows-gpu")
    preserve(home, f"s3://{bucket}/trials/{trial}/", trial=home.name, session=aws)


@pytest.mark.parametrize("edit, what", ids=["drop", "replace", "restart"], argvalues=[
    ({"drop": 3}, "rank 3 ({}): would be terminated: its rank is no longer in trials:cluster.hosts"),
    ({"zone": {3: "us-east-1a"}}, "rank 3 ({}): would be replaced (terminated, a new one created): zone us-east-1d -> "
                                  "us-east-1a"),
    ({"type": {3: "g6e.2xlarge"}}, "rank 3 ({}): would be stopped and started again: instance type g6e.xlarge -> "
                                   "g6e.2xlarge")])
def test_an_up_that_would_drop_replace_or_restart_a_host_is_refused_before_anything_changes(standing, aws, edit, what):
    """The engine applies updates while the program runs and deletes afterwards, so a host's own hook would
    refuse only after every update: the program looks the trial's hosts up first and refuses before it
    registers anything. The state, the account and every stop are as they were (a destroy of that state is
    then the one tests/infra/test_destroy.py runs: refused, nothing deleted)."""
    up, T = standing.up, standing.trial
    cluster = changed(standing.cluster, **edit)
    if "type" in edit:
        cluster["prices"] = {"instance/g6e.2xlarge": 2.24}
        cluster["budget"] = {**cluster["budget"], "compute_usd": 30, "total_usd": 106}
    again = pulumi_run("up", stack_of(cluster), state=up.state, answers=standing.rules, calls=CALLS, provider="moto")
    rank3 = next(s["id"] for s in up.state if s["name"] == f"{T}-rank-3")
    assert again.returncode == 1 and "refusing this `pulumi up`" in again.errors, again.errors
    assert what.format(rank3) in again.errors and "Nothing has been changed" in again.errors
    assert "holds no preservation index" in again.errors and "abandon_unpreserved: true" in again.errors
    assert again.ops == [] and again.steps == [] and no_nulls(again.state) == no_nulls(up.state)
    assert live_instances(aws, T) == 4
    print(f"\n{list(edit)[0]}: refused, {len(again.ops)} steps, {len(in_account(again.state))} resources as before; "
          f"{again.errors.splitlines()[1].strip()}")
    if "drop" in edit:  # the preview `pulumi up` shows first says it already
        preview = pulumi_run("preview", stack_of(cluster), state=up.state, answers=standing.rules, calls=CALLS,
                             provider="moto")
        assert preview.returncode == 1 and "refusing this `pulumi up`" in preview.errors


def test_the_second_line_when_the_lookup_misses_a_host(standing, aws):
    """Should the program's lookup miss a host (here: EC2 answering it with no instance), the drop goes on
    to the engine's deletes — and there the host's stops are its first wave, whose hooks see the live,
    unpreserved hosts and refuse: nothing is deleted."""
    up, T = standing.up, standing.trial
    calls = {**CALLS, "aws:ec2/getInstances:getInstances": {"id": "us-east-1", "ids": [], "privateIps": [],
                                                            "publicIps": [], "ipv6Addresses": []}}
    again = pulumi_run("up", stack_of(changed(standing.cluster, drop=3)), state=up.state, answers=standing.rules,
                       calls=calls, provider="moto")
    assert again.returncode == 0 and again.failed and "is not preserved" in again.failed, again.failed
    assert [st for st in again.steps if st["outcome"] not in ("failed", "not started")] == []
    assert {st["name"] for st in again.steps if st["outcome"] == "failed"} <= {
        f"{T}-transfer-3", f"{T}-transfer-3-in", f"{T}-transfer-3-out", f"{T}-spend-stop-3"}
    assert live_instances(aws, T) == 4


def test_a_destroy_run_without_teardown_set_refuses_all_the_same(standing, aws):
    """`pulumi destroy --run-program` without `TRIALS_TEARDOWN=1` (before the deadline the program then runs as
    for an `up`): the program cannot tell which operation runs it, and the check it registers refuses every
    delete of a live, unpreserved trial, whatever the operation — the first wave is refused, nothing goes."""
    up = standing.up
    d = pulumi_run("destroy", stack_of(standing.cluster), state=up.state, answers=standing.rules, calls=CALLS,
                   provider="moto")
    assert d.failed and "is not preserved" in d.failed, d.failed or d.errors
    assert [st for st in in_account(d.steps) if st["outcome"] not in ("failed", "not started")] == []
    assert live_instances(aws, standing.trial) == 4


def test_a_preserved_trial_moves_a_host_through_a_capacity_refusal_then_drops_it(running, aws, tmp_path):
    """A preserved trial, command after command. (1) Rank 3 is moved to us-east-1a and the replacement's create
    fails (no capacity there): the engine stops; the old host and every stop of it are as they were — their
    updates to the new id never ran — and nothing is deleted. (2) Moved again, it is replaced, create before
    delete: the new host is created during the program and is covered by the deadline stop at once (it selects
    by tag), its own stops are updated in place to the new id, the old host is deleted after the program.
    (3) Dropped: the `up` goes on with no update at all (the deadline stop selects by tag, each spend stop and
    alarm names one host); rank 3's stops go, then rank 3, dependents first; every other host keeps every stop,
    and no zone's subnet is deleted while the account holds it."""
    up, T = running.up, running.trial
    preserve_into(aws, running.bucket, T, tmp_path)
    moved = changed(running.cluster, zone={3: "us-east-1a"})
    old3 = next(s["id"] for s in up.state if s["name"] == f"{T}-rank-3")
    # (1) no capacity in the new zone
    refused = pulumi_run("up", stack_of(moved), state=up.state, answers=running.rules, calls=CALLS, provider="moto",
                         faults=[{"name": f"{T}-rank-3", "op": "replace", "error": CAPACITY}])
    assert refused.failed and "InsufficientInstanceCapacity" in refused.failed and refused.steps == []
    assert [o["op"] for o in refused.ops if o["name"] == f"{T}-rank-3"] == ["failed"]
    before = {s["urn"]: s for s in up.state}
    for st in refused.state:
        if st["type"] in ("aws:ec2/instance:Instance", "aws:cloudwatch/metricAlarm:MetricAlarm",
                          "aws:budgets/budgetAction:BudgetAction", "aws:scheduler/schedule:Schedule"):
            was = before[st["urn"]]  # the host and every stop as they were (the SDK's dependency order may vary)
            assert (st["id"], st["inputs"], st["outputs"]) == (was["id"], was["inputs"], was["outputs"]), st["name"]
    cov = coverage(refused.state, TrialConfig.model_validate(running.cluster), T)
    assert len(cov) == 4 and all(c["deadline"] and c["spend"] and c["transfer"] is not False for c in cov)
    assert live_instances(aws, T) == 4
    # (2) moved again: replaced
    again = pulumi_run("up", stack_of(moved), state=refused.state, answers=running.rules, calls=CALLS,
                       provider="moto")
    assert again.returncode == 0 and again.failed is None, again.failed or again.errors
    ops = {(o["name"], o["op"]) for o in again.ops if o["op"] != "same"}
    (rep,) = [o for o in again.ops if o["op"] == "replace"]
    assert rep["name"] == f"{T}-rank-3" and rep["old_id"] == old3 and "subnetId" in rep["changed"]
    assert {(f"{T}-transfer-3-in", "update"), (f"{T}-transfer-3-out", "update"), (f"{T}-spend-stop-3", "update")} <= ops
    assert not {n for n, o in ops if o == "update"} & {f"{T}-deadline", f"{T}-deadline-stop"}
    assert {st["name"]: st["outcome"] for st in again.steps}[f"{T}-rank-3"] == "deleted (replaced)"
    new3 = next(s for s in again.state if s["name"] == f"{T}-rank-3")
    assert new3["id"] == rep["new_id"] != old3 and live_instances(aws, T) == 4
    # (3) dropped
    dropped = changed(running.cluster, drop=3)
    gone = pulumi_run("up", stack_of(dropped), state=again.state, answers=running.rules, calls=CALLS, provider="moto")
    assert gone.returncode == 0 and gone.failed is None, gone.failed or gone.errors
    assert [o for o in gone.ops if o["op"] not in ("same", "create")] == []  # no update, no replacement
    assert "which is preserved" in " ".join(m["message"] for m in gone.logs)
    deleted = {st["name"] for st in gone.steps if st["outcome"] not in ("failed", "not started")}
    assert deleted == {f"{T}-rank-3", f"{T}-spend-stop-3", f"{T}-transfer-3", f"{T}-transfer-3-in",
                       f"{T}-transfer-3-out"}  # the zones' subnets stay while the account holds them
    wave = {st["name"]: st["wave"] for st in gone.steps}
    assert max(wave[f"{T}-transfer-3-in"], wave[f"{T}-spend-stop-3"]) < wave[f"{T}-rank-3"]
    cov = coverage(gone.state, TrialConfig.model_validate(dropped), T)
    assert len(cov) == 3 and all(c["deadline"] and c["spend"] for c in cov) and live_instances(aws, T) == 3


def test_a_replaced_host_left_pending_is_deleted_only_after_preservation(running, aws, tmp_path):
    """A replacement whose old host's delete failed leaves both hosts in the stack (the old one pending
    deletion, as the engine keeps it). A destroy then — the trial no longer preserved (a commitment anchored
    after its preservation) — deletes nothing; preserved again, it deletes both hosts."""
    up, T = running.up, running.trial
    preserve_into(aws, running.bucket, T, tmp_path)
    again = pulumi_run("up", stack_of(changed(running.cluster, zone={3: "us-east-1a"})), state=up.state,
                       answers=running.rules, calls=CALLS, provider="moto",
                       faults=[{"name": f"{T}-rank-3", "op": "delete", "error": "RequestLimitExceeded"}])
    assert again.failed and "RequestLimitExceeded" in again.failed
    hosts3 = [s for s in again.state if s["name"] == f"{T}-rank-3"]
    assert len(hosts3) == 2 and [bool(s.get("delete")) for s in hosts3].count(True) == 1
    assert live_instances(aws, T) == 5
    anchor = f"trials/{T}/anchors/local-training-windows-gpu/ab12/99999999.json"
    aws.client("s3").put_object(Bucket=running.bucket, Key=anchor, Body=b"{}")
    d = pulumi_run("destroy", stack_of(running.cluster), state=again.state, answers=running.rules, calls=CALLS,
                   env=TEARDOWN, provider="moto")
    assert d.failed and "anchored after its newest preservation" in d.failed
    assert [st for st in in_account(d.steps) if st["outcome"] not in ("failed", "not started")] == []
    assert live_instances(aws, T) == 5
    aws.client("s3").delete_object(Bucket=running.bucket, Key=anchor)
    d = pulumi_run("destroy", stack_of(running.cluster), state=again.state, answers=running.rules, calls=CALLS,
                   env=TEARDOWN, provider="moto")
    assert d.failed is None, d.failed
    assert sum(st["name"] == f"{T}-rank-3" and st["outcome"].startswith("deleted") for st in d.steps) == 2
    assert live_instances(aws, T) == 0 and d.state == []


def test_the_capacity_recovery_moves_a_host_and_deletes_nothing(program):
    """The study's own story: the first `up` runs out of capacity for rank 3 in us-east-1d (hosts 0-2 are up);
    rank 3 goes to us-east-1e and `pulumi up` again. No host changes, so nothing is asked of the store; rank 3
    is created in the new zone; the subnet of us-east-1d, which no host uses now, stays (its delete during a
    live trial would be refused); every host has every stop. (The account is the mocks' state: nothing here
    reads it but the program's lookups.)"""
    first = pulumi_run("up", program.config, answers=answers(TRIAL), calls=CALLS,
                       faults=[{"name": f"{TRIAL}-rank-3", "error": CAPACITY}], after_failure="drain")
    assert first.failed and sum(s["type"] == HOST for s in first.state) == 3
    moved = changed(program.config["trials:cluster"] | {"region": "us-east-1"}, zone={3: "us-east-1e"})
    again = pulumi_run("up", stack_of(moved), state=first.state, answers=answers(TRIAL), calls=CALLS)
    assert again.returncode == 0 and again.failed is None, again.failed or again.errors
    assert again.steps == [] and [o for o in again.ops if o["op"] in ("replace", "update")] == []
    assert {o["name"] for o in again.ops if o["op"] == "create"} >= {f"{TRIAL}-rank-3", f"{TRIAL}-subnet-us-east-1e",
                                                                     f"{TRIAL}-transfer-3-in", f"{TRIAL}-spend-stop-3"}
    assert f"{TRIAL}-subnet-us-east-1d" in {s["name"] for s in again.state}
    cov = coverage(again.state, TrialConfig.model_validate(moved))
    assert len(cov) == 4 and all(c["deadline"] and c["spend"] and c["transfer"] is not False for c in cov)


def test_abandoning_lets_the_up_go_on_and_says_so_in_the_bucket(running, aws):
    up, T = running.up, running.trial
    cluster = changed(running.cluster, drop=3, set={"abandon_unpreserved": True})
    again = pulumi_run("up", stack_of(cluster), state=up.state, answers=running.rules, calls=CALLS, provider="moto")
    assert again.returncode == 0 and again.failed is None, again.failed or again.errors
    assert "which is abandoned" in " ".join(m["message"] for m in again.logs)
    found = aws.client("s3").list_objects_v2(Bucket=running.bucket, Prefix=f"trials/{T}/abandoned/")
    assert found["KeyCount"] >= 1 and live_instances(aws, T) == 3


def test_a_zone_added_later_renumbers_no_subnet(program):
    """A subnet's CIDR is ForceNew and replacing a subnet replaces its hosts: a fifth host in a zone that
    sorts first (us-east-1a) takes a free CIDR, and every existing subnet, host and stop is the same."""
    up, T = program.up, TRIAL
    cluster = program.config["trials:cluster"] | {"region": "us-east-1"}
    cluster["hosts"] = cluster["hosts"] + [{"rank": 4, "instance_type": "g6e.xlarge", "zone": "us-east-1a"}]
    cluster["budget"] = {**cluster["budget"], "compute_usd": 34, "total_usd": 110}
    again = pulumi_run("up", stack_of(cluster), state=up.state, answers=answers(TRIAL), calls=CALLS)
    assert again.returncode == 0 and again.failed is None, again.failed or again.errors
    assert [o for o in again.ops if o["op"] == "replace"] == [] and again.steps == []
    assert [o["name"] for o in again.ops if o["op"] == "update"] == [f"{T}-budget"]  # its limit, raised here
    new = {o["name"] for o in again.ops if o["op"] == "create"}
    assert {f"{T}-subnet-us-east-1a", f"{T}-rank-4", f"{T}-spend-stop-4"} <= new
    cidrs = {r.name: r.inputs["cidrBlock"] for r in again.of("aws:ec2/subnet:Subnet")}
    assert cidrs == {f"{T}-subnet-us-east-1c": "10.42.0.0/24", f"{T}-subnet-us-east-1d": "10.42.1.0/24",
                     f"{T}-subnet-us-east-1a": "10.42.2.0/24"}


# --- previews --------------------------------------------------------------------------------------------

def test_a_preview_creates_nothing_and_knows_no_id(aws):
    """`pulumi preview` (and the preview `pulumi up` shows before "yes?"): every create planned, nothing made
    in the account, no id known to the program (its outputs unknown), no hook run (no delete planned)."""
    bucket = f"preview-{uuid.uuid4().hex[:10]}"
    pv = pulumi_run("preview", stack_of(live()), answers=moto_rules(bucket), calls=CALLS, provider="moto")
    assert pv.returncode == 0 and pv.failed is None, pv.errors
    creates = [o for o in pv.ops if o["op"] == "create"]
    assert len([o for o in creates if o["type"].startswith("aws:")]) == 51 and all(o["preview"] for o in creates)
    assert all(r.id == "" for r in pv.resources if r.custom)
    assert pv.record["hook_calls"] == [] and live_instances(aws) == 0
    assert bucket not in {b["Name"] for b in aws.client("s3").list_buckets()["Buckets"]}
    assert all(h["instance_id"] is None or "Unknown" in str(h["instance_id"]) for h in pv.exports.get("hosts", []))

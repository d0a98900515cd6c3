"""The promise outside the state (#65): instances of the trial the stack does not hold, a stack whose trial,
region or account changes under it, two stacks that use one trial name, and a `TRIALS_TEARDOWN` left in a shell
— each walked over time, command after command, through the engine harness (tests/pulumi_engine.py) with
moto's EC2 as the account: the program's instance look-ups are answered by moto (`provider="moto"`), so it sees
what the account holds, not what the state says.

How an interrupted `up` is emulated (pulumi/pulumi, read: `pkg/backend/snapshot.go` `doCreate` marks a create
pending before the provider's call and completes it after; `Snap` carries every pending CREATE into each later
checkpoint; `pkg/resource/deploy/deployment_executor.go` `printPendingOperationsWarning`): the create of rank 3
reaches EC2 and the engine goes away; the checkpoint keeps a pending CREATE with no id; the next `up` warns
with the engine's words and, since a pending create is no resource of the checkpoint, creates rank 3 again.
"""

from __future__ import annotations

import copy
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from pulumi_engine import pulumi_run, teardown_env
from test_destroy import live_instances, moto_rules, terminate_trial
from test_failures import preserve_into
from test_infra import CALLS, live, stack_of

HOST = "aws:ec2/instance:Instance"


def tagged(aws, trial: str) -> dict[str, str]:
    """The trial's live instances by id -> rank tag, as EC2 has them."""
    out = {}
    for r in aws.client("ec2").describe_instances(Filters=[{"Name": "tag:trial", "Values": [trial]}])["Reservations"]:
        for i in r["Instances"]:
            if i["State"]["Name"] != "terminated":
                out[i["InstanceId"]] = next((t["Value"] for t in i.get("Tags", []) if t["Key"] == "rank"), None)
    return out


def in_state(state: list[dict]) -> set[str]:
    return {s["id"] for s in state if s["type"] == HOST and s.get("id") and not s.get("pending")}


def deleted(d) -> list[str]:
    return [st["name"] for st in d.steps if st["custom"] and st["outcome"].startswith("deleted")]


@contextmanager
def a_trial(aws, prefix: str):
    """A trial of the test's own in moto: (its name, its evidence bucket, the mocks' answers for it); its instances
    and schedules gone at the end."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    bucket = f"{name}-evidence"
    aws.client("s3").create_bucket(Bucket=bucket)
    try:
        yield name, bucket, moto_rules(bucket, name)
    finally:
        terminate_trial(aws, name)


@pytest.fixture
def trial(aws):
    with a_trial(aws, "out") as t:
        yield t


def test_an_interrupted_up_leaves_a_host_the_state_does_not_hold_and_nothing_deletes_past_it(aws, trial, tmp_path):
    T, bucket, rules = trial
    config = stack_of(live(trial=T))
    engine = {"answers": rules, "calls": CALLS, "provider": "moto"}
    # 1. the first `up` goes away while EC2 creates rank 3
    first = pulumi_run("up", config, faults=[{"name": f"{T}-rank-3", "op": "create", "interrupt": True}], **engine)
    assert first.failed and "interrupted" in first.failed
    assert [p["name"] for p in first.pending] == [f"{T}-rank-3"]
    orphan = next(i for i, r in tagged(aws, T).items() if r == "3")
    assert len(tagged(aws, T)) == 4 and len(in_state(first.state)) == 3 and orphan not in in_state(first.state)
    # 2. the next `up`: the engine warns of the pending create and creates rank 3 again; the program sees one
    # instance per rank, which the state may hold (a failed up's hosts look the same), and goes on
    second = pulumi_run("up", config, state=first.state, **engine)
    assert second.returncode == 0 and second.failed is None, second.errors
    assert "1 pending operations from previous deployment" in second.warnings[0] and f"{T}-rank-3" in second.warnings[0]
    assert len(tagged(aws, T)) == 5 and len(in_state(second.state)) == 4 and orphan not in in_state(second.state)
    assert orphan not in {h["instance_id"] for h in second.exports["instances_held"]}
    print(f"\nafter the interrupted up and the next: {len(tagged(aws, T))} live instances of {T} by tag, "
          f"{len(in_state(second.state))} in the state; outside: {orphan} (rank 3)")
    # 3. any later `up` refuses before it changes anything: two instances of rank 3, which one is outside
    third = pulumi_run("up", config, state=second.state, **engine)
    assert third.returncode == 1 and third.ops == [], third.errors
    held3 = next(s["id"] for s in second.state if s["name"] == f"{T}-rank-3" and not s.get("pending"))
    assert f"rank 3 has 2 live instances" in third.errors and f"the stack holds {held3}: {orphan} is outside it" in \
        third.errors and "terminate-instances" in third.errors
    # 4. a destroy, before preservation and after it: the orphan refuses it, nothing is deleted
    for when in ("before", "after"):
        if when == "after":
            preserve_into(aws, bucket, T, tmp_path)
        d = pulumi_run("destroy", config, state=second.state, env=teardown_env(), **engine)
        assert d.failed and f"instance(s) of trial {T} that this stack does not hold exist: {orphan} (rank 3" in d.failed
        assert deleted(d) == [] and len(tagged(aws, T)) == 5, (when, deleted(d))
        print(f"destroy {when} preservation: refused, {len(deleted(d))} deleted, {len(tagged(aws, T))} live")
    # 5. the orphan ended as the refusal says: the preserved trial's destroy deletes everything but the evidence
    aws.client("ec2").terminate_instances(InstanceIds=[orphan])
    d = pulumi_run("destroy", config, state=second.state, env=teardown_env(), **engine)
    assert d.failed is None, d.failed
    assert len(tagged(aws, T)) == 0 and f"{T}-deadline" in deleted(d)
    assert aws.client("s3").list_objects_v2(Bucket=bucket)["KeyCount"] > 0  # the evidence stays
    print(f"orphan terminated; destroy deleted {len(deleted(d))} resources, {len(tagged(aws, T))} instances left")


def test_a_stack_does_not_change_trial_region_or_account_under_its_hosts(aws, trial):
    T, _, rules = trial
    cluster = live(trial=T)
    engine = {"calls": CALLS, "provider": "moto"}
    up = pulumi_run("up", stack_of(cluster), answers=rules, **engine)
    assert up.returncode == 0, up.errors
    # a run the plan refuses (a deadline already past) keeps the stack's record: the SDK registers the exports so
    # far even for a failed program, and the program exports the previous ones before anything can refuse
    late = {**copy.deepcopy(cluster), "deadline": "2020-01-01T00:00:00+00:00"}
    refused = pulumi_run("up", stack_of(late), state=up.state, answers=rules, **engine)
    assert refused.returncode == 1 and "has passed" in refused.errors
    stack_outputs = next(s for s in refused.state if s["type"] == "pulumi:pulumi:Stack")["outputs"]
    assert stack_outputs["trial"] == T and len(stack_outputs["instances_held"]) == 4
    up.record["state"] = refused.state  # what the next runs start from
    renamed = f"{T}-b"
    for edit, said in (({"trial": renamed}, f"trial {T} -> {renamed}"), ({"region": "us-west-2"}, "region us-east-1 -> us-west-2")):
        moved = {**copy.deepcopy(cluster), **edit}
        if "region" in edit:
            moved["hosts"] = [{**h, "zone": "us-west-2a"} for h in moved["hosts"]]
        again = pulumi_run("up", stack_of(moved), state=up.state, answers=moto_rules(f"{T}-evidence", moved["trial"]),
                           **engine)
        assert again.returncode == 1 and again.ops == [], again.errors
        assert "refusing this `pulumi up`: the stack holds trial" in again.errors and said in again.errors
        assert len(tagged(aws, T)) == 4 and tagged(aws, renamed) == {}
        d = pulumi_run("destroy", stack_of(moved), state=up.state, answers=rules, env=teardown_env(), **engine)
        assert d.failed is None and d.returncode == 1 and "refusing this destroy" in d.errors and d.steps == []
        print(f"\n{said}: up refused ({len(again.ops)} steps), destroy refused; {len(tagged(aws, T))} hosts of {T}")


def test_two_stacks_do_not_share_a_trial_name(aws, trial):
    T, _, rules = trial
    config = stack_of(live(trial=T))
    first = pulumi_run("up", config, answers=rules, calls=CALLS, provider="moto", stack="first")
    assert first.returncode == 0, first.errors
    second = pulumi_run("up", config, answers=rules, calls=CALLS, provider="moto", stack="second")
    assert second.returncode == 1 and second.ops == [], second.errors
    assert "is stack organization/trials/first's: trial" in second.errors and len(tagged(aws, T)) == 4


def test_a_teardown_setting_left_in_the_shell_does_not_turn_an_up_into_one(aws, trial):
    """An `up` that resizes a host of an unpreserved trial, with `TRIALS_TEARDOWN=1` exported long ago: the
    program does what `up` does — the look-up, and the refusal of a stop/start — and says why."""
    T, _, rules = trial
    cluster = live(trial=T)
    up = pulumi_run("up", stack_of(cluster), answers=rules, calls=CALLS, provider="moto")
    resized = copy.deepcopy(cluster)
    resized["hosts"][3]["instance_type"] = "g6e.2xlarge"
    resized["prices"] = {"instance/g6e.2xlarge": 2.24}
    resized["budget"] = {**resized["budget"], "compute_usd": 30, "total_usd": 106}
    again = pulumi_run("up", stack_of(resized), state=up.state, answers=rules, calls=CALLS, provider="moto",
                       env={"TRIALS_TEARDOWN": "1"})
    assert again.returncode == 1 and again.ops == []
    assert "would be stopped and started again" in again.errors
    assert any("TRIALS_TEARDOWN=1 names no request file: this run does what `pulumi up` does" in m["message"]
               for m in again.logs)


def test_orchestrate_destroy_is_the_teardown_and_a_copied_request_is_not(aws, trial, tmp_path, monkeypatch):
    """`orchestrate destroy --stack test` runs `pulumi destroy --run-program` (a stand-in CLI that runs the program
    through the harness, tests/standin/pulumi) with a request only that run carries: past the deadline the teardown
    registers what the stack holds and, the trial preserved, deletes it. The same CLI run from a shell that copied
    the request's value afterwards, or with `TRIALS_TEARDOWN=1`, is an `up` of a past deadline: refused, nothing
    deleted. The request file is gone once the destroy ends."""
    import datetime as dt
    import json
    import os
    import subprocess

    from conftest import ROOT, run_cli

    T, bucket, rules = trial
    cluster = live(trial=T)
    up = pulumi_run("up", stack_of(cluster), answers=rules, calls=CALLS, provider="moto")
    assert up.returncode == 0, up.errors
    preserve_into(aws, bucket, T, tmp_path)
    past = {**cluster, "deadline": (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)).isoformat()}
    harness = tmp_path / "harness.json"
    harness.write_text(json.dumps({"config": stack_of(past), "state": up.state, "answers": rules, "calls": CALLS,
                                   "provider": "moto"}))
    monkeypatch.setenv("PATH", f"{ROOT / 'tests' / 'standin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PULUMI_HARNESS", str(harness))
    monkeypatch.setenv("TRIALS_TEARDOWN", "1")  # a value left in the shell: the CLI alone, as a user would type it
    r = subprocess.run(["pulumi", "destroy", "--run-program", "--stack", "test", "--yes"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    got = json.loads(harness.read_text())["result"]
    assert r.returncode != 0 and "has passed" in got["errors"] and got["steps"] == [], got["errors"]
    assert "names no request file: this run does what `pulumi up` does" in got["errors"]
    monkeypatch.delenv("TRIALS_TEARDOWN")
    r = run_cli("-m", "orchestrate", "destroy", "--stack", "test", "--yes")
    got = json.loads(harness.read_text())["result"]
    assert r.returncode == 0, r.stdout + r.stderr + got["errors"]
    assert got["failed"] is None and tagged(aws, T) == {} and f"{T}-deadline" in deleted(SimpleNamespace(**got))
    assert not Path(got["teardown"]).exists()  # the request went with the run
    # the request's value copied into another shell afterwards: the file is gone, the run is an `up`
    harness.write_text(json.dumps({**json.loads(harness.read_text()), "state": up.state}))
    monkeypatch.setenv("TRIALS_TEARDOWN", got["teardown"])
    r = subprocess.run(["pulumi", "destroy", "--run-program", "--stack", "test", "--yes"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    again = json.loads(harness.read_text())["result"]
    assert r.returncode != 0 and "has passed" in again["errors"] and again["steps"] == []
    print(f"\norchestrate destroy: {len(deleted(SimpleNamespace(**got)))} deleted; TRIALS_TEARDOWN=1 or a copied "
          "request: refused as an up past its deadline, 0 deleted")


def test_what_the_up_refuses_is_what_the_stack_does_not_hold():
    """Two live instances of a rank that the stack's record both holds (a replacement whose old copy's delete has not
    run yet: this `up` deletes it) and a host whose `pulumi-stack` tag names the stack under an old name (`pulumi
    stack rename`) are the stack's own; a second instance the record lacks, another stack's, or one no rank tags are
    not."""
    from infra.existing import Existing, SeenHost, outside_problems
    from infra.held import Held
    from infra.plan import TrialConfig

    cfg = TrialConfig.model_validate(live(trial="out-unit"))
    me = "organization/trials/test"

    def host(iid: str, rank: int | None, stack: str | None = me) -> SeenHost:
        return SeenHost(instance_id=iid, rank=rank, stack=stack)

    held = Held(trial="out-unit", region="us-east-1", instances={"i-000000000000000a1": 3, "i-000000000000000a2": 3,
                                                                  "i-000000000000000b1": 0})
    both = Existing(hosts=[host("i-000000000000000a1", 3), host("i-000000000000000a2", 3)])
    assert outside_problems(cfg, both, held, me) == []
    renamed = Existing(hosts=[host("i-000000000000000b1", 0, "organization/trials/old-name")])
    assert outside_problems(cfg, renamed, held, me) == []
    extra = Existing(hosts=[host("i-000000000000000a1", 3), host("i-000000000000000c1", 3)])
    (p,) = outside_problems(cfg, extra, held, me)
    assert "the stack holds i-000000000000000a1: i-000000000000000c1 is outside it" in p
    (p,) = outside_problems(cfg, Existing(hosts=[host("i-000000000000000d1", 1, "organization/trials/other")]), held, me)
    assert "is stack organization/trials/other's" in p
    (p,) = outside_problems(cfg, Existing(hosts=[host("i-000000000000000e1", None)]), held, me)
    assert "no rank" in p
    no_record = Existing(hosts=[host("i-000000000000000f1", 2), host("i-000000000000000f2", 2)])
    (p,) = outside_problems(cfg, no_record, Held(), me)
    assert "one of them at most" in p


def test_orchestrate_destroy_without_the_cli_refuses(tmp_path):
    import os
    import sys

    from conftest import run_cli

    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(bare)  # no pulumi on it
        r = run_cli("-m", "orchestrate", "destroy", "--stack", "test")
    finally:
        os.environ["PATH"] = env_path
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and "put the pulumi CLI on PATH" in said and "Traceback" not in said, said


def test_a_deadline_stop_the_stack_does_not_hold_refuses_the_destroy_until_it_is_deleted(aws, trial, tmp_path):
    """The create of the deadline stop's schedule reaches the cloud and the engine goes away: the next `up` makes
    another (a schedule is autonamed: no create is refused), and a destroy would leave the first running every
    minute, with no stack to end it."""
    T, bucket, rules = trial
    config = stack_of(live(trial=T))
    engine = {"answers": rules, "calls": CALLS, "provider": "moto"}
    sched = aws.client("scheduler")

    def stops() -> list[str]:
        return [s["Name"] for s in sched.list_schedules(NamePrefix=f"{T}-deadline-")["Schedules"]]

    first = pulumi_run("up", config, faults=[{"name": f"{T}-deadline", "type": "aws:scheduler/schedule:Schedule",
                                              "op": "create", "interrupt": True}], **engine)
    assert first.failed and [p["name"] for p in first.pending] == [f"{T}-deadline"]
    (stray,) = stops()
    assert tagged(aws, T) == {}  # every host depends on its deadline stop: none was started
    second = pulumi_run("up", config, state=first.state, **engine)
    assert second.returncode == 0, second.errors
    held = next(s["outputs"]["name"] for s in second.state if s["name"] == f"{T}-deadline" and not s.get("pending")
                and s["type"] == "aws:scheduler/schedule:Schedule")
    assert sorted(stops()) == sorted([stray, held]) and len(tagged(aws, T)) == 4
    preserve_into(aws, bucket, T, tmp_path)
    d = pulumi_run("destroy", config, state=second.state, env=teardown_env(), **engine)
    assert d.failed and f"deadline stop(s) of trial {T} that this stack does not hold exist: {stray}" in d.failed, d.failed
    assert f"aws scheduler delete-schedule --name {stray}" in d.failed and deleted(d) == []
    assert len(stops()) == 2 and len(tagged(aws, T)) == 4
    print(f"\ndestroy with a stray deadline stop: refused, {len(deleted(d))} deleted, {len(stops())} stops live")
    sched.delete_schedule(Name=stray)  # as the refusal says
    d = pulumi_run("destroy", config, state=second.state, env=teardown_env(), **engine)
    assert d.failed is None, d.failed
    # the refused destroy's program was ended by the engine, its lease unreleased: on this machine, passed over at once
    assert any("ended without releasing its lease" in m["message"] and "its process is gone from this machine" in
               m["message"] for m in d.logs if m["severity"] == "WARNING"), [m["message"][:200] for m in d.logs]
    assert stops() == [] and tagged(aws, T) == {}
    print(f"stray deleted; destroy deleted {len(deleted(d))}: {len(stops())} stops, {len(tagged(aws, T))} instances left")

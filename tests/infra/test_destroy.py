"""`pulumi destroy` as the engine runs it, on the program's real resource graph (#31 items 3 and 4): the
program's `up` recorded through the engine harness (every resource with its parent, dependencies,
property dependencies, provider, hooks and options), then `TRIALS_TEARDOWN=1 pulumi destroy
--run-program` through the same harness: the engine's delete waves (tests/pulumi_engine.py, after
`ScheduleDeletes`), the gate's hook run in the program's process against moto's S3.

A refused destroy deletes nothing: the gate is the whole first wave and its refusal cancels the rest.
A preserved trial's destroy ends without error, gate first, with every resource deleted but the
evidence bucket and what keeps it safe, which stay. The hooks on the instances alone — the design
before #31 — are shown to let the guards and the network go before any refusal."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from evidence.stores import preserve
from pulumi_engine import (STACK_TYPE, DependencyGraph, Node, StepError, execute, is_provider, plan_deletes,
                           pulumi_run)
from test_infra import CALLS, answers, live, stack_of

ROOT = Path(__file__).resolve().parents[2]
TRIAL = "ltw-four"
GATE = f"{TRIAL}-destroy-gate"
KEPT = {"aws:s3/bucket:Bucket", "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
        "aws:s3/bucketPolicy:BucketPolicy"}
TEARDOWN = {"TRIALS_TEARDOWN": "1"}


def cloud(state_or_steps: list[dict]) -> list[dict]:
    """The entries that are objects in the account: custom resources other than providers."""
    return [s for s in state_or_steps if s["custom"] and not is_provider(s["type"])]


@pytest.fixture
def stack(aws):
    """The example stack's `pulumi up`, its bucket created in moto (a name of its own: moto's server is the
    session's, and a bucket another test preserved into would pass the gate)."""
    bucket = f"gate-evidence-{uuid.uuid4().hex[:12]}"
    rules = [r for r in answers(TRIAL) if r["type"] != "aws:s3/bucket:Bucket"] + [
        {"type": "aws:s3/bucket:Bucket", "id": bucket, "outputs": {"bucket": bucket}}]
    config = stack_of(live())
    up = pulumi_run("up", config, answers=rules, calls=CALLS)
    assert up.returncode == 0 and up.failed is None, up.errors
    aws.client("s3").create_bucket(Bucket=bucket)
    return up, config, rules, bucket


def destroy(up, config, rules, state=None, **kw):
    return pulumi_run("destroy", config, state=up.state if state is None else state, answers=rules, calls=CALLS,
                      env=TEARDOWN, **kw)


def test_the_gate_depends_on_every_resource_of_the_stack(stack):
    up, *_ = stack
    gate = up.named(GATE)
    assert (gate.typ, gate.custom) == ("trials:infra:DestroyGate", False)
    assert gate.hooks == {"before_delete": [GATE]} and GATE in up.hooks
    assert gate.inputs["bucket"] == stack[3]  # what its hook reads, from the gate's own state
    customs = {r.urn for r in up.resources if r.custom}
    assert customs and customs <= set(gate.dependencies)  # every AWS resource, by name, in the state
    # and through them (parents, providers) everything else: the engine's own closure of its dependencies
    nodes = [Node(s, "old") for s in up.state]
    graph = DependencyGraph(nodes)
    (g,) = [n for n in nodes if n.urn == gate.urn]
    assert {n.urn for n in nodes if id(n) in graph.transitive_dependencies_of(g)} == {s["urn"] for s in up.state} - {gate.urn}


def test_a_refused_destroy_deletes_nothing(stack):
    up, config, rules, bucket = stack
    n = len(cloud(up.state))
    d = destroy(up, config, rules)
    assert d.returncode == 0, d.errors  # the program ran; the engine's deployment is what failed
    assert d.record["waves"][0] == [up.named(GATE).urn]  # the first wave is the gate alone
    assert d.failed and "before hook" in d.failed and "holds no preservation index" in d.failed, d.failed
    deleted = [s for s in cloud(d.steps) if s["outcome"] not in ("failed", "not started")]
    print(f"\nrefused destroy: {len(deleted)} of N = {n} resources deleted; "
          f"{len(d.record['waves'])} waves, the first: {[u.split('::')[-1] for u in d.record['waves'][0]]}")
    assert deleted == [] and n == 38
    assert {s["outcome"] for s in d.steps if s["name"] != GATE} == {"not started"}
    assert len(cloud(d.state)) == n  # the stack still holds every resource
    # --continue-on-error does not get past it either: every later step depends on nothing that failed but
    # the gate depends on all of them, and the engine skips whatever a failed step depends on
    c = destroy(up, config, rules, continue_on_error=True)
    assert [s for s in cloud(c.steps) if s["outcome"] not in ("failed", "not started")] == []


def test_a_preserved_trial_is_destroyed_gate_first_and_its_evidence_kept(stack, aws, tmp_path):
    up, config, rules, bucket = stack
    home = tmp_path / "local-training-windows-gpu"
    (home / "runs").mkdir(parents=True)
    (home / "commitments.jsonl").write_text('{"entry": 0}\n')
    (home / "runs" / "result.json").write_text('{"loss": 1.5}\n')
    preserve(home, f"s3://{bucket}/trials/{TRIAL}/", trial=home.name, session=aws)
    d = destroy(up, config, rules)
    assert d.returncode == 0 and d.failed is None, d.failed or d.errors
    assert d.steps[0]["name"] == GATE and d.record["waves"][0] == [up.named(GATE).urn]
    assert [c["hook"] for c in d.record["hook_calls"]][0] == GATE and not any(c["error"] for c in d.record["hook_calls"])
    outcomes = {(s["type"], s["name"]): s["outcome"] for s in cloud(d.steps)}
    kept = {k for k, v in outcomes.items() if v == "retained"}
    assert {t for t, _ in kept} == KEPT and len(kept) == len(KEPT)
    assert {v for k, v in outcomes.items() if k not in kept} == {"deleted (mocks only)"}
    print(f"\npreserved destroy: {len(outcomes) - len(kept)} of N = {len(outcomes)} deleted, {len(kept)} kept "
          f"({', '.join(sorted(n for _, n in kept))}); gate first, alone")
    # what reads the bucket is gone before it: the hosts' role policy, the instances tagged with it
    wave = {s["name"]: s["wave"] for s in d.steps}
    assert wave[f"{TRIAL}-host-evidence"] < wave[f"{TRIAL}-evidence"] and wave[f"{TRIAL}-rank-0"] < wave[f"{TRIAL}-evidence"]
    assert d.state == []  # the stack is empty; the kept resources are the account's, no longer the stack's
    s3 = aws.client("s3")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"trials/{TRIAL}/indexes/")["KeyCount"] == 1
    # deleting the kept evidence later, on purpose, as docs/evidence.md says (its block, run as written)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key=f"trials/{TRIAL}/indexes/again.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=f"trials/{TRIAL}/indexes/again.json", Body=b"{ }")  # a second version
    with pytest.raises(s3.exceptions.ClientError, match="BucketNotEmpty"):
        s3.delete_bucket(Bucket=bucket)
    block = re.search(r"```bash\n(# delete-evidence.*?)```", (ROOT / "docs" / "evidence.md").read_text(), re.S)[1]
    python = ".venv/bin/python" if (ROOT / ".venv/bin/python").exists() else sys.executable
    block = re.sub(r"BUCKET=\S+ \.venv/bin/python", f"BUCKET={bucket} {python}", block)
    r = subprocess.run(["bash", "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"deleted {bucket}" in r.stdout, r.stderr
    assert bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}


def test_a_stack_from_before_the_gate_is_gated_by_its_first_destroy(stack):
    """The gate is a component: `destroy --run-program` creates it from the program and deletes it first,
    even for a stack whose state never held it."""
    up, config, rules, _ = stack
    before = [s for s in up.state if s["name"] != GATE]
    d = destroy(up, config, rules, state=before)
    assert d.record["waves"][0] == [up.named(GATE).urn] and "holds no preservation index" in (d.failed or "")
    assert [s for s in cloud(d.steps) if s["outcome"] not in ("failed", "not started")] == []


def test_hooks_on_the_instances_alone_let_the_guards_go_first(stack):
    """The same engine rules on the same state without the gate — hooks on the instances only, as before
    #31: the wave before the instances' runs first (the deadline schedule, the budget's spend stop, the
    transfer alarms, their roles' policies, the route-table associations), and the security group's rules
    and the route table are dispatched in the instances' own wave, so all of them are gone by the time an
    instance's hook refuses: the hosts can no longer be reached, and nothing stops them any more."""
    up, *_ = stack
    state = [s for s in up.state if s["name"] != GATE]
    plan = plan_deletes("destroy", state, state)

    def apply(n: Node) -> str:
        if n.state.get("hooks", {}).get("before_delete"):  # the instances: refuse, as unpreserved
            raise StepError("before hook refused")
        return "deleted"

    steps, error = execute(plan, apply, continue_on_error=False)
    deleted = {(s["type"].split(":")[-1], s["name"]) for s in cloud(steps) if s["outcome"] == "deleted"}
    print(f"\nwithout the gate: {len(deleted)} of {len(cloud(state))} deleted before an instance's hook refused: "
          f"{sorted(n for _, n in deleted)}")
    assert error and "rank" in error
    assert {("Schedule", f"{TRIAL}-deadline"), ("RolePolicy", f"{TRIAL}-deadline-stop"),
            ("BudgetAction", f"{TRIAL}-spend-stop"), ("RolePolicy", f"{TRIAL}-spend-stop"),
            ("MetricAlarm", f"{TRIAL}-transfer-3-in"), ("MetricAlarm", f"{TRIAL}-transfer-3-out"),
            ("SecurityGroupIngressRule", f"{TRIAL}-ssh-in"), ("SecurityGroupIngressRule", f"{TRIAL}-members-in"),
            ("RouteTableAssociation", f"{TRIAL}-routes-us-east-1c")} <= deleted


def test_a_teardown_looks_nothing_up(stack):
    """`get_ami` runs at `pulumi up` (unless pinned), never in a teardown: the hosts' image is in the state."""
    up, config, rules, _ = stack
    assert [c["token"] for c in up.calls] == ["aws:ec2/getAmi:getAmi"]
    d = destroy(up, config, rules)
    assert d.returncode == 0 and d.calls == [] and d.resources
    assert {r.inputs["ami"] for r in d.of("aws:ec2/instance:Instance")} == {"ami-teardown-never-launched"}
    assert {s["inputs"]["ami"] for s in d.record["state"] if s["type"] == "aws:ec2/instance:Instance"} == \
        {"ami-0123456789abcdef0"}  # what the destroy deletes is the stored host, image and all
    assert all(r.typ == STACK_TYPE or r.name for r in d.resources)


def test_a_resource_new_to_the_program_does_not_ungate_a_gated_stack(stack):
    """A stack whose state lacks a resource the program now registers (the program grew since the stack's
    last `up`): in a destroy the engine skips that resource and whatever depends on it — the gate's new
    registration among them — but deletes the gate the state holds, from its old state, first."""
    up, config, rules, _ = stack
    added = f"{TRIAL}-transfer-3-out"
    d = destroy(up, config, rules, state=[s for s in up.state if s["name"] != added])
    assert up.named(GATE).urn in d.record["skipped_creates"]
    assert d.record["waves"][0] == [up.named(GATE).urn] and "holds no preservation index" in (d.failed or "")
    assert [s for s in cloud(d.steps) if s["outcome"] not in ("failed", "not started")] == []


def test_an_up_that_drops_a_host_runs_that_hosts_hook(stack):
    """Why the instances keep a hook of their own: `pulumi up` with a host fewer deletes that host (and what
    hangs on it) without touching the gate, and the host's hook refuses while the trial is unpreserved."""
    up, config, rules, _ = stack
    cluster = dict(config["trials:cluster"])
    cluster["hosts"] = [h for h in cluster["hosts"] if h["rank"] != 3]
    del cluster["experiment"]  # its four-rank arms need the fourth host: three hosts plan the single arm alone
    cluster["arms"] = [{"name": "single", "kind": "single", "world_size": 1, "updates": 128}]
    again = pulumi_run("up", {**config, "trials:cluster": cluster}, state=up.state, answers=rules, calls=CALLS)
    assert again.returncode == 0 and again.failed, again.errors
    (host,) = [s for s in again.steps if s["name"] == f"{TRIAL}-rank-3"]
    assert host["outcome"] == "failed" and f"refusing to delete {TRIAL}-rank-3" in host["error"], host
    assert GATE not in {s["name"] for s in again.steps}  # the gate is not deleted by an up
    assert GATE in {s["name"] for s in again.state}

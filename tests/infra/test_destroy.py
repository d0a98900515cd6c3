"""`pulumi destroy` as the engine runs it, on the program's real resource graph (#31 items 3 and 4): the
program's `up` recorded through the engine harness (every resource with its parent, dependencies,
property dependencies, provider, hooks and options; its bucket and instances made in moto), then
`TRIALS_TEARDOWN=1 pulumi destroy --run-program` through the same harness: the engine's delete waves
(tests/pulumi_engine.py, after `ScheduleDeletes`), the hooks run in the program's process against moto's
EC2 and S3.

A refused destroy deletes nothing: the gate is the whole first wave and its refusal cancels the rest. A
preserved trial's destroy ends without error, gate first, with every resource deleted but the evidence
bucket and what keeps it safe, which stay. A plain `pulumi destroy` (no `--run-program`) is refused by the
engine itself. What a destroy does from the states a failed or changing `up` leaves:
tests/infra/test_failures.py."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from evidence.stores import preserve
from pulumi_engine import STACK_TYPE, DependencyGraph, Node, is_provider, pulumi_run, teardown_env
from test_infra import CALLS, answers, live, stack_of
from test_teardown import a_home

ROOT = Path(__file__).resolve().parents[2]
TRIAL = "ltw-four"
GATE = f"{TRIAL}-destroy-gate"
KEPT = {"aws:s3/bucket:Bucket", "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
        "aws:s3/bucketPolicy:BucketPolicy"}
TEARDOWN = teardown_env()


def cloud(state_or_steps: list[dict]) -> list[dict]:
    """The entries that are objects in the account: custom resources other than providers."""
    return [s for s in state_or_steps if s["custom"] and not is_provider(s["type"])]


def terminate_trial(aws, trial: str = TRIAL) -> None:
    """End every instance of `trial` this worker's moto holds, and delete its deadline stops' schedules (the next
    test's check must find neither: a schedule left would be a stop outside that test's stack)."""
    ec2 = aws.client("ec2")
    ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=[{"Name": "tag:trial", "Values": [trial]}])["Reservations"]
           for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    sched = aws.client("scheduler")
    for s in sched.list_schedules(NamePrefix=f"{trial}-deadline-")["Schedules"]:
        sched.delete_schedule(Name=s["Name"])


def moto_rules(bucket: str, trial: str = TRIAL) -> list[dict]:
    """The mocks' answers with the bucket's name the test's own (moto's server is the worker's, and a bucket
    another test preserved into would pass the check) and the instances left for moto to make."""
    return [r for r in answers(trial) if r["type"] not in ("aws:s3/bucket:Bucket", "aws:ec2/instance:Instance")] + [
        {"type": "aws:s3/bucket:Bucket", "id": bucket, "outputs": {"bucket": bucket}}]


def up_in_moto(aws, trial: str = TRIAL):
    """The example stack's `pulumi up` (as trial `trial`): its bucket, the bucket's settings and its four
    instances made in moto (tagged as the program tags them)."""
    bucket = f"gate-evidence-{uuid.uuid4().hex[:12]}"
    rules = moto_rules(bucket, trial)
    config = stack_of(live(trial=trial))
    up = pulumi_run("up", config, answers=rules, calls=CALLS, provider="moto")
    assert up.returncode == 0 and up.failed is None, up.errors
    return up, config, rules, bucket


@pytest.fixture(scope="module")
def stack(moto_module):
    """One `up` for the tests that change nothing in the account (a refused destroy deletes nothing); its
    instances are terminated at the end."""
    yield up_in_moto(moto_module)
    terminate_trial(moto_module)


OWN = "ltw-own"  # a trial of its own: the check finds hosts by their trial tag, and the shared stack's live on


@pytest.fixture
def own_stack(aws):
    """An `up` of the test's own, for a test whose destroy goes through."""
    yield up_in_moto(aws, OWN)
    terminate_trial(aws, OWN)


def destroy(up, config, rules, state=None, **kw):
    kw.setdefault("provider", "moto")
    return pulumi_run("destroy", config, state=up.state if state is None else state, answers=rules, calls=CALLS,
                      env=TEARDOWN, **kw)


def live_instances(aws, trial: str = TRIAL) -> int:
    return sum(i["State"]["Name"] != "terminated" for r in aws.client("ec2").describe_instances(
        Filters=[{"Name": "tag:trial", "Values": [trial]}])["Reservations"] for i in r["Instances"])


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


def test_a_refused_destroy_deletes_nothing(stack, aws):
    up, config, rules, bucket = stack
    n = len(cloud(up.state))
    d = destroy(up, config, rules)
    assert d.returncode == 0, d.errors  # the program ran; the engine's deployment is what failed
    assert d.record["waves"][0] == [up.named(GATE).urn]  # the first wave is the gate alone
    assert d.failed and "before hook" in d.failed and "holds no preservation index" in d.failed, d.failed
    deleted = [s for s in cloud(d.steps) if s["outcome"] not in ("failed", "not started")]
    print(f"\nrefused destroy: {len(deleted)} of N = {n} resources deleted; "
          f"{len(d.record['waves'])} waves, the first: {[u.split('::')[-1] for u in d.record['waves'][0]]}")
    assert deleted == [] and n == 51 and live_instances(aws) == 4
    assert {s["outcome"] for s in d.steps if s["name"] != GATE} == {"not started"}
    assert len(cloud(d.state)) == n  # the stack still holds every resource
    # --continue-on-error does not get past it either: every later step depends on nothing that failed but
    # the gate depends on all of them, and the engine skips whatever a failed step depends on
    c = destroy(up, config, rules, continue_on_error=True)
    assert [s for s in cloud(c.steps) if s["outcome"] not in ("failed", "not started")] == []


def test_a_preserved_trial_is_destroyed_gate_first_and_its_evidence_kept(own_stack, aws, tmp_path):
    up, config, rules, bucket = own_stack
    home = a_home(tmp_path, "local-training-windows-gpu")
    preserve(home, f"s3://{bucket}/trials/{OWN}/", trial=home.name, session=aws)
    d = destroy(up, config, rules)
    assert d.returncode == 0 and d.failed is None, d.failed or d.errors
    assert d.steps[0]["name"] == f"{OWN}-destroy-gate" and d.record["waves"][0] == [up.named(f"{OWN}-destroy-gate").urn]
    assert [c["hook"] for c in d.record["hook_calls"]][0] == f"{OWN}-destroy-gate" and not any(c["error"] for c in d.record["hook_calls"])
    outcomes = {(s["type"], s["name"]): s["outcome"] for s in cloud(d.steps)}
    kept = {k for k, v in outcomes.items() if v == "retained"}
    assert {t for t, _ in kept} == KEPT and len(kept) == len(KEPT)
    assert {v for k, v in outcomes.items() if k not in kept} == {"deleted (mocks only)", "deleted"}
    # in moto: the instances and the deadline stop's schedule
    assert {k[1] for k, v in outcomes.items() if v == "deleted"} == {f"{OWN}-rank-{r}" for r in range(4)} | {f"{OWN}-deadline"}
    assert live_instances(aws, OWN) == 0  # terminated in moto by the destroy
    print(f"\npreserved destroy: {len(outcomes) - len(kept)} of N = {len(outcomes)} deleted, {len(kept)} kept "
          f"({', '.join(sorted(n for _, n in kept))}); gate first, alone")
    # what reads the bucket is gone before it: the hosts' role policy, the instances tagged with it
    wave = {s["name"]: s["wave"] for s in d.steps}
    assert wave[f"{OWN}-host-evidence"] < wave[f"{OWN}-evidence"] and wave[f"{OWN}-rank-0"] < wave[f"{OWN}-evidence"]
    assert d.state == []  # the stack is empty; the kept resources are the account's, no longer the stack's
    s3 = aws.client("s3")
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"trials/{OWN}/indexes/")["KeyCount"] == 1
    # deleting the kept evidence later, on purpose, as docs/evidence.md says (its block, run as written)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key=f"trials/{OWN}/indexes/again.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=f"trials/{OWN}/indexes/again.json", Body=b"{ }")  # a second version
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


def test_a_teardown_looks_nothing_up(stack):
    """`get_ami` runs at `pulumi up` (unless pinned), never in a teardown: the hosts' image is in the state."""
    up, config, rules, _ = stack
    assert [c["token"] for c in up.calls] == ["pulumi:pulumi:readStackOutputs", "aws:ec2/getInstances:getInstances",
                                              "aws:ec2/getSubnets:getSubnets", "aws:ec2/getAmi:getAmi"]
    # the stack's own record (infra/held.py), what exists of the trial (none yet), the AMI; a teardown reads only
    # the record (what the stack held), nothing of the account
    d = destroy(up, config, rules)
    assert d.returncode == 0 and [c["token"] for c in d.calls] == ["pulumi:pulumi:readStackOutputs"] and d.resources
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


def test_a_plain_destroy_is_refused_by_the_engine(stack):
    """`pulumi destroy` without `--run-program`: the engine (>= 3.182) refuses before anything runs, preview
    included, since resources of the state carry delete hooks — none of the program's hooks could run."""
    up, config, rules, _ = stack
    for op in ("destroy", "destroy-preview"):
        d = pulumi_run(op, config, state=up.state, run_program=False)
        assert d.returncode != 0 and not d.record["program_ran"] and d.steps == [] and d.state == up.state
        assert "You must run with the `--run-program` flag to use delete hooks during destroy." in d.failed
        assert d.failed.count("Resource has delete hooks registered") == 46  # 45 resources and the gate


def test_a_destroy_preview_refuses_before_it_asks(stack, aws):
    """`pulumi destroy --run-program` previews first and asks "yes?"; the hooks run in the preview too
    (`on_dry_run`), so the refusal comes before the question, and a preview deletes nothing either way."""
    up, config, rules, _ = stack
    d = pulumi_run("destroy-preview", config, state=up.state, answers=rules, calls=CALLS, env=TEARDOWN,
                   provider="moto")
    assert d.failed and "holds no preservation index" in d.failed and d.steps[0]["name"] == GATE
    assert {s["outcome"] for s in cloud(d.steps)} == {"not started"} and live_instances(aws) == 4

"""The program as four Pulumi components (infra/concern.py: network, evidence, hosts, guards), run as
Pulumi's engine runs it (tests/pulumi_engine.py): every AWS resource sits in one of them, each registers
its outputs, and a stack created by the flat program before them (up to commit 4eec3dd) keeps every
resource — the same logical names, each child aliased to the URN it had under the stack, the same
exported outputs."""

from __future__ import annotations

import pytest

from pulumi_engine import STACK_TYPE
from test_infra import live, run_program

T = "ltw-four"
# What the flat program registered for the example stack (read from it at 4eec3dd: build() before the
# split), by the concern that now holds each: (type, logical name) — the spend stop since split per host.
BY_CONCERN: dict[str, set[tuple[str, str]]] = {
    "Network": {("aws:ec2/vpc:Vpc", f"{T}-vpc"), ("aws:ec2/internetGateway:InternetGateway", f"{T}-igw"),
                ("aws:ec2/routeTable:RouteTable", f"{T}-routes"),
                ("aws:ec2/subnet:Subnet", f"{T}-subnet-us-east-1c"), ("aws:ec2/subnet:Subnet", f"{T}-subnet-us-east-1d"),
                ("aws:ec2/routeTableAssociation:RouteTableAssociation", f"{T}-routes-us-east-1c"),
                ("aws:ec2/routeTableAssociation:RouteTableAssociation", f"{T}-routes-us-east-1d"),
                ("aws:ec2/securityGroup:SecurityGroup", f"{T}-members"),
                ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", f"{T}-members-in"),
                ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", f"{T}-ssh-in"),
                ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", f"{T}-members-out"),
                ("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", f"{T}-https-out")},
    "Evidence": {("aws:s3/bucket:Bucket", f"{T}-evidence"),
                 ("aws:s3/bucketVersioning:BucketVersioning", f"{T}-evidence-versioning"),
                 ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                  f"{T}-evidence-sse"),
                 ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", f"{T}-evidence-private"),
                 ("aws:s3/bucketOwnershipControls:BucketOwnershipControls", f"{T}-evidence-owner"),
                 ("aws:s3/bucketPolicy:BucketPolicy", f"{T}-evidence-tls")},
    "Hosts": {("aws:iam/role:Role", f"{T}-host"), ("aws:iam/rolePolicy:RolePolicy", f"{T}-host-evidence"),
              ("aws:iam/instanceProfile:InstanceProfile", f"{T}-host"), ("aws:ec2/keyPair:KeyPair", f"{T}-operator"),
              *{("aws:ec2/instance:Instance", f"{T}-rank-{r}") for r in range(4)}},
    "Guards": {("aws:sns/topic:Topic", f"{T}-alerts"), ("aws:sns/topicPolicy:TopicPolicy", f"{T}-alerts-publishers"),
               ("aws:iam/role:Role", f"{T}-deadline"), ("aws:iam/rolePolicy:RolePolicy", f"{T}-deadline-stop"),
               ("aws:scheduler/schedule:Schedule", f"{T}-deadline"), ("aws:budgets/budget:Budget", f"{T}-budget"),
               ("aws:iam/role:Role", f"{T}-spend-stop"), ("aws:iam/rolePolicy:RolePolicy", f"{T}-spend-stop"),
               # one budget action for every host became one per host (#54: each host's stop depends on it alone)
               *{("aws:budgets/budgetAction:BudgetAction", f"{T}-spend-stop-{r}") for r in range(4)},
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3-in"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3-out"),
               # the deadline stop became a sweep every minute from the deadline, loud when it fails (#64)
               ("aws:iam/role:Role", f"{T}-deadline-sweep"), ("aws:iam/rolePolicy:RolePolicy", f"{T}-deadline-sweep"),
               ("aws:cloudwatch/logGroup:LogGroup", f"{T}-deadline-sweep"),
               ("aws:lambda/function:Function", f"{T}-deadline-sweep"), ("aws:sqs/queue:Queue", f"{T}-deadline-dlq"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-deadline-sweep-errors"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-deadline-dlq"),
               ("aws:cloudwatch/eventRule:EventRule", f"{T}-stop-failed"),
               ("aws:cloudwatch/eventTarget:EventTarget", f"{T}-stop-failed"),
               ("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig", f"{T}-deadline-sweep")},
}
# The stack outputs the flat program exported (its `outputs` dict at 4eec3dd), which orchestrate reads.
HEAD_OUTPUTS = {"format", "trial", "region", "deadline", "hours", "ssh_user", "host_python", "bucket", "prefix",
                "alert_topic", "security_group", "transfer_guard_bytes", "guard_fraction", "isolated_ranks", "ami",
                "budget", "budget_name", "estimate", "hosts"}
# What each concern registers as its own outputs (visible in `pulumi stack --show-urns` and the console).
CONCERN_OUTPUTS = {"Network": {"vpc_id", "security_group", "subnet_ids"}, "Evidence": {"bucket", "prefix"},
                   "Hosts": {"instance_ids", "ami"}, "Guards": {"alert_topic", "budget_name"}}


def urn_type(urn: str) -> str:
    """A URN's own type (the last of its parent chain): urn:pulumi:s::p::A$B::name → B."""
    return urn.split("::")[2].split("$")[-1]


@pytest.fixture(scope="module")
def registered():
    """The example stack's `pulumi up`, once."""
    d = run_program(live())
    assert d.returncode == 0, d.errors
    return d


def test_every_aws_resource_sits_in_its_concern(registered):
    d = registered
    by_urn = {r.urn: r for r in d.resources}
    components = {(r.typ, r.name) for r in d.resources if not r.custom and r.typ != STACK_TYPE}
    assert components == {(f"trials:infra:{k}", f"{T}-{k.lower()}") for k in BY_CONCERN} | \
        {("trials:infra:DestroyGate", f"{T}-destroy-gate")}  # the gate (infra/gate.py) holds no resource
    for r in d.resources:
        if not r.custom and r.typ != STACK_TYPE:  # the concerns themselves hang from the stack
            assert urn_type(r.parent) == STACK_TYPE, r.name
        if r.custom:  # no AWS resource directly under the stack: each under the concern that holds it
            parent = by_urn[r.parent]
            assert parent.typ.startswith("trials:infra:") and (r.typ, r.name) in BY_CONCERN[parent.typ.split(":")[-1]], \
                ((r.typ, r.name), parent.name)


def test_every_child_keeps_the_urn_it_had_under_the_stack(registered):
    """Parenting changes a URN; the engine would replace every resource of an existing stack (hosts and
    their evidence included) unless each says where it was: `Alias(parent=ROOT_STACK_RESOURCE)`, sent as
    a spec with noParent and no name or type, which the engine resolves to urn:…::<type>::<name> — this
    resource's own type and name under the stack, its URN before the split."""
    for r in registered.resources:
        if not r.custom:
            assert r.aliases == [], r.name  # the concerns are new: nothing to map
            continue
        # pulumi-aws adds its own type aliases to some (the Bucket: its BucketV2 past); ours is the one
        # without a parent, and nothing else: no name, type, stack or project of its own
        ours = [a["spec"] for a in r.aliases if a.get("spec", {}).get("noParent")]
        assert ours == [{"noParent": True}], (r.typ, r.name, r.aliases)


def test_each_concern_registers_its_outputs(registered):
    got = {r.typ.split(":")[-1]: set(r.outputs_registered or ()) for r in registered.resources
           if r.typ.startswith("trials:infra:")}
    assert got == CONCERN_OUTPUTS | {"DestroyGate": {"trial", "bucket"}}


def test_the_same_resources_and_outputs_as_the_flat_program(registered):
    aws = [(r.typ, r.name) for r in registered.resources if r.custom]
    assert len(aws) == len(set(aws)) == 51
    assert set(aws) == set().union(*BY_CONCERN.values())  # every other logical name as before
    assert set(registered.exports) == HEAD_OUTPUTS | {"grace_cap_minutes", "deadline_stop", "instances_held",  # #64, #65
                                                      "budget_names"}  # #68

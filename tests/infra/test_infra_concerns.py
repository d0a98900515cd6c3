"""The program as four Pulumi components (infra/concern.py: network, evidence, hosts, guards), under
Pulumi's mocks: every AWS resource sits in one of them, each registers its outputs, and a stack created
by the flat program before them (up to commit 4eec3dd) keeps every resource — the same logical names,
each child aliased to the URN it had under the stack, the same exported outputs."""

from __future__ import annotations

import asyncio

import pulumi
import pytest
from pulumi.runtime.mocks import MockMonitor

from infra.plan import TrialConfig
from test_infra import NOW, Recorder, study

T = "ltw-four"
# What the flat program registered for the example stack (read from it at 4eec3dd: build() before the
# split), by the concern that now holds each: (type, logical name).
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
               ("aws:budgets/budgetAction:BudgetAction", f"{T}-spend-stop"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3-in"),
               ("aws:cloudwatch/metricAlarm:MetricAlarm", f"{T}-transfer-3-out")},
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


class Registrations(MockMonitor):
    """The monitor's view: each registration's parent and aliases, each component's outputs."""

    def __init__(self, mocks: Recorder) -> None:
        super().__init__(mocks)
        self.requests: dict[tuple[str, str], object] = {}
        self.urns: dict[str, tuple[str, str]] = {}
        self.outputs: dict[str, set[str]] = {}

    def RegisterResource(self, request):
        assert (request.type, request.name) not in self.requests, "registered twice"
        self.requests[(request.type, request.name)] = request
        response = super().RegisterResource(request)
        self.urns[response.urn] = (request.type, request.name)
        return response

    def RegisterResourceOutputs(self, request):
        self.outputs[request.urn] = set(request.outputs.fields)
        return super().RegisterResourceOutputs(request)


@pytest.fixture(scope="module")
def registered():
    """The example stack built once: the mocks, the monitor, and the names `pulumi.export` was given."""
    mocks = Recorder()
    asyncio.set_event_loop(asyncio.new_event_loop())
    monitor = Registrations(mocks)
    pulumi.runtime.set_mocks(mocks, project="trials", stack="test", preview=False, monitor=monitor)
    from infra.program import build

    exported: list[str] = []
    export = pulumi.export
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pulumi, "export", lambda name, value: (exported.append(name), export(name, value)))

        @pulumi.runtime.test
        def go():
            return pulumi.Output.from_input(build(TrialConfig.model_validate(study()), NOW)).apply(lambda _: None)

        go()
    return mocks, monitor, exported


def test_every_aws_resource_sits_in_its_concern(registered):
    mocks, monitor, _ = registered
    components = {(r.typ, r.name) for r in mocks.resources if not r.custom}
    assert components == {(f"trials:infra:{k}", f"{T}-{k.lower()}") for k in BY_CONCERN}
    for key in components:  # the concerns themselves hang from the stack
        assert urn_type(monitor.requests[key].parent) == "pulumi:pulumi:Stack", key
    for r in mocks.resources:
        if r.custom:  # no AWS resource directly under the stack: each under the concern that holds it
            parent = monitor.urns[monitor.requests[(r.typ, r.name)].parent]
            assert parent[0].startswith("trials:infra:") and (r.typ, r.name) in BY_CONCERN[parent[0].split(":")[-1]], \
                ((r.typ, r.name), parent)


def test_every_child_keeps_the_urn_it_had_under_the_stack(registered):
    """Parenting changes a URN; the engine would replace every resource of an existing stack (hosts and
    their evidence included) unless each says where it was: `Alias(parent=ROOT_STACK_RESOURCE)`, sent as
    a spec with noParent and no name or type, which the engine resolves to urn:…::<type>::<name> — this
    resource's own type and name under the stack, its URN before the split."""
    mocks, monitor, _ = registered
    for r in mocks.resources:
        aliases = list(monitor.requests[(r.typ, r.name)].aliases)
        if not r.custom:
            assert aliases == [], r.name  # the concerns are new: nothing to map
            continue
        # pulumi-aws adds its own type aliases to some (the Bucket: its BucketV2 past); ours is the one
        # without a parent
        ours = [a.spec for a in aliases if a.WhichOneof("alias") == "spec" and a.spec.noParent]
        assert len(ours) == 1, (r.typ, r.name, aliases)
        assert (ours[0].name, ours[0].type, ours[0].stack, ours[0].project) == ("", "", "", ""), (r.typ, r.name)


def test_each_concern_registers_its_outputs(registered):
    _, monitor, _ = registered
    got = {monitor.urns[urn][0].split(":")[-1]: keys for urn, keys in monitor.outputs.items()
           if monitor.urns[urn][0].startswith("trials:infra:")}
    assert got == CONCERN_OUTPUTS


def test_the_same_resources_and_outputs_as_the_flat_program(registered):
    mocks, _, exported = registered
    aws = [(r.typ, r.name) for r in mocks.resources if r.custom]
    assert len(aws) == len(set(aws)) == 38
    assert set(aws) == set().union(*BY_CONCERN.values())  # every logical name as before: no URN but the parent's changes
    assert len(exported) == len(set(exported)) and set(exported) == HEAD_OUTPUTS

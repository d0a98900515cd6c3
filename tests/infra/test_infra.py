"""The Pulumi program as Pulumi's engine runs it (tests/pulumi_engine.py: a subprocess started as the
Python language host starts it, the resources answered by mocks; no CLI, no AWS): every property the
trial relies on, the refusal before anything is registered, the estimate for the four-worker study,
the outputs' shape, and the on-host transfer guard script run for real with bash."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.outputs import OutputsError, parse_outputs
from infra.plan import TrialConfig, arm_traffic, estimate, sweep_usd_per_day
from infra.userdata import GUARD_SCRIPT
from conftest import public_key
from pulumi_engine import STACK_TYPE, Deployment, pulumi_run, teardown_env

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.timezone.utc)
PARAMS = 1_711_376_384
OPERATOR_KEY = public_key()


def study(now: dt.datetime = NOW, **changes) -> dict:
    """The example stack (Pulumi.dev.yaml), its deadline 3 h after `now`, an operator key set."""
    cfg = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    c = copy.deepcopy(cfg["trials:cluster"]) | {"region": cfg["aws:region"]}
    c["deadline"] = (now + dt.timedelta(hours=3)).isoformat()
    c["ssh_public_key"] = OPERATOR_KEY
    if "arms" in changes:  # arms written out: a stack of no experiment file
        c.pop("experiment", None)
    c.update(changes)
    return c


def this_hour() -> dt.datetime:
    """Now, to the hour: the program reads the clock (as under a real engine), so a stack it accepts has its
    deadline within `hours` of the real time; 3 h after this hour is."""
    return dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def live(**changes) -> dict:
    """`study` with its deadline 3 h after this hour."""
    return study(this_hour(), **changes)


AMI = {"id": "ami-0123456789abcdef0", "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9"}
CALLS = {"aws:ec2/getAmi:getAmi": AMI}


def answers(trial: str = "ltw-four", ranks: int = 4) -> list[dict]:
    """What the mocks answer: instance ids and addresses by rank (not by the registration order), the
    bucket's generated name; every other resource gets `<name>-id` and `arn:aws:mock:::<name>`."""
    rules = [{"type": "aws:ec2/instance:Instance", "name": f"{trial}-rank-{r}", "id": f"i-{r + 1:017x}",
              "outputs": {"privateIp": f"10.42.0.{11 + r}", "publicIp": f"198.18.0.{11 + r}",
                          "arn": f"arn:aws:ec2:us-east-1:123456789012:instance/i-{r + 1:017x}"}} for r in range(ranks)]
    return rules + [{"type": "aws:s3/bucket:Bucket", "outputs": {"bucket": f"{trial}-evidence-0001"}}]


def stack_of(cluster: dict) -> dict:
    """A cluster (with its region) as the stack's config: `trials:cluster` and `aws:region`."""
    return {"trials:cluster": {k: v for k, v in cluster.items() if k != "region"}, "aws:region": cluster["region"]}


def run_program(cluster: dict, operation: str = "up", **kw) -> Deployment:
    """`pulumi <operation>` of the program for `cluster`, through the engine harness."""
    kw.setdefault("answers", answers(cluster["trial"]))
    kw.setdefault("calls", CALLS)
    return pulumi_run(operation, stack_of(cluster), **kw)


def deadline_of(d: Deployment) -> dt.datetime:
    return dt.datetime.fromisoformat(d.config["trials:cluster"]["deadline"])


@pytest.fixture(scope="module")
def program() -> Deployment:
    d = run_program(live())
    assert d.returncode == 0, d.errors
    return d


def test_hosts(program):
    mocks = program
    inst = sorted(mocks.of("aws:ec2/instance:Instance"), key=lambda r: r.name)
    assert [(r.inputs["instanceType"], r.inputs["availabilityZone"]) for r in inst] == \
        [("g6e.xlarge", "us-east-1c")] * 3 + [("g6e.xlarge", "us-east-1d")]
    subnets = {r.inputs["availabilityZone"]: r for r in mocks.of("aws:ec2/subnet:Subnet")}
    assert set(subnets) == {"us-east-1c", "us-east-1d"}
    for r in inst:
        i = r.inputs
        assert i["ami"] == "ami-0123456789abcdef0"
        assert i["subnetId"] == f"{subnets[i['availabilityZone']].name}-id"
        assert i["metadataOptions"]["httpTokens"] == "required"
        assert i["instanceInitiatedShutdownBehavior"] == "stop"
        assert i["userDataReplaceOnChange"] is False  # a new boot script never replaces a host with evidence
        assert i["keyName"] == "ltw-four-operator"  # the operator logs in with the stack's key
        assert "install -d -m 0755 -o ubuntu -g ubuntu /opt/trial" in i["userData"]  # staging's own directory
        d = i["rootBlockDevice"]
        assert (d["volumeType"], d["volumeSize"], d["encrypted"]) == ("gp3", 300, True)
        assert (d["throughput"], d["iops"]) == (250, 3000)  # the same for every host, so every arm
        assert "blockdev --setra 8192" in i["userData"]
        assert "OnBootSec=20s" in i["userData"] and "OnUnitActiveSec=60s" in i["userData"]  # every boot, every minute
        assert "OnCalendar" not in i["userData"] and deadline_of(program).isoformat() in i["userData"]
        # only the isolated-zone host carries the cumulative transfer guard
        assert ("LIMIT=${TRIAL_GUARD_LIMIT:-3100000000000}" in i["userData"]) == (i["availabilityZone"] == "us-east-1d")
    (kp,) = mocks.of("aws:ec2/keyPair:KeyPair")
    assert (kp.inputs["keyName"], kp.inputs["publicKey"]) == ("ltw-four-operator", OPERATOR_KEY)
    (ami,) = [c["args"] for c in mocks.calls if c["token"] == "aws:ec2/getAmi:getAmi"]  # looked up, not pinned
    assert ami["owners"] == ["amazon"] and ami["mostRecent"] is True
    assert {"name": "name", "values": ["Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 24.04)*"]} \
        in ami["filters"]


def test_every_taggable_resource_names_the_trial(program):
    mocks = program
    untagged_types = {"aws:ec2/routeTableAssociation:RouteTableAssociation", "aws:iam/rolePolicy:RolePolicy",
                      "aws:s3/bucketVersioning:BucketVersioning", "aws:sns/topicPolicy:TopicPolicy",
                      "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                      "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws:s3/bucketPolicy:BucketPolicy",
                      "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
                      "aws:scheduler/schedule:Schedule", "aws:costexplorer/costAllocationTag:CostAllocationTag",
                      "aws:cloudwatch/eventTarget:EventTarget",
                      "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig"}
    for r in mocks.resources:
        if r.custom and r.typ not in untagged_types:  # a component (infra/concern.py) exists in no account
            assert r.inputs.get("tags", {}).get("trial") == "ltw-four", (r.typ, r.name)


def test_security_group_members_only(program):
    mocks = program
    sg = mocks.of("aws:ec2/securityGroup:SecurityGroup")
    assert len(sg) == 1 and "ingress" not in sg[0].inputs  # rules are separate resources, all below
    ingress = mocks.of("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    sg_id = f"{sg[0].name}-id"
    for r in ingress:
        i = r.inputs
        assert i.get("cidrIpv4") != "0.0.0.0/0" and "cidrIpv6" not in i
        if i["ipProtocol"] == "-1":  # every port: NCCL and rendezvous
            assert i["referencedSecurityGroupId"] == sg_id and "cidrIpv4" not in i
        else:
            assert (i["ipProtocol"], i["fromPort"], i["toPort"], i["cidrIpv4"]) == ("tcp", 22, 22, "203.0.113.7/32")
    assert len(ingress) == 2


def test_ssh_from_anywhere_refused_unless_forced():
    with pytest.raises(ValueError, match="whole internet"):
        TrialConfig.model_validate(study(operator_cidr="0.0.0.0/0"))
    mocks = run_program(live(operator_cidr="0.0.0.0/0", allow_ssh_from_anywhere=True))
    ssh = [r for r in mocks.of("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
           if r.inputs["ipProtocol"] == "tcp"]
    assert [r.inputs["cidrIpv4"] for r in ssh] == ["0.0.0.0/0"]  # only SSH, only when forced
    assert all(r.inputs.get("cidrIpv4") is None for r in
               mocks.of("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule") if r.inputs["ipProtocol"] == "-1")


def test_the_deadline_stop_sweeps_every_minute_from_the_deadline(program):
    """From the deadline on, every minute for as long as the stack exists, Scheduler runs the sweep (infra/sweep.py,
    uploaded as it is) with the schedule's input as its event: it names no instance id, so it exists before any
    host and covers every host created after it; its role may stop only instances carrying the tag; every way it
    can fail reaches the alert topic."""
    mocks = program
    (sched,) = mocks.of("aws:scheduler/schedule:Schedule")
    s = sched.inputs
    assert s["scheduleExpression"] == "rate(1 minute)"
    assert s["startDate"] == f"{deadline_of(program):%Y-%m-%dT%H:%M:%S}Z" and "endDate" not in s
    assert s["scheduleExpressionTimezone"] == "UTC" and s["flexibleTimeWindow"]["mode"] == "OFF"
    (fn,) = mocks.of("aws:lambda/function:Function")
    assert s["target"]["arn"] == fn.outputs.get("arn", f"arn:aws:mock:::{fn.name}") or s["target"]["arn"].endswith(fn.name)
    assert fn.inputs["handler"] == "sweep.handler" and fn.inputs["runtime"].startswith("python3")
    assert "sweep.py" in json.dumps(fn.inputs["code"]) and "def handler(" in json.dumps(fn.inputs["code"])
    event = json.loads(s["target"]["input"])
    assert event["trial"] == "ltw-four" and event["deadline"] == deadline_of(program).isoformat()
    assert event["grace_cap_minutes"] == 60 and event["topic_arn"].endswith("ltw-four-alerts")
    assert s["target"]["retryPolicy"]["maximumRetryAttempts"] == 2 and s["target"]["deadLetterConfig"]["arn"]
    roles = {r.name: r for r in mocks.of("aws:iam/role:Role")}
    assert "scheduler.amazonaws.com" in roles["ltw-four-deadline"].inputs["assumeRolePolicy"]
    assert "lambda.amazonaws.com" in roles["ltw-four-deadline-sweep"].inputs["assumeRolePolicy"]
    pols = {r.name: json.loads(r.inputs["policy"]) for r in mocks.of("aws:iam/rolePolicy:RolePolicy")}
    st = {x["Sid"]: x for x in pols["ltw-four-deadline-sweep"]["Statement"]}
    assert st["StopOnlyTheTrialsHosts"] == {
        "Sid": "StopOnlyTheTrialsHosts", "Effect": "Allow", "Action": "ec2:StopInstances",
        "Resource": "arn:aws:ec2:us-east-1:*:instance/*", "Condition": {"StringEquals": {"aws:ResourceTag/trial": "ltw-four"}}}
    assert st["FindTheTrialsHosts"]["Action"] == "ec2:DescribeInstances" and st["SayWhatItDid"]["Action"] == "sns:Publish"
    assert {x["Action"] for x in pols["ltw-four-deadline-stop"]["Statement"]} == {"lambda:InvokeFunction", "sqs:SendMessage"}
    # loud: the function's errors, the dead-letter queue's depth, AWS's stop runbook failing — all to the topic
    alarms = {a.name: a.inputs for a in mocks.of("aws:cloudwatch/metricAlarm:MetricAlarm")}
    assert alarms["ltw-four-deadline-sweep-errors"]["metricName"] == "Errors"
    assert alarms["ltw-four-deadline-dlq"]["metricName"] == "ApproximateNumberOfMessagesVisible"
    (rule,) = mocks.of("aws:cloudwatch/eventRule:EventRule")
    assert json.loads(rule.inputs["eventPattern"])["detail"]["Status"] == ["Failed", "TimedOut", "Cancelled"]
    (invoke,) = mocks.of("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")  # a dropped run: loud
    assert invoke.inputs["destinationConfig"]["onFailure"]["destination"].endswith("ltw-four-alerts")
    assert invoke.inputs["maximumEventAgeInSeconds"] == 120
    (target,) = mocks.of("aws:cloudwatch/eventTarget:EventTarget")
    assert target.inputs["arn"].endswith("ltw-four-alerts")
    (topic_policy,) = mocks.of("aws:sns/topicPolicy:TopicPolicy")
    assert "events.amazonaws.com" in topic_policy.inputs["policy"]
    # every instance is tagged so at launch (its tags are RunInstances' TagSpecifications), waits for the stop, and
    # shows its tags to its own deadline check (instance metadata)
    for inst in mocks.of("aws:ec2/instance:Instance"):
        assert inst.inputs["tags"]["trial"] == "ltw-four"
        assert inst.inputs["metadataOptions"]["instanceMetadataTags"] == "enabled"
        assert inst.inputs["tags"]["trial-deadline"] == f"{deadline_of(program):%Y-%m-%dT%H:%M:%S}Z"  # the host reads it
        assert inst.inputs["tags"]["trial-grace-cap-seconds"] == "3600"
        assert {sched.urn, next(r.urn for r in mocks.resources if r.name == "ltw-four-deadline-sweep"
                                and r.typ == "aws:iam/rolePolicy:RolePolicy")} <= set(inst.dependencies)


def test_budget_and_notifications(program):
    mocks = program
    (b,) = mocks.of("aws:budgets/budget:Budget")
    i = b.inputs
    assert (i["budgetType"], i["limitAmount"], i["limitUnit"]) == ("COST", "100.00", "USD")
    assert i["name"] == "ltw-four-budget"  # a fixed name: `orchestrate status` reads its spend
    # one period from the day of `pulumi up`: this trial crosses a month boundary and must not reset
    start = deadline_of(program) - dt.timedelta(hours=3)  # this hour when the program ran, or the one before
    assert i["timeUnit"] == "ANNUALLY"
    assert i["timePeriodStart"] in {f"{t:%Y-%m-%d}_00:00" for t in (start, start + dt.timedelta(hours=1))}
    assert i["costFilters"] == [{"name": "Region", "values": ["us-east-1"]}]  # no tag needed: see below
    (topic,) = mocks.of("aws:sns/topic:Topic")
    got = sorted((n["notificationType"], n["threshold"]) for n in i["notifications"])
    assert got == [("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)]
    assert all(n["subscriberSnsTopicArns"] == [f"arn:aws:mock:::{topic.name}"] for n in i["notifications"])


def test_the_first_up_needs_no_cost_allocation_tag(program):
    """Activating a tag key billing has not seen (up to 24 h after first use), or in an Organization's
    member account, is refused: the first `pulumi up` must not depend on it. By default the budget counts
    the region's spend (over-counting: it stops early, never late); the tag is opt-in."""
    mocks = program
    assert mocks.of("aws:costexplorer/costAllocationTag:CostAllocationTag") == []
    for choice, activated in (("tag", False), ("tag-activate", True)):
        m = run_program(live(budget_filter=choice))
        (b,) = m.of("aws:budgets/budget:Budget")
        assert b.inputs["costFilters"] == [{"name": "TagKeyValue", "values": ["user:trial$ltw-four"]}]
        tags = m.of("aws:costexplorer/costAllocationTag:CostAllocationTag")
        assert [(t.inputs["tagKey"], t.inputs["status"]) for t in tags] == ([("trial", "Active")] if activated else [])


def test_the_budget_stops_each_host_at_its_limit(program):
    """Spending has a stop in the cloud, not only notifications: at 100 % of actual spend, SSM's stop
    document, approved automatically, by a role that may do only that. Budgets' action takes instance ids,
    so each host has its own, depending on that host alone: no host waits for the others to be covered."""
    mocks = program
    actions = sorted(mocks.of("aws:budgets/budgetAction:BudgetAction"), key=lambda r: r.name)
    assert [a.name for a in actions] == [f"ltw-four-spend-stop-{r}" for r in range(4)]
    insts = {r.name: r for r in mocks.of("aws:ec2/instance:Instance")}
    (topic,) = mocks.of("aws:sns/topic:Topic")
    (role,) = [r for r in mocks.of("aws:iam/role:Role") if r.name == "ltw-four-spend-stop"]
    for rank, action in enumerate(actions):
        a = action.inputs
        assert (a["budgetName"], a["actionType"], a["approvalModel"], a["notificationType"]) == \
            ("ltw-four-budget", "RUN_SSM_DOCUMENTS", "AUTOMATIC", "ACTUAL")
        assert a["actionThreshold"] == {"actionThresholdType": "PERCENTAGE", "actionThresholdValue": 100}
        ssm = a["definition"]["ssmActionDefinition"]
        assert (ssm["actionSubType"], ssm["instanceIds"], ssm["region"]) == \
            ("STOP_EC2_INSTANCES", [f"i-{rank + 1:017x}"], "us-east-1")
        assert a["subscribers"] == [{"address": f"arn:aws:mock:::{topic.name}", "subscriptionType": "SNS"}]
        assert a["executionRoleArn"] == f"arn:aws:mock:::{role.name}"
        other_hosts = {i.urn for n, i in insts.items() if n != f"ltw-four-rank-{rank}"}
        assert insts[f"ltw-four-rank-{rank}"].urn in action.dependencies or \
            insts[f"ltw-four-rank-{rank}"].urn in {u for us in action.property_dependencies.values() for u in us}
        assert not other_hosts & (set(action.dependencies) | {u for us in action.property_dependencies.values() for u in us})
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "budgets.amazonaws.com"}]
    (policy,) = [r for r in mocks.of("aws:iam/rolePolicy:RolePolicy") if r.name == "ltw-four-spend-stop"]
    st = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert st["StopDocument"]["Action"] == "ssm:StartAutomationExecution"
    assert st["StopDocument"]["Resource"] == "arn:aws:ssm:us-east-1:*:automation-definition/AWS-StopEC2Instance:*"
    stop = st["StopTheTrialsHostsThroughSsm"]
    assert (stop["Action"], stop["Resource"]) == ("ec2:StopInstances", "arn:aws:ec2:us-east-1:*:instance/*")
    assert stop["Condition"] == {"StringEquals": {"aws:ResourceTag/trial": "ltw-four"},
                                 "ForAnyValue:StringEquals": {"aws:CalledVia": ["ssm.amazonaws.com"]}}
    assert {s["Action"] for s in st.values()} == {"ssm:StartAutomationExecution", "ec2:StopInstances",
                                                  "ec2:DescribeInstanceStatus"}  # nothing else


def test_transfer_stop_rides_on_single_metric_alarms(program):
    """AWS runs an EC2 stop action only for alarms on a per-instance EC2 metric: the stop sits on one
    NetworkIn and one NetworkOut alarm (half the guard each: in + out > guard ⇒ one of them > half); the
    metric-math alarm on in + out only notifies. Every name keeps the prefix `run` and `status` read."""
    mocks = program
    alarms = {r.inputs["name"]: r.inputs for r in mocks.of("aws:cloudwatch/metricAlarm:MetricAlarm")
              if "-transfer-" in r.inputs["name"]}  # the others watch the deadline stop (its own test)
    assert sorted(alarms) == ["ltw-four-transfer-3", "ltw-four-transfer-3-in", "ltw-four-transfer-3-out"]
    stop = "arn:aws:automate:us-east-1:ec2:stop"
    total = alarms["ltw-four-transfer-3"]
    metrics = {q["id"]: q for q in total["metricQueries"]}
    assert {m["metric"]["metricName"] for k, m in metrics.items() if k != "total"} == {"NetworkIn", "NetworkOut"}
    assert metrics["total"]["expression"] == "rx + tx" and total["threshold"] == 3.1e12
    assert total["alarmActions"] == ["arn:aws:mock:::ltw-four-alerts"]  # notifies only: no stop on metric math
    for short, metric in (("in", "NetworkIn"), ("out", "NetworkOut")):
        a = alarms[f"ltw-four-transfer-3-{short}"]
        assert "metricQueries" not in a or not a["metricQueries"]
        assert (a["namespace"], a["metricName"], a["statistic"], a["period"]) == ("AWS/EC2", metric, "Sum", 3600)
        assert a["dimensions"] == {"InstanceId": "i-00000000000000004"} and a["threshold"] == 3.1e12 / 2
        assert sorted(a["alarmActions"]) == sorted(["arn:aws:mock:::ltw-four-alerts", stop])


def test_evidence_bucket(program):
    mocks = program
    assert mocks.of("aws:s3/bucketVersioning:BucketVersioning")[0].inputs["versioningConfiguration"]["status"] == "Enabled"
    sse = mocks.of("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")[0]
    assert sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    pab = mocks.of("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")[0].inputs
    assert all(pab[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    assert not mocks.of("aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration")
    host = next(json.loads(r.inputs["policy"]) for r in mocks.of("aws:iam/rolePolicy:RolePolicy")
                if r.name == "ltw-four-host-evidence")
    resources = [s["Resource"] for s in host["Statement"]]
    # hosts write content-addressed objects only: the indexes and anchors the destroy hook trusts are not theirs
    # and read staging's relay, never write it: a host cannot alter what another host will install
    assert resources == ["arn:aws:mock:::ltw-four-evidence/trials/ltw-four/objects/*",
                         "arn:aws:mock:::ltw-four-evidence/trials/ltw-four/staging/*", "arn:aws:mock:::ltw-four-evidence"]
    assert host["Statement"][1]["Action"] == "s3:GetObject"
    assert host["Statement"][2]["Condition"] == {"StringLike": {"s3:prefix": ["trials/ltw-four/*"]}}
    assert not any("*" == s["Resource"] or s["Action"] == "s3:*" for s in host["Statement"])
    locked = run_program(live(object_lock_days=30))
    (lock,) = locked.of("aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration")
    assert lock.inputs["rule"]["defaultRetention"] == {"mode": "GOVERNANCE", "days": 30}
    assert locked.of("aws:s3/bucket:Bucket")[0].inputs["objectLockEnabled"] is True


def test_outputs_have_the_documented_shape(program):
    out = program.exports
    parsed = parse_outputs(json.dumps(out))
    assert [(h.rank, h.zone, h.private_ip) for h in parsed.hosts] == [
        (0, "us-east-1c", "10.42.0.11"), (1, "us-east-1c", "10.42.0.12"), (2, "us-east-1c", "10.42.0.13"),
        (3, "us-east-1d", "10.42.0.14")]
    assert parsed.bucket == "ltw-four-evidence-0001" and parsed.prefix == "trials/ltw-four/"
    assert parsed.isolated_ranks == [3] and parsed.deadline == deadline_of(program)
    assert out["hosts"][3]["ebs_baseline_mb_s"] == 125.0 and out["hosts"][3]["volume_throughput_mb_s"] == 250


@pytest.mark.parametrize("edit, words", [
    (lambda o: o["hosts"][1].update(private_ip="10.0.0.1; curl evil"), "private_ip"),
    (lambda o: o["hosts"].pop(0), "ranks must be 0..2"),
    (lambda o: o["hosts"][1].update(instance_id=o["hosts"][0]["instance_id"]), "share an instance id"),
    (lambda o: o.update(prefix="trials/other/"), "prefix"),
    (lambda o: o.pop("bucket"), "bucket"),
    (lambda o: o.update(format="v0"), "format"),
    (lambda o: o.update(ssh_user="root; rm"), "ssh_user"),
])
def test_hostile_outputs_refused(program, edit, words):
    out = copy.deepcopy(program.exports)
    edit(out)
    with pytest.raises(OutputsError, match=words):
        parse_outputs(json.dumps(out))
    with pytest.raises(OutputsError, match="not JSON"):
        parse_outputs("{")


@pytest.mark.parametrize("changes, words", [
    ({"hours": 4, "deadline": 4}, "compute: \\$29.78 estimated > \\$24.00"),
    ({"prices": {"transfer/cross-zone-out": 0.02}}, "transfer: \\$83.79 estimated > \\$66.00"),
    ({"transfer_guard_bytes": 2.5e12}, "host 3 \\(isolated zone\\) would move 2.856 TB .* > 95% of the 2.500 TB"),
])
def test_over_budget_refused_before_any_resource(changes, words):
    if "deadline" in changes:  # hours after this hour
        changes = {**changes, "deadline": (this_hour() + dt.timedelta(hours=changes["deadline"])).isoformat()}
    d = run_program(live(**changes))
    assert d.returncode == 1 and re.search(words, d.errors), d.errors  # a RunError: its message alone
    assert [r.typ for r in d.resources] == [STACK_TYPE]  # nothing was registered but the stack itself
    assert "category" in d.errors and "total" in d.errors  # the table comes with the refusal


def test_deadline_must_fit_the_paid_hours():
    now = dt.datetime.now(dt.timezone.utc)
    far = run_program(study(deadline=(now + dt.timedelta(hours=4, seconds=30)).isoformat()))
    assert far.returncode == 1 and re.search(r"4\.0\d h away but the budget pays for 3 h", far.errors), far.errors
    past = run_program(study(deadline=(now - dt.timedelta(hours=2)).isoformat()))
    assert past.returncode == 1 and "passed" in past.errors, past.errors
    assert [r.typ for r in far.resources + past.resources] == [STACK_TYPE] * 2


def test_estimate_for_the_four_worker_study():
    cfg = TrialConfig.model_validate(study())
    est = estimate(cfg, NOW)
    assert est.problems == []
    assert est.totals_usd.compute == pytest.approx(4 * 3 * 1.861)
    ring = 2 * 3 / 4  # each link carries 2(N-1)/N of the payload per all-reduce
    ddp = 128 * ring * 4 * PARAMS
    diloco = 8 * ring * 4 * PARAMS  # 128 updates / H = 16
    traffic = {t.arm: t for t in est.traffic}
    assert traffic["single"].cross_zone_bytes == 0
    assert traffic["ddp-four"].cross_zone_bytes == pytest.approx(2 * ddp)  # links 2→3 and 3→0
    assert traffic["diloco-four"].cross_zone_bytes == pytest.approx(2 * diloco)
    assert est.totals_usd.transfer == pytest.approx((2 * ddp + 2 * diloco) / 1e9 * 0.02)
    assert est.isolated_host_bytes == {3: pytest.approx(2 * ddp + 2 * diloco)}
    # the same hosts in one zone: no cross-zone bytes, no isolated host
    one_zone = TrialConfig.model_validate(study(hosts=[{"rank": r, "instance_type": "g6e.xlarge",
                                                        "zone": "us-east-1c"} for r in range(4)]))
    assert estimate(one_zone, NOW).totals_usd.transfer == 0 and one_zone.isolated_ranks() == []
    pair = TrialConfig.model_validate(study(hosts=[{"rank": 0, "instance_type": "g6e.xlarge", "zone": "us-east-1c"},
                                                   {"rank": 1, "instance_type": "g6e.xlarge", "zone": "us-east-1d"}],
                                            arms=[{"name": "p", "kind": "ddp", "world_size": 2, "updates": 10}]))
    assert arm_traffic(pair, pair.arms[0]).cross_zone_bytes == pytest.approx(2 * 10 * 1 * 4 * PARAMS)


def test_the_stack_names_its_arms_once_through_the_experiment():
    """The example stack names its experiment and profile; the arms it plans are that experiment's at that
    profile, as `orchestrate run` resolves them (#33: no second copy to drift)."""
    from training.arms import kind
    from training.config import resolve

    cfg = TrialConfig.model_validate(study())
    r = resolve("local-training-windows", "gpu")
    want = [(a.name, a.kind, a.world_size, r.profile.updates, r.arm_settings(a).get("sync_every"))
            for a in r.experiment.arms if kind(a.kind).trains]
    assert [(a.name, a.kind, a.world_size, a.updates, a.sync_every) for a in cfg.arms] == want
    assert [a.name for a in cfg.arms] == ["single", "ddp-four", "diloco-four"] and cfg.arms[2].sync_every == 16
    smoke = TrialConfig.model_validate(study(profile="smoke"))  # the profile's updates and its H
    assert {(a.updates, a.sync_every) for a in smoke.arms if a.kind == "diloco"} == {(16, 4)}
    # PowerSGD's payload is measured: asked for by name, taken from `measured`, refused for an arm not there
    with pytest.raises(ValueError, match="arm powersgd-pair: give payload_bytes_per_sync"):
        TrialConfig.model_validate(study(experiment="batched-learning"))
    batched = TrialConfig.model_validate(study(experiment="batched-learning",
                                               measured={"powersgd-pair": {"payload_bytes_per_sync": 1234}}))
    assert {a.name: a.payload_bytes_per_sync for a in batched.arms} == {"single": None, "powersgd-pair": 1234}
    with pytest.raises(ValueError, match="measured names no arm of batched-learning that trains: seed"):
        TrialConfig.model_validate(study(experiment="batched-learning", measured={"seed": {"payload_bytes_per_sync": 1}}))
    both = study() | {"arms": [{"name": "p", "kind": "ddp", "world_size": 2, "updates": 10}]}
    with pytest.raises(ValueError, match="give experiment .local-training-windows: its arms come from its file. or arms, not both"):
        TrialConfig.model_validate(both)
    with pytest.raises(ValueError, match="experiment nope at profile gpu"):
        TrialConfig.model_validate(study(experiment="nope"))


@pytest.mark.parametrize("changes, words", [
    ({"budget": {"total_usd": 50, "compute_usd": 24, "transfer_usd": 66, "storage_other_usd": 10}}, "exceed the budget"),
    ({"hosts": [{"rank": 1, "instance_type": "g6e.xlarge", "zone": "us-east-1c"}]}, "ranks must be"),
    ({"hosts": [{"rank": 0, "instance_type": "g6e.xlarge", "zone": "us-west-2a"}]}, "not in region"),
    ({"arms": [{"name": "p", "kind": "powersgd", "world_size": 2, "updates": 8}]}, "payload_bytes_per_sync"),
    ({"deadline": "2026-12-01T03:00:00"}, "timezone"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_config_refused(changes, words):
    with pytest.raises(ValueError, match=words):
        TrialConfig.model_validate(study(**changes))


def test_on_host_transfer_guard_counts_across_reboots(tmp_path):
    """The guard script itself, under bash: counters since boot, carried over a reboot, and the stop
    command run once the limit is reached."""
    script = tmp_path / "guard"
    script.write_text(GUARD_SCRIPT)
    state, netdev, boot = tmp_path / "state", tmp_path / "netdev", tmp_path / "boot_id"
    state.mkdir()

    def run(rx_eth: int, tx_eth: int, boot_id: str, limit: int = 10_000) -> str:
        netdev.write_text(
            "Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
            f"    lo: 999999 1 0 0 0 0 0 0 999999 1 0 0 0 0 0 0\n"
            f"enp39s0:{rx_eth} 1 0 0 0 0 0 0 {tx_eth} 1 0 0 0 0 0 0\n"
            f"  ens5: 100 1 0 0 0 0 0 0 50 1 0 0 0 0 0 0\n")
        boot.write_text(boot_id)
        env = dict(os.environ, TRIAL_GUARD_LIMIT=str(limit), TRIAL_GUARD_SOFT="9000", TRIAL_GUARD_STATE=str(state), TRIAL_NETDEV=str(netdev),
                   TRIAL_BOOT_ID=str(boot), TRIAL_STOP_COMMAND=f"touch {tmp_path / 'stopped'}")
        subprocess.run(["bash", str(script)], env=env, check=True)
        return (state / "total").read_text().strip()

    assert run(1000, 2000, "boot-a") == str(1000 + 2000 + 150)  # loopback excluded
    assert run(3000, 3000, "boot-a") == str(6150)
    assert not (tmp_path / "stopped").exists()
    assert run(100, 0, "boot-b") == str(6150 + 250)  # after a reboot the counters restart: carried over
    assert not (tmp_path / "stopped").exists()
    assert not (state / "soft-passed").exists()  # 6,400 < the controller's stop (9,000 here)
    run(3000, 1000, "boot-b")  # 6150 + 4150 ≥ 10,000
    assert (tmp_path / "stopped").exists()
    assert (state / "soft-passed").read_text().strip() == "10300"  # said once on the host too


def test_estimate_command(tmp_path):
    from conftest import example_stack, run_cli

    r = run_cli("-m", "orchestrate", "estimate", "--stack", str(example_stack(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "ddp-four: 2,628.7 GB cross-zone, out" in r.stdout and "isolated host 3: 2.793 TB" in r.stdout
    over = example_stack(tmp_path, prices={"instance/g6e.xlarge": 2.5})
    r = run_cli("-m", "orchestrate", "estimate", "--stack", str(over))
    assert r.returncode == 1 and "compute: $30.00 estimated > $24.00 reserved" in r.stderr
    (tmp_path / "bad.yaml").write_text("config: {}\n")
    r = run_cli("-m", "orchestrate", "estimate", "--stack", str(tmp_path / "bad.yaml"))
    assert r.returncode == 2 and "trials:cluster" in r.stderr


def test_cluster_description_from_the_stack_outputs(program, tmp_path):
    """orchestrate reads the outputs into cluster.json; what it cannot vouch for it refuses."""
    from orchestrate.cluster import ClusterError, load, pulumi_cluster, save

    out = program.exports
    c = pulumi_cluster(json.dumps(out), key_file="/root/.ssh/trial", host_keys={0: "ssh-ed25519 AAAAC3Nz"})
    assert [(h.rank, h.address, h.private_address, h.zone) for h in c.by_rank] == [
        (r, f"198.18.0.{11 + r}", f"10.42.0.{11 + r}", "us-east-1d" if r == 3 else "us-east-1c") for r in range(4)]
    assert c.store == "s3://ltw-four-evidence-0001/trials/ltw-four/" and c.by_rank[0].host_key == "ssh-ed25519 AAAAC3Nz"
    assert load(save(c, tmp_path / "cluster.json")) == c  # round trip through cluster.json
    # what the controller's guard and `orchestrate status` need: the isolated host, its guard, the budget
    assert (c.guarded_ranks, c.transfer_guard_bytes, c.budget_name, c.budget_usd) == (
        [3], out["transfer_guard_bytes"], "ltw-four-budget", 100.0)
    assert c.alert_topic == "arn:aws:mock:::ltw-four-alerts"  # whom status asks who hears the alerts
    # the AMI's own environment runs the project (staging refuses one below requires-python by name)
    assert {h.python for h in c.hosts} == {"/opt/pytorch/bin/python"} and {h.user for h in c.hosts} == {"ubuntu"}
    bad = json.loads((tmp_path / "cluster.json").read_text())
    bad["hosts"][2]["rank"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ClusterError, match="ranks must be 0..3 once each"):
        load(tmp_path / "bad.json")
    hostile = copy.deepcopy(out)
    hostile["hosts"][0]["public_ip"] = "$(reboot)"
    with pytest.raises(ClusterError, match="public_ip"):
        pulumi_cluster(hostile, key_file="/k")


def run_entry(cluster: dict, **kw) -> str:
    """The program as `pulumi up` runs it (infra/__main__.py, config from the stack), through the engine
    harness; the refusal it ends with (a RunError: Pulumi prints the message alone), or '' when it built."""
    d = run_program(cluster, **kw)
    if d.returncode == 1:
        assert [r.typ for r in d.resources] == [STACK_TYPE]  # refused before anything was registered
        return d.errors
    assert d.returncode == 0, d.errors
    return ""


def stack_file(tmp_path: Path, cluster: dict) -> Path:
    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    conf["config"]["trials:cluster"] = {k: v for k, v in cluster.items() if k != "region"}
    out = tmp_path / "Pulumi.t.yaml"
    out.write_text(yaml.safe_dump(conf))
    return out


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("changes, refusal", [
    ({"hosts": [{"rank": r, "instance_type": "g7.huge" if r == 3 else "g6e.xlarge", "zone": "us-east-1c"}
                for r in range(4)]},
     "unknown instance type 'g7.huge' (known: g6e.2xlarge, g6e.xlarge): add its price and facts to infra/prices.py, "
     "or give its hourly price in the stack (prices: {instance/g7.huge: USD})"),
    ({"deadline": "2020-01-01T00:00:00Z"}, "the deadline 2020-01-01T00:00:00+00:00 has passed"),
    ({"deadline": "+5h"}, "h away but the budget pays for 3 h of compute"),
    ({"budget": {"total_usd": float("inf"), "compute_usd": 24, "transfer_usd": 66, "storage_other_usd": 10}},
     "Input should be a finite number"),
    ({"transfer_guard_bytes": float("nan")}, "Input should be a finite number"),
    ({"prices": {"transfer/cross-zone-out": -0.01}}, "prices: transfer/cross-zone-out = -0.01 is negative"),
    ({"prices": {"transfer/to-the-moon": 1.0}}, "prices: no price 'transfer/to-the-moon' to override"),
    ({"deadline": None}, "no deadline: set trials:cluster.deadline to the UTC time the cloud must stop the hosts"),
])
def test_plan_and_the_program_refuse_alike(tmp_path, changes, refusal):
    """Whatever `pulumi up` refuses, `orchestrate plan` refuses, in the same words (one validation)."""
    from typer.testing import CliRunner

    from orchestrate.cli import app

    now = dt.datetime.now(dt.timezone.utc)
    cluster = study(deadline=(now + dt.timedelta(hours=3)).isoformat())
    if changes.get("deadline") == "+5h":
        changes = {"deadline": (now + dt.timedelta(hours=5)).isoformat()}
    cluster.update(changes)
    if cluster["deadline"] is None:
        del cluster["deadline"]
    said = words(run_entry(cluster))
    assert refusal in said, said
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(stack_file(tmp_path, cluster)), "--no-quota"])
    assert r.exit_code in (1, 2) and isinstance(r.exception, SystemExit), r.output
    assert refusal in words(r.stdout + r.stderr), r.output


def test_the_shipped_stack_asks_for_what_is_the_users(tmp_path):
    """As shipped, the example stack is refused with the exact setting to add (by `plan` and by the
    program alike), and the operator key; with both set, both accept it."""
    from typer.testing import CliRunner

    from orchestrate.cli import app

    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    shipped = {**conf["trials:cluster"], "region": conf["aws:region"]}
    assert "deadline" not in shipped and "ssh_public_key" not in shipped
    said = words(run_entry(shipped))
    assert "no deadline: set trials:cluster.deadline" in said and "pulumi config set --path trials:cluster.deadline" in said
    assert "no ssh_public_key: set trials:cluster.ssh_public_key" in said
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--no-quota"])  # the default stack: Pulumi.dev.yaml
    problem = said[said.index("no deadline"):].split(" e.g. ")[0]  # the example time: now, to the minute
    assert r.exit_code == 1 and problem in words(r.stdout + r.stderr) and "no ssh_public_key" in words(r.stdout + r.stderr)
    shipped["deadline"] = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)).isoformat()
    assert "no deadline" not in words(run_entry(shipped))
    shipped["ssh_public_key"] = OPERATOR_KEY
    assert run_entry(shipped) == ""
    r = CliRunner().invoke(app, ["plan", "diloco-four", "--stack", str(stack_file(tmp_path, shipped)), "--no-quota"])
    assert r.exit_code == 0, r.output


def test_every_delete_that_costs_something_is_checked(program):
    """Every resource whose delete would delete something in the account carries the refusing hook, and the
    destroy gate its own (the same check: infra/teardown.py; what it does, against moto, in
    tests/infra/test_teardown.py; the order the engine runs them in, from every state, in
    tests/infra/test_destroy.py and test_failures.py). Only the retained evidence carries none. Both hooks
    run in previews too, so a destroy refuses before it asks."""
    assert set(program.hooks) == {"ltw-four-refuse-unpreserved", "ltw-four-destroy-gate", "ltw-four-lease-held"}
    deletes = {k: h for k, h in program.hooks.items() if k != "ltw-four-lease-held"}
    assert all(h["on_dry_run"] and not h["ignore_errors"] for h in deletes.values())
    # a host's before-create hook (infra/lease.py): not in a preview, which takes no lease
    assert not program.hooks["ltw-four-lease-held"]["on_dry_run"] and not program.hooks["ltw-four-lease-held"]["ignore_errors"]
    for r in program.resources:
        if r.typ == STACK_TYPE or (not r.custom and r.typ != "trials:infra:DestroyGate"):
            assert not r.hooks, r.name  # the stack and the concerns: their delete deletes nothing
        elif r.typ == "trials:infra:DestroyGate":
            assert r.hooks == {"before_delete": ["ltw-four-destroy-gate"]}
        elif r.retain_on_delete:
            assert not r.hooks and r.typ.startswith("aws:s3/"), r.name  # the evidence and what keeps it safe
        elif r.typ == "aws:ec2/instance:Instance":
            assert r.hooks == {"before_delete": ["ltw-four-refuse-unpreserved"], "before_create": ["ltw-four-lease-held"]}
        else:
            assert r.hooks == {"before_delete": ["ltw-four-refuse-unpreserved"]}, r.name
    assert len([r for r in program.resources if r.hooks.get("before_delete") == ["ltw-four-refuse-unpreserved"]]) == 45
    for inst in program.of("aws:ec2/instance:Instance"):
        assert inst.inputs["tags"]["evidence-bucket"] == "ltw-four-evidence-0001"  # what the check verifies
    assert program.named("ltw-four-destroy-gate").inputs["bucket"] == "ltw-four-evidence-0001"


def test_destroy_runs_the_program_after_the_deadline(tmp_path):
    """`pulumi destroy --run-program` runs the program to register the destroy hooks, by when the deadline
    has passed and the operator's key file may be gone: asked for by `orchestrate destroy` (a request this
    process wrote, infra/destroy_request.py) the program builds (the hooks registered) instead of refusing the
    plan; without it — or with a `TRIALS_TEARDOWN=1` left in the shell, a request of another stack, or one whose
    writer is not an ancestor of the run — it refuses as `pulumi up` must (#65), and says why."""
    from infra.destroy_request import write_request

    past = study(deadline=(dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).isoformat(),
                 ssh_public_key=str(tmp_path / "gone.pub"))
    assert "is neither an OpenSSH public key nor a file" in words(run_entry(past, env={"TRIALS_TEARDOWN": ""}))
    past["ssh_public_key"] = OPERATOR_KEY
    assert "has passed" in words(run_entry(past, env={"TRIALS_TEARDOWN": ""}))
    left = words(run_entry(past, env={"TRIALS_TEARDOWN": "1"}))
    assert "has passed" in left and "TRIALS_TEARDOWN=1 names no request file: this run does what `pulumi up` does" in left
    other = words(run_entry(past, env={"TRIALS_TEARDOWN": str(write_request("trials", "prod", where=tmp_path))}))
    assert "has passed" in other and "names a request for trials/prod, not trials/test" in other
    stranger = subprocess.Popen(["sleep", "60"])  # alive, but not an ancestor of the program's process
    try:
        foreign = words(run_entry(past, env={"TRIALS_TEARDOWN": str(write_request("trials", "test", pid=stranger.pid,
                                                                                   where=tmp_path))}))
    finally:
        stranger.kill()
        stranger.wait()
    assert "has passed" in foreign and f"a request of process {stranger.pid}, which did not start this run" in foreign
    past["ssh_public_key"] = str(tmp_path / "gone.pub")
    assert run_entry(past, env=teardown_env()) == ""


def test_one_guard_fraction_for_plan_controller_and_host(program, tmp_path):
    """The controller stops at guard_fraction of the guard; the plan checks the isolated host's traffic
    (with protocol overhead and the staged seed, which its counters see too) against the same number,
    and the program hands it to the controller (outputs → cluster.json) and to the host's guard."""
    from infra.userdata import GUARD_FRACTION
    from orchestrate.cluster import pulumi_cluster
    from orchestrate.guard import Guard

    ring = 2 * 3 / 4 * 4 * PARAMS * (128 + 8)  # ddp-four + diloco-four, per link
    planned = 2 * ring * 1.02 + 4 * PARAMS
    at_default = estimate(TrialConfig.model_validate(study(guard_fraction=GUARD_FRACTION)), NOW)
    assert at_default.isolated_host_planned_bytes == {3: pytest.approx(planned)}
    assert planned > 0.9 * 3.1e12  # the example's traffic does not fit under a 90 % stop ...
    (p,) = at_default.problems
    assert "host 3 (isolated zone) would move 2.856 TB" in p and "> 90% of the 3.100 TB transfer guard (2.790 TB)" in p
    shipped = estimate(TrialConfig.model_validate(study()), NOW)  # ... so the example stops at 95 %
    assert shipped.problems == [] and shipped.guard_stop_bytes == pytest.approx(0.95 * 3.1e12)
    assert "against the controller's stop at 95% of the 3.100 TB guard = 2.945 TB (97.0% of it)" in \
        __import__("infra.plan", fromlist=["table"]).table(shipped)
    mocks, out = program, program.exports
    assert out["guard_fraction"] == 0.95
    c = pulumi_cluster(json.dumps(out), key_file="/k")
    assert c.guard_fraction == 0.95 and Guard().fraction == GUARD_FRACTION
    (host3,) = [r for r in mocks.of("aws:ec2/instance:Instance") if r.inputs["availabilityZone"] == "us-east-1d"]
    assert f"SOFT=${{TRIAL_GUARD_SOFT:-{int(3.1e12 * 0.95)}}}" in host3.inputs["userData"]
    assert "echo 0.95 > /var/lib/trial-guard/fraction" in host3.inputs["userData"]


def test_estimate_counts_stopped_volumes_and_public_ipv4():
    """After the deadline the hosts are stopped, not gone: their gp3 volumes (and provisioned throughput)
    bill until `down`; every public IPv4 address bills $0.005 an hour while its host runs."""
    days = 2.5
    est = estimate(TrialConfig.model_validate(study(stopped_days=days)), NOW)
    lines = {x.item: x for x in est.lines}
    gb = 4 * 300 * 2**30 / 1e9
    assert lines["stopped: 4 x 300 GiB gp3 for 2.5 d until down"].usd == pytest.approx(gb * 0.08 * days * 24 / 730)
    assert lines["stopped: 4 x 125 MB/s above 125 for 2.5 d"].usd == pytest.approx(4 * 125 * 0.04 * days * 24 / 730)
    assert lines["4 public IPv4 addresses x 3 h"].usd == pytest.approx(4 * 3 * 0.005)
    per_day = gb * 0.08 * 24 / 730 + 4 * 125 * 0.04 * 24 / 730
    assert per_day == pytest.approx(4.05, abs=0.01)  # four 300 GiB gp3 volumes at 250 MB/s: ≈ $4.05 a day
    running = gb * 0.08 * 3 / 730 + 4 * 125 * 0.04 * 3 / 730 + 50 * 0.023
    sweep = sweep_usd_per_day(TrialConfig.model_validate(study()))[0]  # the deadline stop, a day after the deadline
    assert lines[f"deadline stop after the deadline: ${sweep:.4f}/d x 2.5 d"].usd == pytest.approx(days * sweep)
    assert est.totals_usd.storage_other == pytest.approx(running + days * (per_day + sweep) + 0.06)
    shipped = estimate(TrialConfig.model_validate(study()), NOW)  # the default: one day until down
    assert shipped.stopped_days == 1 and shipped.totals_usd.storage_other == pytest.approx(running + per_day + sweep + 0.06)
    # a week stopped no longer fits the $10 storage reservation: said before anything exists
    week = estimate(TrialConfig.model_validate(study(stopped_days=7)), NOW)
    assert any(p.startswith("storage_other: $") and "> $10.00 reserved" in p for p in week.problems)


def test_zone_ids_name_the_physical_zone():
    """A zone ID (use1-az4) is the same physical zone in every account; the subnets are placed by ID and
    the instances take their zone from the subnet. IDs of another region, or names mixed with IDs, are refused."""
    hosts = [{"rank": r, "instance_type": "g6e.xlarge", "zone": "use1-az4" if r == 3 else "use1-az2"} for r in range(4)]
    mocks = run_program(live(hosts=hosts))
    out = mocks.exports
    subnets = sorted((r.inputs.get("availabilityZoneId"), r.inputs.get("availabilityZone"))
                     for r in mocks.of("aws:ec2/subnet:Subnet"))
    assert subnets == [("use1-az2", None), ("use1-az4", None)]
    assert all("availabilityZone" not in r.inputs for r in mocks.of("aws:ec2/instance:Instance"))
    assert out["isolated_ranks"] == [3] and [h["zone"] for h in out["hosts"]] == ["use1-az2"] * 3 + ["use1-az4"]
    with pytest.raises(ValueError, match="zone ID usw2-az1 is not in region us-east-1"):
        TrialConfig.model_validate(study(hosts=[{"rank": 0, "instance_type": "g6e.xlarge", "zone": "usw2-az1"}]))
    with pytest.raises(ValueError, match="as a name .* or every one as an ID"):
        TrialConfig.model_validate(study(hosts=[{**h, "zone": "us-east-1c"} if h["rank"] == 0 else h for h in hosts]))


def test_a_new_ami_release_replaces_no_host():
    """`get_ami(most_recent=True)` is read again at every `pulumi up`: the hosts ignore a changed image id
    after creation (Pulumi keeps the stored value, so no replacement), and a stack may pin the id."""
    d = run_program(live())
    for r in range(4):
        assert {"ami", "userData"} <= set(d.named(f"ltw-four-rank-{r}").ignore_changes)
    assert d.exports["ami"] == "ami-0123456789abcdef0"  # recorded in the outputs, to be pinned
    pinned = run_program(live(ami_id="ami-0fedcba9876543210"))
    assert not [c for c in pinned.calls if c["token"] == "aws:ec2/getAmi:getAmi"]  # no lookup at all
    assert {r.inputs["ami"] for r in pinned.of("aws:ec2/instance:Instance")} == {"ami-0fedcba9876543210"}
    assert pinned.exports["ami"] == "ami-0fedcba9876543210"
    # after a new release the lookup names another image; the output names the one the hosts run (their
    # stored state, which keeps the image they were created with)
    kept = [{**a, "outputs": {**a["outputs"], "ami": "ami-0aaaaaaaaaaaaaaa1"}} if a["type"] == "aws:ec2/instance:Instance"
            else a for a in answers()]
    assert run_program(live(), answers=kept).exports["ami"] == "ami-0aaaaaaaaaaaaaaa1"

"""The boto3 calls orchestrate makes itself, against moto's server on loopback (no AWS): tag scan,
describe, stop (with the waiter), budget and alarm reads, reconciliation."""

from __future__ import annotations

import pytest

from orchestrate.cloud import read_alarms, read_budget, reconcile, stop_trial, trial_instances

ACCOUNT = "123456789012"  # moto's default account


def launch(aws, trial: str, zones: list[str]) -> list[str]:
    ec2 = aws.client("ec2")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = []
    for rank, zone in enumerate(zones):
        r = ec2.run_instances(ImageId=ami, InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                              Placement={"AvailabilityZone": zone},
                              TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                  {"Key": "trial", "Value": trial}, {"Key": "rank", "Value": str(rank)}]},
                                  {"ResourceType": "volume", "Tags": [{"Key": "trial", "Value": trial}]}])
        ids.append(r["Instances"][0]["InstanceId"])
    return ids


def test_tag_scan_describe_and_stop(aws):
    ids = launch(aws, "t-stop", ["us-east-1c"] * 3 + ["us-east-1d"])
    other = launch(aws, "someone-else", ["us-east-1c"])
    found = trial_instances(aws, "t-stop")
    assert [(h.rank, h.zone, h.state) for h in found] == \
        [(0, "us-east-1c", "running"), (1, "us-east-1c", "running"), (2, "us-east-1c", "running"),
         (3, "us-east-1d", "running")]
    assert [h.instance_id for h in found] == ids and all(h.private_ip for h in found)

    assert sorted(stop_trial(aws, "t-stop", delay_s=1)) == sorted(ids)
    assert {h.state for h in trial_instances(aws, "t-stop")} == {"stopped"}
    assert stop_trial(aws, "t-stop") == []  # nothing live is left: nothing to stop
    assert trial_instances(aws, "someone-else")[0].state == "running"  # not ours: untouched
    assert [h.instance_id for h in trial_instances(aws, "someone-else")] == other


def test_reconcile_reports_what_still_bills(aws):
    ids = launch(aws, "t-rec", ["us-east-1c", "us-east-1d"])
    cw = aws.client("cloudwatch")
    cw.put_metric_alarm(AlarmName="t-rec-transfer-1", Namespace="AWS/EC2", MetricName="NetworkIn",
                        Statistic="Sum", Period=3600, EvaluationPeriods=1, Threshold=3.1e12,
                        ComparisonOperator="GreaterThanThreshold",
                        Dimensions=[{"Name": "InstanceId", "Value": ids[1]}],
                        AlarmActions=["arn:aws:automate:us-east-1:ec2:stop"])
    live = reconcile(aws, "t-rec")
    kinds = sorted((f.kind, f.billing) for f in live)
    assert ("instance", True) in kinds and ("alarm", False) in kinds
    assert [f.id for f in live if f.kind == "instance"] == ids
    stop_trial(aws, "t-rec", delay_s=1)
    after = reconcile(aws, "t-rec")
    assert not [f for f in after if f.kind == "instance" and f.billing]  # stopped: no compute billing
    assert [f.state for f in after if f.kind == "instance"] == ["stopped", "stopped"]
    aws.client("ec2").terminate_instances(InstanceIds=ids)
    assert [f for f in reconcile(aws, "t-rec") if f.kind == "instance"] == []
    # what a destroy must not leave either: a budget of the trial (one per ten hosts' spend stops) and a deadline stop
    budgets = aws.client("budgets")
    for name in ("t-rec-budget", "t-rec-budget-2", "t-rec-budgetary", "other-budget"):
        budgets.create_budget(AccountId="123456789012", Budget={
            "BudgetName": name, "BudgetLimit": {"Amount": "100", "Unit": "USD"}, "TimeUnit": "ANNUALLY",
            "BudgetType": "COST"})
    aws.client("scheduler").create_schedule(
        Name="t-rec-deadline-0a1b2c3", ScheduleExpression="rate(1 minute)", FlexibleTimeWindow={"Mode": "OFF"},
        Target={"Arn": "arn:aws:lambda:us-east-1:123456789012:function:t-rec-deadline-sweep",
                "RoleArn": "arn:aws:iam::123456789012:role/x"})
    left = {(f.kind, f.id): f.billing for f in reconcile(aws, "t-rec")}
    assert {k: v for k, v in left.items() if k[0] in ("budget", "schedule")} == {
        ("budget", "t-rec-budget"): True, ("budget", "t-rec-budget-2"): True,
        ("schedule", "t-rec-deadline-0a1b2c3"): True}


def test_budget_and_alarm_reads(aws):
    b = aws.client("budgets")
    b.create_budget(
        AccountId=ACCOUNT,
        Budget={"BudgetName": "t-bud-budget", "BudgetLimit": {"Amount": "100.0", "Unit": "USD"},
                "TimeUnit": "MONTHLY", "BudgetType": "COST"},
        NotificationsWithSubscribers=[
            {"Notification": {"NotificationType": kind, "ComparisonOperator": "GREATER_THAN",
                              "Threshold": pct, "ThresholdType": "PERCENTAGE"},
             "Subscribers": [{"SubscriptionType": "SNS", "Address": "arn:aws:sns:us-east-1:123456789012:t"}]}
            for kind, pct in [("ACTUAL", 50.0), ("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0)]])
    got = read_budget(aws, ACCOUNT, "t-bud-budget")
    assert got.limit_usd == 100.0
    assert got.notifications == [("ACTUAL", 50.0), ("ACTUAL", 80.0), ("ACTUAL", 100.0), ("FORECASTED", 100.0)]
    with pytest.raises(Exception, match="NotFound|not found|does not exist"):
        read_budget(aws, ACCOUNT, "no-such-budget")
    assert read_alarms(aws, "t-bud-") == []
    aws.client("cloudwatch").put_metric_alarm(
        AlarmName="t-bud-transfer-3", Namespace="AWS/EC2", MetricName="NetworkOut", Statistic="Sum", Period=3600,
        EvaluationPeriods=1, Threshold=3.1e12, ComparisonOperator="GreaterThanThreshold")
    aws.client("cloudwatch").set_alarm_state(AlarmName="t-bud-transfer-3", StateValue="ALARM",
                                                 StateReason="test: as if the host moved too much")
    (a,) = read_alarms(aws, "t-bud-")
    assert (a.name, a.threshold, a.state) == ("t-bud-transfer-3", 3.1e12, "ALARM")

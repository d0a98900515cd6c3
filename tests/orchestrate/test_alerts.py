"""Alerts a user actually gets (moto's server on loopback): `status` shows each transfer alarm's state
and who the alert topic reaches, warning when nobody does, when a subscription still awaits its
confirmation, and when an alarm is raised; `run` looks at the alarms before each arm, and a raised
one stops the trial the way the controller's guard does — exit 3, the stop recorded, what there is
preserved, nothing trained.

moto confirms every subscription at once, so a pending one comes from botocore's Stubber with the
response real SNS gives (`SubscriptionArn: PendingConfirmation`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
from botocore.stub import Stubber

from conftest import run_cli
from orchestrate.cloud import trial_alerts
from orchestrate.cluster import local_cluster, save


def alarm(aws, name: str) -> None:
    aws.client("cloudwatch").put_metric_alarm(
        AlarmName=name, ComparisonOperator="GreaterThanThreshold", EvaluationPeriods=1, Threshold=3.1e12,
        MetricName="NetworkIn", Namespace="AWS/EC2", Period=3600, Statistic="Sum")


def cloud_cluster(tmp_path: Path, trial: str, topic: str):
    return local_cluster(2, tmp_path, "file:///unused").model_copy(update={
        "region": "us-east-1", "trial": trial, "alert_topic": topic, "guarded_ranks": [1],
        "transfer_guard_bytes": 3.1e12})


def test_status_says_whether_anyone_hears_the_alerts(aws, tmp_path):
    topic = aws.client("sns").create_topic(Name="al-alerts")["TopicArn"]
    for suffix in ("", "-in", "-out"):  # the notifying sum alarm and the two that stop the host
        alarm(aws, f"al-trial-transfer-1{suffix}")
    alarm(aws, "someone-else-transfer-1")  # another trial's: not shown
    save(cloud_cluster(tmp_path, "al-trial", topic), tmp_path / "cluster.json")
    home = tmp_path / "home"
    home.mkdir()

    def status() -> str:
        r = run_cli("-m", "orchestrate", "status", "--cluster", str(tmp_path / "cluster.json"), "--home", str(home))
        assert r.returncode == 0, r.stderr
        return " ".join(r.stderr.split())

    said = status()
    # (moto starts an alarm in OK; real CloudWatch in INSUFFICIENT_DATA until its first period)
    assert ("alerts: transfer alarms al-trial-transfer-1 OK, al-trial-transfer-1-in OK, al-trial-transfer-1-out OK; "
            "topic reaches no one") in said
    assert "warning: nobody subscribes to the alert topic" in said and "someone-else" not in said
    aws.client("sns").subscribe(TopicArn=topic, Protocol="email", Endpoint="me@example.com")
    said = status()
    assert "topic reaches me@example.com (email, confirmed)" in said and "warning:" not in said
    aws.client("cloudwatch").set_alarm_state(AlarmName="al-trial-transfer-1", StateValue="ALARM",
                                             StateReason="test: the host moved more than its guard")
    assert "warning: transfer alarm al-trial-transfer-1 is in ALARM (it stops its host)" in status()
    r = run_cli("-m", "orchestrate", "status", "--cluster", str(tmp_path / "cluster.json"), "--home", str(home),
                "--json")
    alerts = json.loads(r.stdout)["alerts"]
    assert [(a["name"], a["state"]) for a in alerts["alarms"]] == [
        ("al-trial-transfer-1", "ALARM"), ("al-trial-transfer-1-in", "OK"), ("al-trial-transfer-1-out", "OK")]


def test_a_pending_subscription_is_a_warning(tmp_path):
    sns = boto3.client("sns", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                       endpoint_url="http://127.0.0.1:9")  # never reached: the stubber answers
    cw = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                      endpoint_url="http://127.0.0.1:9")
    topic = "arn:aws:sns:us-east-1:123456789012:pa-alerts"
    with Stubber(sns) as s_sns, Stubber(cw) as s_cw:
        s_cw.add_response("describe_alarms", {"MetricAlarms": []}, {"AlarmNamePrefix": "pa-trial-transfer-"})
        s_sns.add_response("list_subscriptions_by_topic", {"Subscriptions": [
            {"SubscriptionArn": "PendingConfirmation", "Owner": "123456789012", "Protocol": "email",
             "Endpoint": "me@example.com", "TopicArn": topic}]}, {"TopicArn": topic})
        got = trial_alerts(type("S", (), {"client": lambda self, n: {"sns": sns, "cloudwatch": cw}[n]})(),
                           cloud_cluster(tmp_path, "pa-trial", topic))
    assert [s.model_dump() for s in got.subscriptions] == [{"protocol": "email", "endpoint": "me@example.com",
                                                           "state": "pending confirmation"}]
    assert got.warnings == [
        "the email subscription for me@example.com is pending confirmation: it hears nothing until its "
        "confirmation link is followed",
        "guarded host rank 1 lacks the transfer alarm(s) pa-trial-transfer-1, pa-trial-transfer-1-in, "
        "pa-trial-transfer-1-out: nothing in the cloud stops it at its guard (a stack made before the "
        "single-metric alarms: `pulumi up` adds them)"]


def test_a_raised_alarm_stops_the_run_before_an_arm(aws, tmp_path, tiny_seed):
    topic = aws.client("sns").create_topic(Name="ra-alerts")["TopicArn"]
    alarm(aws, "ra-trial-transfer-1")
    aws.client("cloudwatch").set_alarm_state(AlarmName="ra-trial-transfer-1", StateValue="ALARM",
                                             StateReason="test")
    c = cloud_cluster(tmp_path, "ra-trial", topic).model_copy(update={"store": f"file://{tmp_path / 'store'}"})
    save(c, tmp_path / "cluster.json")
    seeds = tmp_path / "seeds"
    shutil.copytree(tiny_seed, seeds / "tiny")
    r = run_cli("-m", "orchestrate", "run", "cooperative-learning", "--profile", "smoke", "--trials", str(tmp_path / "t"),
                "--seeds", str(seeds), "--cluster", str(tmp_path / "cluster.json"), timeout=600)
    said = " ".join(r.stderr.split()) + " ".join(r.stdout.split())
    assert r.returncode == 3, said
    assert "transfer alarm ra-trial-transfer-1 in ALARM" in said
    home = tmp_path / "t" / "cooperative-learning-smoke"
    (stop,) = sorted((home / "stops").glob("*.json"))
    rec = json.loads(stop.read_text())
    assert rec["guard"] == "transfer alarm ra-trial-transfer-1 in ALARM" and rec["finished_arms"] == []
    assert not any((home / "runs").glob("*/rank-0/result.json"))  # nothing trained
    assert json.loads((home / "preserved.json").read_text())["files"] > 0  # what there was, preserved

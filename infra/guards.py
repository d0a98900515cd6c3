"""What stops the trial's spending without the operator, and when each stop exists.

Every stop that can name its hosts without knowing their ids exists before any host: the hosts depend on it
(infra/hosts.py), so at no point of any `pulumi up` — whatever order the engine creates in, wherever a
create fails — does an instance exist without it. The stops that need an instance id are created for each
host as soon as that host exists, depending on it alone, never waiting for the other hosts (`cover`).

Before every host:
  deadline   an EventBridge Scheduler one-time schedule that, at the deadline, starts SSM Automation's
             `AWS-StopEC2Instance` on every instance tagged `trial=<trial>` (rate control: `Targets` by tag,
             `TargetParameterName` InstanceId, every instance at once, errors not stopping the rest). The
             schedule's role may start that document and stop only instances carrying the trial's tag.
             AWS documents each piece: Scheduler's universal target calls any API action that is not a
             read-only one (get/describe/list...), so `ssm:startAutomationExecution` is a target; Automation
             runs rate-controlled executions on the resources a tag selects, one per instance, as the
             caller when no AutomationAssumeRole is given; `ec2:StopInstances` takes the condition
             `aws:ResourceTag/${TagKey}` (docs/aws.md cites the pages). A host created after the schedule
             is covered by it without any change to it.
  alerts     the SNS topic every alarm and budget notification goes to (exported: `status` asks who hears it),
  budget     an AWS Budgets budget (the region's spend, or the trial's tag) notifying at 50/80/100 % actual
             and 100 % forecast: a late backstop, never the bound.
Per host, when it exists (`cover`):
  transfer   for an isolated-zone host, CloudWatch alarms on its NetworkIn and NetworkOut that stop it, and
             one on their sum that notifies. AWS runs an EC2 stop action only from an alarm on a
             per-instance metric (InstanceId dimension), so these need the host's id.
  spend      a budget action that, at 100 % of actual spend, runs SSM's stop document on that host (Budgets'
             `SsmActionDefinition` takes instance ids only; 10 actions per budget, so at most 10 hosts).
The on-host deadline timer and transfer guard (the hosts' user data) stay as the last line.
"""

from __future__ import annotations

import datetime as dt
import json

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.outputs import transfer_alarm_prefix
from infra.plan import Host, TrialConfig

ALARM_PERIOD_S = 3600
STOP_BY_TAG_TARGET = "arn:aws:scheduler:::aws-sdk:ssm:startAutomationExecution"
STOP_DOCUMENT = "AWS-StopEC2Instance"


def stop_by_tag_input(trial: str) -> dict:
    """SSM StartAutomationExecution's request (the schedule's input: the API's own parameter names): AWS's stop
    document on every instance tagged trial=<trial>, all at once, a failure on one (a terminated instance the
    tag still names) not stopping the others."""
    return {"DocumentName": STOP_DOCUMENT, "TargetParameterName": "InstanceId",
            "Targets": [{"Key": "tag:trial", "Values": [trial]}], "MaxConcurrency": "100%", "MaxErrors": "100%"}


def stop_by_tag_policy(trial: str, region: str) -> dict:
    """What the deadline schedule's role may do: start the stop document, find the tagged instances, stop
    only instances carrying the trial's tag (the automation runs with this role's permissions)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "StartTheStopDocument", "Effect": "Allow", "Action": "ssm:StartAutomationExecution",
         "Resource": [f"arn:aws:ssm:{region}::automation-definition/{STOP_DOCUMENT}:*",
                      f"arn:aws:ssm:{region}:*:automation-definition/{STOP_DOCUMENT}:*"]},
        {"Sid": "StopOnlyTheTrialsHosts", "Effect": "Allow", "Action": "ec2:StopInstances",
         "Resource": f"arn:aws:ec2:{region}:*:instance/*",
         "Condition": {"StringEquals": {"aws:ResourceTag/trial": trial}}},
        {"Sid": "FindTheTaggedHosts", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "tag:GetResources",
                    "ssm:GetAutomationExecution", "ssm:DescribeAutomationExecutions"], "Resource": "*"}]}


def budget_period_start(cfg: TrialConfig) -> str:
    """The day the budget's single period begins, in Budgets' format: the day the paid hours begin at
    the latest (the deadline less `hours`), a value of the stack's own config. Not the day of this
    `pulumi up`: every later `up` would move the start forward (Budgets updates it in place) and the
    spend before it would drop out of the budget. The plan refuses a deadline more than `hours` away,
    so this day is never after the first `up`."""
    assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
    return (cfg.deadline - dt.timedelta(hours=cfg.hours)).strftime("%Y-%m-%d_00:00")


class Guards(Concern):
    """`topic`: where every alarm and budget notification goes; `budget_name`: fixed, so that `status` can read
    the budget's spend by name; `before_hosts`: what every instance must depend on (the deadline stop)."""

    def __init__(self, cfg: TrialConfig, refuse: pulumi.ResourceHook, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("Guards", cfg, refuse, opts)
        self.topic = self._alerts()
        self.before_hosts = self._deadline()
        self.budget_name = self.name("budget")
        self.budget, self.spender = self._budget()
        self.register_outputs({"alert_topic": self.topic.arn, "budget_name": self.budget_name})

    def _alerts(self) -> aws.sns.Topic:
        name, cfg = self.name, self.cfg
        topic = aws.sns.Topic(name("alerts"), tags=self.tags, opts=self.child())
        aws.sns.TopicPolicy(name("alerts-publishers"), arn=topic.arn, opts=self.child(),
                            policy=topic.arn.apply(lambda arn: json.dumps({
                                "Version": "2012-10-17", "Statement": [{
                                    "Sid": "BudgetsAndAlarms", "Effect": "Allow", "Action": "sns:Publish",
                                    "Resource": arn,
                                    "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]}}]})))
        if cfg.budget.alert_email:
            aws.sns.TopicSubscription(name("alerts-email"), topic=topic.arn, protocol="email",
                                      endpoint=cfg.budget.alert_email, opts=self.child())
        return topic

    def _deadline(self) -> list[pulumi.Resource]:
        """The one-time schedule that stops every host of the trial by its tag, and its role's policy: the
        resources a host depends on."""
        name, cfg = self.name, self.cfg
        assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
        stopper = aws.iam.Role(name("deadline"), tags=self.tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "scheduler.amazonaws.com"}}]}))
        policy = aws.iam.RolePolicy(name("deadline-stop"), role=stopper.id, opts=self.child(),
                                    policy=json.dumps(stop_by_tag_policy(cfg.trial, cfg.region)))
        at = cfg.deadline.strftime("%Y-%m-%dT%H:%M:%S")
        schedule = aws.scheduler.Schedule(
            name("deadline"), schedule_expression=f"at({at})", schedule_expression_timezone="UTC",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            description=f"stop every host tagged trial={cfg.trial} at its deadline", opts=self.child(),
            target=aws.scheduler.ScheduleTargetArgs(arn=STOP_BY_TAG_TARGET, role_arn=stopper.arn,
                                                    input=json.dumps(stop_by_tag_input(cfg.trial))))
        return [schedule, policy]

    def _budget(self) -> tuple[aws.budgets.Budget, aws.iam.Role]:
        """A late backstop (AWS Budgets' data is refreshed at least daily, hours behind the spend), never
        the trial's bound — the deadline schedule and the transfer guards are. It finds the trial's cost
        by region (default) or by the trial tag; activating the tag is opt-in, because activation is
        refused for a key billing has not seen yet (up to 24 h after first use) and in an Organization's
        member accounts, which would fail the first `pulumi up`. Returns the budget and the role its
        per-host spend stops run with."""
        name, cfg, tags = self.name, self.cfg, self.tags
        if cfg.budget_filter == "tag-activate":
            # account-wide: another trial's stack may rely on it, so destroying this one leaves it active
            aws.costexplorer.CostAllocationTag(name("tag"), tag_key="trial", status="Active",
                                               opts=self.child(retain_on_delete=True))
        cost_filter = (aws.budgets.BudgetCostFilterArgs(name="Region", values=[cfg.region])
                       if cfg.budget_filter == "region" else
                       aws.budgets.BudgetCostFilterArgs(name="TagKeyValue", values=[f"user:trial${cfg.trial}"]))
        notes = [("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)]
        budget = aws.budgets.Budget(
            # a monthly budget would reset if the trial crossed a month boundary (the example does): one
            # period from the day the paid hours begin, long enough that it never resets during a trial. The
            # start is kept as created: a later deadline in the config must not move it either
            name("budget"), name=self.budget_name, budget_type="COST", limit_amount=f"{cfg.budget.total_usd:.2f}",
            limit_unit="USD", time_unit="ANNUALLY", time_period_start=budget_period_start(cfg), tags=tags,
            cost_filters=[cost_filter], opts=self.child(ignore_changes=["timePeriodStart"]),
            notifications=[aws.budgets.BudgetNotificationArgs(
                comparison_operator="GREATER_THAN", notification_type=kind, threshold=pct, threshold_type="PERCENTAGE",
                subscriber_sns_topic_arns=[self.topic.arn],
                subscriber_email_addresses=[cfg.budget.alert_email] if cfg.budget.alert_email else None)
                for kind, pct in notes])
        # the spend stop's role: Budgets runs SSM's stop document with it, which may stop only the trial's
        # tagged instances and only through SSM (each host's action names the host: `cover`)
        spender = aws.iam.Role(name("spend-stop"), tags=tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "budgets.amazonaws.com"}}]}))
        aws.iam.RolePolicy(name("spend-stop"), role=spender.id, opts=self.child(), policy=json.dumps({
            "Version": "2012-10-17", "Statement": [
                {"Sid": "StopDocument", "Effect": "Allow", "Action": "ssm:StartAutomationExecution",
                 "Resource": f"arn:aws:ssm:{cfg.region}:*:automation-definition/AWS-StopEC2Instance:*"},
                {"Sid": "StopTheTrialsHostsThroughSsm", "Effect": "Allow", "Action": "ec2:StopInstances",
                 "Resource": f"arn:aws:ec2:{cfg.region}:*:instance/*",
                 "Condition": {"StringEquals": {"aws:ResourceTag/trial": cfg.trial},
                               "ForAnyValue:StringEquals": {"aws:CalledVia": ["ssm.amazonaws.com"]}}},
                {"Sid": "ReadState", "Effect": "Allow", "Action": "ec2:DescribeInstanceStatus", "Resource": "*"}]}))
        return budget, spender

    def cover(self, host: Host, inst: aws.ec2.Instance) -> None:
        """The stops that need `inst`'s id, for it alone: its spend stop and, for an isolated-zone host, its
        transfer alarms. They depend on this host only, so no host waits for another to be guarded."""
        name, cfg, tags = self.name, self.cfg, self.tags
        aws.budgets.BudgetAction(
            name("spend-stop", host.rank), budget_name=self.budget.name, action_type="RUN_SSM_DOCUMENTS",
            approval_model="AUTOMATIC", notification_type="ACTUAL", execution_role_arn=self.spender.arn, tags=tags,
            opts=self.child(),
            action_threshold=aws.budgets.BudgetActionActionThresholdArgs(action_threshold_type="PERCENTAGE",
                                                                         action_threshold_value=100),
            definition=aws.budgets.BudgetActionDefinitionArgs(
                ssm_action_definition=aws.budgets.BudgetActionDefinitionSsmActionDefinitionArgs(
                    action_sub_type="STOP_EC2_INSTANCES", instance_ids=[inst.id], region=cfg.region)),
            subscribers=[aws.budgets.BudgetActionSubscriberArgs(address=self.topic.arn, subscription_type="SNS")])
        if host.rank in set(cfg.isolated_ranks()):
            self._transfer(host, inst)

    def _transfer(self, h: Host, inst: aws.ec2.Instance) -> None:
        """The transfer guard, cloud side, for an isolated-zone host. AWS runs an EC2 stop action only for an
        alarm on a per-instance EC2 metric (InstanceId dimension), so the stop sits on two single-metric
        alarms, NetworkIn and NetworkOut, each at half the guard per hour: whenever in + out exceeds the
        guard, one of them exceeds half of it, so the stop comes no later than a sum would give. The
        metric-math alarm on in + out only notifies. All are named <trial>-transfer-<rank>…, which `run`
        and `status` read."""
        name, cfg, tags = self.name, self.cfg, self.tags
        stop_action = f"arn:aws:automate:{cfg.region}:ec2:stop"

        def metric(mid: str, metric_name: str) -> aws.cloudwatch.MetricAlarmMetricQueryArgs:
            return aws.cloudwatch.MetricAlarmMetricQueryArgs(id=mid, return_data=False, metric=aws.cloudwatch.
                                                             MetricAlarmMetricQueryMetricArgs(
                namespace="AWS/EC2", metric_name=metric_name, period=ALARM_PERIOD_S, stat="Sum",
                dimensions={"InstanceId": inst.id}))

        alarm = f"{transfer_alarm_prefix(cfg.trial)}{h.rank}"
        aws.cloudwatch.MetricAlarm(
            name("transfer", h.rank), name=alarm,
            comparison_operator="GreaterThanThreshold", evaluation_periods=1,
            threshold=cfg.transfer_guard_bytes, treat_missing_data="notBreaching", tags=tags, opts=self.child(),
            alarm_description=f"rank {h.rank} (isolated zone {h.zone}): NetworkIn + NetworkOut over one hour "
                              f"exceeds the whole {cfg.transfer_guard_bytes:.3g}-byte guard (notifies; the "
                              f"{alarm}-in/-out alarms stop the host)",
            metric_queries=[metric("rx", "NetworkIn"), metric("tx", "NetworkOut"),
                            aws.cloudwatch.MetricAlarmMetricQueryArgs(id="total", expression="rx + tx",
                                                                      label="bytes in + out", return_data=True)],
            alarm_actions=[self.topic.arn])
        for short, metric_name in (("in", "NetworkIn"), ("out", "NetworkOut")):
            aws.cloudwatch.MetricAlarm(
                name("transfer", h.rank, short), name=f"{alarm}-{short}",
                comparison_operator="GreaterThanThreshold", evaluation_periods=1,
                namespace="AWS/EC2", metric_name=metric_name, period=ALARM_PERIOD_S, statistic="Sum",
                dimensions={"InstanceId": inst.id}, threshold=cfg.transfer_guard_bytes / 2,
                treat_missing_data="notBreaching", tags=tags, opts=self.child(),
                alarm_description=f"rank {h.rank} (isolated zone {h.zone}): {metric_name} over one hour "
                                  f"exceeds half the {cfg.transfer_guard_bytes:.3g}-byte guard: stops the host",
                alarm_actions=[self.topic.arn, stop_action])

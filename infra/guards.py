"""What stops the trial's spending without the operator: an EventBridge Scheduler one-time schedule at
the deadline that stops every instance (its role allowed ec2:StopInstances on exactly those; the
on-host deadline timer is the hosts' user data); per isolated-zone host, CloudWatch alarms on NetworkIn
and NetworkOut that stop it and one on their sum that notifies (the on-host cumulative guard, and why
both: infra/userdata.py); last, a late backstop: an AWS Budgets budget (the region's spend, or the
trial's tag) notifying an SNS topic at 50/80/100 % actual and 100 % forecast, and a budget action that
stops every instance at 100 % actual (its own role)."""

from __future__ import annotations

import datetime as dt
import json

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.hosts import Hosts
from infra.outputs import transfer_alarm_prefix
from infra.plan import TrialConfig

ALARM_PERIOD_S = 3600


def budget_period_start(cfg: TrialConfig) -> str:
    """The day the budget's single period begins, in Budgets' format: the day the paid hours begin at
    the latest (the deadline less `hours`), a value of the stack's own config. Not the day of this
    `pulumi up`: every later `up` would move the start forward (Budgets updates it in place) and the
    spend before it would drop out of the budget. The plan refuses a deadline more than `hours` away,
    so this day is never after the first `up`."""
    assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
    return (cfg.deadline - dt.timedelta(hours=cfg.hours)).strftime("%Y-%m-%d_00:00")


class Guards(Concern):
    """`topic`: where every alarm and budget notification goes (exported: `status` asks who hears it);
    `budget_name`: fixed, so that `status` can read the budget's spend by name."""

    def __init__(self, cfg: TrialConfig, hosts: Hosts, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("Guards", cfg, opts)
        self.topic = self._alerts()
        arns = pulumi.Output.all(*[i.arn for _, i in hosts.instances])
        ids = pulumi.Output.all(*[i.id for _, i in hosts.instances])
        self._deadline(arns, ids)
        self.budget_name = self.name("budget")
        self._budget(arns, ids)
        self._transfer(hosts)
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

    def _deadline(self, arns: pulumi.Output[list], ids: pulumi.Output[list]) -> None:
        """A one-time schedule that stops every instance (`ids`), with a role allowed only that (`arns`)."""
        name, cfg = self.name, self.cfg
        assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
        stopper = aws.iam.Role(name("deadline"), tags=self.tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "scheduler.amazonaws.com"}}]}))
        aws.iam.RolePolicy(name("deadline-stop"), role=stopper.id, opts=self.child(), policy=arns.apply(lambda a: json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:StopInstances",
                                                    "Resource": list(a)}]})))
        at = cfg.deadline.strftime("%Y-%m-%dT%H:%M:%S")
        aws.scheduler.Schedule(
            name("deadline"), schedule_expression=f"at({at})", schedule_expression_timezone="UTC",
            flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            description=f"stop every host of trial {cfg.trial} at its deadline", opts=self.child(),
            target=aws.scheduler.ScheduleTargetArgs(
                arn="arn:aws:scheduler:::aws-sdk:ec2:stopInstances", role_arn=stopper.arn,
                input=ids.apply(lambda i: json.dumps({"InstanceIds": list(i)}))))

    def _budget(self, arns: pulumi.Output[list], ids: pulumi.Output[list]) -> None:
        """A late backstop (AWS Budgets' data is refreshed at least daily, hours behind the spend), never
        the trial's bound — the deadline schedule and the transfer guards are. It finds the trial's cost
        by region (default) or by the trial tag; activating the tag is opt-in, because activation is
        refused for a key billing has not seen yet (up to 24 h after first use) and in an Organization's
        member accounts, which would fail the first `pulumi up`."""
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
        # the spend stop: at 100 % of actual spend, Budgets runs SSM's stop document on every host, approved
        # automatically, with a role that may start that one document and stop only these instances. Budgets
        # sees costs hours late, so the deadline schedule stays the first bound; this one catches the rest
        spender = aws.iam.Role(name("spend-stop"), tags=tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "budgets.amazonaws.com"}}]}))
        aws.iam.RolePolicy(name("spend-stop"), role=spender.id, opts=self.child(), policy=arns.apply(lambda a: json.dumps({
            "Version": "2012-10-17", "Statement": [
                {"Sid": "StopDocument", "Effect": "Allow", "Action": "ssm:StartAutomationExecution",
                 "Resource": f"arn:aws:ssm:{cfg.region}:*:automation-definition/AWS-StopEC2Instance:*"},
                {"Sid": "StopTheseHostsThroughSsm", "Effect": "Allow", "Action": "ec2:StopInstances",
                 "Resource": list(a), "Condition": {"ForAnyValue:StringEquals": {"aws:CalledVia": ["ssm.amazonaws.com"]}}},
                {"Sid": "ReadState", "Effect": "Allow", "Action": "ec2:DescribeInstanceStatus", "Resource": "*"}]})))
        aws.budgets.BudgetAction(
            name("spend-stop"), budget_name=budget.name, action_type="RUN_SSM_DOCUMENTS", approval_model="AUTOMATIC",
            notification_type="ACTUAL", execution_role_arn=spender.arn, tags=tags, opts=self.child(),
            action_threshold=aws.budgets.BudgetActionActionThresholdArgs(action_threshold_type="PERCENTAGE",
                                                                         action_threshold_value=100),
            definition=aws.budgets.BudgetActionDefinitionArgs(
                ssm_action_definition=aws.budgets.BudgetActionDefinitionSsmActionDefinitionArgs(
                    action_sub_type="STOP_EC2_INSTANCES", instance_ids=ids, region=cfg.region)),
            subscribers=[aws.budgets.BudgetActionSubscriberArgs(address=self.topic.arn, subscription_type="SNS")])

    def _transfer(self, hosts: Hosts) -> None:
        """The transfer guard, cloud side: isolated-zone hosts. AWS runs an EC2 stop action only for an
        alarm on a per-instance EC2 metric (InstanceId dimension), so the stop sits on two single-metric
        alarms, NetworkIn and NetworkOut, each at half the guard per hour: whenever in + out exceeds the
        guard, one of them exceeds half of it, so the stop comes no later than a sum would give. The
        metric-math alarm on in + out only notifies. All are named <trial>-transfer-<rank>…, which `run`
        and `status` read."""
        name, cfg, tags = self.name, self.cfg, self.tags
        isolated = set(cfg.isolated_ranks())
        stop_action = f"arn:aws:automate:{cfg.region}:ec2:stop"
        for h, inst in hosts.instances:
            if h.rank not in isolated:
                continue

            def metric(mid: str, metric_name: str, inst: aws.ec2.Instance = inst) -> aws.cloudwatch.MetricAlarmMetricQueryArgs:
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

"""What stops the trial's spending without the operator, and when each stop exists.

Every stop that can name its hosts without knowing their ids exists before any host: the hosts depend on it
(infra/hosts.py), so at no point of any `pulumi up` — whatever order the engine creates in, wherever a
create fails — does an instance exist without it. The stops that need an instance id are created for each
host as soon as that host exists, depending on it alone, never waiting for the other hosts (`cover`).

Before every host:
  deadline   the deadline stop (infra/sweep.py): an EventBridge Scheduler schedule, `rate(1 minute)` from the
             deadline on (its start date) for as long as the stack exists, invoking a Lambda function that stops
             every instance tagged `trial=<trial>` that runs — but for one inside a grace `orchestrate start
             --grace` granted, capped by `grace_cap_minutes`. So a host pending at the deadline, one an `up`
             creates after it, one started by hand or restarted by EC2 is stopped again within a minute or two,
             by the cloud; each host's own check (infra/userdata.py) does the same at every boot and minute.
             It resolves instances alone (`DescribeInstances`), so a failure means a host was not stopped, and
             every failure is loud: the function publishes it and raises (an alarm on its `Errors` notifies),
             an invocation Scheduler cannot deliver goes to a dead-letter queue (an alarm on its depth
             notifies), and a failed, timed-out or cancelled run of AWS's stop runbook (the budget's spend
             stops run it) reaches the topic through an EventBridge rule. The function's role may only look
             instances up, stop those carrying the trial's tag, publish to the trial's topic and write its
             logs. What AWS documents for each piece: docs/aws.md ("After the deadline").
  alerts     the SNS topic every alarm and budget notification goes to (exported: `status` asks who hears it),
  budget     an AWS Budgets budget (the region's spend, or the trial's tag) notifying at 50/80/100 % actual
             and 100 % forecast: a late backstop, never the bound.
Per host, when it exists (`cover`):
  transfer   for an isolated-zone host, CloudWatch alarms on its NetworkIn and NetworkOut that stop it, and
             one on their sum that notifies. AWS runs an EC2 stop action only from an alarm on a
             per-instance metric (InstanceId dimension), so these need the host's id.
  spend      a budget action that, at 100 % of actual spend, runs SSM's stop document on that host (Budgets'
             `SsmActionDefinition` takes instance ids only). A budget holds 10 actions: past ten hosts the
             stops of ranks 10g … 10g+9 go on budget g, `<trial>-budget-<g>`, on the same spend (infra/plan.py
             `budget_group`), each stop still for its host alone.
The on-host deadline timer and transfer guard (the hosts' user data) stay as the last line.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pulumi
import pulumi_aws as aws

from infra.concern import Concern
from infra.outputs import transfer_alarm_prefix
from infra.plan import (SWEEP_MEMORY_MB, Host, TrialConfig, budget_group, budget_groups, budget_label,
                        stopped_volume_usd_per_day)
from infra.sweep import SWEEP_MINUTES, utc_text

ALARM_PERIOD_S = 3600
STOP_DOCUMENT = "AWS-StopEC2Instance"  # what the budget's spend stops run (Budgets' STOP_EC2_INSTANCES)
SWEEP_HANDLER = "sweep.handler"
SWEEP_RUNTIME = "python3.12"
AUTOMATION_FAILED = ["Failed", "TimedOut", "Cancelled"]


def sweep_source() -> str:
    """The deadline stop's code as Lambda receives it: infra/sweep.py as it is (standard library and boto3)."""
    return (Path(__file__).resolve().parent / "sweep.py").read_text()


def sweep_input(cfg: TrialConfig, topic_arn: str) -> dict:
    """The schedule's input, which Scheduler hands the function as its event (infra/sweep.py reads these keys)."""
    assert cfg.deadline is not None
    return {"trial": cfg.trial, "region": cfg.region, "deadline": cfg.deadline.isoformat(),
            "grace_cap_minutes": cfg.grace_cap_minutes, "topic_arn": topic_arn, "stopped_days": cfg.stopped_days,
            "volume_usd_per_host_day": stopped_volume_usd_per_day(cfg) / len(cfg.hosts),
            "scheduled_time": "<aws.scheduler.scheduled-time>"}  # Scheduler's context attribute, filled per run


def sweep_policy(cfg: TrialConfig, topic_arn: str, function_name: str) -> dict:
    """What the deadline stop may do: look instances up, stop only those carrying the trial's tag, publish to the
    trial's alert topic, write its own log group."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "FindTheTrialsHosts", "Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},
        {"Sid": "StopOnlyTheTrialsHosts", "Effect": "Allow", "Action": "ec2:StopInstances",
         "Resource": f"arn:aws:ec2:{cfg.region}:*:instance/*",
         "Condition": {"StringEquals": {"aws:ResourceTag/trial": cfg.trial}}},
        {"Sid": "SayWhatItDid", "Effect": "Allow", "Action": "sns:Publish", "Resource": topic_arn},
        {"Sid": "ItsOwnLogs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": f"arn:aws:logs:{cfg.region}:*:log-group:/aws/lambda/{function_name}:*"}]}


def automation_failed_pattern() -> dict:
    """An EventBridge pattern for runs of AWS's stop runbook that ended without stopping (SSM's
    "EC2 Automation Execution Status-change Notification", detail Status and Definition)."""
    return {"source": ["aws.ssm"], "detail-type": ["EC2 Automation Execution Status-change Notification"],
            "detail": {"Status": AUTOMATION_FAILED, "Definition": [STOP_DOCUMENT]}}


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
                                    "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com",
                                                              "events.amazonaws.com"]}}]})))
        if cfg.budget.alert_email:
            aws.sns.TopicSubscription(name("alerts-email"), topic=topic.arn, protocol="email",
                                      endpoint=cfg.budget.alert_email, opts=self.child())
        return topic

    def _deadline(self) -> list[pulumi.Resource]:
        """The deadline stop (the sweep, its schedule and their roles) and what makes its failures loud; returns
        what a host depends on."""
        name, cfg, tags = self.name, self.cfg, self.tags
        assert cfg.deadline is not None  # the plan refuses a stack without one before anything exists
        fname = name("deadline-sweep")
        topic = self.topic.arn
        runner = aws.iam.Role(fname, tags=tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "lambda.amazonaws.com"}}]}))
        runs = aws.iam.RolePolicy(fname, role=runner.id, opts=self.child(),
                                  policy=topic.apply(lambda arn: json.dumps(sweep_policy(cfg, arn, fname))))
        logs = aws.cloudwatch.LogGroup(fname, name=f"/aws/lambda/{fname}", retention_in_days=30, tags=tags,
                                       opts=self.child())
        sweep = aws.lambda_.Function(
            fname, name=fname, role=runner.arn, runtime=SWEEP_RUNTIME, handler=SWEEP_HANDLER,
            code=pulumi.AssetArchive({"sweep.py": pulumi.StringAsset(sweep_source())}),
            memory_size=SWEEP_MEMORY_MB, timeout=60, tags=tags, opts=self.child(depends_on=[runs, logs]),
            description=f"stops every running host tagged trial={cfg.trial} from its deadline on, but in a grace")
        # Scheduler hands each run to Lambda's asynchronous queue: a run throttled or failing past its retries is
        # not Scheduler's failure and reaches no dead-letter queue — Lambda sends it to the topic instead, and drops
        # a run older than two minutes (the next minute's run replaces it) rather than stop hosts hours late
        aws.lambda_.FunctionEventInvokeConfig(
            fname, function_name=sweep.name, maximum_event_age_in_seconds=120, maximum_retry_attempts=2,
            destination_config=aws.lambda_.FunctionEventInvokeConfigDestinationConfigArgs(
                on_failure=aws.lambda_.FunctionEventInvokeConfigDestinationConfigOnFailureArgs(destination=topic)),
            opts=self.child())
        dlq = aws.sqs.Queue(name("deadline-dlq"), message_retention_seconds=14 * 86400, tags=tags, opts=self.child())
        stopper = aws.iam.Role(name("deadline"), tags=tags, opts=self.child(), assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "scheduler.amazonaws.com"}}]}))
        invoke = aws.iam.RolePolicy(name("deadline-stop"), role=stopper.id, opts=self.child(),
                                    policy=pulumi.Output.all(sweep.arn, dlq.arn).apply(lambda a: json.dumps({
                                        "Version": "2012-10-17", "Statement": [
                                            {"Sid": "RunTheSweep", "Effect": "Allow", "Action": "lambda:InvokeFunction",
                                             "Resource": [a[0], f"{a[0]}:*"]},
                                            {"Sid": "KeepWhatItCouldNotDeliver", "Effect": "Allow",
                                             "Action": "sqs:SendMessage", "Resource": a[1]}]})))
        at = utc_text(cfg.deadline)
        schedule = self.schedule = aws.scheduler.Schedule(
            name("deadline"), schedule_expression=f"rate({SWEEP_MINUTES} minute)", schedule_expression_timezone="UTC",
            start_date=at, flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
            description=f"from the deadline on, every minute: stop every running host tagged trial={cfg.trial}",
            opts=self.child(depends_on=[invoke]),
            target=aws.scheduler.ScheduleTargetArgs(
                arn=sweep.arn, role_arn=stopper.arn, input=topic.apply(lambda arn: json.dumps(sweep_input(cfg, arn))),
                retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(maximum_event_age_in_seconds=300,
                                                                         maximum_retry_attempts=2),
                dead_letter_config=aws.scheduler.ScheduleTargetDeadLetterConfigArgs(arn=dlq.arn)))
        # failures, loud: the function's errors; invocations Scheduler could not deliver; AWS's stop runbook failing
        aws.cloudwatch.MetricAlarm(
            name("deadline-sweep-errors"), name=name("deadline-sweep-errors"), comparison_operator="GreaterThanThreshold",
            evaluation_periods=1, threshold=0, namespace="AWS/Lambda", metric_name="Errors", period=60,
            statistic="Sum", dimensions={"FunctionName": fname}, treat_missing_data="notBreaching", tags=tags,
            alarm_description=f"the deadline stop of trial {cfg.trial} failed: a host may run past its deadline",
            alarm_actions=[topic], opts=self.child())
        aws.cloudwatch.MetricAlarm(
            name("deadline-dlq"), name=name("deadline-dlq"), comparison_operator="GreaterThanThreshold",
            evaluation_periods=1, threshold=0, namespace="AWS/SQS", metric_name="ApproximateNumberOfMessagesVisible",
            period=60, statistic="Maximum", dimensions={"QueueName": dlq.name}, treat_missing_data="notBreaching",
            tags=tags, alarm_description=f"Scheduler could not run the deadline stop of trial {cfg.trial} "
                                         "(retries exhausted: the dead-letter queue holds the invocation)",
            alarm_actions=[topic], opts=self.child())
        rule = aws.cloudwatch.EventRule(name("stop-failed"), tags=tags, opts=self.child(),
                                        description=f"{STOP_DOCUMENT} ended without stopping (the spend stops of "
                                                    f"trial {cfg.trial} run it)",
                                        event_pattern=json.dumps(automation_failed_pattern()))
        aws.cloudwatch.EventTarget(name("stop-failed"), rule=rule.name, arn=topic, opts=self.child())
        self.deadline_stop = {"schedule": f"rate({SWEEP_MINUTES} minute) from {at}", "function": fname,
                              "grace_cap_minutes": cfg.grace_cap_minutes}
        return [schedule, runs, invoke]

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
        # past ten hosts (10 actions a budget): one more budget per ten ranks, on the same spend, limit and period as
        # the first (its period as created: a budget added after the deadline moved must not start later and miss
        # the spend before), holding those ranks' spend stops. Each notifies at 100 % of actual spend, the threshold
        # its actions share, as the console pairs an action with an alert; the first budget's other alerts are not
        # repeated
        self.budgets = {0: budget}
        for g in budget_groups(h.rank for h in cfg.hosts)[1:]:
            self.budgets[g] = aws.budgets.Budget(
                name("budget", g), name=budget_label(cfg.trial, g), budget_type="COST",
                limit_amount=f"{cfg.budget.total_usd:.2f}", limit_unit="USD", time_unit="ANNUALLY",
                time_period_start=budget.time_period_start, tags=tags, cost_filters=[cost_filter],
                opts=self.child(ignore_changes=["timePeriodStart"]),
                notifications=[aws.budgets.BudgetNotificationArgs(
                    comparison_operator="GREATER_THAN", notification_type="ACTUAL", threshold=100,
                    threshold_type="PERCENTAGE", subscriber_sns_topic_arns=[self.topic.arn])])
        return budget, spender

    def cover(self, host: Host, inst: aws.ec2.Instance) -> None:
        """The stops that need `inst`'s id, for it alone: its spend stop and, for an isolated-zone host, its
        transfer alarms. They depend on this host only, so no host waits for another to be guarded."""
        name, cfg, tags = self.name, self.cfg, self.tags
        aws.budgets.BudgetAction(
            name("spend-stop", host.rank), budget_name=self.budgets[budget_group(host.rank)].name, action_type="RUN_SSM_DOCUMENTS",
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

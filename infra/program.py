"""The trial cluster as Pulumi resources. `build(cfg, now)` refuses an over-budget or mis-timed plan
before registering anything, then creates, all tagged `trial=<name>`:

  network   a VPC, one public subnet per chosen zone, an internet gateway; a security group whose
            every port accepts only its own members (NCCL, rendezvous) and SSH only from the
            operator's CIDR
  hosts     one g6e instance per rank in its zone (a name, or a zone ID: the same physical zone in
            every account), logged in to with the operator's key (a key pair from the stack's
            ssh_public_key): the deep-learning AMI pinned (ami_id) or looked up once and then kept, IMDSv2
            required, shutdown = stop, a 300 GiB encrypted gp3 root volume with the same throughput,
            IOPS and read-ahead everywhere, an instance role that may write only the trial's evidence
            objects and read only those and the trial's staging relay (staging/)
  guards    an EventBridge Scheduler one-time schedule at the deadline that stops every instance
            (role allowed ec2:StopInstances on exactly those), the on-host deadline timer; per
            isolated-zone host, CloudWatch alarms on NetworkIn and NetworkOut that stop it and one on
            their sum that notifies, and the on-host cumulative guard (why both: infra/userdata.py);
            last, a late backstop: an AWS Budgets budget (the region's spend, or the trial's tag)
            notifying an SNS topic at 50/80/100 % actual and 100 % forecast, and a budget action that
            stops every instance at 100 % actual (its own role)
  evidence  an S3 bucket: versioning, default encryption, public access blocked, owner-enforced,
            TLS only, optional object lock

and exports the outputs `orchestrate` reads (shape: infra/outputs.py).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.outputs import OUTPUTS_FORMAT, transfer_alarm_prefix
from infra.plan import TrialConfig, estimate, require_within_budget
from infra.prices import INSTANCE_TYPES
from infra.teardown import BUCKET_TAG, before_host_delete
from infra.userdata import user_data

ALARM_PERIOD_S = 3600


def build(cfg: TrialConfig, now: dt.datetime | None = None, *, teardown: bool = False) -> dict[str, Any]:
    """`teardown`: the program runs for `pulumi destroy --run-program` (infra/__main__.py), to register
    the hooks; the plan is not refused then (its deadline has passed by design), nothing is created."""
    start = now or dt.datetime.now(dt.timezone.utc)
    # raises with the whole table; nothing registered yet
    est = estimate(cfg, start) if teardown else require_within_budget(cfg, start)
    if teardown and cfg.deadline is None:
        raise ValueError("teardown: the stack has no deadline; it was never created by this program")
    assert cfg.deadline is not None  # a missing one is among the problems above
    tags = {"trial": cfg.trial, "managed-by": "trials"}

    def name(*parts: Any) -> str:
        return "-".join([cfg.trial, *map(str, parts)])

    # network
    vpc = aws.ec2.Vpc(name("vpc"), cidr_block="10.42.0.0/16", enable_dns_hostnames=True, enable_dns_support=True,
                      tags=tags)
    igw = aws.ec2.InternetGateway(name("igw"), vpc_id=vpc.id, tags=tags)
    routes = aws.ec2.RouteTable(name("routes"), vpc_id=vpc.id, tags=tags,
                                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)])
    subnets = {}
    for i, zone in enumerate(sorted({h.zone for h in cfg.hosts})):
        # a zone ID (use1-az4) names the same physical zone in every account; a name may not
        where = {"availability_zone_id": zone} if cfg.hosts[0].zone_is_id else {"availability_zone": zone}
        subnets[zone] = aws.ec2.Subnet(name("subnet", zone), vpc_id=vpc.id, **where,
                                       cidr_block=f"10.42.{i}.0/24", map_public_ip_on_launch=True, tags=tags)
        aws.ec2.RouteTableAssociation(name("routes", zone), subnet_id=subnets[zone].id, route_table_id=routes.id)
    sg = aws.ec2.SecurityGroup(name("members"), vpc_id=vpc.id, tags=tags,
                               description=f"trial {cfg.trial}: members only; SSH from the operator")
    aws.vpc.SecurityGroupIngressRule(name("members-in"), security_group_id=sg.id, ip_protocol="-1",
                                     referenced_security_group_id=sg.id, tags=tags,
                                     description="NCCL and rendezvous: members of this group only")
    aws.vpc.SecurityGroupIngressRule(name("ssh-in"), security_group_id=sg.id, ip_protocol="tcp", from_port=22,
                                     to_port=22, cidr_ipv4=cfg.operator_cidr, tags=tags,
                                     description="SSH from the operator")
    aws.vpc.SecurityGroupEgressRule(name("members-out"), security_group_id=sg.id, ip_protocol="-1",
                                    referenced_security_group_id=sg.id, tags=tags, description="to members")
    aws.vpc.SecurityGroupEgressRule(name("https-out"), security_group_id=sg.id, ip_protocol="tcp", from_port=443,
                                    to_port=443, cidr_ipv4="0.0.0.0/0", tags=tags,
                                    description="HTTPS: S3 evidence uploads, AWS APIs")

    # evidence bucket
    bucket = aws.s3.Bucket(name("evidence"), bucket_prefix=name("evidence-")[:37], tags=tags,
                           object_lock_enabled=cfg.object_lock_days is not None, force_destroy=False)
    aws.s3.BucketVersioning(name("evidence-versioning"), bucket=bucket.id,
                            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"))
    aws.s3.BucketServerSideEncryptionConfiguration(
        name("evidence-sse"), bucket=bucket.id,
        rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
            apply_server_side_encryption_by_default=aws.s3.
            BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(sse_algorithm="AES256"),
            bucket_key_enabled=True)])
    aws.s3.BucketPublicAccessBlock(name("evidence-private"), bucket=bucket.id, block_public_acls=True,
                                   block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True)
    aws.s3.BucketOwnershipControls(name("evidence-owner"), bucket=bucket.id,
                                   rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"))
    aws.s3.BucketPolicy(name("evidence-tls"), bucket=bucket.id, policy=bucket.arn.apply(lambda arn: json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Sid": "TLSOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})))
    if cfg.object_lock_days:
        aws.s3.BucketObjectLockConfiguration(
            name("evidence-lock"), bucket=bucket.id,
            rule=aws.s3.BucketObjectLockConfigurationRuleArgs(
                default_retention=aws.s3.BucketObjectLockConfigurationRuleDefaultRetentionArgs(
                    mode="GOVERNANCE", days=cfg.object_lock_days)))
    prefix = f"trials/{cfg.trial}/"

    # instance role: write (and read back) only the trial's evidence objects; read its staging relay
    role = aws.iam.Role(name("host"), tags=tags, assume_role_policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    aws.iam.RolePolicy(name("host-evidence"), role=role.id, policy=bucket.arn.apply(lambda arn: json.dumps({
        "Version": "2012-10-17", "Statement": [
            # a host writes only content-addressed objects (its checkpoint payloads, named by their
            # sha256): the indexes and the log's anchors, which the destroy hook trusts, are the
            # operator's alone
            {"Sid": "TrialPrefixObjects", "Effect": "Allow",
             "Action": ["s3:PutObject", "s3:GetObject", "s3:GetObjectAttributes", "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts"],
             "Resource": f"{arn}/{prefix}objects/*"},
            # staging's relay: the controller puts the wheels and the seed here once, each host reads
            # them in region (evidence/relay.py); a host never writes what another host will install
            {"Sid": "TrialStagingRead", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": f"{arn}/{prefix}staging/*"},
            {"Sid": "TrialPrefixList", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn,
             "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}}]})))
    profile = aws.iam.InstanceProfile(name("host"), role=role.name, tags=tags)

    # the image: pinned in the stack (ami_id), or the newest match at the first `pulumi up`. Either way a
    # host keeps the image it was created with (ignore_changes below): a new AMI release must never
    # replace a host, whose disk holds unpreserved evidence. The id is exported to be pinned.
    ami_id = cfg.ami_id or aws.ec2.get_ami(
        most_recent=True, owners=["amazon"],
        filters=[aws.ec2.GetAmiFilterArgs(name="name", values=[cfg.ami_name]),
                 aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"])]).id
    isolated = set(cfg.isolated_ranks())
    assert cfg.ssh_public_key is not None or teardown  # a missing one is among the problems above
    key = aws.ec2.KeyPair(name("operator"), key_name=name("operator"), public_key=cfg.ssh_public_key or "", tags=tags,
                          opts=pulumi.ResourceOptions(ignore_changes=["publicKey"]) if teardown else None)
    # `pulumi destroy` deletes a host's volume with it: the hook refuses until the trial is preserved
    refuse_unpreserved = pulumi.ResourceHook(name("refuse-unpreserved"), before_host_delete(
        cfg.trial, cfg.region, cfg.abandon_unpreserved))
    hosts = []
    for h in cfg.by_rank:
        inst = aws.ec2.Instance(
            name("rank", h.rank), ami=ami_id, instance_type=h.instance_type, subnet_id=subnets[h.zone].id,
            availability_zone=None if h.zone_is_id else h.zone, vpc_security_group_ids=[sg.id], iam_instance_profile=profile.name,
            key_name=key.key_name, instance_initiated_shutdown_behavior="stop",
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(http_tokens="required", http_endpoint="enabled",
                                                                 http_put_response_hop_limit=1),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_type="gp3", volume_size=cfg.volume.size_gib, encrypted=True, iops=cfg.volume.iops,
                throughput=cfg.volume.throughput_mb_s, delete_on_termination=True, tags={**tags, "rank": str(h.rank)}),
            user_data=user_data(trial=cfg.trial, rank=h.rank, deadline=cfg.deadline,
                                read_ahead_kib=cfg.volume.read_ahead_kib, login_user=cfg.ssh_user,
                                transfer_guard_bytes=cfg.transfer_guard_bytes if h.rank in isolated else None,
                                guard_fraction=cfg.guard_fraction),
            # a changed boot script must never replace a host: its disk holds unpreserved evidence
            user_data_replace_on_change=False,
            tags={**tags, "rank": str(h.rank), "Name": name("rank", h.rank), BUCKET_TAG: bucket.bucket},
            opts=pulumi.ResourceOptions(ignore_changes=["userData", "ami"],
                                        hooks=pulumi.ResourceHookBinding(before_delete=[refuse_unpreserved])))
        hosts.append((h, inst))

    # alerts
    topic = aws.sns.Topic(name("alerts"), tags=tags)
    aws.sns.TopicPolicy(name("alerts-publishers"), arn=topic.arn, policy=topic.arn.apply(lambda arn: json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Sid": "BudgetsAndAlarms", "Effect": "Allow", "Action": "sns:Publish", "Resource": arn,
            "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]}}]})))
    if cfg.budget.alert_email:
        aws.sns.TopicSubscription(name("alerts-email"), topic=topic.arn, protocol="email",
                                  endpoint=cfg.budget.alert_email)

    # deadline: a one-time schedule that stops every instance, with a role allowed only that
    arns = pulumi.Output.all(*[i.arn for _, i in hosts])
    ids = pulumi.Output.all(*[i.id for _, i in hosts])
    stopper = aws.iam.Role(name("deadline"), tags=tags, assume_role_policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "scheduler.amazonaws.com"}}]}))
    aws.iam.RolePolicy(name("deadline-stop"), role=stopper.id, policy=arns.apply(lambda a: json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:StopInstances",
                                                "Resource": list(a)}]})))
    at = cfg.deadline.strftime("%Y-%m-%dT%H:%M:%S")
    aws.scheduler.Schedule(
        name("deadline"), schedule_expression=f"at({at})", schedule_expression_timezone="UTC",
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        description=f"stop every host of trial {cfg.trial} at its deadline",
        target=aws.scheduler.ScheduleTargetArgs(
            arn="arn:aws:scheduler:::aws-sdk:ec2:stopInstances", role_arn=stopper.arn,
            input=ids.apply(lambda i: json.dumps({"InstanceIds": list(i)}))))

    # the budget: a late backstop (AWS Budgets' data is refreshed at least daily, hours behind the spend),
    # never the trial's bound — the deadline schedule and the transfer guards are. It finds the trial's
    # cost by region (default) or by the trial tag; activating the tag is opt-in, because activation is
    # refused for a key billing has not seen yet (up to 24 h after first use) and in an Organization's
    # member accounts, which would fail the first `pulumi up`
    if cfg.budget_filter == "tag-activate":
        # account-wide: another trial's stack may rely on it, so destroying this one leaves it active
        aws.costexplorer.CostAllocationTag(name("tag"), tag_key="trial", status="Active",
                                           opts=pulumi.ResourceOptions(retain_on_delete=True))
    cost_filter = (aws.budgets.BudgetCostFilterArgs(name="Region", values=[cfg.region])
                   if cfg.budget_filter == "region" else
                   aws.budgets.BudgetCostFilterArgs(name="TagKeyValue", values=[f"user:trial${cfg.trial}"]))
    notes = [("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)]
    budget = aws.budgets.Budget(
        # a monthly budget would reset if the trial crossed a month boundary (the example does): one
        # period from the day of `pulumi up`, long enough that it never resets during a trial
        name("budget"), name=name("budget"), budget_type="COST", limit_amount=f"{cfg.budget.total_usd:.2f}", limit_unit="USD",
        time_unit="ANNUALLY", time_period_start=start.strftime("%Y-%m-%d_00:00"), tags=tags,
        cost_filters=[cost_filter],
        notifications=[aws.budgets.BudgetNotificationArgs(
            comparison_operator="GREATER_THAN", notification_type=kind, threshold=pct, threshold_type="PERCENTAGE",
            subscriber_sns_topic_arns=[topic.arn],
            subscriber_email_addresses=[cfg.budget.alert_email] if cfg.budget.alert_email else None)
            for kind, pct in notes])
    # the spend stop: at 100 % of actual spend, Budgets runs SSM's stop document on every host, approved
    # automatically, with a role that may start that one document and stop only these instances. Budgets
    # sees costs hours late, so the deadline schedule stays the first bound; this one catches the rest
    spender = aws.iam.Role(name("spend-stop"), tags=tags, assume_role_policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "budgets.amazonaws.com"}}]}))
    aws.iam.RolePolicy(name("spend-stop"), role=spender.id, policy=arns.apply(lambda a: json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Sid": "StopDocument", "Effect": "Allow", "Action": "ssm:StartAutomationExecution",
             "Resource": f"arn:aws:ssm:{cfg.region}:*:automation-definition/AWS-StopEC2Instance:*"},
            {"Sid": "StopTheseHostsThroughSsm", "Effect": "Allow", "Action": "ec2:StopInstances", "Resource": list(a),
             "Condition": {"ForAnyValue:StringEquals": {"aws:CalledVia": ["ssm.amazonaws.com"]}}},
            {"Sid": "ReadState", "Effect": "Allow", "Action": "ec2:DescribeInstanceStatus", "Resource": "*"}]})))
    aws.budgets.BudgetAction(
        name("spend-stop"), budget_name=budget.name, action_type="RUN_SSM_DOCUMENTS", approval_model="AUTOMATIC",
        notification_type="ACTUAL", execution_role_arn=spender.arn, tags=tags,
        action_threshold=aws.budgets.BudgetActionActionThresholdArgs(action_threshold_type="PERCENTAGE",
                                                                     action_threshold_value=100),
        definition=aws.budgets.BudgetActionDefinitionArgs(
            ssm_action_definition=aws.budgets.BudgetActionDefinitionSsmActionDefinitionArgs(
                action_sub_type="STOP_EC2_INSTANCES", instance_ids=ids, region=cfg.region)),
        subscribers=[aws.budgets.BudgetActionSubscriberArgs(address=topic.arn, subscription_type="SNS")])

    # transfer guard, cloud side: isolated-zone hosts. AWS runs an EC2 stop action only for an alarm on a
    # per-instance EC2 metric (InstanceId dimension), so the stop sits on two single-metric alarms,
    # NetworkIn and NetworkOut, each at half the guard per hour: whenever in + out exceeds the guard, one
    # of them exceeds half of it, so the stop comes no later than a sum would give. The metric-math
    # alarm on in + out only notifies. All are named <trial>-transfer-<rank>…, which `run` and `status` read
    region = cfg.region
    stop_action = f"arn:aws:automate:{region}:ec2:stop"
    for h, inst in hosts:
        if h.rank not in isolated:
            continue

        def metric(mid: str, metric_name: str, inst=inst) -> aws.cloudwatch.MetricAlarmMetricQueryArgs:
            return aws.cloudwatch.MetricAlarmMetricQueryArgs(id=mid, return_data=False, metric=aws.cloudwatch.
                                                             MetricAlarmMetricQueryMetricArgs(
                namespace="AWS/EC2", metric_name=metric_name, period=ALARM_PERIOD_S, stat="Sum",
                dimensions={"InstanceId": inst.id}))

        alarm = f"{transfer_alarm_prefix(cfg.trial)}{h.rank}"
        aws.cloudwatch.MetricAlarm(
            name("transfer", h.rank), name=alarm,
            comparison_operator="GreaterThanThreshold", evaluation_periods=1,
            threshold=cfg.transfer_guard_bytes, treat_missing_data="notBreaching", tags=tags,
            alarm_description=f"rank {h.rank} (isolated zone {h.zone}): NetworkIn + NetworkOut over one hour "
                              f"exceeds the whole {cfg.transfer_guard_bytes:.3g}-byte guard (notifies; the "
                              f"{alarm}-in/-out alarms stop the host)",
            metric_queries=[metric("rx", "NetworkIn"), metric("tx", "NetworkOut"),
                            aws.cloudwatch.MetricAlarmMetricQueryArgs(id="total", expression="rx + tx",
                                                                      label="bytes in + out", return_data=True)],
            alarm_actions=[topic.arn])
        for short, metric_name in (("in", "NetworkIn"), ("out", "NetworkOut")):
            aws.cloudwatch.MetricAlarm(
                name("transfer", h.rank, short), name=f"{alarm}-{short}",
                comparison_operator="GreaterThanThreshold", evaluation_periods=1,
                namespace="AWS/EC2", metric_name=metric_name, period=ALARM_PERIOD_S, statistic="Sum",
                dimensions={"InstanceId": inst.id}, threshold=cfg.transfer_guard_bytes / 2,
                treat_missing_data="notBreaching", tags=tags,
                alarm_description=f"rank {h.rank} (isolated zone {h.zone}): {metric_name} over one hour exceeds half "
                                  f"the {cfg.transfer_guard_bytes:.3g}-byte guard: stops the host",
                alarm_actions=[topic.arn, stop_action])

    outputs = {
        "format": OUTPUTS_FORMAT, "trial": cfg.trial, "region": region,
        "deadline": cfg.deadline.isoformat(), "hours": cfg.hours, "ssh_user": cfg.ssh_user,
        "host_python": cfg.host_python,
        "bucket": bucket.bucket, "prefix": prefix, "alert_topic": topic.arn,
        "security_group": sg.id,
        "transfer_guard_bytes": cfg.transfer_guard_bytes, "guard_fraction": cfg.guard_fraction,
        # the image the hosts run (their stored state, kept by ignore_changes), not this run's lookup:
        # after a new release the two differ, and this is the id to pin
        "isolated_ranks": sorted(isolated), "ami": hosts[0][1].ami,
        "budget": cfg.budget.model_dump(exclude={"alert_email"}), "budget_name": name("budget"),
        "estimate": {"total_usd": est["total_usd"], "totals_usd": est["totals_usd"],
                     "traffic": est["traffic"]},
        "hosts": [{
            "rank": h.rank, "instance_id": inst.id, "instance_type": h.instance_type, "zone": h.zone,
            "private_ip": inst.private_ip, "public_ip": inst.public_ip,
            "vcpus": INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus"),
            "ebs_baseline_mb_s": INSTANCE_TYPES.get(h.instance_type, {}).get("ebs_baseline_mb_s"),
            "volume_throughput_mb_s": cfg.volume.throughput_mb_s,
        } for h, inst in hosts],
    }
    for k, v in outputs.items():
        pulumi.export(k, v)
    return outputs

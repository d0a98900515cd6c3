"""The AWS calls `orchestrate` makes itself (boto3), beside what Pulumi manages: find a trial's hosts
by tag, stop them, read its budget and alarms, and reconcile that nothing of it is left running or
billing. Every call takes a boto3 session, so tests point it at moto's server and users at their
profile; nothing here creates infrastructure.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from evidence.errors import UserError
from infra.keys import pinned_host_key
from infra.outputs import transfer_alarm_prefix
from infra.teardown import tag_value, trial_stops
from infra.teardown import trial_instances as described_instances

LIVE_STATES = ("pending", "running", "stopping", "shutting-down")


class Read(BaseModel):
    """What the cloud said when asked, as `status` and `run` hold it (frozen: a reading, not a state)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Instance(Read):
    """One of the trial's instances, by its tags: what `status` compares cluster.json's addresses with."""

    instance_id: str
    state: str  # EC2's: pending | running | stopping | stopped | shutting-down
    instance_type: str
    zone: str
    rank: int | None  # its rank tag; None: untagged or not a number
    private_ip: str | None
    public_ip: str | None  # None: stopped (an auto-assigned address is released) or never given one


class Budget(Read):
    """The trial's AWS budget as AWS Budgets reports it: hours behind the spend (`budget_note` says so)."""

    name: str
    limit_usd: float
    actual_usd: float
    forecast_usd: float
    updated_at: str | None  # when AWS last refreshed the figures, ISO 8601
    notifications: list[tuple[str, float]]  # (ACTUAL | FORECASTED, percent), sorted


class Alarm(Read):
    """A CloudWatch alarm on a host's transfer (its actions stop the host)."""

    name: str
    state: str  # OK | ALARM | INSUFFICIENT_DATA
    threshold: float
    actions: list[str]


class Subscription(Read):
    """Who the alert topic reaches, and whether they hear it yet."""

    protocol: str
    endpoint: str
    state: str  # confirmed | pending confirmation


class Alerts(Read):
    """The trial's transfer alarms and the alert topic's subscriptions, with what would go unheard."""

    alarms: list[Alarm]
    subscriptions: list[Subscription]
    warnings: list[str]


@dataclass
class Finding:
    kind: str  # instance | volume | alarm | budget | schedule
    id: str
    state: str
    billing: bool  # still costs money while it exists in this state
    detail: dict[str, Any] = field(default_factory=dict)


def trial_instances(session: Any, trial: str) -> list[Instance]:
    """Every instance tagged trial=<trial> that is not terminated, ordered by its rank tag."""
    out = []
    for i in described_instances(session, trial):  # the one query for them, the destroy check's too
        rank = tag_value(i.get("Tags"), "rank")
        out.append(Instance(instance_id=i["InstanceId"], state=i["State"]["Name"], instance_type=i["InstanceType"],
                            zone=i["Placement"]["AvailabilityZone"],
                            rank=int(rank) if rank is not None and rank.isdigit() else None,
                            private_ip=i.get("PrivateIpAddress"), public_ip=i.get("PublicIpAddress")))
    return sorted(out, key=lambda x: (x.rank is None, x.rank, x.instance_id))


def current_addresses(session: Any, instance_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each instance's state and addresses as EC2 reports them now. An auto-assigned public IPv4 address
    is released when its instance stops and a new one is given at start, so the addresses in the stack's
    outputs (read at `pulumi up`) are stale after any stop/start — a deadline or guard stop included."""
    out: dict[str, dict[str, Any]] = {}
    for page in session.client("ec2").get_paginator("describe_instances").paginate(InstanceIds=list(instance_ids)):
        for res in page["Reservations"]:
            for i in res["Instances"]:
                out[i["InstanceId"]] = {"state": i["State"]["Name"], "public_ip": i.get("PublicIpAddress"),
                                        "private_ip": i.get("PrivateIpAddress")}
    return out


def with_current_addresses(outputs: dict[str, Any], current: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The stack's outputs with each host's addresses as EC2 reports them now; refuses, naming each, a host
    that is missing or not running (a stopped host has no public address to reach it by)."""
    hosts, down = [], []
    for h in outputs["hosts"]:
        now = current.get(h["instance_id"])
        if now is None or now["state"] != "running":
            down.append(f"rank {h['rank']} ({h['instance_id']}: {'not found' if now is None else now['state']})")
            continue
        hosts.append({**h, "public_ip": now["public_ip"], "private_ip": now["private_ip"] or h["private_ip"]})
    if down:
        raise ValueError(f"not running: {', '.join(down)}; start them with `orchestrate start --cluster cluster.json` "
                         "(after the deadline with `--grace MINUTES --home <the trial home>`: the cloud stops them again "
                         "at its end) — they come back with new public addresses — and run `orchestrate up` again")
    return {**outputs, "hosts": hosts}


def hosts_not_running(cluster: Any, session: Any = None) -> list[str]:
    """A stack cluster's hosts EC2 does not report running (stopped by the deadline, a guard, by hand): what a
    command that must reach them refuses on, naming each, before it tries SSH and times out."""
    if cluster.source != "pulumi" or not cluster.region:
        return []
    if session is None:
        from orchestrate.identity import stack_session  # start-up: boto3 (~0.9 s) only where AWS is called

        session = stack_session(cluster.stack_config, cluster.region)
    ids = {h.instance_id: h for h in cluster.hosts if h.instance_id}
    now = current_addresses(session, list(ids)) if ids else {}
    return [f"{h.name} ({iid}: {now[iid]['state'] if iid in now else 'not found'})"
            for iid, h in ids.items() if now.get(iid, {}).get("state") != "running"]


def start_command(cluster: Any, cluster_path: str, home: str) -> str:
    """The one command that starts a stack's stopped hosts, with a grace once its deadline has passed."""
    past = cluster.deadline is not None and dt.datetime.now(dt.timezone.utc) >= cluster.deadline
    return (f"orchestrate start --cluster {cluster_path}" + (f" --grace MINUTES --home {home}" if past else "")
            + " (then `orchestrate up` for their new addresses)")


def stop_trial(session: Any, trial: str, *, wait: bool = True, delay_s: int = 5, attempts: int = 60) -> list[str]:
    """Stop every live instance of the trial (stopped hosts keep their disks: evidence survives);
    with `wait`, return only once EC2 reports them stopped."""
    ids = [i.instance_id for i in trial_instances(session, trial) if i.state in LIVE_STATES]
    if not ids:
        return []
    ec2 = session.client("ec2")
    ec2.stop_instances(InstanceIds=ids)
    if wait:
        ec2.get_waiter("instance_stopped").wait(InstanceIds=ids,
                                                WaiterConfig={"Delay": delay_s, "MaxAttempts": attempts})
    return ids


class StartRefused(UserError, ValueError):
    """`orchestrate start` refused: nothing was started or tagged."""


@dataclass
class Started:
    started: list[str]  # instance ids asked to start (stopped ones)
    running: list[str]  # already running


STOP_LATENCY_MINUTES = 2
"""How late after a grace's end the cloud's stop may come: the sweep's minute and Scheduler's minute of precision."""


def startable(found: list[Instance], trial: str) -> None:
    """Refuses, before anything is recorded or tagged, what `start_trial` could not do now."""
    if not found:
        raise StartRefused(f"no instance is tagged trial={trial} in this account and region: nothing to start")
    busy = [f"{i.instance_id} ({i.state})" for i in found if i.state in ("pending", "stopping", "shutting-down")]
    if busy:
        raise StartRefused(f"wait until these settle (a minute or two), then run again: {', '.join(busy)}")


def grace_for(instances: list[Instance], trial: str, deadline: dt.datetime, minutes: float, cap: float | None,
              now: dt.datetime, reason: str, prices: dict[str, float] | None = None) -> Any:
    """The grace `orchestrate start --grace` would grant at `now`: refused past the stack's cap (the cloud would not
    honour it), before the deadline (no grace is needed) and for a stack made before graces (no cap exported: its
    stop would not honour one). Priced at the plan's prices: each host's hourly rate and public address."""
    from evidence.grace import Grace, GraceHost
    from infra.plan import DEADLINE_MARGIN, HOST_CREATION
    from infra.prices import price

    lead = (HOST_CREATION + DEADLINE_MARGIN).total_seconds() / 60

    if cap is None:
        raise StartRefused("this stack predates graces (its outputs name no grace_cap_minutes): its deadline stop would "
                           f"not honour one. Move trials:cluster.deadline to a time at least {lead:.0f} min from now and run "
                           "`pulumi up` (it adds the sweep and creates no host), `orchestrate up`, then `orchestrate "
                           "start` before that deadline")
    if now < deadline:
        raise StartRefused(f"the deadline {deadline.isoformat()} has not passed: no grace is needed (leave out --grace)")
    if not 0 < minutes <= cap:
        raise StartRefused(f"--grace {minutes:g}: give 1 to {cap:g} minutes (the stack's grace_cap_minutes; the cloud's "
                           "stop honours no longer grace)")
    now = now.replace(microsecond=0)  # the tag holds whole seconds: the record says exactly what the cloud honours
    hosts, end = [], now + dt.timedelta(minutes=minutes)
    billed = max(minutes + STOP_LATENCY_MINUTES, 1)  # EC2 bills a start a minute at least; the stop comes late
    ipv4 = price("vpc/public-ipv4", prices)
    for i in instances:
        try:
            p = price(f"instance/{i.instance_type}", prices)
        except KeyError:
            raise StartRefused(f"{i.instance_id} is a {i.instance_type}, which infra/prices.py does not price: the "
                               "grace's cost cannot be said, so none is granted") from None
        hosts.append(GraceHost(instance_id=i.instance_id, rank=i.rank, instance_type=i.instance_type,
                               usd=round((p.usd + ipv4.usd) * billed / 60, 4)))
    return Grace(trial=trial, deadline=deadline, granted_at=now, start=now, end=end, minutes=minutes,
                 cap_minutes=cap, reason=reason, hosts=hosts, usd=round(sum(h.usd for h in hosts), 4),
                 price_source=f"infra/prices.py: each instance type's hourly price and a public IPv4 address's, for the "
                              f"grace's minutes and the {STOP_LATENCY_MINUTES} min its stop may come after its end")


def start_trial(session: Any, found: list[Instance], *, grace: Any = None, wait: bool = True,
                delay_s: int = 5, attempts: int = 60) -> Started:
    """Start the stopped ones of the trial's instances `found` (the look-up `startable` judged, so nothing is
    recorded for a start that is then refused); with `grace`, each is first tagged with it (`trial-grace`), so the
    cloud's sweep and the host's own check keep it running until the grace ends, and stop it then."""
    from infra.sweep import GRACE_TAG, grace_value

    ec2 = session.client("ec2")
    ids = [i.instance_id for i in found]
    if grace is not None:  # before any start: a host never runs past the deadline without the tag that ends it
        ec2.create_tags(Resources=ids, Tags=[{"Key": GRACE_TAG, "Value": grace_value(grace.start, grace.end)}])
    stopped = [i.instance_id for i in found if i.state == "stopped"]
    if stopped:
        ec2.start_instances(InstanceIds=stopped)
        if wait:
            ec2.get_waiter("instance_running").wait(InstanceIds=stopped,
                                                    WaiterConfig={"Delay": delay_s, "MaxAttempts": attempts})
    return Started(started=stopped, running=[i.instance_id for i in found if i.state == "running"])


def console_output(session: Any, instance_id: str) -> str:
    """What the instance has printed on its serial console (the newest buffer), as text; empty while
    it has printed nothing. The API returns it base64-encoded."""

    out = session.client("ec2").get_console_output(InstanceId=instance_id, Latest=True).get("Output") or ""
    try:
        return base64.b64decode(out, validate=True).decode("utf-8", errors="replace")
    except ValueError:
        return out  # some endpoints hand it back already decoded


def pin_host_keys(instances: dict[int, str], read: Callable[[str], str], *, wait_s: float = 900.0,
                  poll_s: float = 10.0, say: Callable[[str], None] = lambda m: None) -> dict[int, str]:
    """Each rank's host key, from what its instance printed at first boot (`infra.keys`), reading the
    consoles again while any instance is still booting, at most `wait_s`; then refuses naming every
    instance that has printed none. A console that shows two different keys is refused at once."""
    keys: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for rank, iid in sorted(instances.items()):
            if rank not in keys:
                key = pinned_host_key(read(iid), f"rank {rank} ({iid})")
                if key is not None:
                    keys[rank] = key
                    say(f"rank {rank} ({iid}): pinned {key.split()[0]} host key from its console")
        waiting = [f"rank {r} ({i})" for r, i in sorted(instances.items()) if r not in keys]
        if not waiting:
            return keys
        left = deadline - time.monotonic()
        if left <= 0:
            raise HostKeysMissing(f"no SSH host keys on the console of {', '.join(waiting)} after {wait_s:.0f} s: "
                                  "still booting (try again in a minute); or restarted since its first boot, whose "
                                  "key block cloud-init prints once and the console keeps only its newest 64 KB of "
                                  "(`up` keeps the keys its earlier --out pinned for the same instances; else pass --host-keys); or "
                                  "an AMI whose cloud-init does not print them. An unknown host key is never accepted")
        say(f"waiting for {', '.join(waiting)} to print its host keys ({left:.0f} s left)")
        time.sleep(min(poll_s, max(left, 0.0)))


class HostKeysMissing(UserError, RuntimeError):
    """An instance printed no host keys within the wait."""


def read_budget(session: Any, account_id: str, name: str) -> Budget:
    b = session.client("budgets")
    budget = b.describe_budget(AccountId=account_id, BudgetName=name)["Budget"]
    notes = b.describe_notifications_for_budget(AccountId=account_id, BudgetName=name)["Notifications"]
    spend = budget.get("CalculatedSpend", {})
    updated = budget.get("LastUpdatedTime")
    return Budget(name=name, limit_usd=float(budget["BudgetLimit"]["Amount"]),
                  actual_usd=float(spend.get("ActualSpend", {}).get("Amount", 0.0)),
                  forecast_usd=float(spend.get("ForecastedSpend", {}).get("Amount", 0.0)),
                  updated_at=updated.isoformat() if hasattr(updated, "isoformat") else updated,
                  notifications=sorted((n["NotificationType"], float(n["Threshold"])) for n in notes))


BUDGET_LAG = ("AWS Budgets' figure, which lags the spend by hours (its data is refreshed at least daily): "
              "the deadline and the transfer guards bound the trial, not this")


def budget_note(b: Budget, now: Any = None) -> str:
    """The budget's spend as a sentence that says how old it may be: a trial of a few hours can be over
    before AWS Budgets sees any of its cost, so `run` and `status` never present it as current."""

    now = now or dt.datetime.now(dt.timezone.utc)
    age = ""
    if b.updated_at:
        try:
            t = dt.datetime.fromisoformat(b.updated_at)
            t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
            age = f", last updated {t:%Y-%m-%d %H:%M} UTC ({(now - t).total_seconds() / 3600:,.1f} h ago)"
        except ValueError:
            age = f", last updated {b.updated_at}"
    return (f"${b.actual_usd:.2f} of ${b.limit_usd:.2f} (forecast ${b.forecast_usd:.2f}){age} — "
            + BUDGET_LAG)


def cluster_budget(cluster: Any, session: Any = None) -> Budget:
    """The trial's AWS budget (`read_budget`) as the cloud accounts for it, read with a session in the
    cluster's region unless one is given: what `run` checks before anything starts and `status` shows."""
    if session is None:
        from orchestrate.identity import stack_session  # start-up: boto3 (~0.9 s) only where AWS is called

        session = stack_session(getattr(cluster, "stack_config", None), cluster.region)
    return read_budget(session, account_id(session), cluster.budget_name)


def read_alarms(session: Any, prefix: str) -> list[Alarm]:
    cw = session.client("cloudwatch")
    out = []
    for page in cw.get_paginator("describe_alarms").paginate(AlarmNamePrefix=prefix):
        for a in page["MetricAlarms"]:
            out.append(Alarm(name=a["AlarmName"], state=a["StateValue"], threshold=a["Threshold"],
                             actions=a.get("AlarmActions", [])))
    return out


def read_subscriptions(session: Any, topic_arn: str) -> list[Subscription]:
    """Who the alert topic reaches. An e-mail subscription stays `PendingConfirmation` until its
    link is clicked, and until then that address hears nothing."""
    sns = session.client("sns")
    out = []
    for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic_arn):
        for sub in page["Subscriptions"]:
            pending = sub["SubscriptionArn"] in ("PendingConfirmation", "pending confirmation")
            out.append(Subscription(protocol=sub["Protocol"], endpoint=sub["Endpoint"],
                                    state="pending confirmation" if pending else "confirmed"))
    return out


def trial_alerts(session: Any, cluster: Any) -> Alerts:
    """The trial's transfer alarms and the alert topic's subscriptions, with a warning for each way an
    alert would go unheard or a raised alarm would go unseen."""

    alarms = read_alarms(session, transfer_alarm_prefix(cluster.trial)) if cluster.trial else []
    subs = read_subscriptions(session, cluster.alert_topic) if cluster.alert_topic else []
    warnings = [f"transfer alarm {a.name} is in ALARM (it stops its host)" for a in alarms if a.state == "ALARM"]
    if cluster.alert_topic and not subs:
        warnings.append("nobody subscribes to the alert topic: budget and transfer alerts reach no one (set "
                        "trials:cluster.budget.alert_email, or subscribe to the topic yourself)")
    warnings += [f"the {s.protocol} subscription for {s.endpoint} is pending confirmation: it hears nothing "
                 "until its confirmation link is followed" for s in subs if s.state != "confirmed"]
    if cluster.trial:  # each guarded host: its notifying sum alarm and the two single-metric ones that stop it
        prefix, names = transfer_alarm_prefix(cluster.trial), {a.name for a in alarms}
        for r in cluster.guarded_ranks:
            lacking = [n for n in (f"{prefix}{r}", f"{prefix}{r}-in", f"{prefix}{r}-out") if n not in names]
            if lacking:
                warnings.append(f"guarded host rank {r} lacks the transfer alarm(s) {', '.join(lacking)}: "
                                "nothing in the cloud stops it at its guard (a stack made before the "
                                "single-metric alarms: `pulumi up` adds them)")
    return Alerts(alarms=alarms, subscriptions=subs, warnings=warnings)


def raised_alarm(session: Any, trial: str) -> str | None:
    """What `run` checks between arms: a transfer alarm in ALARM stops the trial as the controller's
    guard does (its host is being stopped by the alarm's own action)."""

    up = [a.name for a in read_alarms(session, transfer_alarm_prefix(trial)) if a.state == "ALARM"]
    return f"transfer alarm {', '.join(up)} in ALARM" if up else None


def reconcile(session: Any, trial: str) -> list[Finding]:
    """What of the trial still exists: instances (running ones bill compute), volumes (bill storage), alarms on
    its hosts (by tag), its budgets and its deadline stops (by name). An empty list of billing findings is what
    teardown must reach."""
    found = [Finding("instance", i.instance_id, i.state, i.state in LIVE_STATES, {"rank": i.rank, "zone": i.zone})
             for i in trial_instances(session, trial)]
    ec2 = session.client("ec2")
    for page in ec2.get_paginator("describe_volumes").paginate(Filters=[{"Name": "tag:trial", "Values": [trial]}]):
        for v in page["Volumes"]:
            found.append(Finding("volume", v["VolumeId"], v["State"], True,
                                 {"size_gib": v["Size"], "zone": v["AvailabilityZone"]}))
    found += [Finding("alarm", a.name, a.state, False, {"threshold": a.threshold})
              for a in read_alarms(session, f"{trial}-")]
    # the trial's budgets (past ten hosts, one per ten ranks: infra/plan.py) and deadline stops: until the destroy
    # they are the stack's; after it, a budget holding actions bills by the day and a stop runs every minute
    account = session.client("sts").get_caller_identity()["Account"]
    for page in session.client("budgets").get_paginator("describe_budgets").paginate(AccountId=account):
        for b in page.get("Budgets", []):
            if re.fullmatch(rf"{re.escape(trial)}-budget(-\d+)?", b["BudgetName"]):
                found.append(Finding("budget", b["BudgetName"], "exists", True,
                                     {"bills": "$0.10 a day with actions, past the account's free 62 budget-days a month"}))
    found += [Finding("schedule", name, "runs every minute from the deadline", True, {"what": "deadline stop"})
              for name in trial_stops(session, trial)]
    return found


G_VT_VCPU_QUOTA = ("ec2", "L-DB2E81BA")
"""Service Quotas' "Running On-Demand G and VT instances": the vCPUs of g6e hosts an account may run."""


def read_vcpu_quota(session: Any) -> float:
    """The account's on-demand G/VT vCPU limit in the session's region (raises ClientError if unreadable)."""
    q = session.client("service-quotas").get_service_quota(ServiceCode=G_VT_VCPU_QUOTA[0],
                                                           QuotaCode=G_VT_VCPU_QUOTA[1])
    return float(q["Quota"]["Value"])


def zone_offerings(session: Any, zones: list[str], instance_types: list[str], *, by_id: bool) -> dict[str, Any]:
    """Which of `instance_types` EC2 offers in each of `zones` (names or IDs, by `by_id`) in the session's
    region, where else each type is offered, and this account's name → ID map: zone names differ between
    accounts, and a type may be missing from a zone a config names."""
    ec2 = session.client("ec2")
    where: dict[str, set[str]] = {t: set() for t in instance_types}
    for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id" if by_id else "availability-zone",
            Filters=[{"Name": "instance-type", "Values": list(instance_types)}]):
        for o in page["InstanceTypeOfferings"]:
            where.setdefault(o["InstanceType"], set()).add(o["Location"])
    ids = {z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}
    return {"zones": {z: sorted(t for t in instance_types if z in where[t]) for z in zones},
            "offered_in": {t: sorted(v) for t, v in where.items()}, "zone_ids": ids}


def account_id(session: Any) -> str:
    return session.client("sts").get_caller_identity()["Account"]

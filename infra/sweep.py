"""The deadline stop: stop every instance of the trial that runs at or after its deadline, but for one inside a
grace the operator granted — run by the cloud every minute from the deadline on, for as long as the stack exists.

This file is the AWS Lambda function's whole code (infra/guards.py uploads it as it is), so it imports only the
standard library and boto3, which Lambda's Python runtime ships. EventBridge Scheduler invokes it once a minute
from the deadline (`rate(1 minute)` with the deadline as the schedule's start date) with the schedule's input as
the event (the keys `sweep` reads; `scheduled_time` is Scheduler's `<aws.scheduler.scheduled-time>` context
attribute). Why a sweep and not a one-time stop: a one-time stop misses every host that is not
running at that moment — one still `pending` (EC2 refuses to stop it), one an `up` creates after it, one started
again by hand or by EC2 — and a host's own `OnCalendar=` timer never fires again once its date has passed.
Why a function and not SSM Automation: Automation bills every step of every child execution (a sweep by tag
each minute costs dollars a day), cannot read a grace's end, and no emulation here can run a runbook; this
code runs in the tests against moto's EC2 exactly as uploaded (tests/machinery/aws_clock.py).

What it resolves is instances alone (`DescribeInstances` by the `trial` tag): a volume or a schedule carrying
the tag is never a target, so a failure here means a host was not stopped. A failure is loud twice: the
function publishes it to the trial's alert topic and then raises, which Lambda counts in the function's
`Errors` metric (an alarm on it notifies the same topic, infra/guards.py).

A grace is the instance tag `trial-grace` = `<start>/<end>` (ISO 8601, UTC), written by `orchestrate start
--grace` after the deadline. It is honoured only while start <= now < end and only if end - start is at most
the stack's `grace_cap_minutes`: a grace cannot be stretched by editing the tag, and it ends in the cloud
whether or not the controller that granted it is still alive. Each host's own check (infra/userdata.py)
reads the same tag through the instance metadata and applies the same rule.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

GRACE_TAG = "trial-grace"
SWEEP_MINUTES = 1
"""EventBridge Scheduler's finest rate (`rate(1 minute)`); its invocations have a minute's precision."""

LIVE = ("pending", "running", "stopping", "stopped")  # not terminated or shutting down: still the trial's


def utc(text: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def utc_text(t: dt.datetime) -> str:
    """A time as the deadline stop writes it everywhere (its schedule's start, the hosts' tags): UTC, whole seconds."""
    return f"{t.astimezone(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


def grace_value(start: dt.datetime, end: dt.datetime) -> str:
    """The tag's value: `<start>/<end>`, both UTC to the second (EC2 tag values may hold `/`, `:`, `+`)."""
    return f"{utc_text(start)}/{utc_text(end)}"


def honoured_grace(value: str | None, now: dt.datetime, cap_minutes: float) -> dt.datetime | None:
    """The end of the grace `value` grants at `now`, or None: absent, malformed, not begun, over, or longer than
    the cap (then it is no grace at all, not a shorter one: a tag nobody wrote with `orchestrate` is not obeyed)."""
    if not value or "/" not in value:
        return None
    try:
        start, end = (utc(x) for x in value.split("/", 1))
    except ValueError:
        return None
    if not start <= now < end or (end - start).total_seconds() > cap_minutes * 60 + 1e-6:
        return None
    return end


def _tags(i: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in i.get("Tags") or []}


def trial_instances(ec2: Any, trial: str) -> list[dict[str, Any]]:
    """Every instance tagged trial=<trial> that is not terminated: EC2 instances only, by construction."""
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:trial", "Values": [trial]}, {"Name": "instance-state-name", "Values": list(LIVE)}]):
        for r in page["Reservations"]:
            out += r["Instances"]
    return out


def _label(i: dict[str, Any]) -> str:
    rank = _tags(i).get("rank")
    return f"{i['InstanceId']} (rank {rank})" if rank is not None else f"{i['InstanceId']} (no rank tag)"


def _stop(ec2: Any, ids: list[str]) -> dict[str, str]:
    """Stop `ids`; returns id → error for each that was not stopped. One call for all; if EC2 refuses the call
    (one instance changed state in between), each on its own, so one refusal never shields the others."""
    if not ids:
        return {}
    try:
        ec2.stop_instances(InstanceIds=ids)
        return {}
    except Exception:  # noqa: BLE001 - any refusal: retried one by one below, each error kept
        pass
    failed = {}
    for iid in ids:
        try:
            ec2.stop_instances(InstanceIds=[iid])
        except Exception as e:  # noqa: BLE001
            code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
            if code == "IncorrectInstanceState":  # stopping or stopped since the look-up: nothing to do
                now = trial_state(ec2, iid)
                if now in ("stopping", "stopped", "shutting-down", "terminated"):
                    continue
            failed[iid] = f"{code}: {e}"
    return failed


def trial_state(ec2: Any, iid: str) -> str | None:
    try:
        r = ec2.describe_instances(InstanceIds=[iid])["Reservations"]
        return r[0]["Instances"][0]["State"]["Name"] if r else None
    except Exception:  # noqa: BLE001
        return None


def sweep(ec2: Any, spec: dict[str, Any], now: dt.datetime, publish: Callable[[str, str], None]) -> dict[str, Any]:
    """One pass: what it stopped, what is pending (stopped by the next pass: EC2 refuses to stop a pending
    instance), what a grace keeps, and what it could not stop (published, then raised)."""
    trial, deadline = spec["trial"], utc(spec["deadline"])
    out: dict[str, Any] = {"trial": trial, "at": now.isoformat(), "stopped": [], "pending": [], "in_grace": {},
                           "already": [], "failed": {}}
    if now < deadline:
        out["before_deadline"] = True
        return out
    found = trial_instances(ec2, trial)
    running = []
    for i in found:
        state, end = i["State"]["Name"], honoured_grace(_tags(i).get(GRACE_TAG), now, float(spec["grace_cap_minutes"]))
        if state in ("running", "pending") and end is not None:
            out["in_grace"][i["InstanceId"]] = end.isoformat()
        elif state == "running":
            running.append(i)
        elif state == "pending":
            out["pending"].append(i["InstanceId"])
        else:
            out["already"].append(i["InstanceId"])
    failed = _stop(ec2, [i["InstanceId"] for i in running])
    out["stopped"] = [i["InstanceId"] for i in running if i["InstanceId"] not in failed]
    out["failed"] = failed
    late = (now - deadline).total_seconds() / 60
    if out["stopped"]:
        names = ", ".join(_label(i) for i in running if i["InstanceId"] in out["stopped"])
        publish(f"trial {trial}: deadline stop stopped {len(out['stopped'])} host(s)",
                f"At {now:%Y-%m-%d %H:%M} UTC, {late:,.0f} min after the deadline {deadline.isoformat()}, the cloud's "
                f"deadline stop found running and stopped: {names}. A host started after the deadline is stopped "
                f"again within a minute unless `orchestrate start --grace` granted it time.")
    if failed:
        publish(f"trial {trial}: deadline stop FAILED for {len(failed)} host(s)",
                f"At {now:%Y-%m-%d %H:%M} UTC the deadline stop could not stop: "
                + "; ".join(f"{k}: {v}" for k, v in failed.items())
                + ". These hosts still run and bill: stop them (`orchestrate down`) and check the stop's role.")
        raise RuntimeError(f"deadline stop failed for {', '.join(failed)}")
    days = float(spec.get("stopped_days", 0))
    # once a day (the run scheduled in the deadline's own minute of the day: Scheduler's `scheduled-time`, exact
    # whatever its precision made the run's own clock) after the days the plan priced: the volumes of stopped
    # hosts bill until `orchestrate down`
    try:
        scheduled = utc(spec["scheduled_time"]) if spec.get("scheduled_time") else now
    except ValueError:
        scheduled = now
    past = (scheduled - deadline).total_seconds()
    if found and past >= days * 86400 and past % 86400 < SWEEP_MINUTES * 60:
        per_day = float(spec.get("volume_usd_per_host_day", 0.0)) * len(found)
        publish(f"trial {trial}: {len(found)} stopped host(s) still bill for their volumes",
                f"{past / 86400:,.1f} days after the deadline, past the {days:g} day(s) the plan priced, {len(found)} "
                f"instance(s) of trial {trial} still exist ({', '.join(_label(i) for i in found)}): their volumes bill "
                f"about ${per_day:,.2f} a day until `orchestrate down` and `pulumi destroy`.")
        out["volumes_alert"] = True
    return out


def handler(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Lambda's entry: the event is the schedule's input."""
    import boto3

    ec2 = boto3.client("ec2", region_name=event["region"])
    sns = boto3.client("sns", region_name=event["region"])

    def publish(subject: str, message: str) -> None:
        sns.publish(TopicArn=event["topic_arn"], Subject=subject[:100], Message=message)

    return sweep(ec2, event, dt.datetime.now(dt.timezone.utc), publish)

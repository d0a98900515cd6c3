"""The program's deadline stop in emulated time (tests/machinery/aws_clock.py): one `pulumi up` through the engine
harness whose topic, dead-letter queue and function are bound to moto's, then cases run on a virtual clock —
shared by tests/infra/test_deadline_stop.py and bench/deadline_timeline.py, which prints the table."""

from __future__ import annotations

import datetime as dt
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from machinery.aws_clock import ACCOUNT, REGION, Clock, Cloud, Hosts, Lifecycle, Metadata, run_until
from pulumi_engine import Deployment, pulumi_run
from test_infra import CALLS, answers, live, stack_of

TRIAL = "ltw-four"
FUNCTION = f"{TRIAL}-deadline-sweep"


@dataclass
class World:
    deployment: Deployment
    deadline: dt.datetime
    topic: str
    inbox: str  # an SQS queue subscribed to the topic: what the operator's e-mail would receive
    dlq_url: str


def up(ec2: Any, sns: Any, sqs: Any, **changes: Any) -> World:
    """The program's `pulumi up`, its alert topic and dead-letter queue made in moto and answered by name."""
    topic = sns.create_topic(Name=f"{TRIAL}-alerts")["TopicArn"]
    inbox = sqs.create_queue(QueueName=f"{TRIAL}-inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=inbox_arn)
    dlq = sqs.create_queue(QueueName=f"{TRIAL}-deadline-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rules = answers(TRIAL) + [
        {"type": "aws:sns/topic:Topic", "outputs": {"arn": topic}},
        {"type": "aws:sqs/queue:Queue", "outputs": {"arn": dlq_arn, "url": dlq, "name": f"{TRIAL}-deadline-dlq"}},
        {"type": "aws:lambda/function:Function",
         "outputs": {"arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION}"}}]
    cluster = live(**changes)
    d = pulumi_run("up", stack_of(cluster), answers=rules, calls=CALLS)
    assert d.returncode == 0 and d.failed is None, d.errors
    return World(d, dt.datetime.fromisoformat(cluster["deadline"]), topic, inbox, dlq)


def alerts(sqs: Any, world: World) -> list[dict[str, str]]:
    """What reached the topic's subscriber since the last call: subject and message."""
    out = []
    while True:
        got = sqs.receive_message(QueueUrl=world.inbox, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            return out
        for m in got:
            body = json.loads(m["Body"])
            out.append({"subject": body.get("Subject", ""), "message": body.get("Message", "")})
            sqs.delete_message(QueueUrl=world.inbox, ReceiptHandle=m["ReceiptHandle"])


@contextmanager
def emulated(world: World, start: dt.datetime, folder: Path, *, precision_s: float = 59) -> Iterator[tuple]:
    """The clock at `start`, EC2's lifecycle installed in moto, the cloud and the hosts' checks ready."""
    clock = Clock(start)
    lifecycle = Lifecycle(clock)
    metadata = Metadata()
    try:
        with lifecycle.installed():
            cloud = Cloud(world.deployment, clock, precision_s=precision_s, lifecycle=lifecycle)
            user_data = world.deployment.named(f"{TRIAL}-rank-0").inputs["userData"]
            hosts = Hosts(lifecycle, metadata, user_data, folder)
            yield clock, lifecycle, cloud, hosts
    finally:
        metadata.close()


CASES = [
    # (case, launched at (min from the deadline), what happens, the moment it runs after the deadline from)
    ("pending when the deadline passes", -0.5, None, "deadline"),
    ("its `up` finished 1 min before the deadline", -2.5, None, "deadline"),
    ("rebooted across the deadline (EC2 keeps it running)", -3.0, ("reboot", -1 / 3), "deadline"),
    ("created 10 min after the deadline", 10.0, None, "launch"),
    ("pending when a sweep runs (created 1.5 min after)", 1.5, None, "launch"),
    ("started by hand 1 h after the deadline", -3.0, ("start", 60.0), "start"),
    ("restarted by EC2 30 min after (stop/start)", -3.0, ("start", 30.0), "start"),
]


@dataclass
class Row:
    case: str
    mode: str  # both | cloud alone | host alone
    stopped_by: str | None
    minutes_after: float | None  # from the deadline, or from the moment it ran again after the deadline
    states: str
    seen_pending: int = 0  # sweeps that found it pending (EC2 refuses to stop it then: left to the next one)


def timeline(ec2: Any, world: World, folder: Path, mode: str, until_min: float = 64) -> list[Row]:
    """Every case on one clock from 3 min before the deadline to `until_min` after; `mode` disables one line."""
    D = world.deadline
    rows: list[Row] = []
    with emulated(world, D - dt.timedelta(minutes=3.5), folder / mode.replace(" ", "-")) as (clock, life, cloud, hosts):
        cloud.enabled = mode != "host alone"
        hosts.enabled = mode != "cloud alone"
        ids: dict[str, str] = {}
        refs: dict[str, dt.datetime] = {}
        events = []

        def at(minutes: float) -> dt.datetime:
            return D + dt.timedelta(minutes=minutes)

        for rank, (case, launch, then, ref) in enumerate(CASES):
            def do_launch(case: str = case, rank: int = rank, ref: str = ref) -> None:
                iid = ids[case] = life.launch(ec2, TRIAL, rank)
                hosts.add(iid)
                if ref == "launch":
                    refs[case] = clock.now
            events.append((at(launch), do_launch))
            if ref == "deadline":
                refs[case] = D
            if then:
                kind, when = then

                def do(case: str = case, kind: str = kind) -> None:
                    iid = ids[case]
                    if kind == "reboot":
                        life.reboot(iid)
                    else:
                        if life.state(iid) == "running":  # EC2's own stop/start of a host the stop missed
                            with life.acting("EC2"):
                                ec2.stop_instances(InstanceIds=[iid])
                        life.start(ec2, iid)
                        refs[case] = clock.now
                events.append((at(when), do))
        run_until(at(until_min), clock, life, cloud, hosts, events=events)
        for case, *_ in CASES:
            iid, ref = ids[case], refs[case]
            after = [s for s in life.stops if s.instance_id == iid and s.at >= ref and s.by in ("cloud", "host")]
            first = after[0] if after else None
            pending = sum(1 for f in cloud.functions.values() for _, out in f.runs
                          if isinstance(out, dict) and iid in out.get("pending", []))
            rows.append(Row(case, mode, first.by if first else None,
                            None if first is None else (first.at - ref).total_seconds() / 60,
                            life.state(iid), pending))
        ec2.terminate_instances(InstanceIds=list(ids.values()))  # the next mode starts clean
    return rows


def table(rows: list[Row]) -> str:
    """One row per case: what stopped it with both lines, and each line alone (minutes after)."""
    by = {(r.case, r.mode): r for r in rows}
    out = ["| case | stopped by (both lines) | minutes after | cloud alone | host alone | sweeps that found it pending "
           "(cloud alone) | state at the end |", "|---|---|---|---|---|---|---|"]

    def cell(r: Row | None) -> str:
        return "—" if r is None else "NOT STOPPED" if r.minutes_after is None else f"{r.minutes_after:.2f}"

    for case, *_ in CASES:
        both = by.get((case, "both"))
        out.append(f"| {case} | {both.stopped_by if both else '—'} | {cell(both)} | {cell(by.get((case, 'cloud alone')))} "
                   f"| {cell(by.get((case, 'host alone')))} | {getattr(by.get((case, 'cloud alone')), 'seen_pending', '—')} "
                   f"| {both.states if both else '—'} |")
    return "\n".join(out)

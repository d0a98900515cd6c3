"""Time as AWS keeps it, for the deadline stop (#64): a virtual clock that fires the program's own schedules as
EventBridge Scheduler does, runs their Lambda targets from the code the program uploads, keeps moto's EC2 to
the instance lifecycle AWS documents (pending before running; a pending instance cannot be stopped), runs each
host's own deadline check from the boot script the program wrote, evaluates the program's alarms and
EventBridge rules, and runs AWS's stop runbook as its definition reads. moto executes none of these.

What each piece follows (read, not copied; docs/aws-emulation.md says where it still differs):

* Scheduler (docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html): `at(yyyy-mm-ddThh:mm:ss)` fires
  once; `rate(N unit)` "starts after the start date ... and runs at a regular rate ... until the schedule's end
  date" — taken at its latest reading, the first invocation one interval after the start date; "all schedule
  types ... invoke their targets with 60 second precision" — every invocation is late by `precision_s` (59 s by
  default: the worst case); a flexible window of N minutes adds a seeded offset below N minutes
  (managing-schedule-flexible-time-windows.html). A target that cannot be reached is retried by the retry policy
  until its attempts or the event's age run out, then sent to the dead-letter queue (configuring-schedule-dlq.html).
* Lambda targets are invoked asynchronously (lambda/latest/dg/with-eventbridge-scheduler.html): a function that
  raises is not Scheduler's failure; Lambda retries it (1, then 2 minutes later: the async default) while its
  retries and its maximum event age (the program's `FunctionEventInvokeConfig`) allow, then sends the record to
  the on-failure destination; each error counts in the function's `Errors` metric.
* The function is the program's registration: its `code` archive's text executed as a module and its `handler`
  called with the schedule's input as the event, `datetime.now` reading the virtual clock; boto3 reaches moto.
* EC2: an instance launched or started is `pending` for `boot_s`, then `running`; `StopInstances` naming a pending
  one is refused with `IncorrectInstanceState` (the error EC2 gives: "cannot be stopped as it has never reached
  the 'running' state"). A reboot keeps the state `running` (EC2 sees no state change).
* The host: `OnBootSec=20s`, `OnUnitActiveSec=60s` (systemd.timer: monotonic timers fire after every boot), the
  script between the boot script's `CHECK` markers run by bash with the clock, its metadata (a loopback IMDSv2
  serving the instance's tags from moto) and its stop command pointed at the emulation; a stop from the host is
  `shutdown -h`, which stops the instance (`instance_initiated_shutdown_behavior = stop`).
* Alarms: the program's `MetricAlarm` registrations on `AWS/Lambda Errors` and `AWS/SQS
  ApproximateNumberOfMessagesVisible`, evaluated each minute; OK → ALARM publishes to their actions (moto's SNS).
* EventBridge rules: a registration's `eventPattern` matched against an event (exact values in lists, nested
  detail), its `EventTarget` published to.
* AWS-StopEC2Instance (awslabs/aws-systems-manager, `aws-StopEC2Instance.json`): `stopInstances`
  (aws:changeInstanceState stopped, onFailure Continue), then `forceStopInstances` (Force); an execution whose
  step fails ends `Failed` and SSM emits "EC2 Automation Execution Status-change Notification" (source aws.ssm).
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import random
import re
import subprocess
import threading
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ACCOUNT, REGION = "123456789012", "us-east-1"
UTC = dt.timezone.utc


def parse_time(text: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def shim(self) -> types.SimpleNamespace:
        """A `datetime` module whose `datetime.now` reads this clock (for a function's code)."""
        clock = self

        class VirtualDatetime(dt.datetime):
            @classmethod
            def now(cls, tz: Any = None) -> dt.datetime:  # type: ignore[override]
                return clock.now.astimezone(tz) if tz else clock.now.replace(tzinfo=None)

        return types.SimpleNamespace(**{**{k: getattr(dt, k) for k in dir(dt) if not k.startswith("__")},
                                        "datetime": VirtualDatetime})


# --- EC2's instance lifecycle over moto -------------------------------------------------------------------

def _backend() -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT][REGION]


@dataclass
class Stop:
    instance_id: str
    at: dt.datetime
    by: str  # cloud | host | operator


class Lifecycle:
    """moto's instances kept to AWS's lifecycle on the virtual clock; every stop recorded with who made it."""

    def __init__(self, clock: Clock, boot_s: float = 90) -> None:
        self.clock, self.boot_s = clock, boot_s
        self.ready_at: dict[str, dt.datetime] = {}
        self.booted_at: dict[str, dt.datetime] = {}  # the OS's boot (a reboot restarts it; EC2's state stays running)
        self.stops: list[Stop] = []
        self.actor = "operator"
        self.denied: dict[str, str] = {}  # actor → the error EC2 gives its StopInstances (a role IAM denies)

    @contextmanager
    def acting(self, who: str) -> Iterator[None]:
        was, self.actor = self.actor, who
        try:
            yield
        finally:
            self.actor = was

    @contextmanager
    def installed(self) -> Iterator["Lifecycle"]:
        """EC2's refusal to stop a pending instance, in moto's server (in this process); every stop recorded."""
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.models.instances import InstanceBackend

        original = InstanceBackend.stop_instances
        me = self

        def stop_instances(backend: Any, instance_ids: list[str]) -> Any:
            if me.actor in me.denied:
                raise EC2ClientError("UnauthorizedOperation", me.denied[me.actor])
            for inst in backend.get_multi_instances_by_id(instance_ids):
                if inst._state.name == "pending":
                    raise EC2ClientError("IncorrectInstanceState", f"Instance '{inst.id}' cannot be stopped as it has "
                                                                   "never reached the 'running' state.")
            was = {i.id: i._state.name for i in backend.get_multi_instances_by_id(instance_ids)}
            out = original(backend, instance_ids)
            me.stops += [Stop(i, me.clock.now, me.actor) for i, s in was.items() if s == "running"]
            return out

        InstanceBackend.stop_instances = stop_instances
        try:
            yield self
        finally:
            InstanceBackend.stop_instances = original

    def _pending(self, iid: str) -> None:
        inst = _backend().get_instance(iid)
        inst._state.name, inst._state.code = "pending", 0
        self.ready_at[iid] = self.clock.now + dt.timedelta(seconds=self.boot_s)

    def launch(self, ec2: Any, trial: str, rank: int | str | None = None, extra_tags: dict[str, str] | None = None) -> str:
        tags = [{"Key": "trial", "Value": trial}] + ([{"Key": "rank", "Value": str(rank)}] if rank is not None else [])
        tags += [{"Key": k, "Value": v} for k, v in (extra_tags or {}).items()]
        iid = ec2.run_instances(ImageId="ami-0123456789abcdef0", InstanceType="g6e.xlarge", MinCount=1, MaxCount=1,
                                TagSpecifications=[{"ResourceType": "instance", "Tags": tags},
                                                   {"ResourceType": "volume", "Tags": tags}])["Instances"][0]["InstanceId"]
        self._pending(iid)
        return iid

    def start(self, ec2: Any, iid: str) -> None:
        ec2.start_instances(InstanceIds=[iid])
        self._pending(iid)

    def reboot(self, iid: str) -> None:
        """An OS reboot: EC2 keeps the instance `running`; the host's timers start again from its boot."""
        self.booted_at[iid] = self.clock.now + dt.timedelta(seconds=45)

    def tick(self) -> None:
        for iid, at in list(self.ready_at.items()):
            if at <= self.clock.now:
                inst = _backend().get_instance(iid)
                if inst._state.name == "pending":
                    inst._state.name, inst._state.code = "running", 16
                    self.booted_at[iid] = at
                del self.ready_at[iid]

    def state(self, iid: str) -> str:
        return _backend().get_instance(iid)._state.name


# --- Lambda, Scheduler, alarms, EventBridge -------------------------------------------------------------

def archive_text(code: dict[str, Any], name: str) -> str:
    """A file's text from a registered `code` archive (the harness keeps assets by content)."""
    return code["archive"][name]["asset"]["text"]


class Function:
    """A Lambda function as the program registered it: its code run as a module, its handler called as Lambda
    calls an asynchronous invocation, its errors counted per minute (the `Errors` metric)."""

    def __init__(self, registration: Any, clock: Clock) -> None:
        i = registration.inputs
        self.name, self.clock = i["name"], clock
        module_name, self.entry = i["handler"].rsplit(".", 1)
        self.source = archive_text(i["code"], f"{module_name}.py")
        self.errors: list[dt.datetime] = []
        self.runs: list[tuple[dt.datetime, Any]] = []
        self.calls: set[str] = set()  # "service:Operation" of every AWS call its code made
        self.session: Any = None
        self.broken: str | None = None  # a test makes every run raise this (a role denied, a bad deploy)

    def _module(self) -> types.ModuleType:
        mod = types.ModuleType("lambda_function")
        exec(compile(self.source, f"<lambda {self.name}>", "exec"), mod.__dict__)
        mod.dt = self.clock.shim()  # type: ignore[attr-defined]
        return mod

    def run(self, event: dict[str, Any]) -> bool:
        """One attempt; False when it raised (counted in Errors). boto3's default session is the runtime's own for
        the run: every call the code makes on it is recorded (`calls`)."""
        import boto3

        if self.session is None:  # one runtime for every run, as a warm Lambda keeps its process
            self.session = boto3.Session()
            self.session.events.register("before-call", lambda model, **_: self.calls.add(
                f"{model.service_model.signing_name or model.service_model.endpoint_prefix}:{model.name}"))
        was, boto3.DEFAULT_SESSION = boto3.DEFAULT_SESSION, self.session
        try:
            if self.broken:
                raise RuntimeError(self.broken)
            out = getattr(self._module(), self.entry)(json.loads(json.dumps(event)), None)
            self.runs.append((self.clock.now, out))
            return True
        except Exception as e:  # noqa: BLE001 - Lambda records any error
            self.runs.append((self.clock.now, f"error: {e}"))
            self.errors.append(self.clock.now)
            return False
        finally:
            boto3.DEFAULT_SESSION = was


@dataclass
class Invocation:
    schedule: str
    due: dt.datetime  # when Scheduler sends it (precision and window applied)
    attempt: int = 0
    nominal: dt.datetime | None = None  # the schedule's own time for it (`<aws.scheduler.scheduled-time>`)


def with_context(value: Any, inv: Invocation) -> Any:
    """The input with Scheduler's context attributes filled in (scheduler/latest/UserGuide/
    managing-schedule-context-attributes.html): scheduled-time, attempt-number."""
    if isinstance(value, dict):
        return {k: with_context(v, inv) for k, v in value.items()}
    if isinstance(value, list):
        return [with_context(v, inv) for v in value]
    if value == "<aws.scheduler.scheduled-time>":
        return f"{(inv.nominal or inv.due):%Y-%m-%dT%H:%M:%SZ}"
    if value == "<aws.scheduler.attempt-number>":
        return str(inv.attempt)
    return value


@dataclass
class Schedule:
    name: str
    expression: str
    start: dt.datetime | None
    end: dt.datetime | None
    window_min: float
    target_arn: str
    input: dict[str, Any]
    retries: int
    max_age_s: float
    dlq_arn: str | None

    @classmethod
    def of(cls, registration: Any) -> "Schedule":
        i = registration.inputs
        t = i["target"]
        w = i.get("flexibleTimeWindow") or {}
        rp = t.get("retryPolicy") or {}
        return cls(name=registration.name, expression=i["scheduleExpression"],
                   start=parse_time(i["startDate"]) if i.get("startDate") else None,
                   end=parse_time(i["endDate"]) if i.get("endDate") else None,
                   window_min=float(w.get("maximumWindowInMinutes") or 0) if w.get("mode") == "FLEXIBLE" else 0.0,
                   target_arn=t["arn"], input=json.loads(t.get("input") or "{}"),
                   retries=int(rp.get("maximumRetryAttempts", 185)), max_age_s=float(rp.get("maximumEventAgeInSeconds", 86400)),
                   dlq_arn=(t.get("deadLetterConfig") or {}).get("arn"))

    def fire_times(self, t0: dt.datetime, t1: dt.datetime) -> list[dt.datetime]:
        """The nominal times in (t0, t1] (before precision and window)."""
        m = re.fullmatch(r"at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)", self.expression)
        if m:
            at = parse_time(m.group(1))
            return [at] if t0 < at <= t1 else []
        m = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", self.expression)
        if not m:
            raise ValueError(f"schedule {self.name}: the emulation reads at() and rate(), not {self.expression!r}")
        step = dt.timedelta(**{m.group(2).rstrip("s") + "s": int(m.group(1))})
        first = (self.start or t0) + step  # "starts after the start date": its latest reading
        out, t = [], first
        if t <= t0:
            t += step * ((t0 - t) // step + 1)
        while t <= t1 and (self.end is None or t <= self.end):
            out.append(t)
            t += step
        return out


class Cloud:
    """The program's schedules, function, alarms and rules on one virtual clock, against moto."""

    def __init__(self, deployment: Any, clock: Clock, *, precision_s: float = 59, seed: int = 0,
                 lifecycle: Lifecycle | None = None) -> None:
        import boto3

        self.clock, self.precision_s, self.rng = clock, precision_s, random.Random(seed)
        self.lifecycle = lifecycle
        self.sns, self.sqs = boto3.client("sns", region_name=REGION), boto3.client("sqs", region_name=REGION)
        self.functions = {r.outputs.get("arn") or f"arn:aws:mock:::{r.name}": Function(r, clock)
                          for r in deployment.of("aws:lambda/function:Function")}
        self.by_name = {f.name: f for f in self.functions.values()}
        self.schedules = [Schedule.of(r) for r in deployment.of("aws:scheduler/schedule:Schedule")]
        self.alarms = [r.inputs for r in deployment.of("aws:cloudwatch/metricAlarm:MetricAlarm")
                       if r.inputs.get("namespace") in ("AWS/Lambda", "AWS/SQS")]
        self.alarm_state = {a["name"]: "OK" for a in self.alarms}
        self.rules = {r.outputs.get("name") or r.inputs.get("name") or r.name: json.loads(r.inputs["eventPattern"])
                      for r in deployment.of("aws:cloudwatch/eventRule:EventRule")}
        self.rule_targets = [(t.inputs["rule"], t.inputs["arn"]) for t in deployment.of("aws:cloudwatch/eventTarget:EventTarget")]
        self.queue_urls = {q.outputs.get("arn"): q.outputs.get("url") for q in deployment.of("aws:sqs/queue:Queue")}
        # Lambda's asynchronous settings per function: (retries, maximum event age, on-failure destination)
        self.async_config: dict[str, tuple[int, float, str | None]] = {}
        for c in deployment.of("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig"):
            i = c.inputs
            dest = ((i.get("destinationConfig") or {}).get("onFailure") or {}).get("destination")
            self.async_config[i["functionName"]] = (int(i.get("maximumRetryAttempts", 2)),
                                                    float(i.get("maximumEventAgeInSeconds", 21600)), dest)
        self.pending: list[Invocation] = []
        self.lambda_retries: list[tuple[dt.datetime, Function, dict[str, Any], int]] = []
        self.unreachable: set[str] = set()  # target ARNs Scheduler cannot invoke (a test's fault)
        self.dead_letters: list[dict[str, Any]] = []
        self.published: list[dict[str, str]] = []
        self.last = clock.now
        self.enabled = True

    def _publish(self, topic: str, subject: str, message: str) -> None:
        self.sns.publish(TopicArn=topic, Subject=subject[:100], Message=message)
        self.published.append({"topic": topic, "subject": subject, "message": message, "at": self.clock.now.isoformat()})

    def tick(self) -> None:
        """Everything due up to the clock's now, in order: Scheduler's sends, Lambda's retries, the alarms."""
        now = self.clock.now
        if self.enabled:
            for s in self.schedules:
                for t in s.fire_times(self.last, now):
                    late = dt.timedelta(seconds=self.precision_s + (self.rng.uniform(0, s.window_min * 60) if s.window_min else 0))
                    self.pending.append(Invocation(s.name, t + late, nominal=t))
        self.last = now
        for inv in sorted([i for i in self.pending if i.due <= now], key=lambda i: i.due):
            self.pending.remove(inv)
            self._send(inv)
        for item in sorted([r for r in self.lambda_retries if r[0] <= now], key=lambda r: r[0]):
            self.lambda_retries.remove(item)
            _, fn, event, attempt = item
            retries, max_age, dest = self.async_config.get(fn.name, (2, 21600.0, None))
            if self._run(fn, event):
                continue
            first = item[0] - dt.timedelta(minutes=sum(range(1, attempt + 1)))
            too_old = (now - first).total_seconds() + (attempt + 1) * 60 > max_age  # the next retry would be
            if attempt < retries and not too_old:
                self.lambda_retries.append((now + dt.timedelta(minutes=attempt + 1), fn, event, attempt + 1))
            elif dest:  # Lambda's on-failure destination: the invocation record
                self._publish(dest, f"Lambda {fn.name}: an invocation failed {attempt + 1} time(s)",
                              json.dumps({"requestContext": {"functionArn": fn.name, "condition":
                                                             "EventAgeExceeded" if too_old else "RetriesExhausted",
                                                             "approximateInvokeCount": attempt + 1},
                                          "requestPayload": event, "responsePayload": fn.runs[-1][1]}))
        self._alarms()

    def _send(self, inv: Invocation) -> None:
        s = next(x for x in self.schedules if x.name == inv.schedule)
        fn = self.functions.get(s.target_arn)
        if fn is None or s.target_arn in self.unreachable:  # Scheduler's own failure: retried, then dead-lettered
            age = (self.clock.now - inv.due).total_seconds() + inv.attempt * 60
            if inv.attempt < s.retries and age < s.max_age_s:
                self.pending.append(Invocation(inv.schedule, self.clock.now + dt.timedelta(minutes=1), inv.attempt + 1,
                                               inv.nominal))
            elif s.dlq_arn:
                body = {"schedule": s.name, "target": s.target_arn, "error": "the target could not be invoked",
                        "attempts": inv.attempt + 1}
                self.sqs.send_message(QueueUrl=self.queue_urls[s.dlq_arn], MessageBody=json.dumps(body))
                self.dead_letters.append(body)
            return
        event = with_context(s.input, inv)
        if not self._run(fn, event):  # asynchronous: Lambda's own retries, then its on-failure destination
            self.lambda_retries.append((self.clock.now + dt.timedelta(minutes=1), fn, event, 1))

    def _run(self, fn: Function, event: dict[str, Any]) -> bool:
        if self.lifecycle is None:
            return fn.run(event)
        with self.lifecycle.acting("cloud"):
            return fn.run(event)

    def _alarms(self) -> None:
        """Each alarm evaluated once a minute (CloudWatch evaluates per period; these have 60 s)."""
        now = self.clock.now
        minute = now.replace(second=0, microsecond=0)
        if getattr(self, "_evaluated", None) == minute:
            return
        self._evaluated = minute
        for a in self.alarms:
            period = dt.timedelta(seconds=float(a.get("period", 60)))
            if a["namespace"] == "AWS/Lambda":
                fn = self.by_name.get(a["dimensions"]["FunctionName"])
                value = float(len([t for t in (fn.errors if fn else []) if now - period < t <= now]))
            else:
                url = next((u for arn, u in self.queue_urls.items() if arn and arn.endswith(a["dimensions"]["QueueName"])), None)
                value = float(self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                              ["Attributes"]["ApproximateNumberOfMessages"]) if url else 0.0
            state = "ALARM" if value > float(a["threshold"]) else "OK"
            if state != self.alarm_state[a["name"]]:
                self.alarm_state[a["name"]] = state
                if state == "ALARM":
                    for topic in a.get("alarmActions", []):
                        self._publish(topic, f'ALARM: "{a["name"]}" in {REGION}',
                                      json.dumps({"AlarmName": a["name"], "NewStateValue": "ALARM",
                                                  "AlarmDescription": a.get("alarmDescription")}))

    # EventBridge
    def put_event(self, event: dict[str, Any]) -> list[str]:
        """Deliver an event to every rule it matches; returns the rules."""
        hit = [name for name, pattern in self.rules.items() if matches(pattern, event)]
        for rule, arn in self.rule_targets:
            if rule in hit:
                self._publish(arn, event["detail-type"], json.dumps(event))
        return hit


def matches(pattern: Any, event: Any) -> bool:
    """EventBridge's exact matching: every key of the pattern is in the event; a list of values matches one of them;
    a nested object matches recursively."""
    if isinstance(pattern, dict):
        return isinstance(event, dict) and all(k in event and matches(v, event[k]) for k, v in pattern.items())
    if isinstance(pattern, list):
        return any(matches(p, event) if isinstance(p, dict) else event == p for p in pattern)
    return pattern == event


def run_stop_document(ec2: Any, instance_ids: list[str], clock: Clock, cloud: Cloud) -> str:
    """AWS-StopEC2Instance as its definition reads (two aws:changeInstanceState steps, the first onFailure
    Continue); a failed execution emits SSM's status-change event. Returns the execution's status."""
    failed = 0
    for force in (False, True):
        try:
            ec2.stop_instances(InstanceIds=instance_ids, Force=force)
        except Exception:  # noqa: BLE001 - a step's failure
            failed += 1
            if force:
                break
        else:
            break
    status = "Failed" if failed == 2 else "Success"
    cloud.put_event({"version": "0", "source": "aws.ssm", "detail-type": "EC2 Automation Execution Status-change Notification",
                     "account": ACCOUNT, "region": REGION, "time": clock.now.isoformat(),
                     "detail": {"ExecutionId": "emulated", "Definition": "AWS-StopEC2Instance", "DefinitionVersion": 1.0,
                                "Status": status, "StartTime": clock.now.isoformat(), "EndTime": clock.now.isoformat()}})
    return status


# --- the hosts' own check ---------------------------------------------------------------------------------

def check_script(user_data: str) -> tuple[str, str, str]:
    """The deadline check, the deadline and the grace cap in seconds, as the boot script writes them."""
    script = user_data.split("cat > /usr/local/sbin/trial-deadline-check <<'CHECK'\n", 1)[1].split("\nCHECK\n", 1)[0]
    deadline = re.search(r"^echo (\S+) > /var/lib/trial-guard/deadline$", user_data, re.M).group(1)  # type: ignore[union-attr]
    cap = re.search(r"^echo (\d+) > /var/lib/trial-guard/grace-cap-seconds$", user_data, re.M).group(1)  # type: ignore[union-attr]
    return script + "\n", deadline.strip("'"), cap


class Metadata:
    """IMDSv2 on loopback: a token for a PUT, then the instance's tags (from moto) under /<instance id>/latest/…"""

    def __init__(self) -> None:
        import boto3

        ec2 = boto3.client("ec2", region_name=REGION)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_PUT(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"token")

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if self.headers.get("X-aws-ec2-metadata-token") != "token":
                    self.send_response(401)
                    self.end_headers()
                    return
                iid, key = parts[0], parts[-1]
                tags = {t["Key"]: t["Value"] for t in
                        ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0].get("Tags", [])}
                if "/".join(parts[1:-1]) != "latest/meta-data/tags/instance" or key not in tags:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.end_headers()
                self.wfile.write(tags[key].encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Host:
    """One instance's OS: its deadline check's timer, run as systemd would."""

    instance_id: str
    folder: Path
    script: Path
    next_run: dt.datetime | None = None
    boot_seen: dt.datetime | None = None
    runs: list[tuple[dt.datetime, str]] = field(default_factory=list)


class Hosts:
    def __init__(self, lifecycle: Lifecycle, metadata: Metadata, user_data: str, folder: Path) -> None:
        self.lifecycle, self.metadata = lifecycle, metadata
        self.script_text, self.deadline, self.cap = check_script(user_data)
        self.folder = folder
        self.hosts: dict[str, Host] = {}
        self.enabled = True

    def add(self, iid: str) -> Host:
        d = self.folder / iid
        (d / "state").mkdir(parents=True, exist_ok=True)
        (d / "state" / "deadline").write_text(self.deadline + "\n")
        (d / "state" / "grace-cap-seconds").write_text(self.cap + "\n")
        script = d / "trial-deadline-check"
        script.write_text(self.script_text)
        script.chmod(0o755)
        h = self.hosts[iid] = Host(iid, d, script)
        return h

    def tick(self) -> None:
        if not self.enabled:
            return
        now = self.lifecycle.clock.now
        for iid, h in self.hosts.items():
            if self.lifecycle.state(iid) != "running":
                h.next_run, h.boot_seen = None, None
                continue
            boot = self.lifecycle.booted_at.get(iid)
            if boot is None or boot > now:
                continue  # rebooting
            if h.boot_seen != boot:  # OnBootSec=20s after each boot
                h.boot_seen, h.next_run = boot, boot + dt.timedelta(seconds=20)
            while h.next_run is not None and h.next_run <= now and self.lifecycle.state(iid) == "running":
                self._run(h, h.next_run)
                h.next_run = h.next_run + dt.timedelta(seconds=60)  # OnUnitActiveSec=60s

    def _run(self, h: Host, at: dt.datetime) -> None:
        marker = h.folder / "stopped"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TRIAL_GUARD_STATE": str(h.folder / "state"),
               "TRIAL_IMDS": f"{self.metadata.url}/{h.instance_id}", "TRIAL_NOW": str(int(at.timestamp())),
               "TRIAL_STOP_COMMAND": f"touch {marker}"}
        p = subprocess.run(["bash", str(h.script)], env=env, capture_output=True, text=True, timeout=30)
        h.runs.append((at, (p.stdout + p.stderr).strip()))
        if marker.exists():
            marker.unlink()
            import boto3

            with self.lifecycle.acting("host"):  # shutdown -h: the instance stops
                boto3.client("ec2", region_name=REGION).stop_instances(InstanceIds=[h.instance_id])


def run_until(until: dt.datetime, clock: Clock, *parts: Any, step_s: float = 5,
              events: list[tuple[dt.datetime, Callable[[], None]]] | None = None) -> None:
    """Advance the clock to `until` in steps, running each scripted event at its time and every part's tick."""
    todo = sorted(events or [], key=lambda e: e[0])
    while clock.now < until:
        clock.now = min(until, clock.now + dt.timedelta(seconds=step_s))
        while todo and todo[0][0] <= clock.now:
            todo.pop(0)[1]()
        for p in parts:
            p.tick()


def at_time(when: dt.datetime) -> list[str]:
    """A command's argv prefix that runs it with its clock at `when` and moving on (libfaketime: every
    `clock_gettime` of the process shifted, its monotonic clock left alone so its timeouts keep real time)."""
    import shutil

    if shutil.which("faketime") is None:
        raise RuntimeError("faketime is not installed (scripts/test.sh installs it: apt-get install faketime)")
    offset = int((when - dt.datetime.now(UTC)).total_seconds())
    return ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-f", f"{offset:+d}"]

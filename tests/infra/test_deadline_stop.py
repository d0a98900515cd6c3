"""The deadline stop over time (#64), in emulated time against moto (tests/machinery/aws_clock.py): the program's
own schedule, function code, alarms, rule and boot script, each run as AWS and the host run them."""

from __future__ import annotations

import datetime as dt
import os
import subprocess

import pytest

from deadline_world import CASES, TRIAL, alerts, emulated, table, timeline, up
from infra.sweep import grace_value
from machinery.aws_clock import run_stop_document, run_until


@pytest.fixture(scope="module")
def world(moto_module):
    return up(*(moto_module.client(n) for n in ("ec2", "sns", "sqs")))


def test_every_host_that_runs_after_the_deadline_is_stopped_within_minutes(world, moto_module, tmp_path):
    """Each case, with both lines, then each line alone (the other disabled): every host stopped; the cloud
    within 2 min of running (the sweep's minute plus Scheduler's minute of precision, taken at its worst), the
    host's own check within 80 s of its boot or the deadline."""
    ec2, sqs = moto_module.client("ec2"), moto_module.client("sqs")
    rows = [r for mode in ("both", "cloud alone", "host alone") for r in timeline(ec2, world, tmp_path, mode)]
    print("\n" + table(rows))
    assert len(rows) == 3 * len(CASES)
    for r in rows:
        assert r.minutes_after is not None and r.states == "stopped", r
        # counted from the deadline or from the start: a boot (1.5 min) where it had to boot, then the cloud's
        # minute plus Scheduler's minute of precision, or the host's 20 s after boot and its minute
        assert r.minutes_after <= 3.5, r
        assert r.stopped_by == {"cloud alone": "cloud", "host alone": "host"}.get(r.mode, r.stopped_by)
    assert next(r for r in rows if r.case.startswith("pending when a sweep") and r.mode == "cloud alone").seen_pending
    # every AWS call the function's code made is one its role allows (moto enforces no IAM: checked here)
    from infra.guards import sweep_policy
    from infra.plan import TrialConfig
    from test_infra import live

    allowed = {a for st in sweep_policy(TrialConfig.model_validate(live()), world.topic, f"{TRIAL}-deadline-sweep")
               ["Statement"] for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    with emulated(world, world.deadline, tmp_path / "calls") as (clock, life, cloud, hosts):
        iid = life.launch(ec2, TRIAL, 0)
        life.tick()
        clock.now += dt.timedelta(seconds=95)
        life.tick()
        run_until(clock.now + dt.timedelta(minutes=3), clock, life, cloud)
        (fn,) = cloud.functions.values()
        assert {"ec2:DescribeInstances", "ec2:StopInstances", "sns:Publish"} <= fn.calls <= allowed, fn.calls
        ec2.terminate_instances(InstanceIds=[iid])
    for r in rows:
        assert r.stopped_by in ("cloud", "host"), r
    got = alerts(sqs, world)  # the cloud said what it stopped, with the minutes after the deadline
    assert any("deadline stop stopped" in a["subject"] for a in got) and not any("FAILED" in a["subject"] for a in got)


def test_a_stop_that_fails_is_loud(world, moto_module, tmp_path):
    """Three ways the stop can fail, each reaching the alert topic: the function cannot stop a host (its role
    denied: it publishes which, raises, Lambda retries it once within its two minutes and then hands the run to
    the topic, the Errors alarm goes off — and the host's own check
    still stops it); Scheduler cannot invoke the function (retried, then dead-lettered: the queue's alarm); AWS's
    stop runbook (the budget's spend stops) fails on a pending host (the rule on SSM's status-change event)."""
    ec2, sqs = moto_module.client("ec2"), moto_module.client("sqs")
    alerts(sqs, world)
    D = world.deadline
    with emulated(world, D - dt.timedelta(minutes=3), tmp_path) as (clock, life, cloud, hosts):
        iid = life.launch(ec2, TRIAL, 0)
        hosts.add(iid)
        life.denied["cloud"] = "You are not authorized to perform this operation."
        hosts.enabled = False  # the host's own check would stop it first (its minute comes before the sweep's)
        run_until(D + dt.timedelta(minutes=4), clock, life, cloud, hosts)
        assert life.state(iid) == "running"
        got = alerts(sqs, world)
        print("\nthe role denied, the operator receives:", *[f"  {a['subject']}: {a['message'][:160]}" for a in got], sep="\n")
        assert any(f"{TRIAL}: deadline stop FAILED for 1 host(s)" in a["subject"] and "UnauthorizedOperation"
                   in a["message"] for a in got), got
        assert any(a["subject"] == f'ALARM: "{TRIAL}-deadline-sweep-errors" in us-east-1' for a in got), got
        (fn,) = cloud.functions.values()
        assert len(fn.errors) >= 3  # every minute's run, and Lambda's retry of each
        assert any(a["subject"].startswith(f"Lambda {TRIAL}-deadline-sweep: an invocation failed 2 time(s)")
                   and "EventAgeExceeded" in a["message"] for a in got), got  # the on-failure destination
        hosts.enabled = True
        run_until(D + dt.timedelta(minutes=6), clock, life, cloud, hosts)
        assert [s.by for s in life.stops if s.instance_id == iid] == ["host"]  # the second line held
        # Scheduler cannot reach the function: its retries, then the dead-letter queue and its alarm
        del life.denied["cloud"]
        cloud.unreachable.add(next(iter(cloud.functions)))
        run_until(D + dt.timedelta(minutes=9), clock, life, cloud, hosts)
        assert cloud.dead_letters and cloud.dead_letters[0]["attempts"] == 3  # the first try and 2 retries
        got = alerts(sqs, world)
        print("Scheduler unable to invoke, the operator receives:", *[f"  {a['subject']}" for a in got], sep="\n")
        assert any(a["subject"] == f'ALARM: "{TRIAL}-deadline-dlq" in us-east-1' for a in got)
        # AWS-StopEC2Instance on a host still pending: EC2 refuses both of its steps; the run ends Failed
        cloud.unreachable.clear()
        late = life.launch(ec2, TRIAL, 1)
        assert run_stop_document(ec2, [late], clock, cloud) == "Failed"
        got = alerts(sqs, world)
        print("AWS-StopEC2Instance failed, the operator receives:", *[f"  {a['subject']}: {a['message'][:200]}" for a in got],
              sep="\n")
        assert any(a["subject"] == "EC2 Automation Execution Status-change Notification"
                   and '"Status": "Failed"' in a["message"] for a in got), got
        assert run_stop_document(ec2, [iid], clock, cloud) == "Success"  # a stopped one: nothing to say
        assert not alerts(sqs, world)
        ec2.terminate_instances(InstanceIds=[iid, late])


def test_a_grace_runs_to_its_end_and_no_further(world, moto_module, tmp_path):
    """After the deadline stopped the host, `orchestrate start --grace` (its functions, at the emulated time)
    records, tags and starts it: the sweep and the host's check leave it running until the grace's end, then the
    cloud stops it within two minutes. A tag longer than the stack's cap is no grace: stopped at once."""
    from orchestrate.cloud import grace_for, start_trial, trial_instances

    ec2, sqs = moto_module.client("ec2"), moto_module.client("sqs")
    D = world.deadline
    with emulated(world, D - dt.timedelta(minutes=3), tmp_path) as (clock, life, cloud, hosts):
        iid = life.launch(ec2, TRIAL, 0)
        hosts.add(iid)
        run_until(D + dt.timedelta(minutes=30), clock, life, cloud, hosts)
        assert life.state(iid) == "stopped"
        found = trial_instances(moto_module, TRIAL)
        g = grace_for(found, TRIAL, D, 20, 60, clock.now, "preserve the payloads")
        # the minutes and the 2 its stop may come late, at the plan's prices
        assert g.usd == pytest.approx((1.861 + 0.005) * 22 / 60, abs=1e-3) and g.end == clock.now + dt.timedelta(minutes=20)
        with pytest.raises(ValueError, match="give 1 to 60 minutes"):
            grace_for(found, TRIAL, D, 61, 60, clock.now, "too long")
        with pytest.raises(ValueError, match="predates graces"):
            grace_for(found, TRIAL, D, 20, None, clock.now, "an old stack")
        start_trial(moto_module, found, grace=g, wait=False)
        life._pending(iid)  # EC2: pending, then running
        granted_at = clock.now
        run_until(g.end + dt.timedelta(minutes=3), clock, life, cloud, hosts)
        stops = [s for s in life.stops if s.instance_id == iid and s.at > granted_at]
        print(f"\ngrace {g.start:%H:%M:%S}–{g.end:%H:%M:%S} (${g.usd:.3f}); stopped again by the {stops[0].by} at "
              f"{stops[0].at:%H:%M:%S}, {(stops[0].at - g.end).total_seconds():.0f} s after its end")
        assert stops and stops[0].by in ("cloud", "host") and g.end <= stops[0].at <= g.end + dt.timedelta(minutes=2)
        # a grace nobody granted through `orchestrate` (longer than the cap): not honoured
        ec2.create_tags(Resources=[iid], Tags=[{"Key": "trial-grace", "Value":
                                                grace_value(clock.now, clock.now + dt.timedelta(minutes=90))}])
        life.start(ec2, iid)
        t = clock.now
        run_until(t + dt.timedelta(minutes=4), clock, life, cloud, hosts)
        assert [s for s in life.stops if s.instance_id == iid and s.at > t]
        ec2.terminate_instances(InstanceIds=[iid])
    alerts(sqs, world)


def test_stopped_volumes_are_announced_once_a_day_after_the_planned_days(world, moto_module, tmp_path):
    """The plan priced `stopped_days` (1) of stopped volumes: from then on, once a day, the sweep says what they
    bill and what ends it."""
    ec2, sqs = moto_module.client("ec2"), moto_module.client("sqs")
    alerts(sqs, world)
    D = world.deadline
    with emulated(world, D - dt.timedelta(minutes=3), tmp_path) as (clock, life, cloud, hosts):
        iid = life.launch(ec2, TRIAL, 0)
        run_until(D + dt.timedelta(minutes=4), clock, life, cloud)
        assert life.state(iid) == "stopped"
        alerts(sqs, world)
        clock.now = cloud.last = D + dt.timedelta(hours=23, minutes=50)  # a day later, nothing ran meanwhile
        run_until(D + dt.timedelta(days=1, minutes=10), clock, life, cloud, step_s=30)
        got = [a for a in alerts(sqs, world) if "still bill" in a["subject"]]
        print("\na day after the deadline:", *[f"  {a['subject']}: {a['message']}" for a in got], sep="\n")
        assert len(got) == 1 and "orchestrate down" in got[0]["message"] and "$" in got[0]["message"], got
        ec2.terminate_instances(InstanceIds=[iid])


def test_the_hosts_check_as_bash_runs_it(tmp_path):
    """The boot script's check, run by bash against a loopback IMDSv2: before the deadline nothing; after it, a
    grace inside the cap keeps the host, any other tag, an unreadable metadata service or a grace over the cap
    stops it (a host never keeps running on what it cannot read)."""
    import http.server
    import threading

    from infra.userdata import user_data
    from machinery.aws_clock import check_script

    D = dt.datetime(2026, 12, 7, 1, 0, tzinfo=dt.timezone.utc)
    script, deadline, cap = check_script(user_data(trial="t", rank=0, deadline=D, read_ahead_kib=4096,
                                                   transfer_guard_bytes=None, grace_cap_minutes=60))
    assert cap == "3600" and deadline == D.isoformat()
    tags: dict[str, str] = {}

    class IMDS(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_PUT(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"tok")

        def do_GET(self):
            key = self.path.rsplit("/", 1)[-1]
            ok = self.headers.get("X-aws-ec2-metadata-token") == "tok" and key in tags
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                self.wfile.write(tags[key].encode())

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IMDS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "deadline").write_text(deadline + "\n")
    (tmp_path / "state" / "grace-cap-seconds").write_text(cap + "\n")
    (tmp_path / "check").write_text(script)

    def stops(at: dt.datetime, imds: str = f"http://127.0.0.1:{server.server_address[1]}") -> bool:
        marker = tmp_path / "stopped"
        marker.unlink(missing_ok=True)
        subprocess.run(["bash", str(tmp_path / "check")], check=True, timeout=30, capture_output=True, env={
            "PATH": os.environ["PATH"], "TRIAL_GUARD_STATE": str(tmp_path / "state"), "TRIAL_IMDS": imds,
            "TRIAL_NOW": str(int(at.timestamp())), "TRIAL_STOP_COMMAND": f"touch {marker}"})
        return marker.exists()

    try:
        m = dt.timedelta(minutes=1)
        assert not stops(D - m) and stops(D) and stops(D + 90 * m)
        tags["trial-grace"] = grace_value(D + 30 * m, D + 50 * m)
        assert stops(D + 29 * m) and not stops(D + 30 * m) and not stops(D + 49 * m) and stops(D + 50 * m)
        tags["trial-grace"] = grace_value(D + 30 * m, D + 91 * m)  # over the cap: no grace at all
        assert stops(D + 31 * m)
        tags["trial-grace-cap-seconds"] = "7200"  # the stack's cap raised since boot: its tag says so
        assert not stops(D + 31 * m)
        del tags["trial-grace-cap-seconds"]
        for text in ("not a grace", "-1 minute/+58 minutes", "/2026-12-07T02:00:00Z"):  # only the exact form
            tags["trial-grace"] = text
            assert stops(D + 31 * m), text
        tags["trial-grace"] = grace_value(D + 30 * m, D + 50 * m)
        assert stops(D + 31 * m, imds="http://127.0.0.1:9")  # metadata unreachable: no grace
        del tags["trial-grace"]
        tags["trial-deadline"] = f"{D + 60 * m:%Y-%m-%dT%H:%M:%S}Z"  # the deadline moved later since boot
        assert not stops(D + 30 * m) and stops(D + 60 * m)
        tags["trial-deadline"] = "tomorrow"  # not a time: the one written at boot
        assert stops(D + 30 * m)
    finally:
        server.shutdown()
        server.server_close()


def test_the_sweep_honours_a_grace_only_as_written():
    from infra.sweep import honoured_grace

    now = dt.datetime(2026, 12, 7, 2, 0, tzinfo=dt.timezone.utc)
    m = dt.timedelta(minutes=1)
    assert honoured_grace(grace_value(now - m, now + 10 * m), now, 60) == now + 10 * m
    assert honoured_grace(grace_value(now + m, now + 10 * m), now, 60) is None  # not begun
    assert honoured_grace(grace_value(now - 10 * m, now), now, 60) is None  # over
    assert honoured_grace(grace_value(now - m, now + 60 * m), now, 60) is None  # 61 min > the cap
    assert honoured_grace(grace_value(now - m, now + 10 * m), now, 0) is None  # a stack without graces
    assert honoured_grace("2026-12-07T01:00:00Z", now, 60) is None and honoured_grace(None, now, 60) is None


def test_a_deadline_no_up_can_meet_is_refused_before_anything_exists(tmp_path):
    """A deadline 2 minutes away: `orchestrate plan` and `pulumi up` refuse it with the earliest they accept; an
    `up` that creates no host (every rank already live) is not held to it; `plan` prices the deadline stop."""
    from conftest import example_stack, run_cli
    from test_infra import live, run_program

    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=2)).isoformat()
    stack = example_stack(tmp_path, deadline=soon)
    r = run_cli("-m", "orchestrate", "plan", "diloco-four", "--stack", str(stack), "--no-quota")
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1 and "min away: an `up` that creates host(s) (rank 0, 1, 2, 3) needs 30 min" in said, said
    assert "the earliest deadline it accepts now is" in said
    assert "deadline stop: from the deadline on, every minute" in said and "a day for 4 hosts" in said
    refused = run_program(live(deadline=soon))
    assert refused.returncode != 0 and "the earliest deadline it accepts now is" in refused.errors
    assert refused.resources == [] or all(not r.custom for r in refused.resources)  # nothing registered
    first = run_program(live())
    again = run_program(live(deadline=soon), state=first.state)  # every rank live: this up creates no host
    assert again.returncode == 0 and again.failed is None, again.errors
    assert not [o for o in again.ops if o["type"] == "aws:ec2/instance:Instance" and o["op"] == "create"]


def test_one_host_the_stop_cannot_stop_does_not_shield_the_others(world, moto_module, tmp_path):
    """A host with stop protection (EC2 refuses `StopInstances` for it, and so the whole call naming it): the sweep
    stops the others one by one and names the protected one as not stopped, loudly, every minute."""
    ec2, sqs = moto_module.client("ec2"), moto_module.client("sqs")
    alerts(sqs, world)
    D = world.deadline
    with emulated(world, D - dt.timedelta(minutes=3), tmp_path) as (clock, life, cloud, hosts):
        ids = [life.launch(ec2, TRIAL, r) for r in range(3)]
        run_until(D - dt.timedelta(seconds=30), clock, life)
        ec2.modify_instance_attribute(InstanceId=ids[1], DisableApiStop={"Value": True})
        run_until(D + dt.timedelta(minutes=3), clock, life, cloud)
        assert [life.state(i) for i in ids] == ["stopped", "running", "stopped"]
        got = alerts(sqs, world)
        failed = [a for a in got if "deadline stop FAILED for 1 host(s)" in a["subject"]]
        assert failed and ids[1] in failed[0]["message"] and ids[0] not in failed[0]["message"], got
        assert any("stopped 2 host(s)" in a["subject"] for a in got), got
        ec2.modify_instance_attribute(InstanceId=ids[1], DisableApiStop={"Value": False})
        ec2.terminate_instances(InstanceIds=ids)

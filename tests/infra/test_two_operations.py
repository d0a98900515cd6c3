"""Two operations on one trial at once (#65): the program's own lease (infra/lease.py), walked through the engine
harness on an emulated self-managed backend (tests/pulumi_engine.py `DiyBackend`: the stack's checkpoint and lock
files, `pulumi cancel` deleting the lock files and nothing else, as pulumi/pulumi `pkg/backend/diy/lock.go` and
`backend.go` `CancelCurrentUpdate` do), with moto's EC2 and SSM as the account.

An operation is held mid-step by a `pause` fault: the step waits for a file, the checkpoint as of then written
(the diy backend persists after every step), while the test starts a second operation beside it — what a
`pulumi cancel` followed by `orchestrate destroy` (or a colleague's `up`) does to a running `up`.

The lease itself, slot by slot (taken, refused, released, stale and passed over, lost, raced, unreadable), is
tested in-process against moto's SSM at the end of this file."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import infra.lease as lease_mod
from infra.lease import LeaseHeld, current, take
from infra.teardown import DeleteCheck
from pulumi_engine import DiyBackend, pulumi_run, pulumi_start, teardown_env
from test_failures import preserve_into
from test_infra import CALLS, live, stack_of
from test_outside import a_trial, deleted, in_state, tagged

HOST = "aws:ec2/instance:Instance"


@pytest.fixture
def trial(aws):
    with a_trial(aws, "two") as t:
        yield t


def wait_for(path: Path, running, timeout: float = 120) -> None:
    """Until the operation is held at its pause (or ended without reaching it: then what it said)."""
    end = time.monotonic() + timeout
    while not path.exists():
        if running.p.poll() is not None:
            d = running.wait()
            raise AssertionError(f"the operation ended (exit {d.returncode}) before {path.name}: {d.errors or d.failed}")
        assert time.monotonic() < end, f"the operation never reached {path.name}"
        time.sleep(0.05)


def settled(backend: DiyBackend, hosts: int, timeout: float = 60) -> list[dict]:
    """The checkpoint once it holds `hosts` instances (a held operation's other steps complete meanwhile)."""
    end = time.monotonic() + timeout
    while len(in_state(backend.read("test"))) < hosts:
        assert time.monotonic() < end, f"the checkpoint never held {hosts} hosts"
        time.sleep(0.1)
    return backend.read("test")


def only_the_stack(d) -> bool:
    """Nothing registered but the stack resource itself (the SDK registers it before the program runs)."""
    return [r.typ for r in d.resources] == ["pulumi:pulumi:Stack"]


def test_a_destroy_beside_a_running_up_is_refused_though_pulumi_cancel_removed_the_lock(aws, trial, tmp_path):
    T, bucket, rules = trial
    config = stack_of(live(trial=T))
    backend = DiyBackend(tmp_path / "backend")
    engine = {"answers": rules, "calls": CALLS, "provider": "moto", "backend": backend}
    preserve_into(aws, bucket, T, tmp_path)  # preserved: nothing but the other operation may stop the destroy
    pause = tmp_path / "rank-3-create"
    up = pulumi_start("up", config, faults=[{"name": f"{T}-rank-3", "type": HOST, "op": "create", "pause": str(pause)}],
                      **engine)
    wait_for(Path(f"{pause}.reached"), up)
    # the backend's lock refuses a second operation; `pulumi cancel` deletes it, and the `up` runs on
    locked = pulumi_run("destroy", config, env=teardown_env(), **engine)
    assert locked.returncode == 255 and "the stack is currently locked by 1 lock(s)" in locked.failed
    assert backend.cancel("test") == 1
    midway = settled(backend, 3)  # the steps in flight beside rank 3's complete: ranks 0-2
    assert sorted(tagged(aws, T).values()) == ["0", "1", "2"] and set(tagged(aws, T)) == in_state(midway)
    assert any(s["name"] == f"{T}-deadline" for s in midway)
    print(f"\nthe up held at rank 3's create: {len(in_state(midway))} hosts in the checkpoint, {len(tagged(aws, T))} live")
    d = pulumi_run("destroy", config, env=teardown_env(), **engine)
    assert d.returncode == 1 and only_the_stack(d) and d.steps == [], d.errors
    assert f"another operation holds trial {T}'s lease (/trials/{T}/operations/" in d.errors, d.errors
    assert "): up of stack organization/trials/test" in d.errors
    assert "`pulumi cancel` does not stop it" in d.errors
    print(f"\ndestroy beside the running up, after `pulumi cancel` removed its lock: refused, {len(deleted(d))} deleted")
    pause.touch()  # the `up` goes on to its end
    done = up.wait()
    assert done.returncode == 0 and done.failed is None, done.errors
    assert len(tagged(aws, T)) == 4 and len(in_state(backend.read("test"))) == 4
    assert any(s["name"] == f"{T}-deadline" for s in backend.read("test"))  # every host under its deadline stop
    # the lease is released with the `up`: the destroy now goes through (preserved), 0 instances left
    d = pulumi_run("destroy", config, env=teardown_env(), **engine)
    assert d.failed is None and d.returncode == 0, d.failed or d.errors
    assert len(tagged(aws, T)) == 0 and f"{T}-deadline" in deleted(d)
    print(f"after the up ended: destroy deleted {len(deleted(d))}, {len(tagged(aws, T))} instances left")


def test_an_up_beside_a_running_destroy_is_refused_and_a_preview_only_says_so(aws, trial, tmp_path):
    T, bucket, rules = trial
    config = stack_of(live(trial=T))
    backend = DiyBackend(tmp_path / "backend")
    engine = {"answers": rules, "calls": CALLS, "provider": "moto", "backend": backend}
    first = pulumi_run("up", config, **engine)
    assert first.returncode == 0, first.errors
    preserve_into(aws, bucket, T, tmp_path)
    pause = tmp_path / "rank-0-delete"
    destroy = pulumi_start("destroy", config, env=teardown_env(), **engine,
                           faults=[{"name": f"{T}-rank-0", "type": HOST, "op": "delete", "pause": str(pause)}])
    wait_for(Path(f"{pause}.reached"), destroy)
    assert backend.cancel("test") == 1
    # a preview beside it changes nothing and takes no lease: it runs, and says what is running
    seen = pulumi_run("preview", config, **engine)
    assert seen.returncode == 0, seen.errors
    assert any(f"another operation on trial {T}: destroy of stack organization/trials/test" in m["message"]
               for m in seen.logs if m["severity"] == "WARNING"), seen.logs
    again = pulumi_run("up", config, **engine)
    assert again.returncode == 1 and only_the_stack(again) and again.ops == [], again.errors
    assert f"another operation holds trial {T}'s lease (/trials/{T}/operations/" in again.errors
    assert "): destroy of stack organization/trials/test" in again.errors
    print(f"\nup beside the running destroy: refused, {len(again.ops)} steps")
    pause.touch()
    d = destroy.wait()
    assert d.failed is None, d.failed
    assert len(tagged(aws, T)) == 0 and f"{T}-deadline" in deleted(d)
    # and an `up` after it starts the trial anew, under its own lease
    after = pulumi_run("up", config, **engine)
    assert after.returncode == 0, after.errors
    assert len(tagged(aws, T)) == 4


def test_two_stacks_on_one_trial_exclude_each_other_before_either_has_a_host(aws, trial, tmp_path):
    """Two backends (a colleague's laptop, a copied stack) share no lock; the lease is the trial's."""
    T, _, rules = trial
    config = stack_of(live(trial=T))
    mine, theirs = DiyBackend(tmp_path / "mine"), DiyBackend(tmp_path / "theirs")
    pause = tmp_path / "vpc-create"  # the first `up` held before any host of it exists: no look-up can see it
    up = pulumi_start("up", config, answers=rules, calls=CALLS, provider="moto", backend=mine,
                      faults=[{"name": f"{T}-vpc", "type": "aws:ec2/vpc:Vpc", "op": "create", "pause": str(pause)}])
    wait_for(Path(f"{pause}.reached"), up)
    assert tagged(aws, T) == {}
    other = pulumi_run("up", config, stack="colleague", answers=rules, calls=CALLS, provider="moto", backend=theirs)
    assert other.returncode == 1 and other.ops == [], other.errors
    assert "up of stack organization/trials/test" in other.errors
    assert tagged(aws, T) == {}
    pause.touch()
    assert up.wait().returncode == 0
    assert len(tagged(aws, T)) == 4


# --- the lease itself, in-process against moto's SSM -------------------------------------------------------

@pytest.fixture
def ssm(aws):
    return aws.client("ssm")


def test_the_lease_is_taken_refused_released_and_a_dead_holder_passed_over(ssm, monkeypatch):
    T = f"lease-{uuid.uuid4().hex[:6]}"
    a, note = take(lambda: ssm, T, "org/trials/a", "up")
    assert note is None and a.n == 1
    with pytest.raises(LeaseHeld, match=rf"another operation holds trial {T}'s lease \(/trials/{T}/operations/0000000001\): up of stack org/trials/a .*\(pid "):
        take(lambda: ssm, T, "org/trials/b", "destroy")
    assert "up of stack org/trials/a" in current(ssm, T)
    a.release()
    assert current(ssm, T) is None
    b, note = take(lambda: ssm, T, "org/trials/b", "destroy")
    assert note is None and b.n == 2
    # b's holder dies (no release, no beat): within the TTL it still excludes; past it, the next one passes it over
    with pytest.raises(LeaseHeld):
        take(lambda: ssm, T, "org/trials/a", "up")
    monkeypatch.setattr(lease_mod, "TTL_S", 1)
    time.sleep(2.5)  # the service's clock (its Date header) counts whole seconds
    c, note = take(lambda: ssm, T, "org/trials/a", "up")
    assert c.n == 3 and "ended without releasing its lease (destroy of stack org/trials/b" in note
    names = [p["Name"] for p in ssm.get_parameters_by_path(Path=f"/trials/{T}/operations")["Parameters"]]
    assert sorted(n.rsplit("/", 1)[1] for n in names) == ["0000000002", "0000000003"]  # slot 1 dropped
    # b was only slow: at its next beat it finds slot 3 and knows it lost; every delete it has not made is refused
    b.beat()
    assert b.lost and "was taken by up of stack org/trials/a" in b.lost
    check = DeleteCheck(T, False, lambda: None, dry_run=False, lease=b)
    with pytest.raises(LeaseHeld, match=r"refusing to delete .*-deadline \(x\): this operation's lease .* was taken by"):
        check.hook(SimpleNamespace(type="aws:scheduler/schedule:Schedule", id="x", name=f"{T}-deadline", old_outputs={}))
    b.release()  # a lost lease is never written again: slot 3 stays c's
    assert "up of stack org/trials/a" in current(ssm, T)
    c.release()


def test_the_lease_beats_while_its_operation_runs(ssm):
    T = f"lease-{uuid.uuid4().hex[:6]}"
    a, _ = take(lambda: ssm, T, "org/trials/a", "up")
    first = ssm.get_parameter(Name=a.name)["Parameter"]["Version"]
    a.start(every_s=0.2)
    time.sleep(1.0)
    assert ssm.get_parameter(Name=a.name)["Parameter"]["Version"] >= first + 2
    a.release()
    version = ssm.get_parameter(Name=a.name)["Parameter"]
    assert json.loads(version["Value"])["released"]
    time.sleep(0.5)  # released: no beat rewrites it
    assert ssm.get_parameter(Name=a.name)["Parameter"]["Version"] == version["Version"]


def test_two_operations_racing_for_one_slot_one_wins(ssm):
    """Both read the same last slot; the other's create lands between this one's read and its create."""
    T = f"lease-{uuid.uuid4().hex[:6]}"

    class Racing:
        def __init__(self, real):
            self.real, self.exceptions, self.raced = real, real.exceptions, False

        def get_parameters_by_path(self, **kw):
            return self.real.get_parameters_by_path(**kw)

        def put_parameter(self, **kw):
            if not kw.get("Overwrite") and not self.raced:
                self.raced = True
                take(lambda: self.real, T, "org/trials/other", "destroy")
            return self.real.put_parameter(**kw)

        def delete_parameter(self, **kw):
            return self.real.delete_parameter(**kw)

    with pytest.raises(LeaseHeld, match="destroy of stack org/trials/other"):
        take(lambda: Racing(ssm), T, "org/trials/a", "up")


def test_a_lease_that_cannot_be_read_refuses(monkeypatch):
    import boto3

    from orchestrate.launch.command import free_port

    dead = boto3.client("ssm", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{free_port()}",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=__import__("botocore.config").config.Config(retries={"max_attempts": 1},
                                                                           connect_timeout=1))
    with pytest.raises(LeaseHeld, match=r"cannot be taken \(EndpointConnectionError.*ssm:GetParametersByPath"):
        take(lambda: dead, "lease-x", "org/trials/a", "up")


def test_a_holder_that_failed_on_this_machine_is_passed_over_at_once_and_a_silent_one_stops_deleting(ssm):
    """The engine ends a failed deployment's program without letting it return (its lease unreleased); a holder
    that cannot renew its lease must stop acting before others may pass it over."""
    import subprocess
    import sys

    T = f"lease-{uuid.uuid4().hex[:6]}"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, _ = take(lambda: ssm, T, "org/trials/a", "destroy")
    dead.holder["pid"] = gone.pid  # as the killed program wrote it
    dead._write()
    b, note = take(lambda: ssm, T, "org/trials/a", "destroy")
    assert b.n == 2 and "its process is gone from this machine" in note and "ended without releasing" in note
    # b's writes stop going through (the service unreachable): past TTL - 2 beats it is lost, and its deletes stop
    assert b.lost is None

    class Unreachable:
        exceptions = ssm.exceptions

        def __getattr__(self, name):
            def call(**kw):
                raise ConnectionError("the service cannot be reached")
            return call

    b.ssm = Unreachable()
    b.written -= lease_mod.TTL_S - 2 * lease_mod.BEAT_S + 1
    assert b.check() and "has not renewed its lease" in b.lost
    check = DeleteCheck(T, False, lambda: None, dry_run=False, lease=b)
    with pytest.raises(LeaseHeld, match="has not renewed its lease"):
        check.hook(SimpleNamespace(type="aws:ec2/instance:Instance", id="i-1", name=f"{T}-rank-0", old_outputs={}))
    with pytest.raises(LeaseHeld, match="refusing to create .*has not renewed its lease"):
        check.create_hook(SimpleNamespace(type="aws:ec2/instance:Instance", id="", name=f"{T}-rank-0"))
    b.ssm = ssm  # the service back before anyone passed b over: its next renewal makes the lease b's again
    assert b.check() is None
    b.release()


def test_a_create_retried_after_its_answer_was_lost_keeps_the_slot(ssm):
    """botocore retries a PutParameter whose answer was lost; the retry meets the slot the first one made."""
    T = f"lease-{uuid.uuid4().hex[:6]}"

    class LostAnswer:
        def __init__(self, real):
            self.real, self.exceptions = real, real.exceptions

        def get_parameters_by_path(self, **kw):
            return self.real.get_parameters_by_path(**kw)

        def put_parameter(self, **kw):
            self.real.put_parameter(**kw)
            if not kw.get("Overwrite"):
                return self.real.put_parameter(**kw)  # the retry: ParameterAlreadyExists
            return None

        def delete_parameter(self, **kw):
            return self.real.delete_parameter(**kw)

    a, note = take(lambda: LostAnswer(ssm), T, "org/trials/a", "up")
    assert a.n == 1 and note is None
    assert "up of stack org/trials/a" in current(ssm, T)


def test_an_up_that_lost_its_lease_creates_no_more_hosts(aws, trial, tmp_path):
    """An `up` held (a laptop asleep) past the TTL while another operation took the trial's lease over: when it
    goes on, its next host's create is refused before EC2 is asked (the host's before-create hook)."""
    T, _, rules = trial
    config = stack_of(live(trial=T))
    backend = DiyBackend(tmp_path / "backend")
    pause = tmp_path / "rank-3-create"
    up = pulumi_start("up", config, answers=rules, calls=CALLS, provider="moto", backend=backend,
                      faults=[{"name": f"{T}-rank-3", "type": HOST, "op": "create", "pause": str(pause)}])
    wait_for(Path(f"{pause}.reached"), up)
    settled(backend, 3)
    ssm = aws.client("ssm")
    (mine,) = ssm.get_parameters_by_path(Path=f"/trials/{T}/operations")["Parameters"]
    n = int(mine["Name"].rsplit("/", 1)[1])
    ssm.put_parameter(Name=f"/trials/{T}/operations/{n + 1:010d}", Type="String", Overwrite=False, Value=json.dumps(
        {"stack": "organization/trials/test", "operation": "destroy", "user": "someone", "host": "elsewhere",
         "pid": 1, "started": "2026-12-07T00:00:00+00:00"}))  # as an operation that passed the silent one over
    time.sleep(1.2)  # the held `up` wrote its lease over a second ago (its renewals then skip no check)
    pause.touch()
    d = up.wait()
    assert d.failed and f"refusing to create {T}-rank-3: this operation's lease on trial {T} was taken by destroy" \
        in d.failed, d.failed
    assert sorted(tagged(aws, T).values()) == ["0", "1", "2"]  # rank 3 never reached EC2

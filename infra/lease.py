"""One operation at a time on a trial: a lease the program takes in the account for the whole of an `up` or a
destroy, so a destroy is refused while an `up` runs, and the reverse, even where the backend's own lock is gone.

Why the program needs its own lease. A self-managed backend's lock is one file per operation, and `pulumi cancel`
deletes every one of them (pulumi/pulumi `pkg/backend/diy/backend.go` `CancelCurrentUpdate`) while the operation
it meant to stop runs on: the next `up` or destroy then finds no lock (`diy/lock.go` `checkForLock`). On Pulumi
Cloud, `cancel` ends the update in the service; the running CLI learns of it only when its lease renewal is
refused (`httpstate/token_source.go`), and steps already applying finish in the cloud. And two backends (a stack
copied, a colleague's laptop) holding one trial name share no lock at all.

Why SSM Parameter Store. The lease must exist before the first `up` has created anything (the evidence bucket is
made by that `up`), in every account and region, and at no cost. A standard parameter is free, and PutParameter
without Overwrite is a create-if-absent: it raises ParameterAlreadyExists. That is the one atomic step a lease
needs. Parameter Store has no compare-and-swap, so only its holder ever rewrites a lease. Each operation creates
the next slot of a sequence, `/trials/<trial>/operations/<n>`. When two operations race for slot n+1, exactly
one creates it; the other reads it and refuses. The holder alone rewrites its slot: a beat every BEAT_S seconds,
and `released` when it ends. A slot whose holder stopped beating for TTL_S (kill -9, a lost machine) is stale.
The next operation takes the slot after it and says whose the stale one was. The lease is keyed by the trial,
not the stack, so two stacks holding one trial name exclude each other too (infra/existing.py refuses their
hosts once they exist).

How long a lease lasts. The program's process lives as long as the deployment. The engine answers the SDK's
`SignalAndWaitForShutdown` only once every step has run, deletes and their hooks included
(`pkg/resource/deploy/source_eval.go`). So a lease taken when the program starts covers the whole `up` or
destroy, all but the engine's last checkpoint write, and is released when the process exits. A failed deployment
is the exception: the engine never answers that call when a step failed (`deployment_executor.go` `Execute`), and
ends the program's process when it closes the language host, so nothing of the program runs after that. Its slot
stays unreleased. The next operation on the same machine sees that the holder's process is gone and passes the
slot over at once (`gone_here`); from another machine, it waits TTL_S. A preview takes no lease: it changes
nothing, and `pulumi up` runs one just before its update.

A holder stops acting once it sees a slot later than its own, or once none of its renewals has gone through for
TTL_S - 2 * BEAT_S (counted on a clock that includes a machine's sleep). Its hooks renew first, then refuse: every
delete it has not made and every host it has not created (infra/teardown.py `DeleteCheck`).

What the stack's identity needs (`statement`, docs/aws.md): ssm:GetParametersByPath, ssm:PutParameter and
ssm:DeleteParameter on `parameter/trials/<trial>/operations` (GetParametersByPath is authorized against the path
it is asked for, not the parameters it returns) and on its children. Where those calls
fail, the operation is refused: a lease that cannot be read has excluded nothing.
"""

from __future__ import annotations

import atexit
import getpass
import datetime as dt
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable

from evidence.errors import UserError

def clock() -> float:
    """Seconds on a clock that counts a machine's sleep (Linux's CLOCK_BOOTTIME; else the monotonic clock): a
    laptop that slept through the TTL must find its lease's writes that old."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


TTL_S = 90
"""A slot not rewritten for this long has no live holder: its holder beats every BEAT_S."""
BEAT_S = 15


class LeaseHeld(UserError, ValueError):
    """Another operation holds the trial's lease (or it cannot be read): nothing was registered."""


def path_of(trial: str) -> str:
    """The trial's slots are this path's children; GetParametersByPath is authorized against the path itself."""
    return f"/trials/{trial}/operations"


def statement(trial: str = "*") -> dict[str, Any]:
    """What the stack's identity must be allowed for the lease (docs/aws.md prints it; tests grant exactly this)."""
    return {"Sid": "TrialOperationLease", "Effect": "Allow",
            "Action": ["ssm:GetParametersByPath", "ssm:PutParameter", "ssm:DeleteParameter"],
            "Resource": [f"arn:aws:ssm:*:*:parameter{path_of(trial)}", f"arn:aws:ssm:*:*:parameter{path_of(trial)}/*"]}


@dataclass
class Slot:
    """One operation's slot: `n` in the sequence, what its holder wrote, when the service last saw it written."""
    n: int
    name: str
    holder: dict[str, Any]
    modified: dt.datetime

    def stale(self, now: dt.datetime) -> bool:
        return (now - self.modified).total_seconds() > TTL_S

    def live(self, now: dt.datetime) -> bool:
        return not self.holder.get("released") and not self.stale(now)

    def describe(self, now: dt.datetime) -> str:
        h = self.holder
        ago = int((now - self.modified).total_seconds())
        return (f"{h.get('operation', '?')} of stack {h.get('stack', '?')} by {h.get('user', '?')}@{h.get('host', '?')} "
                f"(pid {h.get('pid', '?')}), started {h.get('started', '?')}, last heard {ago} s ago")


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def read_slots(ssm: Any, trial: str) -> tuple[list[Slot], dt.datetime]:
    """The trial's slots in order, and the service's clock (the response's Date): every age is measured on the
    one clock the slots' times come from, so a skewed local clock neither revives nor kills a lease."""
    slots: list[Slot] = []
    now: dt.datetime | None = None
    kw: dict[str, Any] = {"Path": path_of(trial), "Recursive": False}
    while True:
        page = ssm.get_parameters_by_path(**kw)
        date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if date and now is None:
            now = _utc(parsedate_to_datetime(date))
        for p in page.get("Parameters", []):
            tail = p["Name"].rsplit("/", 1)[-1]
            if not tail.isdigit():
                continue
            try:
                holder = json.loads(p["Value"])
            except ValueError:
                holder = {"unreadable": p["Value"][:80]}
            slots.append(Slot(int(tail), p["Name"], holder, _utc(p["LastModifiedDate"])))
        if not page.get("NextToken"):
            break
        kw["NextToken"] = page["NextToken"]
    return sorted(slots, key=lambda s: s.n), now or dt.datetime.now(dt.timezone.utc)


class Lease:
    """A held slot: `beat()` rewrites it, `release()` marks it released, `lost` says why it is no longer ours."""

    def __init__(self, ssm: Any, trial: str, slot: int, holder: dict[str, Any]) -> None:
        self.ssm, self.trial, self.n, self.holder = ssm, trial, slot, holder
        self.name = f"{path_of(trial)}/{slot:010d}"
        self.taken_over: str | None = None  # a later slot seen at a beat
        self.written = clock()  # when the last write that succeeded was sent
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> str | None:
        """Why this operation may no longer act as the lease's holder: a later slot was seen, or no write has
        gone through for long enough that another operation may already have passed this one over (a beat
        that cannot reach the service is no beat: others see the slot age all the same)."""
        if self.taken_over:
            return self.taken_over
        silent = clock() - self.written
        if not self._stop.is_set() and silent > TTL_S - 2 * BEAT_S:
            return (f"this operation has not renewed its lease on trial {self.trial} for {silent:.0f} s; after "
                    f"{TTL_S} s another operation may take it")
        return None

    def _write(self, **extra: Any) -> None:
        sent = clock()
        self.ssm.put_parameter(Name=self.name, Value=json.dumps({**self.holder, **extra}), Type="String",
                               Overwrite=True)
        self.written = sent

    def beat(self) -> None:
        """Rewrites the slot, unless a later slot exists: then the lease is lost and never written again."""
        with self._lock:
            if self.taken_over or self._stop.is_set():
                return
            slots, now = read_slots(self.ssm, self.trial)
            later = [s for s in slots if s.n > self.n]
            if later:
                self.taken_over = (f"this operation's lease on trial {self.trial} was taken by {later[-1].describe(now)} "
                             f"(this one was not heard for over {TTL_S} s)")
                return
            self._write()

    def check(self) -> str | None:
        """Renews now (unless a write went through in the last second: no one can have passed over a slot written
        since) and says whether the lease is lost: what a hook asks before the step it guards, so that no step waits
        for the next beat to learn of a takeover."""
        if clock() - self.written > 1.0:
            try:
                self.beat()
            except Exception:  # noqa: BLE001 — a renewal that fails counts toward `lost` by its silence
                pass
        return self.lost

    def start(self, every_s: float = BEAT_S) -> "Lease":
        def run() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.beat()
                except Exception:  # noqa: BLE001 — a missed beat is retried; TTL_S allows several
                    pass

        atexit.register(self.release)
        self._thread = threading.Thread(target=run, name=f"lease-{self.trial}", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Marks the slot released (the next operation takes the slot after it). Once; a lost lease is left alone."""
        with self._lock:
            if self._stop.is_set():
                return
            lost = self.lost
            self._stop.set()
            if lost is None:
                try:
                    self._write(released=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
                except Exception:  # noqa: BLE001 — unreleased, the slot goes stale after TTL_S
                    pass


def holder_of(stack: str, operation: str) -> dict[str, Any]:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 — no name for this uid: the pid and host still say who
        user = "?"
    return {"stack": stack, "operation": operation, "user": user, "host": socket.gethostname(), "pid": os.getpid(),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


CLIENT_CONFIG = {"connect_timeout": 3, "read_timeout": 5, "retries": {"max_attempts": 2}}
"""The SSM client's settings: a beat must fail fast rather than hang past the TTL in botocore's retries."""


def take(ssm_for: Callable[[], Any], trial: str, stack: str, operation: str) -> tuple[Lease, str | None]:
    """Takes the trial's lease for `operation` ("up" or "destroy") with the SSM client `ssm_for()` opens (the
    stack's identity), or raises LeaseHeld naming the holder, or why the lease cannot be read. Returns the lease
    (not yet beating: `start()` it) and a note when a stale slot was passed over."""
    try:
        ssm = ssm_for()
        slots, now = read_slots(ssm, trial)
        top = slots[-1] if slots else None
        if top is not None and top.live(now) and not gone_here(top):
            raise LeaseHeld(held_message(trial, top, now))
        lease = Lease(ssm, trial, (top.n + 1) if top else 1, holder_of(stack, operation))
        try:
            ssm.put_parameter(Name=lease.name, Value=json.dumps(lease.holder), Type="String", Overwrite=False,
                              Description=f"the operation lease of trial {trial} (infra/lease.py)")
        except ssm.exceptions.ParameterAlreadyExists:
            slots, now = read_slots(ssm, trial)
            (raced,) = [s for s in slots if s.n == lease.n] or [None]
            # a create that went through but whose answer was lost, retried by botocore: the slot is this one's
            if raced is None or raced.holder != lease.holder:
                raise LeaseHeld(held_message(trial, raced, now)) from None
        for old in slots:  # the record of earlier operations: only the last one is ever read
            if old.n < lease.n - 1:
                try:
                    ssm.delete_parameter(Name=old.name)
                except Exception:  # noqa: BLE001 — an old slot left is harmless
                    pass
    except (LeaseHeld, UserError):  # a refusal, or the stack's aws: config naming its own problem
        raise
    except Exception as e:  # noqa: BLE001 — a lease that cannot be read excludes nothing
        raise LeaseHeld(f"refusing to start: the operation lease of trial {trial} cannot be taken "
                        f"({type(e).__name__}: {e}). The stack's identity needs ssm:GetParametersByPath, "
                        f"ssm:PutParameter and ssm:DeleteParameter on parameter{path_of(trial)} and its children (docs/aws.md).") from None
    note = None
    if top is not None and not top.holder.get("released"):
        how = (f"its process is gone from this machine" if gone_here(top) and top.live(now)
               else f"not heard for over {TTL_S} s")
        note = (f"the previous operation on trial {trial} ended without releasing its lease ({top.describe(now)}; "
                f"{how}). A failed deployment ends so (the engine then stops the program instead of letting it "
                "finish), and so does one killed. If it was not a failure you saw, check that it is not still "
                "running before trusting the state (`pulumi refresh`).")
    return lease, note


def gone_here(slot: Slot) -> bool:
    """The slot's holder ran on this machine and its process is gone. The engine ends a failed deployment by
    stopping the program's process rather than letting it return (pulumi/pulumi `deployment_executor.go`: the source
    is closed, which answers `SignalAndWaitForShutdown`, only when no step failed), so a refused `up` or destroy
    leaves its slot unreleased; rerun on the same machine, it is passed over at once instead of after TTL_S."""
    h = slot.holder
    if h.get("host") != socket.gethostname() or not isinstance(h.get("pid"), int):
        return False
    try:
        os.kill(h["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def held_message(trial: str, slot: Slot | None, now: dt.datetime) -> str:
    who = slot.describe(now) if slot is not None else "another operation"
    where = f" ({slot.name})" if slot is not None else ""
    return (f"refusing to start: another operation holds trial {trial}'s lease{where}: {who}. Nothing was changed. "
            f"Wait for it to end: it releases the lease as it ends; one that failed or was killed on another machine "
            f"stops renewing it and is passed over {TTL_S} s after it was last heard (on this machine, at once). "
            "`pulumi cancel` does not stop it.")


def current(ssm: Any, trial: str) -> str | None:
    """Who holds the trial's lease now, or None (for a preview's warning)."""
    slots, now = read_slots(ssm, trial)
    if slots and slots[-1].live(now):
        return slots[-1].describe(now)
    return None

"""Nothing of a trial's stack is deleted while a host of it holds unpreserved evidence.

Each host's root volume is deleted with the instance and holds whatever the controller has not
preserved yet, and the guards, roles, network rules and bucket settings are what stop the hosts and let
them reach the store at all, so "delete after preservation" is made a rule rather than a habit. The check
(`verify_preserved`) reads the trial's evidence store, requires at least one preservation index there,
re-reads each home's newest index and every object it names (`evidence.stores.verify_index`), and
raises naming what is missing.

Where it runs decides what a refusal saves. A `before_delete` hook runs inside its own resource's delete
step, before the provider's Delete, and a failed step cancels the deployment: no later wave starts and the
steps of its own wave that were dispatched with it each run their own hook first (pulumi/pulumi
`pkg/resource/deploy/step.go` `DeleteStep.Apply`, `step_executor.go` `cancelDueToError`,
`step_generator.go` `ScheduleDeletes`). So every resource whose delete could cost something carries the
same hook (infra/concern.py): whatever a `pulumi destroy` would delete first — from a complete stack, one
whose first `up` failed anywhere, or one whose destroy gate never reached the state — refuses, and nothing
is deleted. (The destroy gate, infra/gate.py, still goes first and alone where the state is complete, so a
refusal is then one message.) Retained resources (the evidence bucket and what keeps it safe) delete
nothing and carry no hook.

What it asks, once per program run (`DeleteCheck`, its answer shared by every hook of that run):
  1. Which hosts of the trial exist in the account (EC2, any state but terminated)? Found by their `trial`
     tag and by the ids the stack's state holds (a host whose tag was removed is still found). Any of them the
     stack does not hold — neither registered by this run nor in the stack's own record of what it held
     (infra/held.py): an interrupted `up`'s create, one started by hand, another stack's — refuses every
     delete, preserved or abandoned: deleting the deadline stop would leave it unguarded, tracked by no stack
     (an `up` whose own refusal check allowed host changes settles the run's answer first and is not asked
     again: its deletes never include the deadline stop). Before that,
     the identity the check speaks as must be in the account and region of those hosts (their ARNs): a
     check pointed at another account or region would find no host and could not be trusted to say so.
     No live host: nothing unpreserved can sit on a disk, and the delete goes on (a stack whose first `up`
     failed before any host, or whose hosts are gone, can always be destroyed).
  2. Their evidence buckets (each host's `evidence-bucket` tag): is the trial preserved in each? Yes: go on.
  3. No: refuse, naming what is missing — unless the stack sets `abandon_unpreserved: true`, the
     operator's choice to give the trial up, which is then written to the bucket (not in a preview).
It speaks to AWS as the stack does (infra/credentials.py), and runs in previews too (`on_dry_run`), so a
`pulumi destroy` says "refusing" before it asks "yes?".

The same rule holds for a `pulumi up`'s deletes (what it replaces or no longer registers), and for a
`pulumi destroy --run-program` run without `TRIALS_TEARDOWN=1`: the program cannot tell which operation runs
it, so no delete is let through on the strength of a guess. An `up` that would remove, replace or restart a
host is refused earlier, by the program, before it registers anything (infra/existing.py); where it allowed
one (a preserved or abandoned trial) its answer is this run's answer (`settle`), so the hooks cannot
decide otherwise halfway through. Any other delete of an `up` is checked the same way (removing the alert
e-mail, or the transfer alarms of a host no longer isolated, waits for the preservation); the subnet of a
zone no host uses any more is not deleted at all: it stays registered while the account holds it
(infra/network.py), so moving a host to another zone after a capacity refusal deletes nothing.

The hosts' checkpoint payloads are in those indexes (each host preserves its own), so they are
covered as well: present at their recorded size.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from typing import Any, Callable

from evidence.anchors import AnchorError, released_prefixes
from evidence.canonical import bytes_sha256
from evidence.errors import UserError
from evidence.stores import PreservationError, S3Store, open_store, parse_index, verify_index
from infra.lease import LeaseHeld

BUCKET_TAG = "evidence-bucket"
STACK_TAG = "pulumi-stack"  # on every host: the stack (organization/project/stack) that made it (infra/held.py)


def tag_value(tags: list[dict[str, str]] | None, key: str) -> str | None:
    """One tag's value in EC2's list of {Key, Value}."""
    return next((t["Value"] for t in tags or [] if t["Key"] == key), None)


class NotPreserved(UserError, RuntimeError):
    """The trial's evidence is not preserved in its store; the message names what is missing."""


def trial_prefix(trial: str) -> str:
    return f"trials/{trial}/"


def verify_preserved(bucket: str, trial: str, *, session: Any = None,
                     say: Callable[[str], None] = lambda m: None) -> dict[str, str]:
    """Each preserved home of the trial → its newest index key, every one re-read and verified.
    Raises NotPreserved when the store holds no index; when a home anchored commitments (every home
    `orchestrate run` prepares does) but has no index, or made commitments after its newest one (anchors
    released when a home was discarded unpreserved, `evidence.anchors.release`, are no one's); when
    an index lists nothing; or when one does not verify. Indexes and anchors are written by the
    operator alone (the hosts' role may write only content-addressed objects)."""
    url = S3Store.url_for(bucket, trial_prefix(trial))
    store = open_store(url, session)
    try:
        keys = sorted(k for k in store.list("indexes/") if k.endswith(".json"))
    except Exception as e:  # noqa: BLE001 — a store that cannot be listed has verified nothing
        raise NotPreserved(f"{url}: the preservation indexes cannot be listed: {e}") from None
    newest: dict[str, str] = {}
    for k in keys:  # indexes/<home>/<UTC time>.json: the names sort by time
        parts = k.split("/")
        if len(parts) == 3:
            newest[parts[1]] = k
    if not newest:
        raise NotPreserved(f"{url} holds no preservation index: nothing of trial {trial} is preserved "
                           "(`orchestrate preserve --home H` for each trial home, or `orchestrate run` to its end)")
    try:
        anchored: dict[str, set[str]] = {}  # home → every anchor key its logs left in the store
        for k in store.list("anchors/"):
            parts = k.split("/")
            if len(parts) == 4:
                anchored.setdefault(parts[1], set()).add(k)
    except Exception as e:  # noqa: BLE001 — unlisted anchors could hide an unpreserved home
        raise NotPreserved(f"{url}: the commitments' anchors cannot be listed: {e}") from None
    try:
        for home in sorted(anchored):  # a home discarded unpreserved released its anchors: no longer its own
            gone = released_prefixes(store, home)
            anchored[home] = {k for k in anchored[home] if not any(k.startswith(p) for p in gone)}
            if not anchored[home]:
                del anchored[home]
    except AnchorError as e:
        raise NotPreserved(f"{url}: {e}") from None
    except Exception as e:  # noqa: BLE001 — unread releases could hide an unpreserved home
        raise NotPreserved(f"{url}: the commitments' anchor releases cannot be read: {e}") from None
    never = sorted(set(anchored) - set(newest))
    if never:
        raise NotPreserved(f"home(s) {', '.join(never)} made commitments but were never preserved "
                           "(`orchestrate preserve --home H`)")
    for home, key in sorted(newest.items()):
        body = b"".join(store.read_chunks(key))
        try:
            index = parse_index(body, f"{url}{key}")
            if not index["files"]:
                raise PreservationError(f"{url}{key} lists no files")
            covered = {f"{index.get('anchors', {}).get('prefix', '')}{seq:08d}.json"
                       for seq in range(int((index.get("anchors") or {}).get("count", 0)))}
            later = sorted(anchored.get(home, set()) - covered)
            if later:
                raise PreservationError(f"{len(later)} commitment(s) were anchored after its newest preservation "
                                        f"(e.g. {later[0]}): preserve it again")
            verify_index(url, key, bytes_sha256(body), session=session, say=say)
        except PreservationError as e:
            raise NotPreserved(f"{home}: its preservation does not verify: {e}") from None
    return newest


def abandon(bucket: str, trial: str, instance: str, found: str, *, session: Any = None) -> str:
    """Write the operator's choice to give the trial up, beside its evidence; returns the key."""
    at = dt.datetime.now(dt.timezone.utc)
    key = f"abandoned/{at.strftime('%Y%m%dT%H%M%S%fZ')}-{instance}.json"
    body = json.dumps({"format": "trial-abandoned-v1", "trial": trial, "instance": instance, "at": at.isoformat(),
                       "setting": "abandon_unpreserved: true", "found": found}, sort_keys=True).encode()
    open_store(S3Store.url_for(bucket, trial_prefix(trial)), session).put_bytes(key, body)
    return key


INSTANCE = "aws:ec2/instance:Instance"
NOT_TERMINATED = ["pending", "running", "shutting-down", "stopping", "stopped"]


def trial_instances(session: Any, trial: str, ids: set[str] = frozenset()) -> list[dict[str, Any]]:
    """EC2's record of every instance that is not terminated and is tagged with the trial or is one of `ids`,
    each once. (orchestrate/cloud.py reads the trial's hosts through this too.)"""
    ec2 = session.client("ec2")
    found: dict[str, dict[str, Any]] = {}
    queries = [[{"Name": "tag:trial", "Values": [trial]}]]
    if ids:
        queries.append([{"Name": "instance-id", "Values": sorted(ids)}])
    for filters in queries:
        for page in ec2.get_paginator("describe_instances").paginate(
                Filters=filters + [{"Name": "instance-state-name", "Values": NOT_TERMINATED}]):
            for r in page["Reservations"]:
                for i in r["Instances"]:
                    found[i["InstanceId"]] = i
    return list(found.values())


def arn_place(arn: str) -> tuple[str, str] | None:
    """(region, account) of an EC2 instance's ARN; None for anything else."""
    parts = arn.split(":")
    if len(parts) >= 6 and parts[2] == "ec2" and parts[5].startswith("instance/"):
        return parts[3], parts[4]
    return None


def same_place(session: Any, arns: dict[str, str]) -> None:
    """Raises NotPreserved unless `session` speaks in the account and region of every host `arns` names."""
    places = {i: p for i, a in arns.items() if (p := arn_place(a))}
    if not places:
        return
    account = session.client("sts").get_caller_identity()["Account"]
    region = session.region_name
    wrong = sorted(f"{i} (account {a}, {r})" for i, (r, a) in places.items() if (r, a) != (region, account))
    if wrong:
        raise NotPreserved(f"the check speaks as account {account} in {region}, but the stack's host(s) "
                           f"{', '.join(wrong)} are elsewhere: it could not see them (the stack's aws: config and "
                           "the environment name different identities?)")


def judge(trial: str, hosts: dict[str, str | None], *, abandon_unpreserved: bool, session: Any, dry_run: bool,
          who: str) -> str:
    """"preserved", "abandoned" or "no hosts" for the trial whose live hosts (id -> bucket) are `hosts`;
    raises NotPreserved otherwise. `who` is what asks (written with an abandonment)."""
    if not hosts:
        return "no hosts"
    untagged = sorted(i for i, b in hosts.items() if not b)
    if untagged and not abandon_unpreserved:
        raise NotPreserved(f"host(s) {', '.join(untagged)} carry no {BUCKET_TAG} tag, so their trial's evidence "
                           "cannot be checked")
    reasons = [(None, f"host(s) {', '.join(untagged)} carry no {BUCKET_TAG} tag")] if untagged else []
    for bucket in sorted({b for b in hosts.values() if b}):
        try:
            verify_preserved(bucket, trial, session=session)
        except NotPreserved as e:
            reasons.append((bucket, str(e)))
    if not reasons:
        return "preserved"
    if not abandon_unpreserved:
        raise NotPreserved("; ".join(r for _, r in reasons) + f" (live hosts: {', '.join(sorted(hosts))})")
    if not dry_run:  # the choice is written to every bucket the live hosts name
        found = "; ".join(r for _, r in reasons)
        for bucket in sorted({b for b in hosts.values() if b}):
            abandon(bucket, trial, who, found, session=session)
    return "abandoned"


def end_advice(trial: str, region: str | None, ids: list[str]) -> str:
    """What to do about instances of the trial the stack does not hold (#65)."""
    return (f"Such a host never received work (`cluster.json` comes from the stack's outputs, which never listed it): "
            f"end it — `aws ec2 terminate-instances --region {region or '<region>'} --instance-ids <id>` — once you "
            f"have checked it is not another stack's (`orchestrate status` lists every instance of trial {trial}, "
            "held or not); an instance of another stack means this trial name is taken in the account: give the "
            "trial another name. If an interrupted `up` made it, `pulumi refresh --clear-pending-creates` then drops "
            "the pending create that `up` left in the state (the next `up` made that rank again, so it cannot be "
            f"imported under its name). (Live instances of {trial} now: {', '.join(ids) or 'none'}.)")


SCHEDULE = "aws:scheduler/schedule:Schedule"


def trial_stops(session: Any, trial: str) -> list[str]:
    """The names of every EventBridge schedule named as the trial's deadline stop is: `<trial>-deadline-` and the
    engine's seven hex characters (a schedule takes no tags; infra/guards.py leaves its name to the engine)."""
    sched = session.client("scheduler")
    names: list[str] = []
    kw: dict[str, Any] = {"NamePrefix": f"{trial}-deadline-"}
    while True:
        page = sched.list_schedules(**kw)
        names += [s["Name"] for s in page.get("Schedules", [])
                  if re.fullmatch(rf"{re.escape(trial)}-deadline-[0-9a-f]{{7}}", s["Name"])]
        if not page.get("NextToken"):
            return names
        kw["NextToken"] = page["NextToken"]


class OutsideTheStack(NotPreserved):
    """Instances of the trial exist that the stack does not hold: deleting anything now (its deadline stop first of
    all) would leave them unguarded, tracked by no stack."""


def outside_refusal(trial: str, region: str | None, outside: list[dict[str, Any]], stack: str | None,
                    live: list[str]) -> OutsideTheStack:
    def one(i: dict[str, Any]) -> str:
        owner = tag_value(i.get("Tags"), STACK_TAG)
        whose = f"; stack {owner}'s" if owner and stack and owner != stack else ""
        return (f"{i['InstanceId']} (rank {tag_value(i.get('Tags'), 'rank') or 'none'}, {i.get('State', {}).get('Name', '?')}, launched "
                f"{str(i.get('LaunchTime', '?'))[:19]}{whose})")

    return OutsideTheStack(f"instance(s) of trial {trial} that this stack does not hold exist: "
                           f"{', '.join(one(i) for i in outside)}. While one exists nothing of the stack is deleted — "
                           "its deadline stop is what stops them. " + end_advice(trial, region, live))


def stray_stop_refusal(trial: str, region: str | None, stray: list[str]) -> OutsideTheStack:
    where = f" --region {region}" if region else ""
    return OutsideTheStack(
        f"deadline stop(s) of trial {trial} that this stack does not hold exist: {', '.join(stray)} (the create of an "
        "interrupted `up`, which the next `up` made again). A destroy would leave them running, every minute, with "
        "no stack to end them, so nothing of the stack is deleted while one exists. Once `orchestrate status` shows "
        "no instance of the trial outside the stack, delete them: "
        + "; ".join(f"`aws scheduler delete-schedule --name {n}{where}`" for n in stray) + ".")


ADVICE = ("Preserve the trial first (`orchestrate preserve --home H` for each home, or `orchestrate down`); if "
          "no trial ran on these hosts, or to give its evidence up on purpose, set "
          "trials:cluster.abandon_unpreserved: true (the choice is written to the bucket)")


class DeleteCheck:
    """One program run's answer to "may this stack's resources be deleted?", asked by every delete hook of
    the run and computed once (the hooks of one wave run in parallel). The program tells it the stack's
    hosts as it registers them (`know`), and may settle the answer itself (`settle`)."""

    def __init__(self, trial: str, abandon_unpreserved: bool, session_for: Callable[[], Any], *,
                 dry_run: bool, lease: Any = None) -> None:
        self.trial, self.abandon_unpreserved, self.session_for = trial, abandon_unpreserved, session_for
        self.dry_run = dry_run
        self.lease = lease  # this run's operation lease (infra/lease.py): once lost, no delete goes on
        self.lock = threading.Lock()
        self.answer: str | None = None
        self.refusal: NotPreserved | None = None
        self.asked = 0
        self.known: dict[str, str] = {}  # the stack's instances: id -> ARN
        self.held: set[str] = set()  # instances the stack's own record says it held (infra/held.py)
        self.stack: str | None = None  # this stack (organization/project/stack), as instances' pulumi-stack tag has it
        self.stops: set[str] | None = None  # a destroy's: the deadline stops the stack holds (`watch_stops`)

    def know(self, instance_id: str | None, arn: str | None) -> None:
        """A host the stack holds (its id and ARN as the engine answered the program's registration)."""
        if instance_id:
            with self.lock:
                self.known[instance_id] = arn or ""

    def hold(self, ids: Any, stack: str | None = None) -> None:
        """Instances the stack's own record says it held (the previous runs' `instances_held`)."""
        with self.lock:
            self.held |= set(ids)
            self.stack = stack or self.stack

    def watch_stops(self) -> None:
        """A destroy: schedules named as the trial's deadline stop that the stack does not hold refuse it too."""
        with self.lock:
            self.stops = set() if self.stops is None else self.stops

    def know_stop(self, name: str | None) -> None:
        """A deadline stop the stack holds (its schedule's name as the engine answered the registration)."""
        if name:
            with self.lock:
                self.stops = (self.stops or set()) | {name}

    def settle(self, answer: str) -> None:
        """The program's own verdict for this run (an `up` it let change hosts): the hooks give the same."""
        with self.lock:
            self.answer = answer

    def verdict(self, who: str) -> str:
        """What the trial's hosts and store say, once; raises NotPreserved (the same reason to every asker)."""
        with self.lock:
            self.asked += 1
            if self.answer is None and self.refusal is None:
                try:
                    session = self.session_for()
                    same_place(session, self.known)
                    try:
                        found = trial_instances(session, self.trial, set(self.known))
                    except Exception as e:  # noqa: BLE001 — hosts that cannot be listed may hold evidence
                        raise NotPreserved(f"the hosts of trial {self.trial} cannot be listed: {e}") from None
                    outside = [i for i in found if i["InstanceId"] not in self.known and i["InstanceId"] not in self.held]
                    if outside:
                        raise outside_refusal(self.trial, getattr(session, "region_name", None), outside, self.stack,
                                              sorted(i["InstanceId"] for i in found))
                    if self.stops is not None:
                        try:
                            stray = [n for n in trial_stops(session, self.trial) if n not in self.stops]
                        except Exception as e:  # noqa: BLE001 — a stop that cannot be listed may be left running
                            raise NotPreserved(f"the deadline stops of trial {self.trial} cannot be listed: {e}") from None
                        if stray:
                            raise stray_stop_refusal(self.trial, getattr(session, "region_name", None), stray)
                    hosts = {i["InstanceId"]: tag_value(i.get("Tags"), BUCKET_TAG) for i in found}
                    self.answer = judge(self.trial, hosts, abandon_unpreserved=self.abandon_unpreserved,
                                        session=session, dry_run=self.dry_run, who=who)
                except NotPreserved as e:
                    self.refusal = e
                except Exception as e:  # noqa: BLE001 — a check that cannot run has verified nothing
                    self.refusal = NotPreserved(f"the check could not run: {type(e).__name__}: {e}")
            if self.refusal is not None:
                raise type(self.refusal)(str(self.refusal))
            assert self.answer is not None
            return self.answer

    def create_hook(self, args: Any) -> None:
        """A host's `before_create` hook: an operation that lost the trial's lease (infra/lease.py) creates none, since
        the operation that took the lease over may already have deleted the deadline stop."""
        lost = self.lease.check() if self.lease is not None else None
        if lost:
            raise LeaseHeld(f"refusing to create {args.name}: {lost}. No host is created by this operation.")

    def hook(self, args: Any) -> None:
        """A `before_delete` hook (every deleting resource's, and the destroy gate's): returns to let the delete
        go on, raises to refuse it."""
        if args.type == INSTANCE and args.id:
            self.know(args.id, (args.old_outputs or {}).get("arn"))
        lost = self.lease.check() if self.lease is not None else None
        if lost:
            raise LeaseHeld(f"refusing to delete {args.name}{f' ({args.id})' if args.id else ''}: {lost}. No "
                            "further delete of this operation goes on.")
        try:
            self.verdict(args.id or args.name)
        except OutsideTheStack as e:
            raise OutsideTheStack(f"refusing to delete {args.name}{f' ({args.id})' if args.id else ''}: {e} Nothing "
                                  "of the stack has been deleted by this check.") from None
        except NotPreserved as e:
            raise NotPreserved(f"refusing to delete {args.name}{f' ({args.id})' if args.id else ''}: trial "
                               f"{self.trial} is not preserved: {e}. Nothing of it has been deleted by this "
                               f"check. {ADVICE}") from None

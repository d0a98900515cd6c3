"""`pulumi destroy` deletes nothing before the trial is preserved.

Each host's root volume is deleted with the instance and holds whatever the controller has not
preserved yet, and the guards, roles, network rules and bucket settings are what let the hosts reach
the store at all, so "destroy after preservation" is made a rule rather than a habit. The check
(`verify_preserved`) reads the trial's evidence store, requires at least one preservation index there,
re-reads each home's newest index and every object it names (`evidence.stores.verify_index`), and
raises naming what is missing.

Where it runs decides what a refusal saves. A `before_delete` hook runs inside its own resource's
delete step, and the engine deletes dependents first, in waves (pulumi/pulumi
`pkg/resource/deploy/step_generator.go` `ScheduleDeletes`, `step.go` `DeleteStep.Apply`): a hook on the
instances alone would run only after the schedules, alarms, budget action, role policies, network rules
and bucket settings were deleted. So the check sits on the destroy gate (infra/gate.py), a resource that
depends on every other one of the stack: the engine deletes it first and alone, and a failed step
cancels every later wave (`deployment_executor.go` `performPostSteps`, `step_executor.go`
`cancelDueToError`), so a refusal deletes nothing. The instances keep a hook of their own for the
deletes that are not a whole destroy (a host dropped from the stack by `pulumi up`); within a destroy
whose gate has verified the trial in this same program run, they do not verify it again.

With `abandon_unpreserved: true` in the stack the operator gives the trial up on purpose: the check
then writes that choice, with what was found, to the bucket, and lets the delete go on.

The hosts' checkpoint payloads are in those indexes (each host preserves its own), so they are
covered as well: present at their recorded size.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

from evidence.canonical import bytes_sha256

BUCKET_TAG = "evidence-bucket"


class NotPreserved(RuntimeError):
    """The trial's evidence is not preserved in its store; the message names what is missing."""


def trial_prefix(trial: str) -> str:
    return f"trials/{trial}/"


def verify_preserved(bucket: str, trial: str, *, session: Any = None,
                     say: Callable[[str], None] = lambda m: None) -> dict[str, str]:
    """Each preserved home of the trial → its newest index key, every one re-read and verified.
    Raises NotPreserved when the store holds no index; when a home anchored commitments (every home
    `orchestrate run` prepares does) but has no index, or made commitments after its newest one; when
    an index lists nothing; or when one does not verify. Indexes and anchors are written by the
    operator alone (the hosts' role may write only content-addressed objects)."""
    from evidence.stores import PreservationError, S3Store, open_store, parse_index, verify_index

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
    from evidence.stores import S3Store, open_store

    at = dt.datetime.now(dt.timezone.utc)
    key = f"abandoned/{at.strftime('%Y%m%dT%H%M%S%fZ')}-{instance}.json"
    body = json.dumps({"format": "trial-abandoned-v1", "trial": trial, "instance": instance, "at": at.isoformat(),
                       "setting": "abandon_unpreserved: true", "found": found}, sort_keys=True).encode()
    open_store(S3Store.url_for(bucket, trial_prefix(trial)), session).put_bytes(key, body)
    return key


VERIFIED: dict[tuple[str, str], str] = {}
"""(bucket, trial) → what the destroy gate found in this program run ("preserved" or "abandoned"). The
program runs once per deployment and its hooks run in that same process (the SDK serves them while it
waits for the engine), so this lives exactly as long as one `pulumi destroy`."""


def refuse_unpreserved(what: str, bucket: str | None, trial: str, region: str, abandon_unpreserved: bool,
                       session: Any, resource: str | None = None) -> str:
    """Verify the trial's evidence in `bucket`, or record its abandonment (by `resource`, the id of what
    is being deleted); raises NotPreserved naming `what` otherwise. Returns what was found."""
    if not bucket:
        raise NotPreserved(f"{what}: no evidence bucket recorded for it, so its trial's evidence cannot be checked; "
                           "refusing to delete it (set abandon_unpreserved: true to give the trial up)")
    try:
        verify_preserved(bucket, trial, session=session)
        return "preserved"
    except NotPreserved as e:
        if not abandon_unpreserved:
            raise NotPreserved(f"refusing to delete {what}: {e}. Preserve the trial first, or set "
                               "trials:cluster.abandon_unpreserved: true to give it up on purpose (that choice is "
                               "written to the bucket)") from None
        abandon(bucket, trial, resource or what, str(e), session=session)
        return "abandoned"


def _session(region: str, session_for: Callable[[str], Any] | None) -> Any:
    session = session_for(region) if session_for else None
    if session is None:
        import boto3

        session = boto3.Session(region_name=region)
    return session


def before_gate_delete(trial: str, region: str, abandon_unpreserved: bool,
                       session_for: Callable[[str], Any] | None = None) -> Callable[[Any], None]:
    """The destroy gate's hook: the first step of a destroy, refusing it while the trial is unpreserved.
    The bucket is the gate's own recorded input (its state), so the hook needs nothing but the step."""

    def hook(args: Any) -> None:
        recorded = {**(args.old_outputs or {}), **(args.old_inputs or {})}
        bucket = recorded.get("bucket")
        what = f"the stack of trial {trial} ({args.name} goes first: nothing has been deleted)"
        found = refuse_unpreserved(what, bucket, trial, region, abandon_unpreserved, _session(region, session_for),
                                   args.name)
        VERIFIED[(bucket, trial)] = found

    return hook


def before_host_delete(trial: str, region: str, abandon_unpreserved: bool,
                       session_for: Callable[[str], Any] | None = None) -> Callable[[Any], None]:
    """An instance's hook: refuses the delete of a host whose trial is not preserved — unless the
    destroy gate already verified the same trial in this run (VERIFIED)."""

    def hook(args: Any) -> None:
        tags = (args.old_inputs or {}).get("tags") or (args.old_outputs or {}).get("tags") or {}
        bucket = tags.get(BUCKET_TAG)
        if bucket and (bucket, trial) in VERIFIED:
            return
        if not bucket:
            raise NotPreserved(f"{args.name}: no {BUCKET_TAG} tag, so its trial's evidence cannot be checked; "
                               "refusing to delete it (set abandon_unpreserved: true to give the trial up)")
        refuse_unpreserved(f"{args.name} ({args.id})", bucket, trial, region, abandon_unpreserved,
                           _session(region, session_for), args.id or args.name)

    return hook

"""What the stack itself recorded last time: its trial, region and account, and every instance it has held —
read back by the program at each run from its own outputs, so that it can tell the trial's instances the stack
holds from those it does not, and a stack that changed its trial, region or account from one that did not.

Why its own outputs. The engine hands a program its config, never its state; but the builtin provider answers
`pulumi:pulumi:readStackOutputs` for any stack the backend knows, this one included (pulumi/pulumi
`pkg/resource/deploy/builtins.go` `readStackReference` → `pkg/backend/backend.go` `GetStackOutputs`: no check
refuses a stack's own name; the self-managed backend reads the checkpoint as last written,
`pkg/backend/diy/state.go`, an empty map for a stack that never finished a deployment). The root stack resource
keeps its outputs through a run until the program registers new ones at its end, so what is read at the start is
the previous run's record. The outputs carry `instances_held`: every instance id the stack registered in any run
that reached its end, with its rank, merged run after run — so an instance an `up` replaced, still pending
deletion in the state, stays "held" (`readStackResourceOutputs` would not say so: it skips resources pending
deletion, `backend.go` `GetStackResourceOutputs`).

What is not held: an instance tagged with the trial that no run registered — the create of an interrupted `up`
(the engine keeps it as a pending operation, not a resource, and the next `up` creates that rank again), one
started by hand, one another stack made under the same trial name (its `pulumi-stack` tag says which).
infra/existing.py refuses an `up` that sees two instances of one rank or another stack's, and the delete check
(infra/teardown.py) refuses every delete while such an instance exists.
"""

from __future__ import annotations

import re
from typing import Any

import pulumi
from pydantic import BaseModel

READ_OUTPUTS = "pulumi:pulumi:readStackOutputs"


class Held(BaseModel):
    """The previous run's record of the stack (empty: a stack with no finished deployment, or destroyed)."""
    trial: str | None = None
    region: str | None = None
    account: str | None = None
    instances: dict[str, int | None] = {}  # instance id -> rank, every one the stack has held

    @property
    def recorded(self) -> bool:
        return self.trial is not None


def stack_fqn() -> str:
    """This stack as the backend and the instances' `pulumi-stack` tag name it: organization/project/stack."""
    return f"{pulumi.get_organization() or 'organization'}/{pulumi.get_project()}/{pulumi.get_stack()}"


def account_of(arn: Any) -> str | None:
    parts = str(arn or "").split(":")
    return parts[4] if len(parts) > 5 and re.fullmatch(r"\d{12}", parts[4]) else None


def held_from_outputs(outputs: dict[str, Any]) -> Held:
    """The record in a stack's outputs (those of a stack made before `instances_held` give their `hosts`)."""
    if not isinstance(outputs.get("trial"), str):
        return Held()
    instances: dict[str, int | None] = {}
    for h in outputs.get("instances_held") or []:
        if isinstance(h, dict) and h.get("instance_id"):
            instances[str(h["instance_id"])] = h.get("rank")
    for h in outputs.get("hosts") or []:
        if isinstance(h, dict) and h.get("instance_id"):
            instances.setdefault(str(h["instance_id"]), h.get("rank"))
    return Held(trial=str(outputs["trial"]), region=outputs.get("region"), account=account_of(outputs.get("alert_topic")),
                instances=instances)


def read_previous() -> dict[str, Any]:
    """This stack's previous outputs, through the builtin provider, its secret ones kept secret. The full name
    first, then the bare stack name (a self-managed backend in the legacy layout parses no `org/project/stack`:
    pkg/backend/diy/store.go `legacyReferenceStore`). A read that fails is said and taken as no record: every
    instance of the trial is then judged by what this run registers (stricter, never looser)."""
    errors = []
    for name in (stack_fqn(), pulumi.get_stack()):
        try:
            value = pulumi.runtime.invoke(READ_OUTPUTS, {"name": name}).value or {}
        except Exception as e:  # noqa: BLE001 — tried by the next name, else no record
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        secret = set(value.get("secretOutputNames") or [])
        return {k: pulumi.Output.secret(v) if k in secret else v for k, v in dict(value.get("outputs") or {}).items()}
    pulumi.log.warn(f"the stack's own previous outputs could not be read ({'; '.join(errors)}); every instance of "
                    "the trial this run does not register counts as outside the stack")
    return {}


def keep_previous(previous: dict[str, Any]) -> None:
    """Export the previous outputs again, first thing: the SDK registers the stack's outputs as they are when the
    program ends, even when it fails (pulumi/runtime/stack.py `run_in_stack`: `_finish` in a `finally`), so a run
    refused or failed before its own exports would otherwise leave the stack with none — and the next run with
    no record. This run's own exports replace them at its end."""
    for key, value in previous.items():
        pulumi.export(key, value)


def merged(held: Held, now: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """`instances_held` for this run's outputs: the previous record and this run's instances (rank, id)."""
    out = [{"instance_id": i, "rank": r} for i, r in held.instances.items()]
    seen = set(held.instances)
    for rank, iid in now:
        if iid and iid not in seen:
            out.append({"instance_id": iid, "rank": rank})
            seen.add(iid)
    return out


def identity_problem(held: Held, trial: str, region: str, account_now: Any, *, teardown: bool) -> str | None:
    """Why this run may not go on, when the stack holds a trial under another name, region or account (None: it
    may). `account_now` is called only when the record names an account."""
    if not held.recorded:
        return None
    moved = []
    if held.trial != trial:
        moved.append(f"trial {held.trial} -> {trial}")
    if held.region and held.region != region:
        moved.append(f"region {held.region} -> {region}")
    if held.account:
        try:
            now = account_now()
        except Exception as e:  # noqa: BLE001 — an identity that cannot be checked is not taken as the same
            now = f"unknown ({type(e).__name__}: {e})"
        if now != held.account:
            moved.append(f"account {held.account} -> {now}")
    if not moved:
        return None
    hosts = ", ".join(sorted(held.instances)) or "none recorded"
    if teardown:
        return (f"refusing this destroy: the stack holds trial {held.trial} in {held.region} (account "
                f"{held.account or 'unknown'}; instances {hosts}), but its config now says {'; '.join(moved)}: the "
                "destroy's checks would look at the wrong trial, and the hooks the state names would not be "
                "registered. Nothing has been deleted. Put trials:cluster.trial, aws:region and the stack's "
                "credentials back as they were, then `orchestrate destroy` again")
    return (f"refusing this `pulumi up`: the stack holds trial {held.trial} in {held.region} (account "
            f"{held.account or 'unknown'}; instances {hosts}), and its config now says {'; '.join(moved)}. Pulumi would "
            "create a second cluster under the new settings while the old hosts keep running and billing, and the "
            "old resources could then not be deleted (their hooks are named for the old trial; a new region or "
            "account is a new provider, which replaces every resource). Nothing has been changed. To move the trial: "
            "put the settings back, preserve it and `orchestrate destroy` the stack, then change them; or run the "
            "new trial in a new stack (`pulumi stack init`)")

"""The trial cluster as Pulumi resources. `build(cfg, now)` refuses an over-budget or mis-timed plan
before registering anything, then — at `pulumi up` — looks up what the account already holds of the
trial and refuses an `up` that would delete, replace or restart a host of an unpreserved trial
(infra/existing.py), then creates one component per concern, every resource tagged `trial=<name>`:

  network   infra/network.py: a VPC, a public subnet per zone, a members-only security group
  evidence  infra/bucket.py: the S3 bucket and what a host may do in it
  guards    infra/guards.py: the deadline stop (by tag: before any host), the alert topic, the budget;
            per host, once it exists: its transfer alarms and budget spend stop
  hosts     infra/hosts.py: one g6e instance per rank, its key, image, encrypted gp3 volume and role,
            each depending on the deadline stop
  gate      infra/gate.py: the destroy gate, depending on all of the above, deleted first by `pulumi
            destroy`, whose hook refuses the destroy until the trial is preserved (nothing deleted before)

Every child whose delete costs something carries the same refusing hook (infra/teardown.py, one check per
run), so a destroy from any state an `up` can leave deletes nothing before preservation. The outputs
`orchestrate` reads are exported (shape: infra/outputs.py). A stack created before the components existed
keeps every resource: each child carries an alias to its old URN (infra/concern.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pulumi
from botocore.config import Config

from infra.bucket import Evidence
from infra.credentials import session_factory
from infra.existing import look_up, refuse_host_changes, refuse_outside, subnet_cidrs
from infra.held import held_from_outputs, identity_problem, keep_previous, merged, read_previous, stack_fqn
from infra.lease import CLIENT_CONFIG, current, take
from infra.gate import DestroyGate
from infra.guards import Guards
from infra.hosts import Hosts
from infra.network import Network
from infra.outputs import OUTPUTS_FORMAT
from infra.plan import BudgetError, TrialConfig, deadline_lead_problems, estimate, require_within_budget
from infra.prices import INSTANCE_TYPES
from infra.teardown import DeleteCheck


def build(cfg: TrialConfig, now: dt.datetime | None = None, *, teardown: bool = False,
          previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """`teardown`: the program runs for `pulumi destroy --run-program` (infra/__main__.py), to register
    the hooks; the plan is not refused then (its deadline has passed by design), nothing is created and
    nothing looked up. `previous`: the stack's previous outputs, read and exported again by the entry before
    anything can refuse (infra/held.py); read here when not given."""
    start = now or dt.datetime.now(dt.timezone.utc)
    # raises with the whole table; nothing registered yet
    # the deadline's lead is judged after the look-up below: only an `up` that creates hosts is held to it
    est = estimate(cfg, start) if teardown else require_within_budget(cfg, start, creating=[])
    if teardown and cfg.deadline is None:
        raise ValueError("teardown: the stack has no deadline; it was never created by this program")
    assert cfg.deadline is not None  # a missing one is among the problems above

    dry_run = pulumi.runtime.is_dry_run()
    session_for = session_factory()  # the stack's own AWS identity (infra/credentials.py), opened when first used
    # the stack's record of itself (infra/held.py): a trial, region or account changed under it is refused first
    if previous is None:
        previous = read_previous()
        keep_previous(previous)  # a run that fails leaves the stack's outputs (its record) as they were
    held, stack = held_from_outputs(previous), stack_fqn()
    moved = identity_problem(held, cfg.trial, cfg.region,
                             lambda: session_for().client("sts").get_caller_identity()["Account"], teardown=teardown)
    if moved:
        raise ValueError(moved)  # nothing registered
    # one operation at a time on the trial, whatever the backend's lock says (infra/lease.py): raises, nothing registered
    lease = None
    if not dry_run:
        lease, stale = take(lambda: session_for().client("ssm", config=Config(**CLIENT_CONFIG)), cfg.trial, stack, "destroy" if teardown else "up")
        lease.start()
        if stale:
            pulumi.log.warn(stale)
    else:
        try:
            running = current(session_for().client("ssm"), cfg.trial)
        except Exception as e:  # noqa: BLE001 — a preview changes nothing: said, not refused
            running = f"unknown: the trial's lease cannot be read ({type(e).__name__}: {e})"
        if running:
            pulumi.log.warn(f"another operation on trial {cfg.trial}: {running}; what this preview shows may change")
    check = DeleteCheck(cfg.trial, cfg.abandon_unpreserved, session_for, dry_run=dry_run, lease=lease)
    check.hold(held.instances, stack)
    refuse = pulumi.ResourceHook(f"{cfg.trial}-refuse-unpreserved", check.hook,
                                 pulumi.ResourceHookOptions(on_dry_run=True))
    seen = None if teardown else look_up(cfg)  # a teardown looks nothing up: the state says what to delete
    if seen is not None:
        refuse_outside(cfg, seen, held, stack)  # raises: nothing registered
        live = {h.rank for h in seen.hosts if h.rank is not None}
        lead = deadline_lead_problems(cfg, start, [h.rank for h in cfg.by_rank if h.rank not in live])
        if lead:  # raises: nothing registered
            raise BudgetError("refusing to create anything — the plan does not fit:\n  " + "\n  ".join(lead))
        allowed = refuse_host_changes(cfg, seen, session_for=session_for, dry_run=dry_run)  # raises: nothing registered
        if allowed:
            answer, changes = allowed
            check.settle(answer)  # one decision per run: the hooks give the same answer
            pulumi.log.warn(f"this up deletes, replaces or restarts hosts of trial {cfg.trial}, which is {answer}: "
                            + "; ".join(f"rank {h.rank} {what}" for h, what in changes))

    network = Network(cfg, refuse, subnet_cidrs(cfg, seen))
    evidence = Evidence(cfg, refuse)
    guards = Guards(cfg, refuse)  # before the hosts: each host depends on its deadline stop
    creating = pulumi.ResourceHook(f"{cfg.trial}-lease-held", check.create_hook)  # not on a preview: it takes no lease
    hosts = Hosts(cfg, refuse, network, evidence, guards, stack=stack, teardown=teardown, creating=creating)
    for _, inst in hosts.instances:  # the check looks these up by id too, and in their account and region
        pulumi.Output.all(inst.id, inst.arn).apply(lambda v: check.know(*v))
    if teardown:  # a destroy leaves no deadline stop running: one the stack does not hold refuses it
        check.watch_stops()
        guards.schedule.name.apply(check.know_stop)
    DestroyGate(cfg, evidence, [network, evidence, hosts, guards], check)  # last: it depends on everything above

    outputs = {
        "format": OUTPUTS_FORMAT, "trial": cfg.trial, "region": cfg.region,
        "deadline": cfg.deadline.isoformat(), "hours": cfg.hours, "ssh_user": cfg.ssh_user,
        "host_python": cfg.host_python,
        "bucket": evidence.bucket.bucket, "prefix": evidence.prefix, "alert_topic": guards.topic.arn,
        "security_group": network.sg.id,
        "transfer_guard_bytes": cfg.transfer_guard_bytes, "guard_fraction": cfg.guard_fraction,
        "grace_cap_minutes": cfg.grace_cap_minutes, "deadline_stop": guards.deadline_stop,
        "isolated_ranks": sorted(cfg.isolated_ranks()), "ami": hosts.ami,
        "budget": cfg.budget.model_dump(exclude={"alert_email"}), "budget_name": guards.budget_name,
        # every budget holding spend stops (past ten hosts, one per ten ranks: infra/plan.py `budget_group`)
        "budget_names": [b.name for _, b in sorted(guards.budgets.items())],
        "estimate": {"total_usd": est.total_usd, "totals_usd": est.totals_usd.model_dump(),
                     "traffic": [t.model_dump() for t in est.traffic]},
        "hosts": [{
            "rank": h.rank, "instance_id": inst.id, "instance_type": h.instance_type, "zone": h.zone,
            "private_ip": inst.private_ip, "public_ip": inst.public_ip,
            "vcpus": INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus"),
            "ebs_baseline_mb_s": INSTANCE_TYPES.get(h.instance_type, {}).get("ebs_baseline_mb_s"),
            "volume_throughput_mb_s": cfg.volume.throughput_mb_s,
        } for h, inst in hosts.instances],
        # every instance the stack has held, this run's included: what the next run reads back (infra/held.py)
        "instances_held": pulumi.Output.all(*[inst.id for _, inst in hosts.instances]).apply(
            lambda ids: merged(held, [(h.rank, i) for (h, _), i in zip(hosts.instances, ids)])),
    }
    for k, v in outputs.items():
        pulumi.export(k, v)
    return outputs

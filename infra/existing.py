"""What the account already holds of this trial, looked up by the program at `pulumi up` (and preview)
before it registers anything: the trial's hosts and subnets, found by the `trial` tag.

Two uses.

1. **An `up` that would remove, replace or restart a host of an unpreserved trial is refused** before
   anything changes. The engine applies updates while the program runs and deletes afterwards
   (pulumi/pulumi `step_generator.go`: a replacement is created at once and its old copy deleted with the
   post steps), so by the time a dropped or replaced host's own delete hook refuses, every update has
   happened. What would happen to a host is decided here from the provider's rules (terraform-provider-aws
   `ec2_instance.go`, which pulumi-aws bridges): a rank no longer in the config is deleted; a new zone (its
   `availability_zone`/`subnet_id`, both ForceNew) replaces it; a new instance type is applied by stopping
   the host and starting it again — unconditionally, so a host a guard had stopped would come back running.
   The refusal names each host and what would happen; a preserved trial (verified in its store, as a
   destroy's hook verifies it: infra/teardown.py) or `abandon_unpreserved: true` lets the `up` go on.
2. **No subnet is replaced or deleted under a live trial.** A subnet's CIDR is ForceNew, and replacing a
   subnet replaces every host in it; the CIDRs were numbered by the zones' sorted order, so a new zone
   sorting first would have renumbered the rest. Existing subnets keep the CIDR they have; a new zone
   takes the lowest free one (a new stack numbers them as before). A zone no host uses any more keeps its
   subnet while the account holds it (its delete would be refused anyway: infra/teardown.py). A subnet's
   logical name is its zone as the stack writes it, so a zone written as a name before and as an ID now
   (or back) is another subnet to Pulumi, and its hosts are replaced: the `zone` tag every subnet carries
   tells the two apart, and such an `up` is refused like any other replacement.

The lookups are the provider's invokes (`aws:ec2/getInstances`, `getInstance`, `getSubnets`, `getSubnet`),
so they use the stack's own provider configuration.
"""

from __future__ import annotations

from typing import Any

import pulumi_aws as aws
from pydantic import BaseModel

from infra.held import Held
from infra.plan import TrialConfig
from infra.teardown import ADVICE, BUCKET_TAG, NOT_TERMINATED, STACK_TAG, NotPreserved, end_advice, judge

VPC_CIDR = "10.42.0.0/16"


def subnet_cidr(index: int) -> str:
    return f"10.42.{index}.0/24"


class SeenSubnet(BaseModel):
    subnet_id: str
    zone_name: str | None = None
    zone_id: str | None = None
    cidr: str
    named: str | None = None  # the zone as the stack wrote it (the `zone` tag; none on a subnet made before it)

    def zone(self, by_id: bool) -> str | None:
        """The zone as this subnet's logical name has it."""
        return self.named or (self.zone_id if by_id else self.zone_name)


class SeenHost(BaseModel):
    instance_id: str
    rank: int | None  # None: tagged with the trial but not by this program (no rank tag)
    instance_type: str | None = None
    zone_name: str | None = None
    subnet_id: str | None = None
    bucket: str | None = None
    stack: str | None = None  # the `pulumi-stack` tag: the stack that made it (none on a host made before the tag)


class Existing(BaseModel):
    """The trial's hosts and subnets as the account has them."""
    hosts: list[SeenHost] = []
    subnets: list[SeenSubnet] = []

    def zone_of(self, host: SeenHost, by_id: bool) -> str | None:
        """A host's zone as its subnet's logical name has it (else as the stack names zones now)."""
        for s in self.subnets:
            if s.subnet_id == host.subnet_id:
                return s.zone(by_id)
        return None if by_id else host.zone_name


def look_up(cfg: TrialConfig) -> Existing:
    """The trial's live instances and its subnets, through the provider's invokes."""
    tags = {"trial": cfg.trial}
    hosts = []
    for iid in aws.ec2.get_instances(instance_tags=tags, instance_state_names=NOT_TERMINATED).ids:
        i = aws.ec2.get_instance(instance_id=iid)
        t = dict(i.tags or {})
        rank = t.get("rank")
        hosts.append(SeenHost(instance_id=iid, rank=int(rank) if rank and rank.isdigit() else None,
                              instance_type=i.instance_type, zone_name=i.availability_zone,
                              subnet_id=i.subnet_id, bucket=t.get(BUCKET_TAG), stack=t.get(STACK_TAG)))
    subnets = []
    for sid in aws.ec2.get_subnets(tags=tags).ids:
        s = aws.ec2.get_subnet(id=sid)
        subnets.append(SeenSubnet(subnet_id=sid, zone_name=s.availability_zone, zone_id=s.availability_zone_id,
                                  cidr=s.cidr_block, named=dict(s.tags or {}).get("zone")))
    return Existing(hosts=hosts, subnets=subnets)


def host_changes(cfg: TrialConfig, seen: Existing) -> list[tuple[SeenHost, str]]:
    """Each existing host this config would delete, replace or stop-and-start, with what and why."""
    wanted = {h.rank: h for h in cfg.hosts}
    by_id = cfg.hosts[0].zone_is_id
    changes = []
    for host in sorted(seen.hosts, key=lambda h: (h.rank is None, h.rank or 0, h.instance_id)):
        if host.rank is None:
            continue  # not this program's: Pulumi would not touch it
        want = wanted.get(host.rank)
        if want is None:
            changes.append((host, "would be terminated: its rank is no longer in trials:cluster.hosts"))
            continue
        zone = seen.zone_of(host, by_id)
        if zone is not None and zone != want.zone:  # another subnet: availability_zone/subnet_id are ForceNew
            changes.append((host, f"would be replaced (terminated, a new one created): zone {zone} -> {want.zone}"))
        elif host.instance_type and host.instance_type != want.instance_type:
            changes.append((host, f"would be stopped and started again: instance type {host.instance_type} -> "
                                  f"{want.instance_type}"))
    return changes


def subnet_cidrs(cfg: TrialConfig, seen: Existing | None) -> dict[str, str]:
    """Each zone the stack registers a subnet for -> its CIDR: the config's zones and those whose subnet the
    account holds; an existing subnet keeps its CIDR, a new one takes the lowest free one, in the zones'
    sorted order (a new stack: 10.42.0.0/24, 10.42.1.0/24, ... as before)."""
    by_id = cfg.hosts[0].zone_is_id
    have = {}
    for s in (seen.subnets if seen else []):
        zone = s.zone(by_id)
        if zone is not None:
            have[zone] = s.cidr
    used = set(have.values())
    out = {}
    for zone in sorted({h.zone for h in cfg.hosts} | set(have)):
        if zone in have:
            out[zone] = have[zone]
            continue
        i = next(i for i in range(256) if subnet_cidr(i) not in used)
        used.add(subnet_cidr(i))
        out[zone] = subnet_cidr(i)
    return out


def refuse_host_changes(cfg: TrialConfig, seen: Existing, *, session_for: Any,
                        dry_run: bool) -> tuple[str, list[tuple[SeenHost, str]]] | None:
    """Raises ValueError (the program's refusal) when this `up` would delete, replace or restart a host of
    an unpreserved trial; returns what allowed it and the changes otherwise (None: no host changes)."""
    changes = host_changes(cfg, seen)
    if not changes:
        return None
    touched = {h.instance_id: h.bucket for h, _ in changes}
    lines = "\n".join(f"  rank {h.rank} ({h.instance_id}): {what}" for h, what in changes)
    try:
        return judge(cfg.trial, touched, abandon_unpreserved=cfg.abandon_unpreserved, session=session_for(),
                     dry_run=dry_run, who="pulumi-up"), changes
    except Exception as e:  # noqa: BLE001 — NotPreserved, or a check that could not run: either way, refused
        why = str(e) if isinstance(e, NotPreserved) else f"the check could not run: {type(e).__name__}: {e}"
        raise ValueError(f"refusing this `pulumi up`: it would change host(s) of trial {cfg.trial} whose evidence "
                         f"is not preserved:\n{lines}\nNothing has been changed. Why: {why}. {ADVICE}; or put "
                         "trials:cluster.hosts back as they were.") from None


def outside_problems(cfg: TrialConfig, seen: Existing, held: Held, stack: str) -> list[str]:
    """The trial's live instances this `up` must not go on beside: another stack's (its `pulumi-stack` tag), a
    second instance of one rank (the stack holds one per rank: the other is an interrupted `up`'s create, or
    one started by hand) and one tagged with the trial but not by this program (no rank). A host of a rank
    the state may hold, alone in its rank, is not refused here: only the stack's state knows it, and the run's
    registrations tell (the delete check refuses every delete while one is outside)."""
    problems = []
    for h in seen.hosts:
        if h.stack and h.stack != stack and h.instance_id not in held.instances:  # renamed stack: its record says
            problems.append(f"{h.instance_id} (rank {h.rank}) is stack {h.stack}'s: trial {cfg.trial} is in use by "
                            "another stack in this account")
        elif h.rank is None:
            problems.append(f"{h.instance_id} carries the trial's tag but no rank: it was not made by this program")
    by_rank: dict[int, list[SeenHost]] = {}
    for h in seen.hosts:
        if h.rank is not None and (not h.stack or h.stack == stack or h.instance_id in held.instances):
            by_rank.setdefault(h.rank, []).append(h)
    for rank, hosts in sorted(by_rank.items()):
        ids = [h.instance_id for h in hosts]
        mine = [i for i in ids if i in held.instances]
        others = [i for i in ids if i not in held.instances]
        # two the stack holds: a replacement whose old copy's delete has not run yet (this `up` deletes it)
        if len(hosts) > 1 and (others if mine else True):
            problems.append(f"rank {rank} has {len(hosts)} live instances ({', '.join(sorted(ids))}); the stack holds "
                            + (f"{', '.join(mine)}: {', '.join(sorted(others))} is outside it" if mine else
                               "one of them at most (its record does not say which)")
                            + " — an interrupted `up` created one the state never recorded")
    return problems


def refuse_outside(cfg: TrialConfig, seen: Existing, held: Held, stack: str) -> None:
    """Raises ValueError (the program's refusal, nothing registered) when `outside_problems` finds any."""
    problems = outside_problems(cfg, seen, held, stack)
    if problems:
        ids = sorted({h.instance_id for h in seen.hosts})
        raise ValueError(f"refusing this `pulumi up`: trial {cfg.trial} has live instance(s) this stack does not "
                         "hold:\n  " + "\n  ".join(problems) + "\nNothing has been changed. "
                         + end_advice(cfg.trial, cfg.region, ids))

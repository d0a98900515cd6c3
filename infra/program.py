"""The trial cluster as Pulumi resources. `build(cfg, now)` refuses an over-budget or mis-timed plan
before registering anything, then creates one component per concern, every resource tagged
`trial=<name>`:

  network   infra/network.py: a VPC, a public subnet per zone, a members-only security group
  evidence  infra/bucket.py: the S3 bucket and what a host may do in it
  hosts     infra/hosts.py: one g6e instance per rank, its key, image, encrypted gp3 volume and role
  guards    infra/guards.py: the deadline stop, the transfer alarms, the budget and its spend stop
  gate      infra/gate.py: the destroy gate, depending on all of the above, deleted first by `pulumi
            destroy`, whose hook refuses the destroy until the trial is preserved (nothing deleted before)

and exports the outputs `orchestrate` reads (shape: infra/outputs.py). A stack created before the
components existed keeps every resource: each child carries an alias to its old URN (infra/concern.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pulumi

from infra.bucket import Evidence
from infra.gate import DestroyGate
from infra.guards import Guards
from infra.hosts import Hosts
from infra.network import Network
from infra.outputs import OUTPUTS_FORMAT
from infra.plan import TrialConfig, estimate, require_within_budget
from infra.prices import INSTANCE_TYPES


def build(cfg: TrialConfig, now: dt.datetime | None = None, *, teardown: bool = False) -> dict[str, Any]:
    """`teardown`: the program runs for `pulumi destroy --run-program` (infra/__main__.py), to register
    the hooks; the plan is not refused then (its deadline has passed by design), nothing is created and
    nothing looked up."""
    start = now or dt.datetime.now(dt.timezone.utc)
    # raises with the whole table; nothing registered yet
    est = estimate(cfg, start) if teardown else require_within_budget(cfg, start)
    if teardown and cfg.deadline is None:
        raise ValueError("teardown: the stack has no deadline; it was never created by this program")
    assert cfg.deadline is not None  # a missing one is among the problems above

    network = Network(cfg)
    evidence = Evidence(cfg)
    hosts = Hosts(cfg, network, evidence, teardown=teardown)
    guards = Guards(cfg, hosts)
    DestroyGate(cfg, evidence, [network, evidence, hosts, guards])  # last: it depends on everything above

    outputs = {
        "format": OUTPUTS_FORMAT, "trial": cfg.trial, "region": cfg.region,
        "deadline": cfg.deadline.isoformat(), "hours": cfg.hours, "ssh_user": cfg.ssh_user,
        "host_python": cfg.host_python,
        "bucket": evidence.bucket.bucket, "prefix": evidence.prefix, "alert_topic": guards.topic.arn,
        "security_group": network.sg.id,
        "transfer_guard_bytes": cfg.transfer_guard_bytes, "guard_fraction": cfg.guard_fraction,
        "isolated_ranks": sorted(cfg.isolated_ranks()), "ami": hosts.ami,
        "budget": cfg.budget.model_dump(exclude={"alert_email"}), "budget_name": guards.budget_name,
        "estimate": {"total_usd": est["total_usd"], "totals_usd": est["totals_usd"],
                     "traffic": est["traffic"]},
        "hosts": [{
            "rank": h.rank, "instance_id": inst.id, "instance_type": h.instance_type, "zone": h.zone,
            "private_ip": inst.private_ip, "public_ip": inst.public_ip,
            "vcpus": INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus"),
            "ebs_baseline_mb_s": INSTANCE_TYPES.get(h.instance_type, {}).get("ebs_baseline_mb_s"),
            "volume_throughput_mb_s": cfg.volume.throughput_mb_s,
        } for h, inst in hosts.instances],
    }
    for k, v in outputs.items():
        pulumi.export(k, v)
    return outputs

"""plan: an arm's experiment on a stack — cost, hours, bytes, quota, zones and placement — against
the budget split, before anything in the cloud exists (`orchestrate plan`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from evidence.errors import UserError

if TYPE_CHECKING:
    from infra.plan import TrialConfig


class PlanError(UserError, ValueError):
    """An option that names something the stack does not plan or this machine does not have."""


def plan_arm(cfg: TrialConfig, stack: Path, arm: str, *, wheelhouse: Optional[Path], uplink_mbps: float,
             quota: bool, now: dt.datetime, profile: str = "gpu") -> dict[str, Any]:
    """The plan of ARM's experiment (the arm and its controls) on the stack `cfg` (read from `stack`):
    the estimate, the hosts' vCPUs against the account's G-instance quota (with `quota`: the only AWS
    reads), the zones' offerings, the placement and what staging sends from this machine — all before
    `pulumi up` spends anything. `problems` lists what does not fit; the record is what `orchestrate
    plan --json` prints. Raises ConfigError or PlanError."""
    from evidence.attainability import analyse
    from infra.plan import estimate as run_estimate
    from infra.prices import INSTANCE_TYPES
    from training.config import address, resolve

    name, arm = address(arm)  # EXPERIMENT/ARM, an experiment (its primary), or an arm one experiment has
    resolved = resolve(name, profile)
    exp = resolved.experiment
    if cfg.experiment is not None and (cfg.experiment, cfg.profile) != (name, profile):
        raise PlanError(f"{stack} runs {cfg.experiment} at profile {cfg.profile}; this plan is of {name} at profile "
                        f"{profile}: plan what the stack runs, or set its experiment and profile")
    names = {a.name for a in exp.arms}
    arms = [a for a in cfg.arms if a.name in names]
    if arm not in {a.name for a in arms}:
        raise PlanError(f"{stack} plans no arm '{arm}' (it plans: {', '.join(a.name for a in cfg.arms)})")
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise PlanError(f"--wheelhouse {wheelhouse} is not a directory")
    staging = staging_upload(cfg, wheelhouse, uplink_mbps)
    # the isolated host's counters see staging too: the guard check counts it
    est = run_estimate(cfg.model_copy(update={"arms": arms}), now, wheelhouse_bytes=staging["wheelhouse_bytes"])
    problems = list(est["problems"])
    if wheelhouse is not None:  # a wheelhouse for the controller's Python installs nowhere on the hosts
        from orchestrate.wheelhouse import describe_unfit, unfit

        bad = unfit([p.name for p in wheelhouse.glob("*.whl")], cfg.host_python_version, cfg.host_platform)
        if bad:
            problems.append(describe_unfit(bad, cfg.host_python_version, cfg.host_platform))
    if staging["hours"] > cfg.hours:
        problems.append(f"staging sends {staging['bytes'] / 1e9:,.2f} GB from this machine, even through the bucket: "
                        f"{staging['hours']:.2f} h at {uplink_mbps:g} Mbit/s, more than the {cfg.hours:g} h paid for")
    need = sum(int(INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus") or 0) for h in cfg.hosts)
    vcpu: dict = {"hosts_vcpus": need, "quota": None, "note": None}
    zones: dict = {"checked": False, "note": "not checked (--no-quota: no AWS reads)"}
    if quota:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        from orchestrate.cloud import G_VT_VCPU_QUOTA, read_vcpu_quota, zone_offerings

        session = boto3.Session(region_name=cfg.region)
        try:
            vcpu["quota"] = read_vcpu_quota(session)
        except (BotoCoreError, ClientError) as e:
            vcpu["note"] = f"quota not readable: {e}"
        try:  # zone names differ between accounts; a zone may not offer the type at all
            by_id = cfg.hosts[0].zone_is_id
            zones = {"checked": True, "by_id": by_id, **zone_offerings(
                session, sorted({h.zone for h in cfg.hosts}), sorted({h.instance_type for h in cfg.hosts}), by_id=by_id)}
            for h in cfg.by_rank:
                if h.instance_type not in zones["zones"][h.zone]:
                    problems.append(f"host {h.rank}'s zone {h.zone} does not offer {h.instance_type} in this account "
                                    f"(offered in: {', '.join(zones['offered_in'].get(h.instance_type, [])) or 'none'} "
                                    f"of {cfg.region}): choose one of those, as a zone ID (use1-az4), which names the "
                                    "same physical zone in every account")
        except (BotoCoreError, ClientError) as e:
            zones = {"checked": False, "note": f"not checked (offerings not readable: {e})"}
        if vcpu["quota"] is not None and need > vcpu["quota"]:
            problems.append(f"the hosts need {need} G/VT vCPUs; the account's quota in {cfg.region} is "
                            f"{vcpu['quota']:g} (Service Quotas {G_VT_VCPU_QUOTA[1]}): ask for more before `pulumi up`")
    placed = _plan_placement(exp, cfg, {a.name for a in arms}, problems)
    # what each gate can reach at the gpu profile, before anything is spent (a gate that cannot pass
    # there would make the trial's verdict a foregone one: said here, committed again by `run`)
    attainable = analyse(resolved.as_dict(), {"source": "stack", "cores": None})
    return {**est, "arm": arm, "experiment": exp.name, "profile": profile, "hours": cfg.hours,
            "deadline": cfg.deadline and cfg.deadline.isoformat(), "vcpu": vcpu,
            "placement": placed, "staging": staging, "zones": zones, "attainability": attainable,
            # an arm setting the profile replaces (its H, its dense warmup): priced as it runs, and said
            "scaled": [{"arm": a, "key": k, "arm_own": own, "profile": v} for a, k, own, v in resolved.scaled()],
            "problems": problems}


def staging_upload(cfg: TrialConfig, wheelhouse: Optional[Path], uplink_mbps: float) -> dict:
    """What staging sends from the operator's machine, over its uplink: the seed (FP32 safetensors, 4
    bytes a parameter) and the wheelhouse (every wheel in it: torch and its CUDA libraries are several GB,
    since the hosts' AMI has another torch). Over SSH alone (a cluster without a bucket) once to every
    host; through the stack's bucket (the relay, evidence/relay.py: what `orchestrate run` does on a
    stack) once in all, plus the project's wheel and a manifest to each host (under a MB each,
    counted as PROJECT_WHEEL_BYTES). The budget is checked against the relay's figure."""
    wheels = sum(p.stat().st_size for p in wheelhouse.glob("*.whl")) if wheelhouse and wheelhouse.is_dir() else 0
    seed, hosts = 4 * cfg.parameters, len(cfg.hosts)
    ssh = hosts * (seed + wheels)
    relay = seed + wheels + hosts * PROJECT_WHEEL_BYTES

    def hours(b: int) -> float:
        return b * 8 / (uplink_mbps * 1e6) / 3600

    return {"hosts": hosts, "seed_bytes": seed, "wheelhouse_bytes": wheels, "uplink_mbps": uplink_mbps,
            "bytes": relay, "hours": hours(relay), "ssh_only_bytes": ssh, "ssh_only_hours": hours(ssh)}


PROJECT_WHEEL_BYTES = 1_000_000
"""An upper bound on the project's own wheel and a staging manifest (the wheel is
well under it): what still goes over SSH to each host when the relay carries the rest."""


def _plan_placement(exp: Any, cfg: TrialConfig, planned: set[str], problems: list[str]) -> dict | None:
    """Whether each planned arm's ranks get a GPU each on the stack's hosts (one rank per host; GPUs per
    instance type from infra/prices.py, None where unknown: the arm is then listed as "unknown"). A host 0
    without a GPU is a problem: nothing could train or score; an arm that does not fit is listed as not
    run, as `run` would."""
    from infra.prices import INSTANCE_TYPES
    from orchestrate.cluster import ClusterError
    from orchestrate.placement import hosts_devices, place

    gpus = [INSTANCE_TYPES.get(h.instance_type, {}).get("gpus") for h in cfg.by_rank]
    d = hosts_devices("stack", gpus, None, "infra/prices.py, per instance type")
    try:
        placed = {"cluster": d.as_dict(), **place(exp.arms, exp.serving_arm, "cuda", d)}
    except ClusterError as e:
        problems.append(str(e))
        return None
    placed["arms"] = [{**r, "gpus_known": None not in gpus[:r["world_size"]]} for r in placed["arms"]
                      if r["arm"] in planned]
    return placed

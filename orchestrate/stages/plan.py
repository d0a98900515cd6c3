"""plan: an arm's experiment on a stack — cost, hours, bytes, quota, zones and placement — against
the budget split, before anything in the cloud exists (`orchestrate plan`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

from pydantic import Field

from evidence.attainability import analyse
from evidence.errors import UserError
from evidence.placement import ArmPlacement, PlacementCluster, ServingPlacement
from infra.estimate import Estimate, Frozen, Number
from infra.plan import estimate as run_estimate
from infra.prices import INSTANCE_TYPES
from orchestrate.cloud import G_VT_VCPU_QUOTA, read_vcpu_quota, zone_offerings
from orchestrate.cluster import ClusterError
from orchestrate.placement import hosts_devices, place
from orchestrate.wheelhouse import describe_unfit, unfit
from training.config import address, resolve

if TYPE_CHECKING:
    from infra.plan import TrialConfig
    from training.config import Experiment


class PlanError(UserError, ValueError):
    """An option that names something the stack does not plan or this machine does not have."""


class Staging(Frozen):
    """What staging sends from the operator's machine (`staging_upload`)."""

    hosts: int
    seed_bytes: int = Field(description="the seed, FP32: 4 bytes a parameter")
    wheelhouse_bytes: int = Field(description="every wheel of the wheelhouse (0: none given)")
    uplink_mbps: Number = Field(description="this machine's upload rate, Mbit/s")
    bytes: int = Field(description="what leaves this machine through the stack's bucket (the relay)")
    hours: Number = Field(description="`bytes` at uplink_mbps")
    ssh_only_bytes: int = Field(description="what would leave it over SSH alone: everything once per host")
    ssh_only_hours: Number = Field(description="`ssh_only_bytes` at uplink_mbps")


class Vcpu(Frozen):
    """The hosts' vCPUs against the account's G/VT on-demand quota."""

    hosts_vcpus: int
    quota: Number | None  # None: not asked (--no-quota) or not readable (`note` says why)
    note: str | None


class ZonesChecked(Frozen):
    """The zones' instance-type offerings as EC2 gives them to this account (`orchestrate.cloud.zone_offerings`)."""

    checked: Literal[True] = True
    by_id: bool  # the stack names zones by ID (use1-az4), not by name
    zones: dict[str, list[str]]  # each host zone: the stack's instance types it offers
    offered_in: dict[str, list[str]]  # each instance type: every zone of the region offering it
    zone_ids: dict[str, str]  # this account's zone name → zone ID


class ZonesUnchecked(Frozen):
    """The offerings were not asked for (--no-quota) or not readable."""

    checked: Literal[False] = False
    note: str  # why not


Zones = Annotated[ZonesChecked | ZonesUnchecked, Field(discriminator="checked")]


class PlannedArm(ArmPlacement):
    """One planned arm's placement, and whether its ranks' GPUs are known at all."""

    gpus_known: bool  # every host it needs has an instance type whose GPU count is known


class PlannedPlacement(Frozen):
    """Where `run` would place the planned arms and the serving probe on the stack's hosts."""

    cluster: PlacementCluster  # a planned stack's: source "stack", GPUs from the instance types
    arms: list[PlannedArm]
    serving: ServingPlacement


class Scaled(Frozen):
    """An arm setting the profile replaces: priced as it runs, and said."""

    arm: str
    key: str
    arm_own: int | None
    profile: int


class PlanOutcome(Estimate):
    """The plan of an arm's experiment on a stack: the estimate of its arms (and its fields, so `plan
    --json` prints one record), with `problems` extended by what the stack, this machine and the account
    refuse, and the quota, zones, placement and staging behind them."""

    arm: str
    experiment: str
    profile: str
    hours: Number = Field(description="the compute hours the budget pays for")
    deadline: str | None = Field(description="the cloud stop, ISO 8601 UTC; None: not set")
    vcpu: Vcpu
    placement: PlannedPlacement | None  # None: nothing could train or score (said in `problems`)
    staging: Staging
    zones: Zones
    attainability: dict[str, Any] = Field(description="evidence.attainability.analyse's record of the experiment's gates")
    scaled: list[Scaled]


def plan_arm(cfg: TrialConfig, stack: Path, arm: str, *, wheelhouse: Optional[Path], uplink_mbps: float,
             quota: bool, now: dt.datetime, profile: str = "gpu") -> PlanOutcome:
    """The plan of ARM's experiment (the arm and its controls) on the stack `cfg` (read from `stack`):
    the estimate, the hosts' vCPUs against the account's G-instance quota (with `quota`: the only AWS
    reads), the zones' offerings, the placement and what staging sends from this machine — all before
    `pulumi up` spends anything. `problems` lists what does not fit; its dump is what `orchestrate
    plan --json` prints. Raises ConfigError or PlanError."""

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
    est = run_estimate(cfg.model_copy(update={"arms": arms}), now, wheelhouse_bytes=staging.wheelhouse_bytes)
    problems = list(est.problems)
    if wheelhouse is not None:  # a wheelhouse for the controller's Python installs nowhere on the hosts

        bad = unfit([p.name for p in wheelhouse.glob("*.whl")], cfg.host_python_version, cfg.host_platform)
        if bad:
            problems.append(describe_unfit(bad, cfg.host_python_version, cfg.host_platform))
    if staging.hours > cfg.hours:
        problems.append(f"staging sends {staging.bytes / 1e9:,.2f} GB from this machine, even through the bucket: "
                        f"{staging.hours:.2f} h at {uplink_mbps:g} Mbit/s, more than the {cfg.hours:g} h paid for")
    need = sum(int(INSTANCE_TYPES.get(h.instance_type, {}).get("vcpus") or 0) for h in cfg.hosts)
    quota_read: Number | None = None
    quota_note: str | None = None
    zones: ZonesChecked | ZonesUnchecked = ZonesUnchecked(note="not checked (--no-quota: no AWS reads)")
    if quota:
        # start-up: boto3/botocore take ~0.9 s to import (-X importtime, 2026-12-06); only AWS calls pay it
        from botocore.exceptions import BotoCoreError, ClientError

        from orchestrate.identity import IdentityError, stack_session

        try:  # as the stack's config says the provider will speak (orchestrate/identity.py)
            session = stack_session(stack, cfg.region)
        except IdentityError as e:
            raise PlanError(f"{e} (or --no-quota: no AWS reads)") from None
        try:
            quota_read = read_vcpu_quota(session)
        except (BotoCoreError, ClientError) as e:
            quota_note = f"quota not readable: {e}"
        try:  # zone names differ between accounts; a zone may not offer the type at all
            by_id = cfg.hosts[0].zone_is_id
            zones = ZonesChecked(by_id=by_id, **zone_offerings(
                session, sorted({h.zone for h in cfg.hosts}), sorted({h.instance_type for h in cfg.hosts}), by_id=by_id))
            for h in cfg.by_rank:
                if h.instance_type not in zones.zones[h.zone]:
                    problems.append(f"host {h.rank}'s zone {h.zone} does not offer {h.instance_type} in this account "
                                    f"(offered in: {', '.join(zones.offered_in.get(h.instance_type, [])) or 'none'} "
                                    f"of {cfg.region}): choose one of those, as a zone ID (use1-az4), which names the "
                                    "same physical zone in every account")
        except (BotoCoreError, ClientError) as e:
            zones = ZonesUnchecked(note=f"not checked (offerings not readable: {e})")
        if quota_read is not None and need > quota_read:
            problems.append(f"the hosts need {need} G/VT vCPUs; the account's quota in {cfg.region} is "
                            f"{quota_read:g} (Service Quotas {G_VT_VCPU_QUOTA[1]}): ask for more before `pulumi up`")
    placed = _plan_placement(exp, cfg, {a.name for a in arms}, problems)
    # what each gate can reach at the gpu profile, before anything is spent (a gate that cannot pass
    # there would make the trial's verdict a foregone one: said here, committed again by `run`)
    attainable = analyse(resolved.as_dict(), {"source": "stack", "cores": None})
    return PlanOutcome(**{**dict(est), "problems": problems}, arm=arm, experiment=exp.name, profile=profile,
                       hours=cfg.hours, deadline=cfg.deadline and cfg.deadline.isoformat(),
                       vcpu=Vcpu(hosts_vcpus=need, quota=quota_read, note=quota_note), placement=placed,
                       staging=staging, zones=zones, attainability=attainable,
                       # an arm setting the profile replaces (its H, its dense warmup): priced as it runs, and said
                       scaled=[Scaled(arm=a, key=k, arm_own=own, profile=v) for a, k, own, v in resolved.scaled()])


def staging_upload(cfg: TrialConfig, wheelhouse: Optional[Path], uplink_mbps: float) -> Staging:
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

    return Staging(hosts=hosts, seed_bytes=seed, wheelhouse_bytes=wheels, uplink_mbps=uplink_mbps, bytes=relay,
                   hours=hours(relay), ssh_only_bytes=ssh, ssh_only_hours=hours(ssh))


PROJECT_WHEEL_BYTES = 1_000_000
"""An upper bound on the project's own wheel and a staging manifest (the wheel is
well under it): what still goes over SSH to each host when the relay carries the rest."""


def _plan_placement(exp: Experiment, cfg: TrialConfig, planned: set[str],
                    problems: list[str]) -> PlannedPlacement | None:
    """Whether each planned arm's ranks get a GPU each on the stack's hosts (one rank per host; GPUs per
    instance type from infra/prices.py, None where unknown: the arm is then listed as "unknown"). A host 0
    without a GPU is a problem: nothing could train or score; an arm that does not fit is listed as not
    run, as `run` would."""

    gpus = [INSTANCE_TYPES.get(h.instance_type, {}).get("gpus") for h in cfg.by_rank]
    d = hosts_devices("stack", gpus, None, "infra/prices.py, per instance type")
    try:
        decided = place(exp.arms, exp.serving_arm, "cuda", d)
    except ClusterError as e:
        problems.append(str(e))
        return None
    return PlannedPlacement(
        cluster=d.record(), serving=decided.serving,
        arms=[PlannedArm(**r.model_dump(), gpus_known=None not in gpus[:r.world_size]) for r in decided.arms
              if r.arm in planned])

"""The stack's configuration, the cost and traffic estimate it implies, and the refusal when the
estimate exceeds the budget or any of its reservations — decided before any resource exists.

Transfer model (NCCL_ALGO=Ring, the order of the ring is the rank order): one all-reduce of P bytes
sends 2(N−1)/N·P over each link r → r+1 mod N and receives as much. A link between two zones is paid
on both sides (out and in). So a trial's cross-zone bytes are (cross-zone links) × 2(N−1)/N·P per
synchronization, and each host moves 2 × 2(N−1)/N·P (receive + transmit) per synchronization, which
is what the transfer guard on an isolated-zone host must allow. DDP synchronizes P = 4 bytes per
parameter (FP32 gradients) every update; DiLoCo the same P every H updates and after the last;
PowerSGD's payload must be given (measured), since it depends on the layer shapes and the rank. How
often each kind synchronizes, and what the plan must be told about it, is the kind's own
(`training.arms`, torch-free): the trainer runs by the same schedule.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import re
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evidence.errors import UserError
from evidence.schema import problems, require_ranks
from infra.estimate import ByReservation, Category, Estimate, Line, Traffic
from infra.keys import operator_public_key
from infra.prices import HOURS_PER_MONTH, PRICES, price
from infra.sweep import SWEEP_MINUTES
from infra.userdata import GUARD_FRACTION

SWEEP_MEMORY_MB = 128
from training.arms import kind as arm_kind
from training.config import ConfigError, resolve

GB = 1e9


class BudgetError(UserError, ValueError):
    """The plan does not fit: the message holds the whole estimate table."""


class StackConfigError(UserError, ValueError):
    """A stack config's `trials:cluster` that does not validate: one line per key, naming the fix."""


class Strict(BaseModel):
    # an infinite budget or guard is a typo, never a plan
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def is_zone_id(zone: str) -> bool:
    """A zone ID (use1-az4: the same physical zone in every account), not a zone name (us-east-1c)."""
    return bool(re.fullmatch(r"[a-z]+[0-9]+-az[0-9]+", zone))


class Host(Strict):
    rank: int = Field(ge=0)
    instance_type: str
    # a zone name (us-east-1c) or, better, a zone ID (use1-az4): in us-east-1 and a few other regions a
    # name maps to a different physical zone in each account, an ID to the same one everywhere
    zone: str = Field(pattern=r"^[a-z0-9-]{4,32}$")

    @property
    def zone_is_id(self) -> bool:
        return is_zone_id(self.zone)


_DIRECTIONS = {"east": "e", "west": "w", "north": "n", "south": "s", "central": "c", "southeast": "se",
               "northeast": "ne", "southwest": "sw", "northwest": "nw"}


def zone_id_prefix(region: str) -> str | None:
    """The AZ-ID prefix AWS uses for a region (us-east-1 → use1, ap-southeast-2 → apse2), or None for a
    region whose name does not follow the pattern."""
    m = re.fullmatch(r"([a-z]{2})-([a-z]+)-(\d+)", region)
    if m is None or m.group(2) not in _DIRECTIONS:
        return None
    return f"{m.group(1)}{_DIRECTIONS[m.group(2)]}{m.group(3)}"


class Volume(Strict):
    size_gib: int = Field(300, ge=8)
    throughput_mb_s: int = Field(250, ge=125, le=2000)
    iops: int = Field(3000, ge=3000, le=80000)
    read_ahead_kib: int = Field(4096, ge=0)


class Budget(Strict):
    total_usd: float = Field(gt=0)
    compute_usd: float = Field(ge=0)
    transfer_usd: float = Field(ge=0)
    storage_other_usd: float = Field(ge=0)
    alert_email: str | None = None

    @model_validator(mode="after")
    def _split_fits(self) -> "Budget":
        if self.compute_usd + self.transfer_usd + self.storage_other_usd > self.total_usd + 1e-9:
            raise ValueError(f"the reservations ({self.compute_usd} + {self.transfer_usd} + "
                             f"{self.storage_other_usd}) exceed the budget {self.total_usd}")
        return self


class Arm(Strict):
    name: str
    kind: str  # a key of training.arms.KINDS
    world_size: int = Field(ge=1)
    updates: int = Field(ge=1)
    sync_every: int | None = Field(None, ge=1)  # DiLoCo's H
    payload_bytes_per_sync: int | None = Field(None, ge=0)  # required for powersgd (measured)

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        arm_kind(v)
        return v


def experiment_arms(experiment: str, profile: str, measured: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """The arms a stack plans for `experiment` at `profile`, read from the experiment's own file (the one
    `orchestrate run` trains from): every arm that trains, its kind and ranks, the profile's updates and the
    settings its kind runs with (`Resolved.arm_settings`: DiLoCo's H as the profile scales it); what only a
    measurement gives (PowerSGD's payload per update) from `measured`, keyed by arm name."""
    try:
        r = resolve(experiment, profile)
    except ConfigError as e:
        raise ValueError(f"experiment {experiment} at profile {profile}: {e}") from None
    trains = {a.name for a in r.experiment.arms if arm_kind(a.kind).trains}
    unknown = sorted(set(measured) - trains)
    if unknown:
        raise ValueError(f"measured names no arm of {experiment} that trains: {', '.join(unknown)} "
                         f"(its arms: {', '.join(sorted(trains))})")
    out = []
    for a in r.experiment.arms:
        if a.name not in trains:
            continue
        settings = r.arm_settings(a)
        out.append({"name": a.name, "kind": a.kind, "world_size": a.world_size, "updates": r.profile.updates,
                    **({"sync_every": settings["sync_every"]} if settings.get("sync_every") is not None else {}),
                    **measured.get(a.name, {})})
    return out


ACTIONS_PER_BUDGET = 10
"""AWS Budgets' quota of actions per budget (Budgets' quotas page): each host's spend stop is one, so the stops of
ranks 10g … 10g+9 go on the trial's budget g (`budget_group`; infra/guards.py), every budget on the same spend."""


def budget_group(rank: int) -> int:
    """The budget a host's spend stop goes on: by rank, so adding or dropping hosts never moves another's stop
    (a stop moved to another budget would be replaced: deleted, which an unpreserved trial refuses)."""
    return rank // ACTIONS_PER_BUDGET


def budget_label(trial: str, group: int) -> str:
    """The AWS name of the trial's budget `group` (`status` reads the first one's spend by this name)."""
    return f"{trial}-budget" if group == 0 else f"{trial}-budget-{group}"


def budget_groups(ranks: Any) -> list[int]:
    """The trial's budgets (0: `<trial>-budget`, g > 0: `<trial>-budget-<g>`) for hosts of these ranks."""
    return sorted({budget_group(r) for r in ranks} | {0})


class TrialConfig(Strict):
    """`trials:cluster` in the stack config (see Pulumi.dev.yaml). The arms are named once: `experiment`
    (and `profile`) read them from the experiment's file; `arms` written out is for a stack that plans
    arms of no experiment file (the two together are refused: one would silently differ from the other)."""

    trial: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{2,40}$")
    region: str
    hosts: list[Host] = Field(min_length=1)
    volume: Volume = Volume()
    operator_cidr: str
    allow_ssh_from_anywhere: bool = False
    deadline: dt.datetime | None = None  # UTC; the cloud-side stop fires then (required: `deadline_problems`)
    hours: float = Field(gt=0)  # the compute the budget pays for; the deadline may not be later
    budget: Budget
    transfer_guard_bytes: float = Field(gt=0)  # per isolated-zone host, receive + transmit
    # the share of the guard at which the controller stops the group (before the host's own guard and the
    # alarm stop the host): one number, read by the plan, the controller (through the outputs) and the host
    guard_fraction: float = Field(GUARD_FRACTION, gt=0, le=1)
    # what the kernel's counters see beyond the ring's payload (TCP/IP and Ethernet headers, ACKs, NCCL's
    # own messages): ~0.7 % of a 9001-byte VPC frame plus ACKs; 2 % leaves room for retransmits
    protocol_overhead: float = Field(0.02, ge=0, le=1)
    # days the stopped hosts' volumes keep billing after the deadline until `orchestrate down` (EBS bills a
    # volume while its instance is stopped)
    stopped_days: float = Field(1.0, ge=0)
    # the longest grace `orchestrate start --grace` may grant after the deadline (to preserve what a host still
    # holds): the cloud's sweep and each host's own check honour no longer one (infra/sweep.py); 0: none
    grace_cap_minutes: float = Field(60, ge=0, le=24 * 60)
    # how the budget finds the trial's cost: "region" (the account's spend in the region from the day of
    # `pulumi up` — counts other work too, so it stops early, never late), "tag" (the trial=<name> cost-
    # allocation tag, which must already be active: activation works only on a key billing has seen, up to
    # 24 h after first use, and only in a management or standalone account), or "tag-activate" (the
    # program also activates it — an account where the key is already known)
    budget_filter: Literal["region", "tag", "tag-activate"] = "region"
    ami_id: str | None = Field(None, pattern=r"^ami-[0-9a-f]{8,17}$")  # pin the image (else looked up once, then kept)
    parameters: int = Field(ge=1)  # model parameters synchronized by the distributed arms
    experiment: str | None = None  # the study this stack runs: its arms come from config/experiments/<name>.toml
    profile: str = "gpu"  # the experiment's profile: its updates and the settings it scales
    measured: dict[str, dict[str, int]] = {}  # per arm, what only a measurement gives: payload_bytes_per_sync
    arms: list[Arm] = Field(min_length=1)
    evidence_gb: float = Field(50, ge=0)  # what the evidence bucket is expected to hold
    object_lock_days: int | None = Field(None, ge=1)
    # the PyTorch deep-learning AMI on Ubuntu 24.04, the line AWS still releases for x86_64 (the Ubuntu
    # 22.04 one ended at PyTorch 2.7); its environment's Python (python_location in the release notes)
    # runs the project. Its torch is not the pinned one, so the wheelhouse carries torch and its CUDA
    # libraries, built for `host_python_version` on `host_platform` (Ubuntu 24.04: glibc 2.39): `orchestrate
    # wheelhouse`, checked by `plan --wheelhouse`; staging refuses, naming the host, an interpreter that is
    # missing or too old, and wheels for another Python, before uploading anything (docs/aws.md #31)
    ami_name: str = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 24.04)*"
    host_python: str = Field("/opt/pytorch/bin/python", pattern=r"^[A-Za-z0-9._/+-]+$")
    host_python_version: str = Field("3.12", pattern=r"^3\.\d{1,2}$")
    host_platform: str = Field("manylinux_2_39_x86_64", pattern=r"^manylinux_2_\d{1,2}_x86_64$")
    ssh_user: str = "ubuntu"
    ssh_public_key: str | None = None  # the operator's OpenSSH public key, text or path (required: `key_problems`)
    abandon_unpreserved: bool = False  # let `pulumi destroy` delete hosts whose trial is not preserved (recorded)
    prices: dict[str, float] = {}

    @field_validator("ssh_public_key")
    @classmethod
    def _ssh_key(cls, v: str | None) -> str | None:
        return None if v is None else operator_public_key(v)

    @field_validator("prices")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        for k, usd in v.items():
            if k not in PRICES and not k.startswith("instance/"):
                raise ValueError(f"prices: no price {k!r} to override (known: {', '.join(sorted(PRICES))}, or "
                                 "instance/<type> for an instance type of your own)")
            if usd < 0:
                raise ValueError(f"prices: {k} = {usd} is negative")
        return v

    @field_validator("operator_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        ipaddress.ip_network(v, strict=False)
        return v

    @field_validator("deadline")
    @classmethod
    def _utc(cls, v: dt.datetime | None) -> dt.datetime | None:
        if v is None:
            return v
        if v.tzinfo is None:
            raise ValueError("give the deadline with a timezone, e.g. 2026-12-01T03:00:00Z")
        return v.astimezone(dt.timezone.utc)

    @model_validator(mode="before")
    @classmethod
    def _arms_of_the_experiment(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("experiment") is None:
            return data
        if data.get("arms") is not None:
            raise ValueError(f"give experiment ({data['experiment']}: its arms come from its file) or arms, not both")
        profile = data.get("profile", cls.model_fields["profile"].default)
        return {**data, "arms": experiment_arms(data["experiment"], profile, data.get("measured") or {})}

    @model_validator(mode="after")
    def _consistent(self) -> "TrialConfig":
        require_ranks(h.rank for h in self.hosts)
        for h in self.hosts:  # a type is priced by infra/prices.py or by the stack; its facts may be unknown
            if f"instance/{h.instance_type}" not in PRICES and f"instance/{h.instance_type}" not in self.prices:
                raise ValueError(f"unknown instance type {h.instance_type!r} (known: "
                                 f"{', '.join(sorted(k.removeprefix('instance/') for k in PRICES if k.startswith('instance/')))}): "
                                 f"add its price and facts to infra/prices.py, or give its hourly price in the stack "
                                 f"(prices: {{instance/{h.instance_type}: USD}})")
        prefix = zone_id_prefix(self.region)
        for h in self.hosts:
            if h.zone_is_id and (prefix is None or not h.zone.startswith(f"{prefix}-az")):
                raise ValueError(f"host {h.rank}'s zone ID {h.zone} is not in region {self.region} (its IDs are "
                                 f"{prefix or '?'}-az<N>)")
            if not h.zone_is_id and not h.zone.startswith(self.region):
                raise ValueError(f"host {h.rank}'s zone {h.zone} is not in region {self.region}")
        if len({h.zone_is_id for h in self.hosts}) > 1:
            raise ValueError("give every host's zone as a name (us-east-1c) or every one as an ID (use1-az4), not "
                             "both: a name and an ID may be the same physical zone, which the traffic model must know")
        if ipaddress.ip_network(self.operator_cidr, strict=False).prefixlen == 0 and not self.allow_ssh_from_anywhere:
            raise ValueError(f"operator_cidr {self.operator_cidr} opens SSH to the whole internet; give your own "
                             "address (x.x.x.x/32) or set allow_ssh_from_anywhere: true knowingly")
        for a in self.arms:
            if a.world_size > len(self.hosts):
                raise ValueError(f"arm {a.name} needs {a.world_size} hosts; the stack has {len(self.hosts)}")
            for setting, why in arm_kind(a.kind).plan_needs.items():
                if getattr(a, setting) is None:
                    raise ValueError(f"arm {a.name}: give {setting} ({why})")
        return self

    @property
    def by_rank(self) -> list[Host]:
        return sorted(self.hosts, key=lambda h: h.rank)

    def isolated_ranks(self) -> list[int]:
        """Hosts outside the zone holding the most hosts (ties: rank 0's zone): every byte they
        exchange with the group crosses zones."""
        counts = Counter(h.zone for h in self.hosts)
        best = max(counts.values())
        main = next(h.zone for h in self.by_rank if counts[h.zone] == best)
        return [h.rank for h in self.by_rank if h.zone != main]


def trial_config(cluster: Any, region: str, where: str = "the stack config") -> TrialConfig:
    """`trials:cluster` (and `aws:region`) as `pulumi up` and `orchestrate plan` both read them, refused in
    the same words by both: one line per problem, as `where: trials:cluster.KEY: …` (`evidence.schema.problems`)."""
    data = {**cluster, "region": region} if isinstance(cluster, dict) else cluster
    try:
        return TrialConfig.model_validate(data)
    except ValidationError as e:
        raise StackConfigError("\n".join(f"{where}: {line}" for line in problems(
            e.errors(), TrialConfig, data, root="trials:cluster"))) from None


def arm_traffic(cfg: TrialConfig, arm: Arm) -> Traffic:
    """Synchronizations, bytes per host and cross-zone bytes of one arm (see the module docstring)."""
    n = arm.world_size
    if n == 1:
        syncs, payload = 0, 0
    else:
        payload = arm.payload_bytes_per_sync if arm.payload_bytes_per_sync is not None else 4 * cfg.parameters
        syncs = arm_kind(arm.kind).synchronizations(arm.updates, arm)
    link = 2 * (n - 1) / n * payload * syncs if n > 1 else 0.0  # bytes over each ring link
    zones = [h.zone for h in cfg.by_rank[:n]]
    crossing = sum(zones[r] != zones[(r + 1) % n] for r in range(n)) if n > 1 else 0
    return Traffic(arm=arm.name, kind=arm.kind, world_size=n, synchronizations=syncs, payload_bytes_per_sync=payload,
                   host_bytes_rx_plus_tx=2 * link, cross_zone_links=crossing, cross_zone_bytes=crossing * link)


def key_problems(cfg: TrialConfig) -> list[str]:
    """Without the operator's key the hosts are created and nobody can log in to them."""
    if cfg.ssh_public_key is None:
        return ["no ssh_public_key: set trials:cluster.ssh_public_key to your OpenSSH public key, its text or the "
                "path of the .pub file (`pulumi config set --path trials:cluster.ssh_public_key ~/.ssh/id_ed25519.pub`); "
                "every host accepts that key for its login user"]
    return []


HOST_CREATION = dt.timedelta(minutes=10)
"""How long an `up` that creates hosts may take to reach them: its IAM roles, network and guards first (the
hosts depend on the stop), then `RunInstances` and the wait for `running`, a create refused and retried."""
DEADLINE_MARGIN = dt.timedelta(minutes=20)
"""What a trial needs beyond its hosts' creation before the deadline can be worth reaching: keys pinned,
staging, one arm's first updates. A deadline closer than creation + margin would stop the hosts while an
`up` still creates them, or before anything could run on them."""


def deadline_lead_problems(cfg: TrialConfig, now: dt.datetime, creating: list[int] | None = None) -> list[str]:
    """An `up` that creates hosts must leave them `HOST_CREATION` + `DEADLINE_MARGIN` before the deadline.
    `creating`: the ranks the `up` would create (the program knows them from its look-up); None: every rank (what
    `orchestrate plan` assumes, looking nothing up). An `up` that creates no host — the same hosts kept, a guard's
    stop undone by `orchestrate start` — is not held to it."""
    ranks = [h.rank for h in cfg.by_rank] if creating is None else sorted(creating)
    if cfg.deadline is None or not ranks or cfg.deadline <= now:
        return []  # no deadline or a past one: `deadline_problems` says so
    lead = HOST_CREATION + DEADLINE_MARGIN
    if cfg.deadline - now >= lead:
        return []
    earliest = (now + lead + dt.timedelta(seconds=59)).replace(second=0, microsecond=0)
    return [f"the deadline {cfg.deadline.isoformat()} is {(cfg.deadline - now).total_seconds() / 60:,.1f} min away: an "
            f"`up` that creates host(s) (rank {', '.join(map(str, ranks))}) needs {lead.total_seconds() / 60:.0f} min before "
            f"it ({HOST_CREATION.total_seconds() / 60:.0f} min to create them, {DEADLINE_MARGIN.total_seconds() / 60:.0f} min "
            f"to use them) — the earliest deadline it accepts now is {earliest:%Y-%m-%dT%H:%M:00Z} "
            f"(`pulumi config set --path trials:cluster.deadline {earliest:%Y-%m-%dT%H:%M:00Z}`), at most {cfg.hours:g} h away"]


def sweep_usd_per_day(cfg: TrialConfig) -> tuple[float, list[tuple[str, float, str]]]:
    """What the deadline stop costs a day once it runs (from the deadline until `pulumi destroy`): one Scheduler
    invocation and one Lambda run a minute (infra/sweep.py), whose time grows with the hosts it looks at (one
    `DescribeInstances` page; a stop call for those it finds running). Priced as if no free tier applied.
    Returns the total and its parts (key, quantity a day, what)."""
    runs = 24 * 60 / SWEEP_MINUTES
    seconds = 0.4 + 0.02 * len(cfg.hosts)  # a run's billed time: Lambda start, one page of instances, a publish
    parts = [("scheduler/invocation", runs, "Scheduler invocations"), ("lambda/request", runs, "Lambda requests"),
             ("lambda/gb-second", runs * seconds * SWEEP_MEMORY_MB / 1024,
              f"Lambda GB-seconds ({SWEEP_MEMORY_MB} MB x {seconds:.2f} s a run for {len(cfg.hosts)} hosts)"),
             ("cloudwatch/alarm", 2 * 12 / 365, "its 2 failure alarms (a day's share of a month)")]
    return sum(q * price(k, cfg.prices).usd for k, q, _ in parts), parts


def stopped_volume_usd_per_day(cfg: TrialConfig) -> float:
    """What every host's volume bills a day while the host is stopped (storage, and throughput and IOPS above
    gp3's baseline): what the deadline stop's alert names once the planned `stopped_days` have passed."""
    v, n, day = cfg.volume, len(cfg.hosts), 24 / HOURS_PER_MONTH
    usd = n * v.size_gib * 2**30 / GB * price("ebs/gp3-storage", cfg.prices).usd * day
    usd += n * max(v.throughput_mb_s - 125, 0) * price("ebs/gp3-throughput", cfg.prices).usd * day
    usd += n * max(v.iops - 3000, 0) * price("ebs/gp3-iops", cfg.prices).usd * day
    return round(usd, 4)


def deadline_problems(cfg: TrialConfig, now: dt.datetime) -> list[str]:
    """The cloud stop must be set, come in the future, and no later than the hours the budget pays for."""
    if cfg.deadline is None:
        example = (now + dt.timedelta(hours=cfg.hours)).replace(second=0, microsecond=0)
        return [f"no deadline: set trials:cluster.deadline to the UTC time the cloud must stop the hosts, at most "
                f"{cfg.hours:g} h (hours) after `pulumi up` — e.g. deadline: \"{example:%Y-%m-%dT%H:%M:00Z}\" for an "
                "up now (`pulumi config set --path trials:cluster.deadline ...`)"]
    left = (cfg.deadline - now).total_seconds() / 3600
    if left <= 0:
        return [f"the deadline {cfg.deadline.isoformat()} has passed: set trials:cluster.deadline to a time at most "
                f"{cfg.hours:g} h from now"]
    if left > cfg.hours + 1e-9:
        return [f"the deadline is {left:.2f} h away but the budget pays for {cfg.hours:g} h of compute: move the "
                "deadline earlier or raise hours (and the compute reservation)"]
    return []


def staging_bytes_per_host(cfg: TrialConfig, wheelhouse_bytes: int = 0) -> int:
    """What staging sends to every host before it trains: the seed (FP32, 4 bytes a parameter) and the
    wheelhouse. An isolated host's guard counts these bytes too (its counters see every interface)."""
    return 4 * cfg.parameters + wheelhouse_bytes


def estimate(cfg: TrialConfig, now: dt.datetime, *, wheelhouse_bytes: int = 0,
             creating: list[int] | None = None) -> Estimate:
    """The table: every line with quantity, unit price and source; totals per reservation; and every
    problem that refuses the plan — the same list for `orchestrate plan`/`estimate` and `pulumi up`.
    `creating`: the ranks an `up` creates (`deadline_lead_problems`; None: all)."""
    lines: list[Line] = []

    def line(category: Category, item: str, qty: float, key: str, factor: float = 1.0) -> None:
        p = price(key, cfg.prices)
        lines.append(Line(category=category, item=item, quantity=qty, unit=p.unit, unit_usd=p.usd,
                          usd=qty * p.usd * factor, source=f"{p.source} ({p.as_of})"))

    for t, n in sorted(Counter(h.instance_type for h in cfg.hosts).items()):
        line("compute", f"{n} x {t} x {cfg.hours:g} h", n * cfg.hours, f"instance/{t}")
    months = cfg.hours / HOURS_PER_MONTH
    v, n = cfg.volume, len(cfg.hosts)
    line("storage_other", f"{n} x {v.size_gib} GiB gp3 for {cfg.hours:g} h", n * v.size_gib * 2**30 / GB,
         "ebs/gp3-storage", months)
    if v.throughput_mb_s > 125:
        line("storage_other", f"{n} x {v.throughput_mb_s - 125} MB/s gp3 throughput above 125",
             n * (v.throughput_mb_s - 125), "ebs/gp3-throughput", months)
    if v.iops > 3000:
        line("storage_other", f"{n} x {v.iops - 3000} gp3 IOPS above 3000", n * (v.iops - 3000), "ebs/gp3-iops", months)
    # after the deadline the hosts are stopped, not gone: their volumes bill until `orchestrate down`
    stopped = cfg.stopped_days * 24 / HOURS_PER_MONTH
    if cfg.stopped_days:
        line("storage_other", f"stopped: {n} x {v.size_gib} GiB gp3 for {cfg.stopped_days:g} d until down",
             n * v.size_gib * 2**30 / GB, "ebs/gp3-storage", stopped)
        if v.throughput_mb_s > 125:
            line("storage_other", f"stopped: {n} x {v.throughput_mb_s - 125} MB/s above 125 for {cfg.stopped_days:g} d",
                 n * (v.throughput_mb_s - 125), "ebs/gp3-throughput", stopped)
        if v.iops > 3000:
            line("storage_other", f"stopped: {n} x {v.iops - 3000} IOPS above 3000 for {cfg.stopped_days:g} d",
                 n * (v.iops - 3000), "ebs/gp3-iops", stopped)
    # the deadline stop runs every minute from the deadline until the stack is destroyed: priced for the days the
    # stopped hosts are planned to stay (the volumes' days above); per day in the line's words
    if cfg.stopped_days:
        per_day, _ = sweep_usd_per_day(cfg)
        lines.append(Line(category="storage_other", item=f"deadline stop after the deadline: ${per_day:.4f}/d x "
                          f"{cfg.stopped_days:g} d", quantity=cfg.stopped_days, unit="day", unit_usd=per_day,
                          usd=per_day * cfg.stopped_days,
                          source="Scheduler each minute + Lambda (infra/plan.py sweep_usd_per_day; "
                                 "infra/prices.py, 2026-12)"))
    # past ten hosts the spend stops need more budgets (10 actions each); every action-enabled budget bills per day
    # it exists once the account's free 62 budget-days of the month are used. The trial's first budget is taken
    # as within them (as before #68); the others are priced for every calendar day from the `up` to the destroy
    # (one more than the span, which may start late in a day)
    extra = len(budget_groups(h.rank for h in cfg.hosts)) - 1
    if extra:
        days = math.ceil(cfg.hours / 24 + cfg.stopped_days) + 1
        line("storage_other", f"{extra} more action-enabled budget(s) for the spend stops past "
             f"{ACTIONS_PER_BUDGET} hosts x {days} d", extra * days, "budgets/action-enabled-budget-day")
    # an auto-assigned public IPv4 address bills per hour while its host runs (released at stop)
    line("storage_other", f"{n} public IPv4 addresses x {cfg.hours:g} h", n * cfg.hours, "vpc/public-ipv4")
    line("storage_other", f"evidence bucket, {cfg.evidence_gb:g} GB for a month", cfg.evidence_gb,
         "s3/standard-storage")
    traffic = [arm_traffic(cfg, a) for a in cfg.arms]
    for t in traffic:
        if t.cross_zone_bytes:
            gb = t.cross_zone_bytes / GB
            line("transfer", f"{t.arm}: {gb:,.1f} GB cross-zone, out", gb, "transfer/cross-zone-out")
            line("transfer", f"{t.arm}: {gb:,.1f} GB cross-zone, in", gb, "transfer/cross-zone-in")
    totals = ByReservation(**{c: sum(x.usd for x in lines if x.category == c)
                              for c in ("compute", "transfer", "storage_other")})
    reserved = ByReservation(compute=cfg.budget.compute_usd, transfer=cfg.budget.transfer_usd,
                             storage_other=cfg.budget.storage_other_usd)
    total = sum(usd for _, usd in totals.items())
    isolated = cfg.isolated_ranks()
    per_host = {r: sum(t.host_bytes_rx_plus_tx for t in traffic if r < t.world_size) for r in isolated}
    staged = staging_bytes_per_host(cfg, wheelhouse_bytes)
    # what the host's counters will show: the ring's bytes with protocol overhead, plus staging
    planned = {r: b * (1 + cfg.protocol_overhead) + staged for r, b in per_host.items()}
    stop_at = cfg.guard_fraction * cfg.transfer_guard_bytes
    problems = deadline_problems(cfg, now) + deadline_lead_problems(cfg, now, creating) + key_problems(cfg)
    problems += [f"{c}: ${usd:.2f} estimated > ${getattr(reserved, c):.2f} reserved" for c, usd in totals.items()
                 if usd > getattr(reserved, c) + 1e-9]
    if total > cfg.budget.total_usd + 1e-9:
        problems.append(f"total: ${total:.2f} estimated > ${cfg.budget.total_usd:.2f} budget")
    for r, b in planned.items():
        if b > stop_at:
            problems.append(f"host {r} (isolated zone) would move {b / 1e12:.3f} TB ({per_host[r] / 1e12:.3f} TB of "
                            f"all-reduce x {1 + cfg.protocol_overhead:g} protocol overhead + {staged / 1e9:.2f} GB "
                            f"staging) > {cfg.guard_fraction:.0%} of the {cfg.transfer_guard_bytes / 1e12:.3f} TB "
                            f"transfer guard ({stop_at / 1e12:.3f} TB), where the controller stops the trial: lower "
                            "the traffic, raise transfer_guard_bytes or guard_fraction")
    return Estimate(lines=lines, totals_usd=totals, total_usd=total, reserved_usd=reserved,
                    budget_usd=cfg.budget.total_usd, traffic=traffic, isolated_ranks=isolated,
                    isolated_host_bytes=per_host, isolated_host_planned_bytes=planned, staging_bytes_per_host=staged,
                    protocol_overhead=cfg.protocol_overhead, transfer_guard_bytes=cfg.transfer_guard_bytes,
                    guard_fraction=cfg.guard_fraction, guard_stop_bytes=stop_at, stopped_days=cfg.stopped_days,
                    problems=problems)


def table(est: Estimate) -> str:
    """The estimate as plain text (what a refusal and `orchestrate plan` print)."""
    rows = [f"{'category':<14} {'item':<52} {'quantity':>14} {'unit price':>12} {'USD':>10}"]
    for x in est.lines:
        rows.append(f"{x.category:<14} {x.item:<52} {x.quantity:>14,.3f} {x.unit_usd:>12.4f} {x.usd:>10.2f}")
    for c, v in est.totals_usd.items():
        rows.append(f"{'total ' + c:<67} {'reserved':>14} {getattr(est.reserved_usd, c):>12.2f} {v:>10.2f}")
    rows.append(f"{'total':<67} {'budget':>14} {est.budget_usd:>12.2f} {est.total_usd:>10.2f}")
    for t in est.traffic:
        rows.append(f"traffic {t.arm}: {t.synchronizations} syncs x {t.payload_bytes_per_sync:,} B; "
                    f"{t.host_bytes_rx_plus_tx / 1e12:.3f} TB rx+tx per host; "
                    f"{t.cross_zone_bytes / 1e12:.3f} TB cross-zone over {t.cross_zone_links} links")
    for r, b in est.isolated_host_bytes.items():
        p = est.isolated_host_planned_bytes[r]
        rows.append(f"isolated host {r}: {b / 1e12:.3f} TB rx+tx; with {est.protocol_overhead:.0%} protocol overhead "
                    f"and {est.staging_bytes_per_host / 1e9:.2f} GB staging {p / 1e12:.3f} TB, against the controller's "
                    f"stop at {est.guard_fraction:.0%} of the {est.transfer_guard_bytes / 1e12:.3f} TB guard = "
                    f"{est.guard_stop_bytes / 1e12:.3f} TB ({p / est.guard_stop_bytes:.1%} of it)")
    return "\n".join(rows)


def require_within_budget(cfg: TrialConfig, now: dt.datetime, creating: list[int] | None = None) -> Estimate:
    est = estimate(cfg, now, creating=creating)
    if est.problems:
        raise BudgetError("refusing to create anything — the plan does not fit:\n  "
                          + "\n  ".join(est.problems) + "\n\n" + table(est))
    return est

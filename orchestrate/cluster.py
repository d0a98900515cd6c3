"""Cluster descriptions (`cluster.json`): which hosts run which rank, how to reach them, where the
evidence goes, the deadline and the budget — from three sources:

  local    the embedded local cluster: N ranks on this machine over loopback (the default)
  hosts    SSH hosts described by hand (the test suite's namespace hosts are such a cluster)
  pulumi   a stack's outputs (`pulumi stack output --json`, shape in infra/outputs.py)

What a cluster is made of is said by its fields, never read off its source: hosts that share the
controller's cores say so (`shared_cores`).

Every description is validated the same way; a hostile or incomplete one is refused naming the field.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from evidence.canonical import write_json_atomic
from evidence.errors import UserError
from evidence.schema import explain, problems, require_ranks
from evidence.stores import STORES, PreservationError, S3Store, store_class
from infra.outputs import OutputsError, parse_outputs
from orchestrate.transport import LocalTransport, SSHTransport, Transport

CLUSTER_FORMAT = "trial-cluster-v1"


class ClusterError(UserError, ValueError):
    """A cluster description that cannot be used; the message names the field."""


class Host(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rank: int = Field(ge=0)
    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    transport: Literal["local", "ssh"]
    address: str  # how the controller reaches it
    private_address: str  # how ranks reach each other (MASTER_ADDR is rank 0's)
    zone: str | None = None
    user: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    port: int = Field(22, ge=1, le=65535)
    host_key: str | None = Field(None, pattern=r"^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/=]+$")
    root: str = Field(pattern=r"^/[A-Za-z0-9._/-]+$")  # the host's working directory
    interface: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,15}$")  # for GLOO/NCCL_SOCKET_IFNAME
    python: str = Field("python3", pattern=r"^[A-Za-z0-9._/+-]+$")  # the host's interpreter
    instance_id: str | None = Field(None, pattern=r"^i-[0-9a-f]{8,17}$")  # a stack's host: its EC2 instance

    @field_validator("address", "private_address")
    @classmethod
    def _ip(cls, v: str) -> str:
        ipaddress.ip_address(v)
        return v


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["trial-cluster-v1"] = CLUSTER_FORMAT
    source: Literal["local", "hosts", "pulumi"]
    hosts: list[Host] = Field(min_length=1)
    key_file: str | None = None  # the controller's SSH key for every ssh host
    store: str  # a URL of a registered store (evidence.stores.registry)
    deadline: dt.datetime | None = None
    budget_usd: float | None = None
    region: str | None = None
    trial: str | None = None
    transfer_guard_bytes: float | None = Field(None, gt=0)  # per guarded host, rx + tx (the cloud alarm's)
    guard_fraction: float | None = Field(None, gt=0, le=1)  # the controller stops there (the stack's; default 0.9)
    guarded_ranks: list[int] = []  # hosts in an isolated zone, whose traffic is billed and guarded
    budget_name: str | None = None  # the AWS Budgets budget that tracks the trial's spend
    alert_topic: str | None = None  # the SNS topic the budget and the transfer alarms notify
    # the longest grace after the deadline `orchestrate start --grace` may grant (the stack's); written only if set
    grace_cap_minutes: float | None = Field(None, ge=0)
    # the stack config whose AWS identity every call about this cluster uses (orchestrate/identity.py); written
    # only if known
    stack_config: str | None = None
    # every instance the stack holds beyond `hosts` (a replaced host pending deletion): not outside it (status)
    held_instances: list[str] = []
    # how staging reaches the hosts: through the trial's bucket (each artifact leaves this machine
    # once; the hosts fetch it with their own credentials) or over SSH to each host; "auto" relays on
    # a stack's cluster (its hosts have the instance role) and uses SSH elsewhere
    staging: Literal["auto", "ssh", "relay"] = "auto"
    # how long a rank runs on without hearing from its controller (which renews the lease every 5 s while
    # it reaches the host) before it stops itself at its next group checkpoint, keeping everything for a
    # resume: a controller gone for good (a laptop closed for the night) leaves nothing running for hours,
    # a blink or a reconnect costs nothing; well under a stack's deadline, the last resort
    controller_lease_s: float = Field(1800.0, ge=5)
    shared_cores: bool = Field(False, description=(
        "SSH hosts that run on the controller's own machine (network namespaces, containers) and so share its "
        "CPU cores: the controller splits the cores between the ranks (OMP_NUM_THREADS) and the gates' "
        "attainability counts them as shared. Real hosts use cores of their own (false, the default); the "
        "embedded local cluster's ranks always share this machine's. Written to cluster.json only when true."))

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Every cluster.json written before `shared_cores` existed stays the same, key for key."""
        out = handler(self)
        if not self.shared_cores:
            out.pop("shared_cores", None)
        if self.grace_cap_minutes is None:
            out.pop("grace_cap_minutes", None)
        if self.stack_config is None:
            out.pop("stack_config", None)
        if not self.held_instances:
            out.pop("held_instances", None)
        return out

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        try:
            store_class(v)  # the registry's scheme, nothing opened: the controller checks, the stages open
        except PreservationError as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Cluster":
        require_ranks(h.rank for h in self.hosts)
        if self.staging == "relay" and not store_class(self.store).staging_relay:
            relays = ", ".join(c.form for c in STORES.values() if c.staging_relay)
            raise ValueError(f"staging = relay needs the trial's bucket (a store the hosts fetch from themselves: "
                             f"{relays}), not {self.store}")
        if any(h.transport == "ssh" for h in self.hosts) and not self.key_file:
            raise ValueError("ssh hosts need key_file")
        if len({h.name for h in self.hosts}) != len(self.hosts):
            raise ValueError("two hosts share a name")
        if set(self.guarded_ranks) - {h.rank for h in self.hosts}:
            raise ValueError("guarded_ranks names a rank that is not a host")
        if self.guarded_ranks and self.transfer_guard_bytes is None:
            raise ValueError("guarded_ranks need transfer_guard_bytes")
        if self.deadline is not None and self.deadline.tzinfo is None:
            raise ValueError("deadline has no timezone")
        return self

    @property
    def by_rank(self) -> list[Host]:
        return sorted(self.hosts, key=lambda h: h.rank)

    @property
    def relay(self) -> str | None:
        """The store staging relays through, or None for SSH to each host (see `staging`)."""
        if self.staging == "relay" or (self.staging == "auto" and self.source == "pulumi"
                                       and store_class(self.store).staging_relay):
            return self.store
        return None

    def transport(self, host: Host, **kw: Any) -> Transport:
        if host.transport == "local":
            return LocalTransport(host.name)
        return SSHTransport(host.name, host.address, user=host.user, port=host.port,
                            key_file=Path(self.key_file), host_key=host.host_key, **kw)


def load(path: str | Path) -> Cluster:
    """cluster.json (`orchestrate up` writes it; for your own SSH hosts you do): refused one line per
    problem, naming the key and the fix (`evidence.schema.problems`)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ClusterError(f"{path}: {e}") from None
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ClusterError("\n".join(f"{path}: {line}" for line in problems(e.errors(), Cluster, data))) from None


def save(cluster: Cluster, path: str | Path) -> Path:
    write_json_atomic(path, json.loads(cluster.model_dump_json()))
    return Path(path)


def local_cluster(n: int, root: Path, store: str) -> Cluster:
    return Cluster(source="local", store=store, hosts=[
        Host(rank=r, name=f"local-{r}", transport="local", address="127.0.0.1", private_address="127.0.0.1",
             root=str(root)) for r in range(n)])


def pulumi_cluster(outputs: str | dict, *, key_file: str, host_keys: dict[int, str] | None = None,
                   root: str = "/opt/trial", stack_config: str | None = None) -> Cluster:
    """From `pulumi stack output --json`. Host keys are not in the outputs (the cloud cannot vouch
    for them): pass them per rank, read from each instance's console output."""

    try:
        out = parse_outputs(outputs)
    except OutputsError as e:
        raise ClusterError(str(e)) from None
    try:
        return Cluster(source="pulumi", key_file=key_file, store=S3Store.url_for(out.bucket, out.prefix),
                       deadline=out.deadline, region=out.region, trial=out.trial,
                       transfer_guard_bytes=out.transfer_guard_bytes, guarded_ranks=out.isolated_ranks,
                       guard_fraction=out.guard_fraction,
                       budget_name=out.budget_name, budget_usd=out.budget.get("total_usd") if out.budget else None,
                       alert_topic=out.alert_topic, grace_cap_minutes=out.grace_cap_minutes,
                       stack_config=stack_config,
                       held_instances=sorted({h.instance_id for h in out.instances_held} - {h.instance_id for h in out.hosts}),
                       hosts=[
                           Host(rank=h.rank, name=f"{out.trial}-{h.rank}", transport="ssh",
                                address=h.public_ip or h.private_ip, private_address=h.private_ip, zone=h.zone,
                                user=out.ssh_user, host_key=(host_keys or {}).get(h.rank), root=root,
                                python=out.host_python, instance_id=h.instance_id)
                           for h in out.hosts])
    except ValidationError as e:
        raise ClusterError(explain(e, "cluster")) from None

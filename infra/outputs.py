"""The stack outputs `orchestrate` reads (`pulumi stack output --json`), as a checked shape.

    {"format": "trial-stack-v1", "trial", "region", "deadline" (ISO, UTC), "hours", "ssh_user", "host_python",
     "bucket", "prefix" ("trials/<trial>/"), "alert_topic", "security_group",
     "transfer_guard_bytes", "guard_fraction", "grace_cap_minutes", "isolated_ranks": [r, ...], "ami", "budget": {...}, "budget_name",
     "budget_names" (every budget holding spend stops: one per ten ranks), "estimate": {...},
     "hosts": [{"rank", "instance_id", "instance_type", "zone", "private_ip", "public_ip",
                "vcpus", "ebs_baseline_mb_s", "volume_throughput_mb_s"}, ...]}

Outputs are data from a cloud account: anything missing, duplicated or out of shape is refused with
the field named, never guessed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evidence.errors import UserError
from evidence.schema import explain, require_ranks
from infra.userdata import GUARD_FRACTION

OUTPUTS_FORMAT = "trial-stack-v1"


def transfer_alarm_prefix(trial: str) -> str:
    """Every transfer alarm of a trial is named `<trial>-transfer-<rank>`: `orchestrate` finds them by
    this prefix (the program names them so, rather than letting Pulumi add a random suffix)."""
    return f"{trial}-transfer-"


class OutputsError(UserError, ValueError):
    """The stack's outputs are incomplete or hostile; the message names the field."""


class HostOut(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rank: int = Field(ge=0)
    instance_id: str = Field(pattern=r"^i-[0-9a-f]{8,17}$")
    instance_type: str
    zone: str
    private_ip: str
    public_ip: str | None = None
    vcpus: int | None = None
    ebs_baseline_mb_s: float | None = None
    volume_throughput_mb_s: float | None = None

    @field_validator("private_ip", "public_ip")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        if v is not None:
            ipaddress.ip_address(v)  # refuses host names and shell text alike
        return v


class HeldOut(BaseModel):
    model_config = ConfigDict(extra="ignore")
    instance_id: str = Field(pattern=r"^i-[0-9a-f]{8,17}$")
    rank: int | None = None


class StackOutputs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: str
    trial: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{2,40}$")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    deadline: dt.datetime
    hours: float
    ssh_user: str = Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    host_python: str = Field("python3", pattern=r"^[A-Za-z0-9._/+-]+$")  # the hosts' interpreter
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str
    alert_topic: str
    transfer_guard_bytes: float
    guard_fraction: float = Field(GUARD_FRACTION, gt=0, le=1)  # where the controller stops (infra/userdata.py)
    # the longest grace `orchestrate start --grace` may grant after the deadline; None: a stack made before graces
    grace_cap_minutes: float | None = Field(None, ge=0)
    ami: str | None = None  # the image the hosts were created with: pin it as trials:cluster.ami_id
    isolated_ranks: list[int]
    budget_name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,100}$")
    budget: dict[str, float] | None = None
    hosts: list[HostOut] = Field(min_length=1)
    # every instance the stack has held (infra/held.py), a replaced host pending deletion included; none: older stacks
    instances_held: list[HeldOut] = []

    @model_validator(mode="after")
    def _consistent(self) -> "StackOutputs":
        if self.format != OUTPUTS_FORMAT:
            raise ValueError(f"format {self.format!r} is not {OUTPUTS_FORMAT!r}")
        require_ranks(h.rank for h in self.hosts)
        if self.prefix != f"trials/{self.trial}/":
            raise ValueError(f"prefix {self.prefix!r} is not this trial's (trials/{self.trial}/)")
        if len({h.instance_id for h in self.hosts}) != len(self.hosts):
            raise ValueError("two hosts share an instance id")
        if self.deadline.tzinfo is None:
            raise ValueError("deadline has no timezone")
        return self


def parse_outputs(text: str | dict[str, Any]) -> StackOutputs:
    try:
        data = json.loads(text) if isinstance(text, str) else text
        return StackOutputs.model_validate(data)
    except json.JSONDecodeError as e:
        raise OutputsError(f"stack outputs are not JSON: {e}") from None
    except ValidationError as e:
        raise OutputsError(f"stack outputs refused: {explain(e, 'outputs')}") from None


PASSPHRASE_VARS = ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE")


def stack_file(stack: str, work_dir: str | Path = ".") -> Path:
    """`Pulumi.<stack>.yaml` of a stack (`org/project/name` → its name), in the project's `stackConfigDir`
    when Pulumi.yaml sets one."""
    import yaml  # start-up: ~30 ms, paid only where a stack file is read (orchestrate parses outputs without it)

    root = Path(work_dir)
    project = root / "Pulumi.yaml"
    config_dir = (yaml.safe_load(project.read_text()) or {}).get("stackConfigDir") if project.exists() else None
    return root / (config_dir or ".") / f"Pulumi.{stack.rsplit('/', 1)[-1]}.yaml"


def passphrase_problem(stack: str, work_dir: str | Path = ".", environ: dict[str, str] | None = None) -> str | None:
    """Why reading `stack`'s outputs would fail for want of its passphrase, or None. A stack whose secrets
    provider is a passphrase (the default on a self-managed backend: file://, s3://…) records
    `encryptionsalt` in its stack file (pulumi/pulumi `sdk/go/common/workspace/project.go`, ProjectStack), and
    the CLI run by the Automation API — `pulumi stack output --json --show-secrets` — cannot prompt for it:
    it reads PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE (`pkg/secrets/passphrase/manager.go`)."""
    import yaml  # start-up: ~30 ms, paid only where a stack file is read (orchestrate parses outputs without it)

    env = os.environ if environ is None else environ
    path = stack_file(stack, work_dir)
    try:
        conf = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None  # no stack file here: the CLI says what it finds
    provider = conf.get("secretsprovider") or "passphrase"
    if not conf.get("encryptionsalt") or provider != "passphrase":
        return None
    if env.get("PULUMI_CONFIG_PASSPHRASE") is not None:
        return None
    given = env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if given:
        return None if Path(given).expanduser().is_file() else \
            f"PULUMI_CONFIG_PASSPHRASE_FILE names {given}, which is not a file"
    return (f"stack {stack!r} keeps its secrets with a passphrase ({path.name} has an encryptionsalt), and reading "
            "its outputs (`pulumi stack output --show-secrets`, through the Automation API) needs it without a "
            "prompt: export PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE, a file holding it) as for "
            "`pulumi up`")


def read_stack_outputs(stack: str, work_dir: str | Path = ".") -> dict[str, Any]:
    """A stack's outputs through Pulumi's Automation API, which drives the `pulumi` CLI: without the
    CLI on PATH, say how to save them where it is, for `--pulumi-outputs`; on a passphrase-kept stack
    without the passphrase in the environment, name the variable before the CLI fails on it."""
    if shutil.which("pulumi") is None:
        raise OutputsError(f"reading stack {stack!r} needs the pulumi CLI on PATH (Pulumi's Automation API drives "
                           f"it); without it, save the outputs where the CLI is — `pulumi stack output --json "
                           f"--stack {stack} > outputs.json` — and pass --pulumi-outputs outputs.json")
    problem = passphrase_problem(stack, work_dir)
    if problem:
        raise OutputsError(problem)
    from pulumi import automation as auto  # optional: pulumi (the `infra` extra, ~0.3 s) only where the CLI is

    try:
        return {k: v.value for k, v in auto.select_stack(stack_name=stack, work_dir=str(work_dir)).outputs().items()}
    except Exception as e:  # noqa: BLE001 — the CLI's refusal, a version it cannot use, a workspace it cannot read
        raise OutputsError(f"pulumi could not read stack {stack!r} ({type(e).__name__}): {str(e).strip()[-600:]}; "
                           f"`pulumi stack output --json --stack {stack} > outputs.json` and --pulumi-outputs "
                           "outputs.json read the same outputs") from None

"""The stack's own AWS identity, for the calls the program makes itself: the delete hooks' preservation
check and the `pulumi up` check of the hosts it would change (infra/teardown.py).

Why not boto3's default chain. Pulumi's AWS provider authenticates from the stack's `aws:` config first:
static keys, then a profile, then the environment, then an assumed-role chain on top (pulumi-aws
`provider/config.go`; hashicorp/aws-sdk-go-base `aws_config.go` and `credentials.go`: static keys in the
provider config win outright, a `profile` there beats `AWS_PROFILE` and the environment's keys, and
`assumeRoles` are assumed in order, each with the previous one's credentials). A hook that used boto3's
default chain would speak for another identity, or for none: a stack that authenticates only through its
config could never be destroyed. So the hooks build their session from the same keys, in the same order:

  aws:accessKey / aws:secretKey / aws:token     static credentials (then nothing else is consulted)
  aws:profile                                   a named profile (beats the environment's keys)
  aws:sharedCredentialsFiles, sharedConfigFiles where profiles are read (one file each here)
  aws:assumeRoles                               [{roleArn, sessionName, externalId, duration, policy,
                                                  policyArns, sourceIdentity, tags, transitiveTagKeys}]
  aws:region                                    else AWS_REGION / AWS_DEFAULT_REGION
  aws:endpoints                                 [{"s3": url, "ec2": url, "sts": url}] per service

(pulumi-aws 7 refuses the singular `aws:assumeRole`; so does this.) Values arrive as the language host
hands config to the program: strings, lists and objects as JSON text (tests/pulumi_engine.py `config_env`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Mapping

import boto3
import botocore.session
from pulumi.runtime.config import get_config
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evidence.errors import UserError

KEYS = ("region", "profile", "accessKey", "secretKey", "token", "sharedCredentialsFiles", "sharedConfigFiles",
        "assumeRoles", "endpoints")
UNSUPPORTED = {"assumeRole": "pulumi-aws 7 does not read it: set aws:assumeRoles, a list",
               "assumeRoleWithWebIdentity": "the program's own checks cannot take that identity",
               "sharedCredentialsFile": "give aws:sharedCredentialsFiles, a list",
               "stsRegion": "the program's own checks call STS in aws:region"}
"""Keys that would change who the provider is, which the checks do not read: refused rather than ignored,
since a check speaking as someone else would find none of the stack's hosts."""


class CredentialsError(UserError, ValueError):
    """The stack's `aws:` config cannot give a session; the message names the key."""


def go_duration_s(text: str) -> int:
    """A Go duration ("1h", "15m", "1h30m", "900s") in whole seconds, as the provider reads `duration`."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not text.strip() or parts is None:
        raise ValueError(f"duration {text!r} is not a Go duration such as 1h or 15m")
    h, m, s = (int(p or 0) for p in parts.groups())
    return h * 3600 + m * 60 + s


class AssumeRole(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    role_arn: str = Field(alias="roleArn", pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+")
    session_name: str | None = Field(None, alias="sessionName")
    external_id: str | None = Field(None, alias="externalId")
    duration: str | None = None
    policy: str | None = None
    policy_arns: list[str] = Field([], alias="policyArns")
    source_identity: str | None = Field(None, alias="sourceIdentity")
    tags: dict[str, str] = {}
    transitive_tag_keys: list[str] = Field([], alias="transitiveTagKeys")

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            go_duration_s(v)
        return v

    def request(self) -> dict[str, Any]:
        """STS AssumeRole's parameters for this role."""
        r: dict[str, Any] = {"RoleArn": self.role_arn, "RoleSessionName": self.session_name or "trials-program"}
        if self.external_id:
            r["ExternalId"] = self.external_id
        if self.duration:
            r["DurationSeconds"] = go_duration_s(self.duration)
        if self.policy:
            r["Policy"] = self.policy
        if self.policy_arns:
            r["PolicyArns"] = [{"arn": a} for a in self.policy_arns]
        if self.source_identity:
            r["SourceIdentity"] = self.source_identity
        if self.tags:
            r["Tags"] = [{"Key": k, "Value": v} for k, v in self.tags.items()]
        if self.transitive_tag_keys:
            r["TransitiveTagKeys"] = self.transitive_tag_keys
        return r


class StackAws(BaseModel):
    """The `aws:` keys of a stack that decide who the program is and where it calls."""
    model_config = ConfigDict(extra="forbid")
    region: str | None = None
    profile: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    token: str | None = None
    shared_credentials_files: list[str] = Field([], max_length=1)
    shared_config_files: list[str] = Field([], max_length=1)
    assume_roles: list[AssumeRole] = []
    endpoints: dict[str, str] = {}

    @classmethod
    def from_config(cls, raw: Mapping[str, str | None]) -> "StackAws":
        """From the stack's config values by key (`region`, `assumeRoles`, …), as strings or JSON text."""
        for key, why in UNSUPPORTED.items():
            if raw.get(key):
                raise CredentialsError(f"aws:{key} is set: {why}")

        def obj(key: str) -> Any:
            v = raw.get(key)
            if v in (None, ""):
                return None
            try:
                return json.loads(v) if isinstance(v, str) else v
            except json.JSONDecodeError:
                raise CredentialsError(f"aws:{key} is not JSON: {v[:80]!r}") from None

        endpoints: dict[str, str] = {}
        for entry in obj("endpoints") or []:  # a list of objects, service -> URL (normally one object)
            if not isinstance(entry, dict):
                raise CredentialsError(f"aws:endpoints: each entry is an object of service: URL, not {entry!r}")
            endpoints.update({str(k): str(u) for k, u in entry.items() if u})
        try:
            return cls(region=raw.get("region") or None, profile=raw.get("profile") or None,
                       access_key=raw.get("accessKey") or None, secret_key=raw.get("secretKey") or None,
                       token=raw.get("token") or None,
                       shared_credentials_files=obj("sharedCredentialsFiles") or [],
                       shared_config_files=obj("sharedConfigFiles") or [],
                       assume_roles=obj("assumeRoles") or [], endpoints=endpoints)
        except ValidationError as e:
            def where(loc: tuple) -> str:
                head, *rest = loc
                key = "aws:" + re.sub(r"_(\w)", lambda m: m[1].upper(), str(head))
                return key + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in rest)

            problems = "; ".join(f"{where(err['loc'])}: {err['msg']}" for err in e.errors())
            raise CredentialsError(f"the stack's aws: config: {problems}"
                                   + (" (one shared file of each kind is read here)" if "Files" in problems else "")
                                   ) from None


class StackSession:
    """A boto3 session that speaks as the stack's provider does: `client(service)` is the session's client
    at the stack's endpoint for that service, if the stack names one."""

    def __init__(self, session: Any, endpoints: Mapping[str, str]) -> None:
        self.session, self.endpoints = session, dict(endpoints)
        self.region_name = session.region_name

    def client(self, service: str, **kw: Any) -> Any:
        if service in self.endpoints and "endpoint_url" not in kw:
            kw["endpoint_url"] = self.endpoints[service]
        return self.session.client(service, **kw)


def open_session(stack: StackAws) -> StackSession:
    """The session `stack` describes, its assumed roles already assumed (each with the previous one)."""
    core = botocore.session.Session()
    if stack.shared_credentials_files:
        core.set_config_variable("credentials_file", os.path.expanduser(stack.shared_credentials_files[0]))
    if stack.shared_config_files:
        core.set_config_variable("config_file", os.path.expanduser(stack.shared_config_files[0]))
    region = stack.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if stack.access_key or stack.secret_key or stack.token:
        if not (stack.access_key and stack.secret_key):
            raise CredentialsError("the stack sets only one of aws:accessKey and aws:secretKey")
        base = boto3.Session(aws_access_key_id=stack.access_key, aws_secret_access_key=stack.secret_key,
                             aws_session_token=stack.token, region_name=region, botocore_session=core)
    elif stack.profile:  # botocore leaves the environment's keys out once a profile is named, as the provider does
        base = boto3.Session(profile_name=stack.profile, region_name=region, botocore_session=core)
    else:
        base = boto3.Session(region_name=region, botocore_session=core)
    session = StackSession(base, stack.endpoints)
    for role in stack.assume_roles:
        c = session.client("sts").assume_role(**role.request())["Credentials"]
        session = StackSession(boto3.Session(aws_access_key_id=c["AccessKeyId"], aws_secret_access_key=c["SecretAccessKey"],
                                             aws_session_token=c["SessionToken"], region_name=region), stack.endpoints)
    return session


def stack_config() -> dict[str, str | None]:
    """The running program's `aws:` config values (read raw: a secret key's value is a secret here too, and the
    program only hands it to boto3)."""
    return {k: get_config(f"aws:{k}") for k in (*KEYS, *UNSUPPORTED)}


def session_factory(raw: dict[str, str | None] | None = None) -> Callable[[], StackSession]:
    """Reads the stack's config now; parses it and opens the session when first called (a check may never
    run, and a setting it cannot use must not stop an `up` that needs no check), then keeps it."""
    opened: list[StackSession] = []
    raw = stack_config() if raw is None else raw

    def get() -> StackSession:
        if not opened:
            opened.append(open_session(StackAws.from_config(raw)))
        return opened[0]

    return get

"""Who `orchestrate` is on AWS: the stack's own identity wherever a stack config is known, as the program's checks
are (infra/credentials.py), else boto3's default chain — and a refusal, never a traceback, where none resolves.

Why. `down`, `status`, `up`, `start`, `plan` and the budget a run reads each made a `boto3.Session(region_name=…)`:
the environment's keys, profile or role. Where those point at another account than the stack's (a second
project's keys exported in the shell), `down` stopped nothing and said "stopped 0 instance(s)", `status` found no
host, and `up` refused hosts it could not see; where there were none, a traceback. The stack config names the
identity the provider uses (`aws:accessKey`/`secretKey`/`token`, `aws:profile` and its files, `aws:assumeRoles`,
`aws:region`, `aws:endpoints`): `stack_session` opens the same one (`infra.credentials.open_session`, the
provider's precedence). A `secure:` value is decrypted by the Pulumi CLI (`pulumi config get`), as only it can.

Where the config comes from: `plan --stack FILE`; `up --stack NAME` (its `Pulumi.<NAME>.yaml`) or `up
--stack-config FILE` beside `--pulumi-outputs`; then `cluster.json` records the file's path (`stack_config`), so
`status`, `start` and `run` speak as the stack without being told again; `down --aws-trial` takes `--stack-config`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from evidence.errors import UserError


class IdentityError(UserError, RuntimeError):
    """No AWS identity resolves for a command, or the stack's config cannot give one; the message says which."""


def stack_aws_config(stack_config: Path) -> dict[str, Any]:
    """The `aws:` keys of a stack config file (by key without the namespace), `secure:` values decrypted."""
    import yaml

    try:
        conf = (yaml.safe_load(Path(stack_config).read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError) as e:
        raise IdentityError(f"the stack config {stack_config} cannot be read ({type(e).__name__}: {e}): it names the "
                            "AWS identity every call of this command uses") from None
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if not str(key).startswith("aws:"):
            continue
        name = str(key).split(":", 1)[1]
        if isinstance(value, dict) and set(value) == {"secure"}:
            value = _decrypt(Path(stack_config), str(key))
        out[name] = value
    return out


def _decrypt(stack_config: Path, key: str) -> str:
    """A `secure:` config value, through the Pulumi CLI (the passphrase or the secrets provider is its business)."""
    stack = stack_config.name.removeprefix("Pulumi.").removesuffix(".yaml")
    if shutil.which("pulumi") is None:
        raise IdentityError(f"{stack_config} keeps {key} encrypted (secure:); decrypting it needs the pulumi CLI on "
                            "PATH (and PULUMI_CONFIG_PASSPHRASE for a passphrase-kept stack)")
    r = subprocess.run(["pulumi", "config", "get", key, "--stack", stack], cwd=stack_config.parent,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise IdentityError(f"`pulumi config get {key} --stack {stack}` failed: {r.stderr.strip()[-400:]}")
    return r.stdout.rstrip("\n")


def stack_session(stack_config: Path | str | None, region: str | None) -> Any:
    """A session that speaks as the stack does (its config's identity) or, with no config, as the default chain —
    refused, naming what to give, when no credentials resolve."""
    import boto3  # start-up: AWS only (boto3 ~0.9 s)

    from infra.credentials import CredentialsError, StackAws, open_session

    if stack_config is not None:
        raw = stack_aws_config(Path(stack_config))
        if region and not raw.get("region"):
            raw["region"] = region
        try:
            return open_session(StackAws.from_config(raw))
        except CredentialsError as e:
            raise IdentityError(f"{stack_config}: {e}") from None
        except Exception as e:  # noqa: BLE001 — an assumed role refused, a profile missing: the stack's identity fails
            raise IdentityError(f"the identity {stack_config} names cannot be opened ({type(e).__name__}: {e})") from None
    session = boto3.Session(region_name=region)
    if session.get_credentials() is None:
        raise IdentityError("no AWS credentials resolve (no keys, profile, role or instance identity in this "
                            "environment): give the stack's config (`--stack-config Pulumi.<stack>.yaml`, or a "
                            "cluster.json written by `orchestrate up` from a stack) so the command speaks as the stack")
    return session

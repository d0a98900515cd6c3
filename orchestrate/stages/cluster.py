"""cluster: the trial's `cluster.json` — written by `orchestrate up` (the embedded local cluster, or a
Pulumi stack's hosts from its outputs), read back by `run` and `probe`, which refuse to start on a
cluster whose deadline or budget leaves nothing to run in."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from evidence.covered import guard_writes
from evidence.stores import FileStore
from infra.outputs import OutputsError, parse_outputs, read_stack_outputs, stack_file
from orchestrate.cloud import (
    budget_note,
    cluster_budget,
    console_output,
    current_addresses,
    pin_host_keys,
    raised_alarm,
    with_current_addresses,
)
from orchestrate.cluster import ClusterError, load, local_cluster, pulumi_cluster, save
from orchestrate.guard import Guard
from orchestrate.identity import IdentityError, stack_session
from orchestrate.progress import Progress

if TYPE_CHECKING:
    from orchestrate.cluster import Cluster


def write_cluster(out: Path, progress: Progress, *, local: bool, hosts: int, stack: Optional[str],
                  pulumi_outputs: Optional[Path], key_file: Optional[Path], host_keys: Optional[Path],
                  boot_wait: float, addresses: str, store: Optional[str],
                  stack_config: Optional[Path] = None) -> Cluster:
    """The description of the cluster the options name, every field checked, saved at `out`. The
    hosts' SSH keys are pinned here (from --host-keys, from `out` for the same instances, else from
    each instance's console), because an unknown host key is never accepted later. Raises
    ClusterError, HostKeysMissing, CoveredFileError, ValueError, OSError, IdentityError, or botocore's errors
    when EC2 cannot be read. Every AWS call speaks as the stack's config (`stack_config`, else `--stack`'s own
    file) says, which cluster.json then records (orchestrate/identity.py)."""
    if [local, pulumi_outputs is not None, stack is not None].count(True) != 1:
        raise ClusterError("pass exactly one of --local, --stack and --pulumi-outputs")
    if local:
        desc = local_cluster(hosts, Path.cwd(), store or FileStore.url_for((Path('trials') / 'store').resolve()))
    else:
        if key_file is None:
            raise ClusterError("--stack/--pulumi-outputs need --key-file (the private half of the stack's "
                               "ssh_public_key)")
        try:
            keys = {int(k): v for k, v in json.loads(host_keys.read_text()).items()} if host_keys else None
            text = json.dumps(read_stack_outputs(stack)) if stack else pulumi_outputs.read_text()
        except OutputsError as e:
            raise ClusterError(str(e)) from None
        except (OSError, ValueError, AttributeError) as e:
            raise ClusterError(f"cannot read {host_keys or pulumi_outputs}: {e}") from None
        if addresses not in ("cloud", "outputs"):
            raise ClusterError(f"--addresses {addresses!r}: give 'cloud' or 'outputs'")
        if stack_config is None and stack is not None and stack_file(stack).is_file():
            stack_config = stack_file(stack)
        if stack_config is not None and not stack_config.is_file():
            raise ClusterError(f"--stack-config {stack_config}: no such file (the stack's Pulumi.<stack>.yaml)")
        config_path = str(stack_config.resolve()) if stack_config is not None else None
        sessions: list = []

        def session_for(region: str):  # one session, opened at the first AWS call
            if not sessions:
                sessions.append(stack_session(config_path, region))
            return sessions[0]
        if addresses == "cloud":  # the outputs' addresses are those of `pulumi up`, gone after a stop
            try:
                parsed = parse_outputs(text)
            except OutputsError as e:
                raise ClusterError(str(e)) from None
            now = current_addresses(session_for(parsed.region), [h.instance_id for h in parsed.hosts])
            text = json.dumps(with_current_addresses(json.loads(text), now))
            progress.say("cluster", "addresses as EC2 reports them now: " + ", ".join(
                f"rank {h.rank} {now[h.instance_id]['public_ip']}" for h in parsed.hosts))
        if keys is None:  # from the consoles, where cloud-init printed them at first boot
            try:
                parsed = parse_outputs(text)
            except OutputsError as e:
                raise ClusterError(str(e)) from None
            # cloud-init prints the keys at an instance's first boot only: after a stop/start the
            # console has none, so the keys pinned earlier for the same instances are kept
            keys = kept_host_keys(out, {h.rank: h.instance_id for h in parsed.hosts})
            if keys:
                progress.say("cluster", f"host keys kept from {out} for rank(s) {sorted(keys)} (the same instances; "
                                        "cloud-init prints them only at first boot)")
            todo = {h.rank: h.instance_id for h in parsed.hosts if h.rank not in keys}
            if todo:
                session = session_for(parsed.region)
                progress.say("cluster", f"reading {len(todo)} instance console(s) for their SSH host keys")
                keys |= pin_host_keys(todo, lambda iid: console_output(session, iid), wait_s=boot_wait,
                                      say=lambda m: progress.say("cluster", m))
        desc = pulumi_cluster(text, key_file=str(key_file.resolve()), host_keys=keys, stack_config=config_path)
        missing = [h.rank for h in desc.hosts if h.host_key is None]
        if missing:
            raise ClusterError(f"no pinned host key for rank(s) {missing}: --host-keys names none for them "
                               "(an unknown host key is never accepted)")
    guard_writes({out: b""})  # --out is the user's choice of path: never a trial home's evidence
    save(desc, out)
    return desc


def kept_host_keys(path: Path, instances: dict[int, str]) -> dict[int, str]:
    """{rank: host key} pinned in an earlier cluster.json at `path` for the same instance at the same
    rank; nothing from a file that is absent or unreadable, or for a rank whose instance changed (a
    replaced host has new keys, read from its console)."""

    if not path.is_file():
        return {}
    try:
        prev = load(path)
    except ClusterError:
        return {}
    return {h.rank: h.host_key for h in prev.hosts
            if h.host_key and h.instance_id and instances.get(h.rank) == h.instance_id}


def load_cluster(path: Optional[Path], progress: Progress) -> Cluster | None:
    """The cluster description, or None for the embedded local cluster. A deadline within the
    controller's margin or a spent budget refuses it here, before anything starts, rather than midway."""
    if path is None:
        return None
    desc = load(path)
    left = None if desc.deadline is None else (desc.deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()
    if left is not None and left < Guard().margin_s:
        raise ClusterError(f"{path}: the deadline {desc.deadline.isoformat()} is "
                           + ("past" if left <= 0 else f"{left / 60:.1f} min away")
                           + f"; the controller stops {Guard().margin_s / 60:.0f} min before it, so nothing starts")
    if desc.budget_name:  # the cloud's own account of the spend: a spent budget starts nothing
        from botocore.exceptions import BotoCoreError, ClientError  # start-up: AWS only, as above

        try:
            b = cluster_budget(desc)
        except (BotoCoreError, ClientError, IdentityError) as e:
            raise ClusterError(f"cannot read the trial's budget {desc.budget_name}: {e}") from None
        # a spent budget starts nothing; an unspent one proves little: its figure is hours old
        if b.actual_usd >= b.limit_usd:
            raise ClusterError(f"the trial's budget {desc.budget_name} is spent (${b.actual_usd:.2f} of "
                               f"${b.limit_usd:.2f}); nothing starts ({budget_note(b)})")
        progress.say("budget", f"{desc.budget_name}: {budget_note(b)}")
    progress.say("cluster", f"{path}: {desc.source}, {len(desc.hosts)} host(s)"
                 + (f", deadline {desc.deadline.isoformat()}" if desc.deadline else ""))
    return desc


def alarm_check(desc: Cluster | None, progress: Progress) -> Callable[[], str | None] | None:
    """For a cluster in the cloud with transfer alarms: a check that names any alarm in ALARM. A failed
    read is said and not a stop (the alarm's own action stops its host either way)."""
    if desc is None or not desc.trial or not desc.guarded_ranks:
        return None
    from botocore.exceptions import BotoCoreError, ClientError  # start-up: AWS only, as above

    try:
        session = stack_session(desc.stack_config, desc.region)
    except IdentityError as e:
        raise ClusterError(f"the transfer alarms cannot be read: {e}") from None

    def check() -> str | None:
        try:
            return raised_alarm(session, desc.trial)
        except (BotoCoreError, ClientError) as e:
            progress.say("warning:", f"could not read the transfer alarms: {e}", style="bold yellow")
            return None

    return check

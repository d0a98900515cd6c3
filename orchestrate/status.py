"""`orchestrate status`: a running trial at a glance — spend so far, bytes against the transfer guard,
time to the deadline, and each rank's state — read from the hosts themselves, never from memory.

Each host runs one small stdlib-only script over its transport (the same for the embedded local
cluster and SSH hosts): for every arm directory it holds, its rank's heartbeat (update, age), whether
the rank's process is alive and whether it has finished; plus the host's rx + tx counters.
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from orchestrate.cloud import Alerts, Budget, Instance, cluster_budget, trial_alerts, trial_instances
from orchestrate.cluster import Cluster
from orchestrate.guard import COUNTERS, parse_counters


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArmBeat(Model):
    """What STATE_SCRIPT prints for one arm directory of a rank on its host. In a RankState or a
    HostStatus a field that was not learned (an idle rank has no arm to describe; a host that did not
    answer, no state at all) is left unset, and `dump` leaves it out, as `status --json` always has."""

    arm: str | None = None
    finished: bool | None = None  # the rank's result.json is written
    alive: bool | None = None  # the pid its heartbeat names is running
    update: int | None = Field(None, description="the update the heartbeat names; None without a heartbeat")
    heartbeat_age_s: float | None = Field(None, description="seconds since the heartbeat was written; None without one")


class RankState(ArmBeat):
    """A rank's current arm: the one running, else the one with the latest heartbeat."""

    state: str = Field(description="idle | running | finished | stopped | not started; a host row may also be "
                                   "unknown (the script failed) or unreachable")


class _Host(Model):
    rank: int
    host: str
    zone: str | None
    guarded: bool  # an isolated-zone host with a transfer guard
    reachable: bool


class HostStatus(RankState, _Host):  # _Host's fields dump first, then the rank's state (`status --json`'s order)
    """One host's row: its rank's state and its bytes against the transfer guard."""

    error: str | None = None  # the script's stderr or the transport's error, cut short
    bytes_rx_tx: int | None = Field(None, description="the host's received + transmitted bytes, all interfaces")
    guard_fraction: float | None = Field(None, description="bytes_rx_tx / the transfer guard (guarded hosts)")


class Unknown(Model):
    """What could not be read, and why: shown as unknown, never guessed."""

    error: str


class TrialStatus(Model):
    """`orchestrate status`: read from the hosts and the cloud when asked."""

    source: str
    trial: str | None
    at: str = Field(description="when status looked, ISO 8601 UTC")
    hosts: list[HostStatus]
    transfer_guard_bytes: float | None
    deadline: str | None = Field(description="the cloud stop, ISO 8601 UTC")
    seconds_to_deadline: float | None
    spend: Budget | Unknown | None = Field(
        description="the trial's AWS budget (orchestrate.cloud.cluster_budget); None: the cluster has none")
    addresses: list[str] | None  # where cluster.json no longer reaches a host; None: not a Pulumi stack's cluster
    outside: list[str] | None = Field(None, description="instances tagged with the trial that cluster.json (the "
                                                        "stack's outputs) does not list: none of the stack's")
    alerts: Alerts | Unknown | None = Field(
        description="the transfer alarms and the alert topic's subscriptions (orchestrate.cloud.trial_alerts)")

    def dump(self) -> dict[str, Any]:
        """The record `status --json` prints: what was learned, nothing made up for the rest."""
        return self.model_dump(mode="json", exclude_unset=True)


_BEATS = TypeAdapter(list[ArmBeat])

STATE_SCRIPT = r"""
import json, os, sys, time, pathlib
home, rank = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def running(pid):
    try:  # a zombie has exited, though kill -0 would still find it: its state in /proc says so
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] not in ("", "Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        if os.path.isdir("/proc"):
            return False
    except (OSError, IndexError):  # hidden (hidepid) or an unexpected line: kill -0 decides
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
out = []
for d in sorted(home.glob(f"runs/*/rank-{rank}")):
    hb = d / "heartbeat.json"
    try:
        beat = json.loads(hb.read_text())
        beat = beat if isinstance(beat, dict) else None
    except (OSError, ValueError):
        beat = None
    alive = bool(beat) and isinstance(beat.get("pid"), int) and running(beat["pid"])
    out.append({"arm": d.parent.name, "finished": (d / "result.json").is_file(), "alive": alive,
                "update": beat.get("update") if beat else None,
                "heartbeat_age_s": time.time() - hb.stat().st_mtime if beat else None})
print(json.dumps(out))
"""


def rank_state(arms: list[ArmBeat]) -> RankState:
    """The rank's current arm: the one running, else the latest heartbeat."""
    if not arms:
        return RankState(arm=None, state="idle")
    running = [a for a in arms if a.alive and not a.finished]
    pick = running[0] if running else min(arms, key=lambda a: a.heartbeat_age_s if a.heartbeat_age_s
                                           is not None else float("inf"))
    state = "running" if running else "finished" if pick.finished else \
        "stopped" if pick.update is not None else "not started"
    return RankState(**pick.model_dump(exclude_unset=True), state=state)


def address_warnings(cluster: Cluster, now: dict[int | None, Instance]) -> list[str]:
    """Where cluster.json no longer reaches a host: its instance is gone or stopped, or EC2 now gives it
    another public address than the one written at `orchestrate up`."""
    out = []
    for h in cluster.by_rank:
        i = now.get(h.rank)
        if i is None:
            out.append(f"rank {h.rank}: no instance tagged trial={cluster.trial}, rank={h.rank}")
        elif i.state != "running":
            out.append(f"rank {h.rank} ({i.instance_id}) is {i.state}: its public address is released; after "
                       "a start, run `orchestrate up` again for the new one")
        elif i.public_ip != h.address:
            out.append(f"rank {h.rank} ({i.instance_id}) is now at {i.public_ip}, cluster.json says {h.address}: "
                       "run `orchestrate up` again")
    return out


def outside_warnings(cluster: Cluster, found: list[Instance]) -> list[str]:
    """Every instance tagged with the trial that cluster.json does not list (#65): an interrupted `up`'s create,
    one started by hand, another stack's. None of them ever received work; while one exists the stack's destroy
    deletes nothing (infra/teardown.py)."""
    listed = {h.instance_id for h in cluster.hosts if h.instance_id} | set(cluster.held_instances)
    return [f"{i.instance_id} (rank {'none' if i.rank is None else i.rank}, {i.state}, {i.instance_type} in {i.zone}) "
            f"carries trial={cluster.trial}'s tag but is not in cluster.json: outside the stack — its destroy is "
            f"refused while it exists; once you have checked it is not another stack's, end it: aws ec2 "
            f"terminate-instances --region {cluster.region} --instance-ids {i.instance_id}"
            for i in found if i.instance_id not in listed]


def trial_status(cluster: Cluster, home: Path | None, *, session: Any = None,
                 now: dt.datetime | None = None) -> TrialStatus:
    now = now or dt.datetime.now(dt.timezone.utc)
    hosts = []
    for h in cluster.by_rank:
        local = h.transport == "local"
        if local and home is None:
            raise ValueError("the embedded local cluster's ranks write into the trial home: pass --home")
        # the script is stdlib-only: any Python of the host runs it, isolated (-I: no PYTHON* variables,
        # no working directory or user site on its path), no staged packages needed
        argv = [sys.executable if local else h.python, "-I", "-c", STATE_SCRIPT,
                str(home) if local else f"{h.root}/home", str(h.rank)]
        # what is learned, as it is learned: a HostStatus of exactly these fields (the rest stay unset)
        row: dict[str, Any] = {"rank": h.rank, "host": h.name, "zone": h.zone,
                               "guarded": h.rank in cluster.guarded_ranks}
        t = None
        try:
            t = cluster.transport(h, connect_timeout=5)
            r = t.run(" ".join(map(shlex.quote, argv)), timeout=15)
            row["reachable"] = True
            if r.status == 0:
                row |= rank_state(_BEATS.validate_json(r.stdout)).model_dump(exclude_unset=True)
            else:
                row |= {"state": "unknown", "error": r.stderr.strip()[-200:]}
            c = t.run(COUNTERS, timeout=10)
            row["bytes_rx_tx"] = parse_counters(c.stdout) if c.status == 0 else None
        except Exception as e:  # noqa: BLE001 — a host that does not answer is a state to show
            row |= {"reachable": row.get("reachable", False), "error": str(e)[:200]}
            row.setdefault("state", "unreachable")
        finally:
            if t is not None:
                t.close()
        if row["guarded"] and row.get("bytes_rx_tx") is not None and cluster.transfer_guard_bytes:
            row["guard_fraction"] = row["bytes_rx_tx"] / cluster.transfer_guard_bytes
        hosts.append(HostStatus(**row))
    spend: Budget | Unknown | None = None
    if cluster.budget_name:
        try:
            spend = cluster_budget(cluster, session)
        except Exception as e:  # noqa: BLE001 — spend is reported as unknown, never guessed
            spend = Unknown(error=str(e)[:300])
    addresses: list[str] | None = None
    outside: list[str] | None = None
    if cluster.source == "pulumi" and cluster.trial:  # a stop/start gives a host a new public address

        try:
            if session is None:
                from orchestrate.identity import stack_session  # start-up: boto3 (~0.9 s) only for AWS calls

                session = stack_session(cluster.stack_config, cluster.region)
            found = trial_instances(session, cluster.trial)
            listed = {h.instance_id for h in cluster.hosts}
            # per rank, the listed instance first: a second one of the rank is outside, not the host
            by_rank = {i.rank: i for i in sorted(found, key=lambda i: i.instance_id in listed)}
            addresses = address_warnings(cluster, by_rank)
            outside = outside_warnings(cluster, found)
        except Exception as e:  # noqa: BLE001 — unknown, never assumed current
            addresses = [f"the hosts' current addresses are unknown ({str(e)[:200]})"]
    alerts: Alerts | Unknown | None = None
    if cluster.alert_topic or (cluster.trial and cluster.guarded_ranks):
        try:
            if session is None:
                from orchestrate.identity import stack_session  # start-up: as above

                session = stack_session(cluster.stack_config, cluster.region)
            alerts = trial_alerts(session, cluster)
        except Exception as e:  # noqa: BLE001 — whether anyone hears the alerts is unknown, never assumed
            alerts = Unknown(error=str(e)[:300])
    return TrialStatus(source=cluster.source, trial=cluster.trial, at=now.isoformat(), hosts=hosts,
                       transfer_guard_bytes=cluster.transfer_guard_bytes,
                       deadline=cluster.deadline.isoformat() if cluster.deadline else None,
                       seconds_to_deadline=(cluster.deadline - now).total_seconds() if cluster.deadline else None,
                       spend=spend, addresses=addresses, outside=outside, alerts=alerts)

"""`up`, `status`, `stop` and `down`: the cluster's description, a running trial's state, its ranks
stopped, and teardown once the evidence verifies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from orchestrate.cli.console import con, progress, refusing, say


def up(local: bool = typer.Option(False, "--local", help="the embedded local cluster on this machine"),
       hosts: int = typer.Option(4, help="--local: how many ranks"),
       stack: Optional[str] = typer.Option(None, help="a Pulumi stack's name: its outputs read through Pulumi's "
                                                      "Automation API (needs the pulumi CLI)"),
       pulumi_outputs: Optional[Path] = typer.Option(None, help="a stack's `pulumi stack output --json`, saved"),
       key_file: Optional[Path] = typer.Option(None, help="--stack/--pulumi-outputs: the private half of the "
                                                          "stack's ssh_public_key"),
       host_keys: Optional[Path] = typer.Option(None, help="--stack/--pulumi-outputs: JSON {rank: 'ssh-ed25519 AAAA…'} you "
                                                           "checked yourself (default: read from each instance's "
                                                           "console output)"),
       boot_wait: float = typer.Option(900, help="--stack/--pulumi-outputs: seconds to wait for booting instances to "
                                                 "print their host keys"),
       addresses: str = typer.Option("cloud", help="--stack/--pulumi-outputs: 'cloud' reads each host's current "
                                                   "addresses from EC2 (a stop/start gives new public ones); "
                                                   "'outputs' takes the stack outputs' as they are"),
       store: Optional[str] = typer.Option(None, help="--local: evidence store (default file://trials/store)"),
       stack_config: Optional[Path] = typer.Option(None, help="--pulumi-outputs: the stack's Pulumi.<stack>.yaml, whose "
                                                              "AWS identity every call uses (--stack: its own file)"),
       out: Path = typer.Option(Path("cluster.json"), help="where to write the description")) -> None:
    """Write cluster.json: the embedded local cluster, or a Pulumi stack's hosts from its outputs
    (`pulumi up` creates them; this only describes them, and checks every field)."""
    # start-up: boto3/botocore take ~0.9 s to import (-X importtime, 2026-12-06); only AWS calls pay it
    from botocore.exceptions import BotoCoreError, ClientError

    from evidence.covered import CoveredFileError
    from orchestrate.cloud import HostKeysMissing
    from orchestrate.cluster import ClusterError
    from orchestrate.identity import IdentityError
    from orchestrate.stages.cluster import write_cluster

    try:
        desc = write_cluster(out, progress, local=local, hosts=hosts, stack=stack, pulumi_outputs=pulumi_outputs,
                             key_file=key_file, host_keys=host_keys, boot_wait=boot_wait, addresses=addresses,
                             store=store, stack_config=stack_config)
    except (ClusterError, CoveredFileError, ValueError, OSError, HostKeysMissing, IdentityError) as e:  # ValueError: pydantic's
        say("error:", str(e), style="bold red")                                           # or a key's refusal
        raise typer.Exit(2)
    except (BotoCoreError, ClientError) as e:
        say("error:", f"reading the instances (addresses, consoles) failed: {e}", style="bold red")
        raise typer.Exit(1)
    say("cluster", f"{desc.source}: {len(desc.hosts)} host(s), store {desc.store} → {out}")


def status(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json"),
           home: Optional[Path] = typer.Option(None, help="the trial home (the embedded local cluster's ranks write there)"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """A running trial: spend so far, bytes against the transfer guard, time to the deadline, each rank's state."""
    from orchestrate.cloud import budget_note
    from orchestrate.cluster import ClusterError, load
    from orchestrate.status import Unknown, trial_status

    with refusing(ClusterError, ValueError):
        desc = load(cluster)
        st = trial_status(desc, home)
    if as_json:
        print(json.dumps(st.dump(), indent=1))
        return
    left = st.seconds_to_deadline
    spend = st.spend
    say(f"{desc.trial or desc.source}:", "deadline "
        + ("none" if left is None else f"{st.deadline} ({left / 60:,.1f} min left)" if left > 0
        else f"{st.deadline} (PASSED)")
        + "; spend " + ("— (no AWS budget: embedded or test cluster)" if spend is None
        else f"unknown ({spend.error})" if isinstance(spend, Unknown)
        else budget_note(spend)))
    tb = Table()
    for col in ("rank", "host", "zone", "state", "arm", "update", "heartbeat age", "rx+tx", "of guard"):
        tb.add_column(col, justify="right")
    for h in st.hosts:
        age = h.heartbeat_age_s
        tb.add_row(str(h.rank), h.host, h.zone or "—", h.state, h.arm or "—",
                   "—" if h.update is None else str(h.update), "—" if age is None else f"{age:,.0f} s",
                   "—" if h.bytes_rx_tx is None else f"{h.bytes_rx_tx / 1e9:,.3f} GB",
                   "—" if h.guard_fraction is None else f"{h.guard_fraction:.1%}")
    con.print(tb)
    for w in st.addresses or []:
        say("warning:", w, style="bold yellow")
    for w in st.outside or []:
        say("outside the stack:", w, style="bold red")
    alerts = st.alerts
    if isinstance(alerts, Unknown):
        say("alerts:", f"unknown ({alerts.error})", style="bold yellow")
    elif alerts is not None:
        say("alerts:", "transfer alarms " + (", ".join(f"{a.name} {a.state}" for a in alerts.alarms) or "none")
            + "; topic reaches " + (", ".join(f"{s.endpoint} ({s.protocol}, {s.state})"
                                              for s in alerts.subscriptions) or "no one"))
        for w in alerts.warnings:
            say("warning:", w, style="bold yellow")


def stop(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json")) -> None:
    """Stop the ranks left running on the cluster's hosts (an interrupted `orchestrate run` leaves them
    detached there): SIGTERM by pid, SIGKILL 10 s later. Their checkpoints stay for a resume."""
    from orchestrate.cluster import ClusterError, load
    from orchestrate.launch.ssh import stop_ranks
    from orchestrate.transport import TransportError


    with refusing(ClusterError, TransportError):
        c = load(cluster)
        stopped = stop_ranks(c, len(c.hosts), None)
    con.print(f"stopped a rank on {len(stopped)} host(s){': ' + ', '.join(stopped) if stopped else ''}",
              highlight=False)


def start(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json (a stack's)"),
          grace: Optional[float] = typer.Option(None, help="after the deadline: minutes the hosts may run (at most the "
                                                           "stack's grace_cap_minutes); the cloud stops them at its end"),
          home: Optional[Path] = typer.Option(None, help="--grace: the trial home it serves (the grace is recorded "
                                                         "there, preserved with it and shown by its report)"),
          reason: str = typer.Option("preserve what the hosts still hold", help="--grace: why, in the record"),
          yes: bool = typer.Option(False, "--yes", help="--grace: grant it without asking")) -> None:
    """Start a stack's stopped hosts. Before the deadline: start them. After it: only inside a grace — the hosts
    are tagged with it first, and the cloud's deadline stop and each host's own check stop them at its end, whether
    or not this machine is still there. Then `orchestrate up` for their new addresses."""
    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

    from evidence.errors import UserError
    from orchestrate.cloud import StartRefused
    from orchestrate.cluster import ClusterError

    try:
        granted, done = _start(cluster, grace, home, reason, yes)
    except (ClusterError, StartRefused, ValueError, UserError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2) from None
    except WaiterError as e:
        say("error:", f"the hosts did not reach `running` ({e}): `orchestrate status` says where they are",
            style="bold red")
        raise typer.Exit(1) from None
    except (BotoCoreError, ClientError) as e:
        say("error:", f"EC2 refused ({e}); nothing is recorded as started", style="bold red")
        raise typer.Exit(1) from None
    say("started", f"{len(done.started)} host(s){': ' + ', '.join(done.started) if done.started else ''}; "
        f"{len(done.running)} already running")
    if granted is not None:
        say("until", f"{granted.end:%Y-%m-%d %H:%M:%S} UTC: then the cloud's deadline stop and each host's own check "
            "stop them again, whether or not this machine is still up")
        _report_again(home)  # type: ignore[arg-type]
    say("next", f"orchestrate up --stack <stack> (their new addresses), then orchestrate preserve --home "
        f"{home or '<trial home>'} --cluster {cluster}")


def _start(cluster: Path, grace: Optional[float], home: Optional[Path], reason: str, yes: bool) -> tuple:
    """`start`'s refusals and work: (the grace granted or None, what was started)."""
    import datetime as dt

    from evidence.grace import write_grace
    from orchestrate.cloud import StartRefused, grace_for, start_trial, startable, trial_instances
    from orchestrate.cluster import load

    desc = load(cluster)
    if desc.source != "pulumi" or not desc.trial or not desc.region or desc.deadline is None:
        raise StartRefused(f"{cluster} is not a stack's cluster (no trial, region or deadline): only a stack's "
                           "hosts are started")
    if grace is not None and home is None:
        raise StartRefused("--grace needs --home: the trial home whose evidence it serves, where it is recorded")
    if home is not None and not (home / "commitments.jsonl").exists():
        raise StartRefused(f"{home} is not a trial home (no commitments.jsonl)")
    now = dt.datetime.now(dt.timezone.utc)
    if grace is None and now >= desc.deadline:
        cap = desc.grace_cap_minutes
        raise StartRefused(f"the deadline {desc.deadline.isoformat()} has passed: the cloud stops any host of trial "
                           f"{desc.trial} that runs within a minute or two. To preserve what the hosts hold, grant a "
                           f"grace: orchestrate start --cluster {cluster} --grace MINUTES --home <trial home>"
                           + (f" (at most {cap:g} min)" if cap is not None else ""))
    from orchestrate.identity import stack_session  # start-up: AWS only (boto3 ~0.9 s)

    session = stack_session(desc.stack_config, desc.region)
    found = trial_instances(session, desc.trial)
    startable(found, desc.trial)  # before anything is recorded or tagged
    granted = None
    if grace is not None:
        asked = grace_for(found, desc.trial, desc.deadline, grace, desc.grace_cap_minutes, now, reason)
        say("grace", f"{grace:g} min for {len(found)} host(s) of {desc.trial}: ${asked.usd:.2f} (" + ", ".join(
            f"{h.instance_id} {h.instance_type} ${h.usd:.2f}" for h in asked.hosts) + "; the minutes and the "
            "2 min its stop may come late)")
        if not yes and not typer.confirm("grant it and start the hosts?", default=False):
            raise StartRefused("not granted: nothing was started or tagged")
        # from now, not from before the question: the grace is whole however long it was pondered
        granted = grace_for(found, desc.trial, desc.deadline, grace, desc.grace_cap_minutes,
                            dt.datetime.now(dt.timezone.utc), reason)
        path = write_grace(home, granted)  # type: ignore[arg-type]  # the record before any host starts
        say("recorded", f"{path} (until {granted.end:%Y-%m-%d %H:%M:%S} UTC)")
    return granted, start_trial(session, found, grace=granted)


def _report_again(home: Path) -> None:
    """The home's report recomputed with the grace in it (a preserved report.json is kept: the next free name)."""
    from evidence.errors import UserError
    from evidence.report import EvidenceError, write_report_numbered

    if not (home / "report.json").exists():
        say("report", "none yet in the home: the grace is in its evidence, and the report will show it")
        return
    try:
        _, out = write_report_numbered(home, home / "report.json")
        say("report", f"{out} (with the grace and its cost)")
    except (EvidenceError, UserError, OSError) as e:
        say("warning:", f"the report was not recomputed ({e}); the grace is recorded in the home", style="bold yellow")


def down(home: Path = typer.Option(..., help="the trial home"),
         aws_trial: Optional[str] = typer.Option(None, help="stop and reconcile this trial's AWS hosts by tag"),
         region: Optional[str] = typer.Option(None, help="AWS region of --aws-trial"),
         stack_config: Optional[Path] = typer.Option(None, help="--aws-trial: the stack's Pulumi.<stack>.yaml, whose AWS "
                                                                "identity the calls use (else the environment's)")) -> None:
    """Tear down — only once the home's evidence index verifies in its store, object by object."""
    from orchestrate.cloud import reconcile, stop_trial
    from orchestrate.homes import Refused, verified_home
    from orchestrate.identity import IdentityError, stack_session

    with refusing(Refused, label="refused:"):
        with verified_home(home, f"run `orchestrate preserve --home {home}` first — hosts stay up until the evidence "
                                 "is safe", progress) as (rec, v):
            pass
    say("verified", f"{v.files} objects, {v.bytes / 1e6:,.1f} MB in {rec.store}")
    if aws_trial is None:
        con.print("embedded local cluster: no hosts to stop", highlight=False)
        return
    from botocore.exceptions import BotoCoreError, ClientError

    with refusing(IdentityError):
        session = stack_session(stack_config, region)
    try:
        stopped = stop_trial(session, aws_trial)
        con.print(f"stopped {len(stopped)} instance(s): {', '.join(stopped) or '—'}", highlight=False)
        left = reconcile(session, aws_trial)
    except (BotoCoreError, ClientError) as e:
        say("error:", f"AWS refused ({e}): `orchestrate status` says where the hosts are", style="bold red")
        raise typer.Exit(1) from None
    for f in left:
        con.print(f"  {f.kind} {f.id}: {f.state}{' — still billing' if f.billing else ''} {f.detail}",
                  highlight=False)
    if any(f.billing and f.kind == "instance" for f in left):
        raise typer.Exit(1)


def destroy(stack: str = typer.Option(..., help="the trial's Pulumi stack (its name, as `pulumi stack ls` lists it)"),
            work_dir: Path = typer.Option(Path("."), help="the Pulumi project's directory (where Pulumi.yaml is)"),
            yes: bool = typer.Option(False, "--yes", help="no question before deleting (passed to pulumi)"),
            preview_only: bool = typer.Option(False, "--preview-only", help="only show what would be deleted")) -> None:
    """Tear the trial's stack down: `pulumi destroy --run-program`, asked for as a teardown this run alone carries
    (never an `up`). Refused, deleting nothing, while the trial is unpreserved or any instance of it is outside the
    stack; the evidence bucket and what keeps it safe stay."""
    from orchestrate.destroy import DestroyRefused, run_destroy

    with refusing(DestroyRefused):
        code = run_destroy(stack, work_dir.resolve(), yes=yes, preview_only=preview_only, say=say)
    if code != 0:
        say("error:", f"pulumi destroy ended with status {code}: what it refused is above; nothing it did not "
                      "list as deleted was deleted", style="bold red")
        raise typer.Exit(code)

"""`estimate`, `plan`, `gates` and `wheelhouse`: what a trial will cost, send and be able to show,
decided before anything is bought or trained."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.table import Table

from orchestrate.cli.console import con, refusing, say
from orchestrate.cli.render import show_attainability


def estimate(stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
             as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON")) -> None:
    """The cost and traffic estimate of a stack's plan against its budget (what `pulumi up` checks)."""
    from infra.plan import estimate as run_estimate
    from infra.plan import table

    cfg = _stack_config(stack)
    est = run_estimate(cfg, _now())
    if as_json:
        print(json.dumps(est.model_dump(mode="json"), indent=1))
    else:
        print(table(est))
    for p in est.problems:
        say("does not fit:", p, style="bold red")
    raise typer.Exit(1 if est.problems else 0)


def _now():
    return dt.datetime.now(dt.timezone.utc)


def _stack_config(stack: Path):
    from infra.plan import StackConfigError, trial_config

    try:
        conf = yaml.safe_load(stack.read_text())["config"]
        return trial_config(conf["trials:cluster"], conf["aws:region"], where=str(stack))
    except KeyError as e:
        say("error:", f"{stack}: no {e.args[0]} key: a stack config sets trials:cluster and aws:region under "
                      "config (as Pulumi.dev.yaml does)", style="bold red")
        raise typer.Exit(2)
    except (OSError, TypeError, yaml.YAMLError, StackConfigError) as e:
        say("error:", str(e) if isinstance(e, StackConfigError) else f"{stack}: {e}", style="bold red")
        raise typer.Exit(2)


def plan(arm: str = typer.Argument(..., help="an arm the stack plans, e.g. diloco-four, EXPERIMENT/ARM, or an "
                                             "experiment's name (its primary arm): every arm of its experiment "
                                             "the stack plans is priced, and the gates are the primary's"),
         stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
         quota: bool = typer.Option(True, help="read the account's G/VT vCPU quota and the zones' instance-type "
                                               "offerings (needs AWS credentials); --no-quota: no AWS reads"),
         wheelhouse: Optional[Path] = typer.Option(None, help="the wheelhouse staging will upload (its size counts)"),
         uplink_mbps: float = typer.Option(100.0, min=0.001, max=1e6,
                                           help="this machine's upload rate, Mbit/s, for the staging time"),
         as_json: bool = typer.Option(False, "--json"),
         profile: str = typer.Option("gpu", help="the profile `run` will use on the hosts, one of the "
                                                 "experiment's (`orchestrate list` shows each experiment's): the "
                                                 "gates' attainability is planned at it (bytes, hours and the "
                                                 "placement come from the stack's arms and hosts)")) -> None:
    """Cost, hours and bytes of ARM's experiment (the arm and its controls) against the budget split,
    the hosts' vCPUs against the account's G-instance quota, and what staging sends from this machine.
    Exit 1 when anything does not fit."""
    from infra.plan import (ACTIONS_PER_BUDGET, GB, budget_groups, budget_label, stopped_volume_usd_per_day,
                            sweep_usd_per_day, table)
    from infra.prices import price
    from orchestrate.stages.plan import PlanError, plan_arm
    from training.config import ConfigError

    cfg = _stack_config(stack)
    with refusing(ConfigError, PlanError):
        est = plan_arm(cfg, stack, arm, wheelhouse=wheelhouse, uplink_mbps=uplink_mbps, quota=quota, now=_now(),
                       profile=profile)
    problems, placed, staging, vcpu, zones = est.problems, est.placement, est.staging, est.vcpu, est.zones
    if as_json:
        print(json.dumps(est.model_dump(mode="json"), indent=1))
        raise typer.Exit(1 if problems else 0)
    usd = {x.arm: sum(ln.usd for ln in est.lines  # the estimate's own priced lines, per arm
                      if ln.category == "transfer" and ln.item.startswith(f"{x.arm}:"))
           for x in est.traffic}
    t = Table(title=f"{arm} ({est.experiment}) on {len(cfg.hosts)} host(s) in {cfg.region}, {cfg.hours:g} h, "
                    f"deadline {cfg.deadline.isoformat() if cfg.deadline else 'not set'}")
    for col in ("arm", "ranks", "GPUs", "syncs", "payload/sync", "rx+tx per host", "cross-zone", "transfer USD"):
        t.add_column(col, justify="right")
    fits = {r.arm: r for r in (placed.arms if placed is not None else [])}
    for x in est.traffic:
        r = fits.get(x.arm)
        t.add_row(x.arm, str(x.world_size),
                  "—" if r is None else "not run" if r.reason else "fits" if r.gpus_known else "unknown",
                  str(x.synchronizations),
                  f"{x.payload_bytes_per_sync / GB:,.2f} GB", f"{x.host_bytes_rx_plus_tx / 1e12:,.3f} TB",
                  f"{x.cross_zone_bytes / 1e12:,.3f} TB", f"{usd[x.arm]:,.2f}")
    con.print(t)
    for sc in est.scaled:  # the arm's own value does not run: said beside what the plan priced
        print(f"  {sc.arm}: {sc.key} = {sc.profile} (profile {est.profile}; the arm's own: {sc.arm_own})")
    if placed is not None:
        print(f"GPUs: {placed.cluster.gpus_per_host} per host ({placed.cluster.gpus_from}), one rank per "
              f"host; an arm that does not fit is not run (`orchestrate run` trains the others)")
        for r in placed.arms:
            if r.reason:
                print(f"  {r.arm}: {r.reason}")
    print(table(est))
    show_attainability(est.attainability)
    print(f"vCPUs: the hosts need {vcpu.hosts_vcpus}; G/VT quota "
          + (f"{vcpu.quota:g}" if vcpu.quota is not None else f"unknown ({vcpu.note or 'not asked'})"))
    per_host = (f"{staging.seed_bytes / 1e9:,.2f} GB seed, 4 bytes × {cfg.parameters:,} parameters + "
                f"{staging.wheelhouse_bytes / 1e9:,.2f} GB wheelhouse" + ("" if wheelhouse else " (not given: --wheelhouse)"))
    print(f"staging through the trial's bucket (what `orchestrate run` does on this stack): ({per_host}) once + the "
          f"project's wheel to each of {staging.hosts} host(s) = {staging.bytes / 1e9:,.2f} GB leave this machine: "
          f"{staging.hours:.2f} h at {uplink_mbps:g} Mbit/s (--uplink-mbps), {staging.hours / cfg.hours:.0%} of "
          f"the {cfg.hours:g} h paid for; the hosts fetch it in region")
    print(f"staging over SSH alone (no bucket): {staging.hosts} host(s) × ({per_host}) = "
          f"{staging.ssh_only_bytes / 1e9:,.2f} GB: {staging.ssh_only_hours:.2f} h at {uplink_mbps:g} Mbit/s")
    if zones.checked:
        print("zones: " + "; ".join(
            f"{z}{'' if zones.by_id else ' (' + zones.zone_ids.get(z, '?') + ' in this account)'} offers "
            f"{', '.join(t) or 'none of the types'}" for z, t in zones.zones.items()))
    else:
        print(f"zones: {zones.note}; `pulumi up` fails at the first host whose zone lacks its type")
    print(f"transfer guard: the controller stops a group at {cfg.guard_fraction:.0%} (guard_fraction, the same number on "
          f"the hosts) of each isolated host's {cfg.transfer_guard_bytes / 1e12:.3f} TB; the host's own guard and its "
          "NetworkIn/NetworkOut alarms stop it at 100 %")
    per_day = stopped_volume_usd_per_day(cfg)
    left = est.reserved_usd.storage_other - est.totals_usd.storage_other
    if cfg.stopped_days:
        print(f"stopped volumes: ${per_day:.2f} a day after the deadline until `orchestrate down` ({cfg.stopped_days:g} "
              f"d counted, stopped_days); the storage reservation has ${left:.2f} left" +
              (f", {left / per_day:.1f} more days" if per_day and left > 0 else ""))
    else:
        print("stopped volumes: not counted (stopped_days = 0): they bill every day after the deadline until "
              "`orchestrate down`")
    sweep, parts = sweep_usd_per_day(cfg)
    print(f"deadline stop: from the deadline on, every minute until `pulumi destroy`, the cloud stops every running host "
          f"tagged trial={cfg.trial} (in the state or not; pending, late, started by hand or by EC2) but inside a grace "
          f"of at most {cfg.grace_cap_minutes:g} min (`orchestrate start --grace`); each host checks too, at every boot "
          f"and minute. It costs ${sweep:.4f} a day for {len(cfg.hosts)} hosts ("
          + ", ".join(f"{q:,.1f} {what} x ${price(k, cfg.prices).usd:.7f}" for k, q, what in parts) + "; no free tier "
          f"counted). A grace costs ${sum(price(f'instance/{h.instance_type}', cfg.prices).usd + price('vpc/public-ipv4', cfg.prices).usd for h in cfg.hosts) / 60:.3f} "
          f"a minute for the {len(cfg.hosts)} hosts")
    print(f"stops: the deadline stop (every host tagged trial={cfg.trial}, from its first moment) "
          "and the transfer guards are the bounds. The budget "
          f"(${cfg.budget.total_usd:g}, {'the region' if cfg.budget_filter == 'region' else 'the trial tag'}'s spend) "
          "and its per-host stop actions are a late backstop: AWS Budgets sees costs hours late (its data is refreshed "
          f"at least daily), so a {cfg.hours:g}-h trial's spend may not show in it before the deadline"
          + (f". A budget holds {ACTIONS_PER_BUDGET} actions: the {len(cfg.hosts)} hosts' stops go on {len(groups)} "
             f"budgets on that spend, one per {ACTIONS_PER_BUDGET} ranks ({', '.join(budget_label(cfg.trial, g) for g in groups)})"
             if len(groups := budget_groups(h.rank for h in cfg.hosts)) > 1 else ""))
    for p in problems:
        say("does not fit:", p, style="bold red")
    raise typer.Exit(1 if problems else 0)


def gates(arm: str = typer.Argument(..., help="an experiment's name, an arm (e.g. diloco-four) or EXPERIMENT/ARM: "
                                              "the gates are those of the arm's experiment, judged on its primary"),
          profile: Optional[str] = typer.Option(None, help="one of the experiment's profiles (`orchestrate list` "
                                                            "shows each experiment's; default: cpu)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """What each gate of ARM's experiment can reach at PROFILE on the embedded local cluster — the
    analysis `run` commits as attainability.json before training (evidence/attainability.py): whether
    it can pass at all, and the smallest effect it can detect. Nothing is prepared or trained."""
    from evidence.attainability import analyse
    from orchestrate.attainability import cluster_basis
    from orchestrate.study import profile_named
    from training.config import ConfigError, address, not_judged, resolve

    with refusing(ConfigError):
        name, named = address(arm)
        cfg = resolve(name, profile_named(name, profile))
    if why := not_judged(cfg.experiment, named):  # the arm selects nothing of its own here: said, not ignored
        say("note:", f"{why}: the gates below are {cfg.experiment.acceptance.primary}'s", style="bold yellow")
    rec = analyse(cfg.as_dict(), cluster_basis("local", shared_cores=True))
    if as_json:
        print(json.dumps(rec, indent=1, ensure_ascii=False))
    else:
        show_attainability(rec)


def wheelhouse(dest: Path = typer.Argument(..., help="the directory to fill; give it to `plan` and `run` as --wheelhouse"),
               stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="the stack whose hosts to build for "
                                                                        "(host_python_version, host_platform)"),
               python_version: Optional[str] = typer.Option(None, help="the hosts' Python (3.12), instead of the stack's"),
               platform: Optional[str] = typer.Option(None, help="the hosts' newest manylinux tag "
                                                               "(manylinux_2_39_x86_64), instead of the stack's"),
               requirement: list[str] = typer.Option([], help="what to download (default: the project's "
                                                             "dependencies, constrained by requirements.lock)"),
               find_links: list[Path] = typer.Option([], help="also look for wheels here (pip --find-links)"),
               no_index: bool = typer.Option(False, help="no package index: --find-links only (pip --no-index)")) -> None:
    """Download every dependency as wheels for the hosts' Python and platform (not this machine's): torch
    and its CUDA libraries included, since the hosts' AMI has another torch. Refuses a directory holding a
    wheel the hosts could not install."""
    from orchestrate.wheelhouse import WheelhouseError, download, project_requirements


    root = Path(__file__).resolve().parent.parent
    if python_version is None or platform is None:
        cfg = _stack_config(stack)
        python_version, platform = python_version or cfg.host_python_version, platform or cfg.host_platform
    lock = root / "requirements.lock"
    with refusing(WheelhouseError):
        with con.status(f"pip download for CPython {python_version} on {platform}…"):
            wheels = download(dest, python_version, platform, requirement or project_requirements(root),
                              constraints=lock if not requirement and lock.is_file() else None,
                              find_links=find_links, no_index=no_index)
    size = sum(w.stat().st_size for w in wheels)
    print(f"{dest}: {len(wheels)} wheel(s), {size / 1e9:,.2f} GB, for CPython {python_version} on {platform} and "
          f"older manylinux tags; `orchestrate plan ARM --wheelhouse {dest}` counts them")

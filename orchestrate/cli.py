"""`orchestrate`: the user's entry point for a whole trial. It parses options, calls the trial's
stages (orchestrate/stages/) and prints; the stages hold the pipeline, so a benchmark runs the same
code without going through a command line."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import shutil
import signal
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from evidence.attainability import UNATTAINABLE, analyse
from evidence.canonical import EvidenceFileError, file_sha256
from evidence.covered import CoveredFileError
from evidence.errors import UserError
from evidence.report.render import closing, verdict
from evidence.stores import (
    PRESERVED,
    FileStore,
    PreservationError,
    known_forms,
    read_preserved,
    verify_index,
)
from infra.plan import GB, TrialConfig, table
from infra.plan import estimate as run_estimate
from orchestrate.attainability import cluster_basis
from orchestrate.backends import make_backend
from orchestrate.cloud import HostKeysMissing, budget_note, reconcile, stop_trial
from orchestrate.cluster import ClusterError, load
from orchestrate.launch.ssh import stop_ranks
from orchestrate.launch.supervise import LeftRunning
from orchestrate.placement import NO_SERVE
from orchestrate.progress import ConsoleProgress, stderr_console
from orchestrate.recovery import RecoveryOptions, run_recovery
from orchestrate.remote import host_parts
from orchestrate.stages.cluster import load_cluster, write_cluster
from orchestrate.stages.evaluate import serve_probe
from orchestrate.stages.plan import PlanError, plan_arm
from orchestrate.stages.prepare import seed_from_model_dir
from orchestrate.stages.preserve import preserve_home
from orchestrate.status import Unknown, trial_status
from orchestrate.transport import TransportError
from orchestrate.trial import OptionError, TrialOptions, run_trial
from orchestrate.wheelhouse import WheelhouseError, download, project_requirements
from training.config import (
    ConfigError,
    Resolved,
    address,
    config_dir,
    experiment_names,
    lineage,
    load_experiment,
    origins,
    resolve,
)
from training.hold import HeldError, hold, lock_path
from training.prepare import PrepareError, require_prepared, task_source
from training.results import ArmSummary
from training.sources import TaskFileError
from training.train import resolved_from_prepared

if TYPE_CHECKING:
    from evidence.report import Report

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run budget-bounded training trials end to end.")
con = stderr_console()
progress = ConsoleProgress(con)
say = progress.say


@app.callback()
def _root() -> None:
    """Run budget-bounded training trials end to end."""


@app.command()
def run(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four, or an experiment's name "
                                             "(its primary arm)"),
        profile: str = typer.Option("cpu", help="smoke | cpu | gpu"),
        trials: Path = typer.Option(Path("trials"), help="where trial homes are created"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="a profile with seed = \"local\": your model, a Hugging "
                                                 "Face causal-LM directory (imported under --seeds with a receipt) "
                                                 "or a seed directory `python -m training seed` made"),
        store: Optional[str] = typer.Option(None, help=f"evidence store, one of {known_forms()} "
                                                       "(default: the cluster's, else file://<trials>/store)"),
        cluster: Optional[Path] = typer.Option(None, help="cluster.json from `orchestrate up` (default: the "
                                                         "embedded local cluster)"),
        wheelhouse: Optional[Path] = typer.Option(None, help="SSH hosts: wheels of every dependency for the "
                                                            "hosts' Python (the project's own wheel is built)"),
        record: Optional[Path] = typer.Option(None, help="the run's record (stage seconds, arms not run, scoring "
                                                        "speed) as JSON; default "
                                                        "<trials>/run-records/<home>-<time>.json"),
        share_gpus: bool = typer.Option(False, "--share-gpus", help="embedded local cluster, CUDA profile: run an "
                                        "arm of N ranks (and the probe's replicas) on fewer GPUs, rank r on GPU r mod "
                                        "M, reducing through gloo; committed in placement.json. Learning verdicts are "
                                        "real, timing gates are marked not comparable"),
        replay: Optional[Path] = typer.Option(None, help="your own replay conversations (JSONL, as `python -m "
                                              "training prepare --replay`) for the experiment run here, in place "
                                              "of the generated ones; committed with its sha256"),
        no_serve: bool = typer.Option(False, "--no-serve", help="do not run the serving probe (committed in "
                                      "placement.json at the home's first run; the report shows the serving "
                                      "gates not evaluated, with this reason)")
        ) -> None:
    """Run ARM's experiment: seed → prepare → commit → place → train every arm the cluster can place →
    select → score → serve → report → preserve, on the embedded local cluster or a cluster's SSH hosts.
    An arm whose ranks cannot each get their own GPU (or host) is reported as not run, never launched."""
    options = TrialOptions(arm=arm, profile=profile, trials=trials, seeds=seeds, model_dir=model_dir, store=store,
                           cluster=cluster, wheelhouse=wheelhouse, record=record, share_gpus=share_gpus,
                           replay=replay, no_serve=no_serve)
    try:
        out = run_trial(options, CliView(con))
    except OptionError as e:
        raise typer.BadParameter(str(e))
    except LeftRunning as e:  # ranks detached on SSH hosts: they were left running, on purpose
        say("interrupted:", f"{len(e.where)} rank(s) keep running on their hosts, detached:", style="bold yellow")
        for w in e.where:
            con.print(f"  {w}", highlight=False)
        again = " ".join(shlex.quote(a) for a in ["orchestrate", *sys.argv[1:]])
        con.print(f"to follow them again and finish the trial: {again}\n"
                  f"to see them: orchestrate status --cluster {cluster}\n"
                  f"to stop them: orchestrate stop --cluster {cluster}", highlight=False)
        raise
    if out.error is not None:
        say("error:", out.error, style="bold red")
    if out.exit:
        raise typer.Exit(out.exit)
    say(f"{out.arm}:", f"prepared, trained, selected, scored, {'served, ' if out.served else ''}"
        f"reported and preserved in {out.total_seconds:.1f} s → {out.report}; evidence {out.preserved}")
    if out.not_run:
        placed = any(why != NO_SERVE for why in out.not_run.values())  # not the operator's own choice
        con.print("not run: " + "; ".join(f"{a} ({why.removeprefix('not run: ')})" for a, why in out.not_run.items())
                  + (" — see docs/clusters.md, \"Placement\", for running them where the GPUs are" if placed else ""),
                  highlight=False)
    con.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in out.stages_seconds.items())
              + f"; record {out.record}", highlight=False)


class CliView(ConsoleProgress):
    """Progress on the console, and the training and report tables as the trial reaches them."""

    def trained(self, cfg: Resolved, summaries: list[ArmSummary]) -> None:
        show_summaries(cfg, summaries)

    def reported(self, report: Report) -> None:
        show_report(report)


def show_summaries(cfg, summaries: list[ArmSummary]) -> None:
    t = Table(title=f"{cfg.experiment.name}/{cfg.profile_name}: training")
    for col in ("arm", "ranks", "updates", "step s", "loop s", "MB/update", "loss first", "loss last",
                "replicas"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(s.arm, str(s.world_size), str(s.updates), f"{s.step_seconds_median:.3f}",
                  f"{s.training_loop_seconds:.1f}", f"{s.payload_bytes_per_update / 1e6:.2f}",
                  f"{s.loss_first:.4f}", f"{s.loss_last:.4f}",
                  "agree" if s.replicas_agree else "DIFFER")
    con.print(t)
    con.print("step s: median over updates of the slowest rank; MB/update: logical collective payload "
              "per rank; loss: global weighted response loss of the first and last update")


def show_report(rep: Report) -> None:
    """The trial in one table: test accuracy per arm (and what was not run), payload per update, and the
    gates — each one, failed or not evaluated as well as passed."""
    for g in rep.gates:
        said = verdict(g)
        if g.failed and g.attainable is not False:  # what it would have taken
            said += f" ({'could pass at this profile: ' if g.attainable else ''}{g.attainability})"
        con.print(f"  gate {g.gate}: " + (f"not evaluated ({g.reason})" if g.not_evaluated
                                          else f"{g.value:.4g} → {said}"),
                  highlight=False)
    t = Table(title=f"{rep.experiment}/{rep.profile}: result (primary {rep.selection['primary']})")
    for col in ("arm", "test exact", "accuracy", "MB/update"):
        t.add_column(col, justify="right")
    for arm, a in rep.accuracy.items():
        mb = rep.arms.get(arm, {}).get("payload_bytes_per_update")
        t.add_row(arm, f"{a['correct']}/{a['cases']}", f"{a['accuracy']:.1%}", "—" if mb is None else f"{mb / 1e6:,.2f}")
    for what, why in rep.not_run.items():
        t.add_row(Text(what), Text(why), "—", "—")
    con.print(t)
    con.print(closing(rep)[0], highlight=False)


def show_attainability(rec: dict) -> None:
    """What each gate of the plan's experiment can reach at its profile (evidence/attainability.py)."""

    gates = [g for g in rec["gates"] if not g["gate"].startswith("serving")]
    print(f"{rec['experiment']}: gates at profile {rec['profile']} ({rec['basis']['test_cases']} test cases): "
          f"{sum(g['attainable'] is True for g in gates)} attainable, "
          f"{sum(g['attainable'] is False for g in gates)} {UNATTAINABLE}, "
          f"{sum(g['attainable'] is None for g in gates)} decided by measurement")
    for g in gates:
        print(f"  {g['gate']}: " + (f"{UNATTAINABLE}: " if g["attainable"] is False else "") + g["attainability"])


@app.command()
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
       out: Path = typer.Option(Path("cluster.json"), help="where to write the description")) -> None:
    """Write cluster.json: the embedded local cluster, or a Pulumi stack's hosts from its outputs
    (`pulumi up` creates them; this only describes them, and checks every field)."""
    # start-up: boto3/botocore take ~0.9 s to import (-X importtime, 2026-12-06); only AWS calls pay it
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        desc = write_cluster(out, progress, local=local, hosts=hosts, stack=stack, pulumi_outputs=pulumi_outputs,
                             key_file=key_file, host_keys=host_keys, boot_wait=boot_wait, addresses=addresses,
                             store=store)
    except (ClusterError, CoveredFileError, ValueError, OSError, HostKeysMissing) as e:  # ValueError: pydantic's
        say("error:", str(e), style="bold red")                                           # or a key's refusal
        raise typer.Exit(2)
    except (BotoCoreError, ClientError) as e:
        say("error:", f"reading the instances (addresses, consoles) failed: {e}", style="bold red")
        raise typer.Exit(1)
    say("cluster", f"{desc.source}: {len(desc.hosts)} host(s), store {desc.store} → {out}")


@app.command()
def probe(home: Path = typer.Option(..., help="a trial home with a committed selection"),
          retry: Optional[str] = typer.Option(None, help="run another probe; the reason is recorded"),
          cluster: Optional[Path] = typer.Option(None, help="cluster.json the trial ran on: its SSH hosts serve "
                                                           "(default: replicas on this machine)"),
          seeds: Path = typer.Option(Path(".seeds"), help="SSH hosts: where the profile's seed is materialized"),
          model_dir: Optional[Path] = typer.Option(None, help="SSH hosts: the seed directory (a 'local' seed)"),
          wheelhouse: Optional[Path] = typer.Option(None, help="SSH hosts: wheels of every dependency")) -> None:
    """Run the serving probe (one replica per rank of the serving arm, at least two): on this machine,
    or with --cluster one per SSH host, where the trial's ranks ran."""

    backend = None
    try:
        with hold(home, f"trial home {home}"):
            cfg = resolved_from_prepared(require_prepared(home))
            desc = load_cluster(cluster, progress)
            if model_dir is not None and (desc is None or desc.source == "local"):  # replicas here read the home's model
                raise typer.BadParameter(f"--model-dir {model_dir} is used only with --cluster of SSH hosts "
                                         "(it stages their seed); replicas on this machine serve the trained model")
            if desc is not None and desc.source != "local":  # the hosts are staged (again) from the seed
                md = seed_from_model_dir(model_dir, seeds, progress) if model_dir else seeds / cfg.profile.seed
                backend = make_backend(desc, home, md, home.parent, wheelhouse, progress)
            serve_probe(cfg, home, progress, retry=retry, backend=backend)
    except UserError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    finally:
        if backend is not None:
            backend.close()


@app.command()
def estimate(stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
             as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON")) -> None:
    """The cost and traffic estimate of a stack's plan against its budget (what `pulumi up` checks)."""
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
    try:
        conf = yaml.safe_load(stack.read_text())["config"]
        return TrialConfig.model_validate({**conf["trials:cluster"], "region": conf["aws:region"]})
    except (OSError, KeyError, TypeError, yaml.YAMLError, ValidationError) as e:
        say("error:", f"{stack}: {e}", style="bold red")
        raise typer.Exit(2)


@app.command()
def plan(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four, EXPERIMENT/ARM, or an "
                                             "experiment's name (its primary arm)"),
         stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
         quota: bool = typer.Option(True, help="read the account's G/VT vCPU quota and the zones' instance-type "
                                               "offerings (needs AWS credentials); --no-quota: no AWS reads"),
         wheelhouse: Optional[Path] = typer.Option(None, help="the wheelhouse staging will upload (its size counts)"),
         uplink_mbps: float = typer.Option(100.0, min=0.001, max=1e6,
                                           help="this machine's upload rate, Mbit/s, for the staging time"),
         as_json: bool = typer.Option(False, "--json"),
         profile: str = typer.Option("gpu", help="the profile `run` will use on the hosts: the gates' "
                                                 "attainability is planned at it (bytes, hours and the "
                                                 "placement come from the stack's arms and hosts)")) -> None:
    """Cost, hours and bytes of ARM's experiment (the arm and its controls) against the budget split,
    the hosts' vCPUs against the account's G-instance quota, and what staging sends from this machine.
    Exit 1 when anything does not fit."""
    cfg = _stack_config(stack)
    try:
        est = plan_arm(cfg, stack, arm, wheelhouse=wheelhouse, uplink_mbps=uplink_mbps, quota=quota, now=_now(),
                       profile=profile)
    except (ConfigError, PlanError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
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
    per_day = sum(ln.usd for ln in est.lines if ln.item.startswith("stopped:")) / (cfg.stopped_days or 1)
    left = est.reserved_usd.storage_other - est.totals_usd.storage_other
    if cfg.stopped_days:
        print(f"stopped volumes: ${per_day:.2f} a day after the deadline until `orchestrate down` ({cfg.stopped_days:g} "
              f"d counted, stopped_days); the storage reservation has ${left:.2f} left" +
              (f", {left / per_day:.1f} more days" if per_day and left > 0 else ""))
    else:
        print("stopped volumes: not counted (stopped_days = 0): they bill every day after the deadline until "
              "`orchestrate down`")
    print(f"stops: the cloud schedule at the deadline (every host tagged trial={cfg.trial}, from its first moment) "
          "and the transfer guards are the bounds. The budget "
          f"(${cfg.budget.total_usd:g}, {'the region' if cfg.budget_filter == 'region' else 'the trial tag'}'s spend) "
          "and its stop action are a late backstop: AWS Budgets sees costs hours late (its data is refreshed at "
          f"least daily), so a {cfg.hours:g}-h trial's spend may not show in it before the deadline")
    for p in problems:
        say("does not fit:", p, style="bold red")
    raise typer.Exit(1 if problems else 0)


@app.command()
def gates(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four, or an experiment's name"),
          profile: str = typer.Option("cpu", help="smoke | cpu | gpu | …"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """What each gate of ARM's experiment can reach at PROFILE on the embedded local cluster — the
    analysis `run` commits as attainability.json before training (evidence/attainability.py): whether
    it can pass at all, and the smallest effect it can detect. Nothing is prepared or trained."""
    try:
        cfg = resolve(address(arm)[0], profile)
    except ConfigError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    rec = analyse(cfg.as_dict(), cluster_basis({"cluster": {"source": "local"}}, shared_cores=True))
    if as_json:
        print(json.dumps(rec, indent=1, ensure_ascii=False))
    else:
        show_attainability(rec)


@app.command()
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

    root = Path(__file__).resolve().parent.parent
    if python_version is None or platform is None:
        cfg = _stack_config(stack)
        python_version, platform = python_version or cfg.host_python_version, platform or cfg.host_platform
    lock = root / "requirements.lock"
    try:
        with con.status(f"pip download for CPython {python_version} on {platform}…"):
            wheels = download(dest, python_version, platform, requirement or project_requirements(root),
                              constraints=lock if not requirement and lock.is_file() else None,
                              find_links=find_links, no_index=no_index)
    except WheelhouseError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    size = sum(w.stat().st_size for w in wheels)
    print(f"{dest}: {len(wheels)} wheel(s), {size / 1e9:,.2f} GB, for CPython {python_version} on {platform} and "
          f"older manylinux tags; `orchestrate plan ARM --wheelhouse {dest}` counts them")


@app.command()
def status(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json"),
           home: Optional[Path] = typer.Option(None, help="the trial home (the embedded local cluster's ranks write there)"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """A running trial: spend so far, bytes against the transfer guard, time to the deadline, each rank's state."""
    try:
        desc = load(cluster)
        st = trial_status(desc, home)
    except (ClusterError, ValueError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
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
    alerts = st.alerts
    if isinstance(alerts, Unknown):
        say("alerts:", f"unknown ({alerts.error})", style="bold yellow")
    elif alerts is not None:
        say("alerts:", "transfer alarms " + (", ".join(f"{a['name']} {a['state']}" for a in alerts["alarms"]) or "none")
            + "; topic reaches " + (", ".join(f"{s['endpoint']} ({s['protocol']}, {s['state']})"
                                              for s in alerts["subscriptions"]) or "no one"))
        for w in alerts["warnings"]:
            say("warning:", w, style="bold yellow")


@app.command()
def preserve(home: Path = typer.Option(..., help="the trial home"),
             store: Optional[str] = typer.Option(None, help=f"one of {known_forms()} "
                                                            "(default: the cluster's, else file://<home's parent>/store)"),
             cluster: Optional[Path] = typer.Option(None, help="the cluster the ranks ran on: each SSH host "
                                                               "preserves the checkpoint payloads that stayed on it"),
             leave_host_payloads: Optional[str] = typer.Option(None, help="REASON: preserve without the payloads "
                                                               "that stayed on the hosts (recorded in the index)")) -> None:
    """Upload every file of the home, content-addressed, each object read back and re-hashed; with
    --cluster, every SSH host preserves its own checkpoint payloads from where they are."""

    class Hosts:  # the one thing preserve_home asks of a backend
        def __init__(self, desc):
            self.desc, self.ts = desc, [desc.transport(h) for h in desc.by_rank]

        def host_parts(self, url: str):
            return host_parts(self.desc, self.ts, url, say=lambda m: say("preserve", m))

        def close(self) -> None:
            for t in self.ts:
                t.close()

    hosts = None
    try:
        desc = load(cluster) if cluster else None
        hosts = Hosts(desc) if desc is not None and any(h.transport == "ssh" for h in desc.hosts) else None
        url = store or (desc.store if desc else FileStore.url_for(home.resolve().parent / 'store'))
        with hold(home, f"trial home {home}"):
            rec = preserve_home(home, url, progress, hosts, leave_host_payloads)
    except UserError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    finally:
        if hosts is not None:
            hosts.close()
    con.print(f"  → {rec['store']}{rec['index']}", highlight=False)


@contextmanager
def verified_home(home: Path, not_preserved: str) -> Iterator[tuple[dict, dict]]:
    """Hold `home` (not while a run writes in it) with its preservation record read and its evidence index
    verified in the store, object by object: (record, verification). Refused (exit 2), by name, when the
    home was never preserved (`not_preserved`: what to do), is held, or its evidence does not verify."""
    rec_path = home / PRESERVED
    if not rec_path.is_file():
        say("refused:", f"{home} has not been preserved (no {PRESERVED}); {not_preserved}", style="bold red")
        raise typer.Exit(2)
    with ExitStack() as held:
        try:
            held.enter_context(hold(home, f"trial home {home}"))
        except HeldError as e:
            say("refused:", str(e), style="bold red")
            raise typer.Exit(2)
        try:
            rec = read_preserved(home)
            with con.status("re-reading every preserved object…"):
                v = verify_index(rec["store"], rec["index"], rec["index_sha256"])
        except (EvidenceFileError, PreservationError, OSError) as e:
            say("refused:", f"the evidence {rec_path} records does not verify: {e}", style="bold red")
            raise typer.Exit(2)
        yield rec, v


@app.command()
def down(home: Path = typer.Option(..., help="the trial home"),
         aws_trial: Optional[str] = typer.Option(None, help="stop and reconcile this trial's AWS hosts by tag"),
         region: Optional[str] = typer.Option(None, help="AWS region of --aws-trial")) -> None:
    """Tear down — only once the home's evidence index verifies in its store, object by object."""
    with verified_home(home, f"run `orchestrate preserve --home {home}` first — hosts stay up until the evidence "
                             "is safe") as (rec, v):
        pass
    say("verified", f"{v['files']} objects, {v['bytes'] / 1e6:,.1f} MB in {rec['store']}")
    if aws_trial is None:
        con.print("embedded local cluster: no hosts to stop", highlight=False)
        return
    import boto3

    session = boto3.Session(region_name=region)
    stopped = stop_trial(session, aws_trial)
    con.print(f"stopped {len(stopped)} instance(s): {', '.join(stopped) or '—'}", highlight=False)
    left = reconcile(session, aws_trial)
    for f in left:
        con.print(f"  {f.kind} {f.id}: {f.state}{' — still billing' if f.billing else ''} {f.detail}",
                  highlight=False)
    if any(f.billing and f.kind == "instance" for f in left):
        raise typer.Exit(1)


@app.command()
def stop(cluster: Path = typer.Option(Path("cluster.json"), help="the trial's cluster.json")) -> None:
    """Stop the ranks left running on the cluster's hosts (an interrupted `orchestrate run` leaves them
    detached there): SIGTERM by pid, SIGKILL 10 s later. Their checkpoints stay for a resume."""

    try:
        c = load(cluster)
        stopped = stop_ranks(c, len(c.hosts), None)
    except (ClusterError, TransportError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    con.print(f"stopped a rank on {len(stopped)} host(s){': ' + ', '.join(stopped) if stopped else ''}",
              highlight=False)


@app.command()
def remove(home: Path = typer.Option(..., help="the trial home to delete from this machine")) -> None:
    """Delete a trial home once every file in it is in its preserved, verified evidence index: how old
    trials leave the disk. A home never preserved, whose store does not verify, or holding anything the
    index does not hold as it is now (a later run's report, a changed file) is refused, naming it, and
    left as it is. The store is not touched."""
    try:
        with verified_home(home, f"run `orchestrate preserve --home {home}` first — nothing of it would survive "
                                 "its removal") as (rec, v):
            files = [p for p in sorted(home.rglob("*")) if p.is_file() or p.is_symlink()]
            size = sum(p.stat().st_size for p in files if p.is_file())
            with con.status(f"comparing {len(files)} files with the index…"):  # a link is never preserved
                left = [rel for rel in (p.relative_to(home).as_posix() for p in files) if rel != PRESERVED and (
                        (home / rel).is_symlink() or rel not in v["sha256"] or v["sha256"][rel] != file_sha256(home / rel))]
            if left:
                say("refused:", f"{home} holds {len(left)} file(s) its evidence index {rec['store']}{rec['index']} "
                    f"does not hold as they are now: {', '.join(left[:8])}{' …' if len(left) > 8 else ''}; "
                    f"preserve them (`orchestrate preserve --home {home}`) or move them out first", style="bold red")
                raise typer.Exit(2)
            # the record last: a deletion that fails part way leaves a home `remove` can still verify and finish
            for p in sorted(home.iterdir()):
                if p.name != PRESERVED:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            shutil.rmtree(home)
            lock_path(home).unlink(missing_ok=True)  # while held: no other run can have taken it
    except OSError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    say("removed", f"{home}: {len(files)} files, {size / 1e6:,.1f} MB; every one is in {rec['store']}{rec['index']} "
        f"({v['files']} objects verified)")


@app.command("list")
def list_cmd() -> None:
    """The experiments this checkout defines (config/experiments/, or $TRIAL_CONFIG_DIR): each one's arms
    (kind, ranks; the primary and the serving arm marked), the experiment before it, and its profiles."""

    try:
        d = config_dir()
        for name in experiment_names(d):
            exp = load_experiment(name, d)
            print(f"{name}: {exp.description}" + (f" (after {exp.previous})" if exp.previous else "")
                  + (f" (tasks: {exp.task_file})" if exp.task_file else ""))
            for a in exp.arms:
                marks = [m for m, yes in (("primary", a.name == exp.acceptance.primary),
                                          ("serving", a.name == exp.serving_arm)) if yes]
                print(f"  arm {a.name}: {a.kind}, {a.world_size} rank(s)" + (f" [{', '.join(marks)}]" if marks else ""))
            print(f"  profiles: {', '.join(exp.profiles)}")
    except ConfigError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)


@app.command()
def validate(experiment: str = typer.Argument(..., help="an experiment's name (or one of its arms)"),
             profile: str = typer.Option("cpu", help="the profile to resolve it at"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The study `orchestrate run` would run, resolved without running anything: every value with where it
    comes from (the experiment, an arm, the profile or its base, a default), and every experiment before
    it. Exit 2, naming the value, when it would be refused."""
    try:
        name = address(experiment)[0]
        chain = lineage(name, profile)
        values = origins(name, profile)
        cases = None
        for step in chain:  # every task file of the lineage read and split as prepare will
            if step.experiment.task_file is not None:
                (src := task_source(step)).cases(step.split_counts)
                cases = {**src.describe(), "path": str(step.experiment.task_path())} if step is chain[-1] else cases
    except (ConfigError, PrepareError, TaskFileError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps({"experiment": name, "profile": profile, "digest": chain[-1].digest(),
                          "previous": [c.experiment.name for c in chain[:-1]], "task_source": cases,
                          "values": {k: {"value": v, "from": o} for k, (v, o) in values.items()}}, indent=2))
        return
    print(f"{name} at profile {profile}: valid; resolved digest {chain[-1].digest()[:16]}…"
          + (f"; prepared after {', '.join(c.experiment.name for c in chain[:-1])} (no task of theirs recurs)"
             if len(chain) > 1 else ""))
    if cases is not None:
        u = cases["used"]
        print(f"tasks: {cases['path']} — {cases['cases']} cases (sha256 {cases['sha256'][:12]}…), split by "
              f"{'the file' if cases['split_by'] == 'file' else 'the generator seed'}: train {u['train']}, dev "
              f"{u['dev']}, test {u['test']}; {cases['unused']} not used; {cases['wrong_answers']} with a wrong answer")
    width = max(len(k) for k in values)
    for k, (v, o) in values.items():
        print(f"  {k:<{width}}  {json.dumps(v)}  ← {o}")


@app.command("recovery-trial")
def recovery_trial_cmd(
        arm: str = typer.Option("diloco-four", help="the arm to interrupt"),
        profile: str = typer.Option("recovery", help="a profile with checkpoint_every set"),
        from_step: int = typer.Option(64, help="the uninterrupted run's checkpoint to start from"),
        kill_rank: int = typer.Option(1, help="the rank to kill"),
        kill_after: int = typer.Option(75, help="kill it after this many updates"),
        out: Path = typer.Option(Path("trials/recovery"), help="a fresh directory for the trial"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="a profile with seed = \"local\": your model (as `run "
                                                 "--model-dir`)"),
        share_gpus: bool = typer.Option(False, "--share-gpus", help="CUDA profile with fewer GPUs than ranks: the "
                                        "ranks share them (gloo between them); the comparison stays exact")) -> None:
    """Kill a rank mid-run, restart from the common checkpoint, compare with an uninterrupted run."""
    options = RecoveryOptions(arm=arm, profile=profile, from_step=from_step, kill_rank=kill_rank,
                              kill_after=kill_after, out=out, seeds=seeds, model_dir=model_dir, share_gpus=share_gpus)
    try:
        rep = run_recovery(options, progress)
    except OptionError as e:
        raise typer.BadParameter(str(e))
    except (UserError, ValueError, RuntimeError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    f, c = rep["failure"], rep["comparison"]
    con.print(f"kill → failure observed {f['kill_to_observed_seconds']:.3f} s, → survivors stopped "
              f"{f['kill_to_survivors_stopped_seconds']:.3f} s; resumed from {sorted(set(rep['resumed_from']))}")
    con.print(f"final state of every rank vs the uninterrupted run: max |Δ| = {c['max_abs_diff']!r} "
              f"over {sum(p['tensors'] for r in c['ranks'] for k, p in r.items() if isinstance(p, dict))} "
              f"tensors; {'IDENTICAL' if c['identical'] else 'DIFFERENT'}")
    print(json.dumps({"comparison": str(out / "recovery-comparison.json"), "digest": rep["digest"],
                      "max_abs_diff": c["max_abs_diff"], "identical": c["identical"],
                      "kill_to_survivors_stopped_seconds": f["kill_to_survivors_stopped_seconds"]}))
    if not c["identical"]:
        raise typer.Exit(1)


def main() -> None:
    def terminated(signum: int, frame) -> None:
        raise KeyboardInterrupt("terminated (SIGTERM)")

    # `timeout`, a scheduler or `kill` ends a run with SIGTERM, which Python would obey at once, skipping
    # every `finally`: ranks left running, holds and records not written. As Ctrl-C, it unwinds instead.
    signal.signal(signal.SIGTERM, terminated)
    app()

"""`orchestrate`: the user's entry point for a whole trial."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run budget-bounded training trials end to end.")
# logs and CI are not terminals: give tables room instead of rich's 80-column default
con = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


@app.callback()
def _root() -> None:
    """Run budget-bounded training trials end to end."""


@app.command()
def run(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four"),
        profile: str = typer.Option("cpu", help="smoke | cpu | gpu"),
        trials: Path = typer.Option(Path("trials"), help="where trial homes are created"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="seed directory for a 'local' seed"),
        store: Optional[str] = typer.Option(None, help="evidence store: file://DIR or s3://BUCKET/PREFIX "
                                                       "(default: file://<trials>/store)")) -> None:
    """Run ARM's experiment on the embedded local cluster: seed → prepare → commit → train every arm
    → select → score → serve → report → preserve."""
    from training.config import arm_to_experiment, lineage, resolve
    from training.errors import USER_ERRORS
    from training.prepare import prepare
    from training.seed import materialize

    started = time.monotonic()
    try:
        name = arm_to_experiment(arm)
        cfg = resolve(name, profile)
        cfg.arm(arm)
        if cfg.profile.seed == "local":
            if model_dir is None:
                raise typer.BadParameter(f"profile {profile} trains a local seed: pass --model-dir")
            md = model_dir
        else:
            md = seeds / cfg.profile.seed
            con.print(f"[bold]seed[/] {cfg.profile.seed} → {md}")
            with con.status("materializing / verifying the seed…"):
                materialize(cfg.profile.seed, md)
        previous: Optional[Path] = None
        for step in lineage(name, profile):  # earlier experiments first: no task may recur
            exp_name = step.experiment.name
            home = trials / f"{exp_name}-{profile}"
            con.print(f"[bold]prepare[/] {exp_name}/{profile} → {home}"
                      + (f" (no task of {previous} may recur)" if previous else ""))
            with con.status(f"preparing {exp_name}…"):
                res = prepare(step, home, md, previous_home=str(previous) if previous else None)
            c = res["prepared"]["counts"]
            con.print(f"  {res['status']} in {res['record']['seconds']['total']:.1f} s: "
                      f"{c['task']['documents']} task + {c['replay']['documents']} replay documents, "
                      f"task share of targets {c['task_share_of_targets']:.1%} unweighted / "
                      f"{c['task_share_of_weighted_targets']:.1%} weighted; committed")
            previous = home
        summaries = train_arms(cfg, previous, md)
        show_summaries(cfg, summaries)
        report = select_evaluate_report(cfg, previous, md)
        rec = preserve_home(previous, store or f"file://{trials.resolve() / 'store'}")
    except USER_ERRORS as e:
        con.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2)
    con.print(f"[bold]{arm}[/]: prepared, trained, selected, scored, served, reported and preserved in "
              f"{time.monotonic() - started:.1f} s → {report}; evidence {rec['store']}{rec['index']}",
              highlight=False)


def select_evaluate_report(cfg, home: Path, seed_dir: Path) -> Path:
    """select (once) → test scoring of the seed and every candidate (once each) → the serving probe
    (once) → the report."""
    from evidence.commitments import CommitmentLog
    from evidence.report import EvidenceError, write_report
    from training.errors import TrainError
    from training.evaluate import attempts_dir, evaluate
    from training.select import select

    if CommitmentLog(home).latest("selection") is None:
        sel = select(home, cfg)
        con.print(f"[bold]select[/] committed: primary {sel['primary']} (fixed by the rules), "
                  f"{len(sel['candidates'])} candidates acknowledged")
    for a in cfg.experiment.arms:
        if (attempts_dir(home, "test", a.name)).exists():
            con.print(f"[bold]test[/] {a.name}: already scored, attempts kept")
            continue
        with con.status(f"scoring {a.name} on the test cases…"):
            res = evaluate(home, a.name, "test", seed_dir=seed_dir)
        con.print(f"[bold]test[/] {a.name}: {res['correct']}/{res['cases']} exact, retention probe loss "
                  f"{res['probe_mean_loss']:.4f} ({res['seconds']:.1f} s)")
    if CommitmentLog(home).latest("serving") is None:
        serve_probe(cfg, home)
    else:
        con.print("[bold]serve[/] already probed, attempts kept")
    out = home / "report.json"
    try:
        rep = write_report(home, out)
    except EvidenceError as e:
        raise TrainError(f"evidence is inconsistent, no report written: {e}") from None
    for g in rep["gates"]:
        con.print(f"  gate {g['gate']}: {g['value']:.4g} → {'passed' if g['passed'] else 'FAILED'}",
                  highlight=False, markup=False)
    return out


def preserve_home(home: Path, url: str) -> dict:
    """Every file of the home into the evidence store, each object read back; raises TrainError."""
    from evidence.stores import PreservationError, preserve as run_preserve
    from training.errors import TrainError

    try:
        with con.status(f"preserving {home} → {url}…"):
            rec = run_preserve(home, url, trial=home.resolve().name)
    except (PreservationError, OSError) as e:
        raise TrainError(f"preservation failed, nothing may be torn down: {e}") from None
    con.print(f"[bold]preserve[/] {rec['files']} files, {rec['bytes'] / 1e6:,.1f} MB "
              f"({rec['uploaded_bytes'] / 1e6:,.1f} MB uploaded now), every object read back", highlight=False)
    return rec


def serve_probe(cfg, home: Path, retry: str | None = None) -> dict:
    """The serving probe on this machine: one replica process per rank of the serving arm."""
    from orchestrate.local import threads_per_rank
    from orchestrate.serving import local_probe

    arm = cfg.arm(cfg.experiment.serving_arm)
    n = max(2, arm.world_size)  # one replica per rank, and at least two: the last phase stops one
    con.print(f"[bold]serve[/] {arm.name}: {n} replicas on this machine, 1 → {n} → {n} with one stopped")
    with con.status("serving probe…"):
        res = local_probe(home, arm.name, n, threads=threads_per_rank(n), retry=retry,
                          say=lambda m: con.print(f"  {m}", highlight=False, markup=False))
    r = res.get("throughput_ratio_replicas_vs_single")
    con.print(f"  throughput {n} replicas / 1: {'—' if r is None else f'{r:.2f}'}; "
              f"tasks with differing tokens: {len(res['tasks_with_differing_tokens'])}; "
              f"model identities: {len(res['model_identities'])} → {res['attempt']}", highlight=False)
    return res


def train_arms(cfg, home: Path, model_dir: Path) -> list[dict]:
    """Train every arm of the experiment, one after another (never two jobs on one device)."""
    from orchestrate.local import supervise, threads_per_rank, train_argv
    from training.errors import TrainError
    from training.results import finished, load_results, summarize
    from training.train import set_aside_unfinished

    out = []
    for a in cfg.experiment.arms:
        if a.kind == "seed":
            continue
        if finished(home, a.name, a.world_size):
            con.print(f"[bold]train[/] {a.name}: already finished, results kept")
        else:
            con.print(f"[bold]train[/] {a.name} ({a.kind}, {a.world_size} rank"
                      f"{'s' if a.world_size > 1 else ''}) → {home / 'runs' / a.name}")
            resumable = _resumable(home, a.name, a.world_size)
            if not resumable and set_aside_unfinished(home, a.name, a.world_size):
                con.print(f"  an unfinished earlier attempt was moved to "
                          f"{home / 'runs' / a.name / 'attempts'}")
            argv = train_argv(home, a.name, model_dir, threads_per_rank(a.world_size))
            rank_dirs = [home / "runs" / a.name / f"rank-{r}" for r in range(a.world_size)]
            # with group checkpoints, a failed group is restarted once from the common manifest
            attempts = supervise(argv, a.world_size, log_root=home / "logs" / a.name,
                                 heartbeats=[d / "heartbeat.json" for d in rank_dirs],
                                 max_restarts=1 if cfg.profile.checkpoint_every else 0,
                                 resume_first=resumable,
                                 can_resume=lambda: _resumable(home, a.name, a.world_size),
                                 echo=lambda line: con.print(f"  {line}", highlight=False, markup=False))
            if not attempts[-1].ok:
                raise TrainError(f"arm {a.name} failed; {attempts[-1].failure_text()}")
        out.append(summarize(load_results(home, a.name, a.world_size)))
    return out


def _resumable(home: Path, arm: str, world: int) -> bool:
    """An earlier attempt left a manifest for the same step on every rank: resume, don't restart."""
    from training.checkpoint import local_manifests

    held = [set(local_manifests(home / "runs" / arm / f"rank-{r}")) for r in range(world)]
    return bool(held) and bool(set.intersection(*held))


def show_summaries(cfg, summaries: list[dict]) -> None:
    from rich.table import Table

    t = Table(title=f"{cfg.experiment.name}/{cfg.profile_name}: training")
    for col in ("arm", "ranks", "updates", "step s", "loop s", "MB/update", "loss first", "loss last",
                "replicas"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in summaries:
        t.add_row(s["arm"], str(s["world_size"]), str(s["updates"]), f"{s['step_seconds_median']:.3f}",
                  f"{s['training_loop_seconds']:.1f}", f"{s['payload_bytes_per_update'] / 1e6:.2f}",
                  f"{s['loss_first']:.4f}", f"{s['loss_last']:.4f}",
                  "agree" if s["replicas_agree"] else "DIFFER")
    con.print(t)
    con.print("step s: median over updates of the slowest rank; MB/update: logical collective payload "
              "per rank; loss: global weighted response loss of the first and last update")


@app.command()
def probe(home: Path = typer.Option(..., help="a trial home with a committed selection"),
          retry: Optional[str] = typer.Option(None, help="run another probe; the reason is recorded")) -> None:
    """Run the serving probe on this machine (one replica per rank of the serving arm)."""
    from training.errors import USER_ERRORS
    from training.prepare import require_prepared
    from training.train import resolved_from_prepared

    try:
        serve_probe(resolved_from_prepared(require_prepared(home)), home, retry=retry)
    except USER_ERRORS as e:
        con.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2)


@app.command()
def estimate(stack: Path = typer.Option(Path("Pulumi.dev.yaml"), help="a Pulumi stack config file"),
             as_json: bool = typer.Option(False, "--json", help="print the estimate as JSON")) -> None:
    """The cost and traffic estimate of a stack's plan against its budget (what `pulumi up` checks)."""
    import json

    import yaml
    from pydantic import ValidationError

    from infra.plan import TrialConfig, estimate as run_estimate, table

    try:
        conf = yaml.safe_load(stack.read_text())["config"]
        cfg = TrialConfig.model_validate({**conf["trials:cluster"], "region": conf["aws:region"]})
    except (OSError, KeyError, TypeError, yaml.YAMLError, ValidationError) as e:
        con.print(f"[bold red]error:[/] {stack}: {e}", highlight=False)
        raise typer.Exit(2)
    est = run_estimate(cfg)
    if as_json:
        print(json.dumps(est, indent=1))
    else:
        print(table(est))
    for p in est["problems"]:
        con.print(f"[bold red]over:[/] {p}", highlight=False)
    raise typer.Exit(1 if est["problems"] else 0)


@app.command()
def preserve(home: Path = typer.Option(..., help="the trial home"),
             store: Optional[str] = typer.Option(None, help="file://DIR or s3://BUCKET/PREFIX "
                                                            "(default: file://<home's parent>/store)")) -> None:
    """Upload every file of the home, content-addressed, each object read back and re-hashed."""
    from training.errors import TrainError

    try:
        rec = preserve_home(home, store or f"file://{home.resolve().parent / 'store'}")
    except TrainError as e:
        con.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2)
    con.print(f"  → {rec['store']}{rec['index']}", highlight=False)


@app.command()
def down(home: Path = typer.Option(..., help="the trial home"),
         aws_trial: Optional[str] = typer.Option(None, help="stop and reconcile this trial's AWS hosts by tag"),
         region: Optional[str] = typer.Option(None, help="AWS region of --aws-trial")) -> None:
    """Tear down — only once the home's evidence index verifies in its store, object by object."""
    import json

    from evidence.stores import PRESERVED, PreservationError, verify_index

    rec_path = home / PRESERVED
    if not rec_path.is_file():
        con.print(f"[bold red]refused:[/] {home} has not been preserved (no {PRESERVED}); run "
                  f"`orchestrate preserve --home {home}` first — hosts stay up until the evidence is safe",
                  highlight=False)
        raise typer.Exit(2)
    rec = json.loads(rec_path.read_text())
    try:
        with con.status("re-reading every preserved object…"):
            v = verify_index(rec["store"], rec["index"], rec["index_sha256"])
    except (PreservationError, OSError) as e:
        con.print(f"[bold red]refused:[/] the evidence does not verify: {e}", highlight=False)
        raise typer.Exit(2)
    con.print(f"[bold]verified[/] {v['files']} objects, {v['bytes'] / 1e6:,.1f} MB in {rec['store']}", highlight=False)
    if aws_trial is None:
        con.print("embedded local cluster: no hosts to stop", highlight=False)
        return
    import boto3

    from orchestrate.cloud import reconcile, stop_trial

    session = boto3.Session(region_name=region)
    stopped = stop_trial(session, aws_trial)
    con.print(f"stopped {len(stopped)} instance(s): {', '.join(stopped) or '—'}", highlight=False)
    left = reconcile(session, aws_trial)
    for f in left:
        con.print(f"  {f.kind} {f.id}: {f.state}{' — still billing' if f.billing else ''} {f.detail}",
                  highlight=False, markup=False)
    if any(f.billing and f.kind == "instance" for f in left):
        raise typer.Exit(1)


@app.command("recovery-trial")
def recovery_trial_cmd(
        arm: str = typer.Option("diloco-four", help="the arm to interrupt"),
        profile: str = typer.Option("recovery", help="a profile with checkpoint_every set"),
        from_step: int = typer.Option(64, help="the uninterrupted run's checkpoint to start from"),
        kill_rank: int = typer.Option(1, help="the rank to kill"),
        kill_after: int = typer.Option(75, help="kill it after this many updates"),
        out: Path = typer.Option(Path("trials/recovery"), help="a fresh directory for the trial"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized")) -> None:
    """Kill a rank mid-run, restart from the common checkpoint, compare with an uninterrupted run."""
    import json

    from orchestrate.recovery import recovery_trial
    from training.config import arm_to_experiment, lineage
    from training.errors import USER_ERRORS
    from training.seed import materialize

    try:
        name = arm_to_experiment(arm)
        chain = lineage(name, profile)
        if out.exists():
            raise typer.BadParameter(f"{out} exists; give a fresh --out")
        md = seeds / chain[-1].profile.seed
        materialize(chain[-1].profile.seed, md)
        rep = recovery_trial(out, experiment_chain=chain, arm=arm, model_dir=md, from_step=from_step,
                             kill_rank=kill_rank, kill_after=kill_after,
                             say=lambda m: con.print(m, highlight=False, markup=False))
    except (*USER_ERRORS, ValueError, RuntimeError) as e:
        con.print(f"[bold red]error:[/] {e}", highlight=False)
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
    app()

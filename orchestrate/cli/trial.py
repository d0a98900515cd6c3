"""`run`, `probe` and `recovery-trial`: a trial, its serving probe again, and the recovery trial —
parsed into the typed calls of orchestrate/trial.py and orchestrate/recovery.py, rendered here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from evidence.errors import UserError
from evidence.stores import known_forms
from orchestrate.cli.console import con, progress, say
from orchestrate.cli.render import CliView


def run(arm: str = typer.Argument(..., help="the experiment to trial: its name, its primary arm (e.g. diloco-four) "
                                             "or EXPERIMENT/PRIMARY; the trial trains every arm of the "
                                             "experiment and judges its primary"),
        profile: Optional[str] = typer.Option(None, help="one of the experiment's profiles (`orchestrate list` "
                                                          "shows each experiment's; default: cpu)"),
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
    """Run ARM's experiment: judge → seed → prepare → commit → place → train every arm the cluster can
    place → select → score → serve → report → preserve, on the embedded local cluster or a cluster's SSH
    hosts. The study and its trial names are judged first, as `validate` judges them: a refusal there
    leaves nothing written. An arm whose ranks cannot each get their own GPU (or host) is reported as
    not run, never launched."""
    from orchestrate.interrupted import resume_command
    from orchestrate.launch.supervise import LeftRunning
    from orchestrate.placement import NO_SERVE
    from orchestrate.trial import OptionError, TrialOptions, run_trial

    options = TrialOptions(arm=arm, profile=profile, trials=trials, seeds=seeds, model_dir=model_dir, store=store,
                           cluster=cluster, wheelhouse=wheelhouse, record=record, share_gpus=share_gpus,
                           replay=replay, no_serve=no_serve)
    try:
        out = run_trial(options, CliView(con))
    except OptionError as e:  # read like every other refusal, not as a usage error
        say("error:", str(e), style="bold red")
        raise typer.Exit(2) from None
    except LeftRunning as e:  # ranks detached on SSH hosts: they were left running, on purpose
        say("interrupted:", f"{len(e.where)} rank(s) keep running on their hosts, detached:", style="bold yellow")
        for w in e.where:
            con.print(f"  {w}", highlight=False)
        con.print(f"to follow them again and finish the trial: {resume_command()}\n"
                  f"to see them: orchestrate status --cluster {cluster}\n"
                  f"to stop them: orchestrate stop --cluster {cluster}", highlight=False)
        raise typer.Exit(130)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: what is kept, what the next run does, how to resume
        said = getattr(e, "interrupted", None)
        for i, line in enumerate(said.lines() if said else [f"{e or 'interrupted'}; to resume: {resume_command()}"]):
            con.print(line, style="bold yellow" if i == 0 else None, highlight=False)
        raise typer.Exit(130)
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


def probe(home: Path = typer.Option(..., help="a trial home with a committed selection"),
          retry: Optional[str] = typer.Option(None, help="run another probe; the reason is recorded"),
          cluster: Optional[Path] = typer.Option(None, help="cluster.json the trial ran on: its SSH hosts serve "
                                                           "(default: replicas on this machine)"),
          seeds: Path = typer.Option(Path(".seeds"), help="SSH hosts: where the profile's seed is materialized"),
          model_dir: Optional[Path] = typer.Option(None, help="SSH hosts: the seed directory (a 'local' seed)"),
          wheelhouse: Optional[Path] = typer.Option(None, help="SSH hosts: wheels of every dependency")) -> None:
    """Run the serving probe (one replica per rank of the serving arm, at least two): on this machine,
    or with --cluster one per SSH host, where the trial's ranks ran."""
    from orchestrate.backends import make_backend
    from orchestrate.stages.cluster import load_cluster
    from orchestrate.stages.evaluate import serve_probe
    from orchestrate.stages.prepare import seed_from_model_dir
    from training.hold import hold
    from training.prepare import require_prepared
    from training.train import resolved_from_prepared


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


def recovery_trial_cmd(
        arm: str = typer.Option("diloco-four", help="the arm to interrupt"),
        profile: str = typer.Option("recovery", help="a profile whose arms publish group checkpoints (any whose checkpoint_every is not 0)"),
        from_step: int = typer.Option(64, help="the uninterrupted run's checkpoint to start from"),
        kill_rank: int = typer.Option(1, help="the rank to kill"),
        kill_after: int = typer.Option(75, help="kill it after this many updates"),
        out: Path = typer.Option(Path("trials/recovery"), help="a fresh directory for the trial"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="a profile with seed = \"local\": your model (as `run "
                                                 "--model-dir`)"),
        share_gpus: bool = typer.Option(False, "--share-gpus", help="CUDA profile with fewer GPUs than ranks: the "
                                        "ranks share them (gloo between them); the comparison stays exact"),
        control: bool = typer.Option(True, "--control/--no-control", help="also resume the same checkpoint without "
                                     "a kill and compare it with the uninterrupted run: tells a restart that loses "
                                     "state from numerics that are not reproducible")) -> None:
    """Kill a rank mid-run, restart from the common checkpoint, compare with an uninterrupted run (and, as a
    control, the same restart without a kill)."""
    from evidence.report.recovery import REPORT as RECOVERY_REPORT, write_recovery_report
    from orchestrate.recovery import RecoveryOptions, run_recovery
    from orchestrate.trial import OptionError

    options = RecoveryOptions(arm=arm, profile=profile, from_step=from_step, kill_rank=kill_rank,
                              kill_after=kill_after, out=out, seeds=seeds, model_dir=model_dir, share_gpus=share_gpus,
                              control=control)
    try:
        rep = run_recovery(options, progress)
    except OptionError as e:  # read like every other refusal, not as a usage error
        say("error:", str(e), style="bold red")
        raise typer.Exit(2) from None
    except (UserError, ValueError, RuntimeError) as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    f, c = rep.failure, rep.comparison
    con.print(f"kill → failure observed {f.kill_to_observed_seconds:.3f} s, → survivors stopped "
              f"{f.kill_to_survivors_stopped_seconds:.3f} s; resumed from {sorted(set(rep.resumed_from))}")
    con.print(f"final state of every rank vs the uninterrupted run: max |Δ| = {c.max_abs_diff!r} "
              f"over {sum(p.tensors for r in c.ranks for p in r.parts.values())} "
              f"tensors; {'IDENTICAL' if c.identical else 'DIFFERENT'}"
              + (f"; first parts at update {rep.parting.update} (rank {rep.parting.rank})"
                 if rep.parting and rep.parting.update else ""))
    if rep.control is not None:
        k = rep.control.comparison
        con.print(f"control (resumed without a kill) vs the uninterrupted run: max |Δ| = {k.max_abs_diff!r}; "
                  f"{'IDENTICAL' if k.identical else 'DIFFERENT'}"
                  + (f"; first parts at update {rep.control.parting.update}" if rep.control.parting.update else ""))
        if not c.identical:
            con.print("→ " + ("the numerics are not reproducible here (the control differs too): "
                              + ("set deterministic = true in the profile" if not rep.deterministic else
                                 "although the profile sets deterministic = true")
                              if not k.identical else "the restart does not restore every state (the control is identical)"),
                      highlight=False)
    try:  # the verdict a reader reads, rendered by evidence/ from the file just written (its digest checked)
        verdict, _ = write_recovery_report(out)
    except UserError as e:
        say("error:", str(e), style="bold red")
        raise typer.Exit(2)
    report = out / RECOVERY_REPORT
    con.print(f"report: {report.with_suffix('.md')} ({verdict.conclusion})", highlight=False)
    print(json.dumps({"comparison": str(out / "recovery-comparison.json"), "digest": rep.digest,
                      "report": str(report), "markdown": str(report.with_suffix(".md")),
                      "conclusion": verdict.conclusion,
                      "max_abs_diff": c.max_abs_diff, "identical": c.identical,
                      "control_identical": rep.control.comparison.identical if rep.control else None,
                      "control_max_abs_diff": rep.control.comparison.max_abs_diff if rep.control else None,
                      "kill_to_survivors_stopped_seconds": f.kill_to_survivors_stopped_seconds}))
    if not c.identical:
        raise typer.Exit(1)

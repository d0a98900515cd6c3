"""`orchestrate`: the user's entry point for a whole trial."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run budget-bounded training trials end to end.")
con = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Run budget-bounded training trials end to end."""


@app.command()
def run(arm: str = typer.Argument(..., help="the arm under trial, e.g. diloco-four"),
        profile: str = typer.Option("cpu", help="smoke | cpu | gpu"),
        trials: Path = typer.Option(Path("trials"), help="where trial homes are created"),
        seeds: Path = typer.Option(Path(".seeds"), help="where seed models are materialized"),
        model_dir: Optional[Path] = typer.Option(None, help="seed directory for a 'local' seed")) -> None:
    """Run ARM's experiment on the embedded local cluster (currently: seed → prepare → commit)."""
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
    except USER_ERRORS as e:
        con.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(2)
    con.print(f"[bold]{arm}[/]: inputs prepared and committed in {time.monotonic() - started:.1f} s. "
              "Training, evaluation, serving and the report are not built yet (issues #3–#8); "
              "the trial stops here.")


def main() -> None:
    app()

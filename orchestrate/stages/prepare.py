"""seed → prepare → commit: the seed model materialized (or verified), and every experiment of the
chain prepared in its own home, its receipts committed and anchored before anything trains."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from orchestrate.progress import Progress
from orchestrate.stages.preserve import anchor_home

if TYPE_CHECKING:
    from training.config import Resolved


def materialize_seed(cfg: Resolved, seeds: Path, progress: Progress) -> Path:
    """The profile's seed under `seeds`, materialized once and verified on every later run."""
    from training.seed import materialize

    md = seeds / cfg.profile.seed
    progress.say("seed", f"{cfg.profile.seed} → {md}")
    with progress.status("materializing / verifying the seed…"):
        materialize(cfg.profile.seed, md, say=lambda m: progress.say("seed", m))
    return md


def prepare(cfg: Resolved, chain: list[Resolved], home_of: Callable[[Resolved], Path], seed_dir: Path,
            store_url: str, progress: Progress, *, replay_file: Path | None = None) -> Iterator[Path]:
    """Each experiment of `chain` (earlier experiments first: none of their tasks may recur) prepared
    in its home and anchored in the store. Yields each home as it is prepared, so a run that fails at
    a later experiment still knows — and records — the last home it reached."""
    from training.prepare import prepare_chain

    name, profile = cfg.experiment.name, cfg.profile_name
    doing = f"preparing {name}" + (" and the experiments before it…" if cfg.experiment.previous else "…")
    with progress.status(doing):
        for step, home, res in prepare_chain(chain, home_of, seed_dir,
                                             replay_file=str(replay_file) if replay_file else None):
            yield home
            anchor_home(home, store_url, progress)
            c = res["prepared"]["counts"]
            progress.say("prepare", f"{step.experiment.name}/{profile} → {home}"
                         + (f" (no task of {step.experiment.previous} recurs)" if step.experiment.previous else "")
                         + f": {res['status']} in {res['record']['seconds']['total']:.1f} s: "
                         f"{c['task']['documents']} task + {c['replay']['documents']} replay documents, "
                         f"task share of targets {c['task_share_of_targets']:.1%} unweighted / "
                         f"{c['task_share_of_weighted_targets']:.1%} weighted; committed")
            src = res["prepared"].get("replay_source") or {}
            if src.get("kind") == "user-jsonl":
                progress.say("prepare", f"  replay: {src['rows']} conversations from {src['file']} (sha256 {src['sha256'][:12]}…)")
            for arm, key, own, value in step.scaled():  # the arm's own value does not run: say so
                progress.say("prepare", f"  {arm}: {key} = {value} (profile {profile}; the arm's own: {own})")

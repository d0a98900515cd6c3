"""stage → place → launch → supervise → collect: the hosts get the pinned environment, the cluster's
room decides which arms run, and every arm that runs is trained, restarted and collected through its
backend (orchestrate/backends/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from evidence.attainability import ATTAINABILITY, UNATTAINABLE
from evidence.commitments import CommitmentLog
from evidence.placement import SERVING_PROBE, ArmPlacement, not_run
from orchestrate import placement as pl
from orchestrate.attainability import commit_attainability
from orchestrate.cluster import ClusterError
from orchestrate.progress import Progress
from training.errors import TrainError
from training.results import finished, load_results, summarize

if TYPE_CHECKING:
    from orchestrate.backends import Backend
    from training.config import Resolved
    from training.results import ArmSummary


class GuardStopped(Exception):
    """The controller's guard stopped an arm's group; not restarted, not an error of the arm."""

    def __init__(self, arm: str, said: str):
        super().__init__(f"{arm}: {said}")
        self.arm, self.said = arm, said


def place_arms(cfg: Resolved, home: Path, backend: Backend, progress: Progress, *,
               no_serve: bool = False) -> dict[str, str]:
    """Where this cluster can run the experiment's arms, decided before anything launches and
    committed (or, on a later run, the home's committed placement); prints what is not run.
    Returns what is not run: arm (or the serving probe) → reason."""

    d = dataclasses.replace(backend.devices(pl.trial_device(cfg)), no_serve=no_serve)
    done = {a.name for a in cfg.experiment.arms if a.trains and finished(home, a.name, a.world_size)}
    probed = CommitmentLog(home).latest("serving") is not None
    rec, now = pl.commit_placement(cfg, home, d, finished=done, probed=probed)
    if rec is None:  # a home whose candidates predate committed placements: every arm and the probe run
        if no_serve and not probed:  # (a probe already run: --no-serve leaves out nothing there)
            raise ClusterError(f"--no-serve: {home} committed its candidates before placements were committed, "
                               "so nothing it runs can be left out by choice (its report expects the probe); run "
                               "without --no-serve, or in a fresh --trials folder")
        return {}
    skipped = not_run(rec)
    if not no_serve and not now and rec.cluster.no_serve:
        progress.line("  --no-serve was chosen at this home's first run and stands: no serving probe")
    if d.share_gpus and pl.trial_device(cfg) != "cuda":
        progress.line(f"  --share-gpus: profile {cfg.profile_name} runs on the CPU; there is no GPU to share")
    elif d.share_gpus and not now and not rec.cluster.share_gpus:
        progress.line("  --share-gpus: this home's placement was committed at its first run without it and stands; "
                      "to share GPUs, run in a fresh --trials directory")
    gpus = ("a CPU profile, no GPU needed" if pl.trial_device(cfg) != "cuda" else
            f"{d.gpus_per_host[0]} GPU(s) on this machine ({d.gpus_from})" if not d.one_rank_per_host else
            f"GPUs per host {list(d.gpus_per_host)} ({d.gpus_from})")
    progress.say("place", f"{cfg.experiment.name}/{cfg.profile_name} on the {d.source} cluster, {gpus}: "
                 + ("committed" if now else "as committed at this home's first run"))
    for r in [*rec.arms, rec.serving]:
        if r.shared:
            progress.line(f"  {r.arm if isinstance(r, ArmPlacement) else SERVING_PROBE}: {r.shared.processes} "
                          f"share {r.shared.gpus} GPU(s) (--share-gpus): learning verdicts real, timing gates not "
                          "comparable")
    for what, why in skipped.items():
        progress.line(f"  {what}: {why}")
    if any("GPUs, the cluster has" in why for why in skipped.values()) and not d.one_rank_per_host \
            and not d.share_gpus:
        progress.line("  (orchestrate run --share-gpus runs them on the GPUs there are, ranks sharing a GPU: the "
                      "learning verdicts are real, the timing gates are marked not comparable)")
    if skipped:
        runs = [r.arm for r in rec.arms if r.runs]
        acc = cfg.experiment.acceptance
        progress.line(f"  trained: {', '.join(runs) or 'none'}; gates that need what is not run are shown as not "
                      "evaluated, the selection rules unchanged"
                      + (f"; the primary arm {acc.primary} is not run: its gates are not evaluated"
                         if acc.primary in skipped else "")
                      + ("; no serving probe" if SERVING_PROBE in skipped else ""))
    # the local cluster's ranks are processes on this machine; SSH hosts share its cores only where their
    # cluster says so (`Cluster.shared_cores`, which the SSH backend carries)
    shared_cores = backend.shared_cores
    say_attainability(*commit_attainability(home, rec, shared_cores=shared_cores), progress)
    return skipped


def say_attainability(rec: dict | None, now: bool, progress: Progress) -> None:
    """What each gate can reach at this profile, said before anything trains: the unattainable ones
    first, then the smallest effect each other gate can detect (the serving gates need no size)."""

    if rec is None:
        return
    gates = [g for g in rec["gates"] if not g["gate"].startswith("serving")]
    no = [g for g in gates if g["attainable"] is False]
    progress.say("gates", f"at {rec['profile']}, {rec['basis']['test_cases']} test cases: "
                 f"{sum(g['attainable'] is True for g in gates)} attainable, {len(no)} {UNATTAINABLE}, "
                 f"{sum(g['attainable'] is None for g in gates)} decided by measurement ("
                 + ("committed" if now else "as committed") + f" → {ATTAINABILITY})")
    for g in sorted(gates, key=lambda g: g["attainable"] is not False):
        progress.line(f"  {g['gate']}: " + (f"{UNATTAINABLE}: " if g["attainable"] is False else "")
                      + g["attainability"])


def train_arms(cfg: Resolved, home: Path, backend: Backend, progress: Progress,
               not_run: dict[str, str] | None = None,
               stop_check: Callable[[], str | None] | None = None) -> list[ArmSummary]:
    """Train every arm of the experiment the committed placement runs on the backend, one after another (never two jobs on
    one device); an arm in `not_run` is never launched. Before each arm it would launch,
    `stop_check` may name a reason to stop (a raised cloud alarm): the trial then stops as when the
    controller's guard stops it (GuardStopped). Returns each trained arm's summary."""

    out = []
    for a in cfg.experiment.arms:
        if not a.trains:
            continue
        if a.name in (not_run or {}):
            progress.line(f"train {a.name}: {not_run[a.name]}")
            continue
        if finished(home, a.name, a.world_size):
            progress.say("train", f"{a.name}: already finished, results kept")
        else:
            reason = stop_check() if stop_check else None
            if reason:
                raise GuardStopped(a.name, reason)
            progress.say("train", f"{a.name} ({a.kind}, {a.world_size} rank"
                         f"{'s' if a.world_size > 1 else ''}) → {home / 'runs' / a.name}")
            # with group checkpoints, a failed group is restarted once from the common manifest
            attempts = backend.train(home, a, max_restarts=1 if cfg.checkpoint_interval else 0,
                                       echo=lambda line: progress.line(f"  {line}"))
            if attempts and not attempts[-1].ok:  # none: it had finished on the hosts and was collected
                if attempts[-1].reason == "guard":
                    raise GuardStopped(a.name, attempts[-1].guard or "")
                raise TrainError(f"arm {a.name} failed; {attempts[-1].failure_text()}")
        out.append(summarize(load_results(home, a.name, a.world_size)))
    return out

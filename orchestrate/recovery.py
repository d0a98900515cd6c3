"""The recovery trial: kill a rank mid-run, restart the group from a common checkpoint, and prove the
result equals an uninterrupted run tensor for tensor.

    uninterrupted/   the arm trained start to finish, publishing a group checkpoint every N updates
    recovered/       the same prepared inputs plus copies of every rank's step-S checkpoint and
                     manifest (original rank identities); resumed from S, rank K killed after update
                     U, the supervisor stops the survivors and restarts the same membership from the
                     latest common manifest (S again), and the run finishes
    recovery-comparison.json   every rank's final state (model, Adam moments, RNG, outer momentum,
                     PowerSGD state) compared by tensor contents; max |Δ|; kill → survivors stopped
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict

from evidence.canonical import read_json, write_json_atomic
from evidence.recovery import (  # the record's models: evidence reads the file the trial writes
    Comparison,
    Control,
    Failure,
    Kill,
    Parting,
    RankComparison,
    RecoveryComparison,
    Seconds,
    Shared,
)
from orchestrate.launch.command import Site, local_argv, threads_per_rank, train_argv
from orchestrate.launch.local import local_launch
from orchestrate.launch.supervise import GroupResult, supervise
from orchestrate.placement import visible_gpus
from orchestrate.progress import Progress
from orchestrate.stages.prepare import seed_from_model_dir
from orchestrate.trial import OptionError
from training.config import address, lineage
from training.prepare import prepare_chain
from training.results import load_results
from training.runs import checkpoint_dir, manifest_path
from training.seed import materialize

COPY_HOME = ("inputs", "prepared.json", "prepare-record.json", "commitments.jsonl")

def seed_recovered_home(src: Path, dst: Path, arm: str, world: int, step: int) -> None:
    """Copy the prepared inputs and each rank's step-`step` checkpoint + manifest into `dst`."""

    if dst.exists():
        raise FileExistsError(f"{dst} exists; a recovery trial starts from a fresh directory")
    dst.mkdir(parents=True)
    for name in COPY_HOME:
        p = src / name
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, dst / name)
    run = Path("runs") / arm
    (dst / run).mkdir(parents=True)
    shutil.copy2(src / run / "numerical-profile.json", dst / run / "numerical-profile.json")
    for r in range(world):
        s_rank, d_rank = src / run / f"rank-{r}", dst / run / f"rank-{r}"
        # linked where the disk allows: a published checkpoint is never written again, and at 135M four
        # DiLoCo ranks' states are 11 GB, which the control and the recovered run would each copy
        shutil.copytree(checkpoint_dir(s_rank, step), checkpoint_dir(d_rank, step), copy_function=_link_or_copy)
        manifest_path(d_rank, step).parent.mkdir(parents=True)
        shutil.copy2(manifest_path(s_rank, step), manifest_path(d_rank, step))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def compare_homes(a: Path, b: Path, arm: str, step: int, ra: list[dict[str, Any]],
                  rb: list[dict[str, Any]]) -> Comparison:
    """Every rank's checkpointed state at `step` in home a against home b, tensor by tensor; `ra`,
    `rb` are the two runs' result files, already read by the caller."""
    # start-up: these import torch (~3.5 s), which no other command of the CLI that imports this module needs
    from training.checkpoint.compare import compare_states
    from training.checkpoint.group import load_rank_state

    ranks = []
    for r in range(len(ra)):
        sa, _ = load_rank_state(a / "runs" / arm / f"rank-{r}", step, r)
        sb, _ = load_rank_state(b / "runs" / arm / f"rank-{r}", step, r)
        ranks.append(RankComparison.model_validate({"rank": r, **compare_states(sa, sb)}))
    return Comparison(
        step=step,
        ranks=ranks,
        max_abs_diff=max(x.max_abs_diff for x in ranks),
        identical=all(x.identical for x in ranks),
        final_parameter_digests_equal=[x["digests"]["final_parameters"] for x in ra]
        == [x["digests"]["final_parameters"] for x in rb],
    )


def first_parting(ra: list[dict[str, Any]], rb: list[dict[str, Any]], after: int) -> Parting:
    """The first update after `after` whose (loss_sum_local, grad_norm) differs between two runs' result
    files on any rank, compared exactly (each rank's journal holds every update, restored ones too)."""
    for u in range(after, min(len(ra[0]["updates"]), len(rb[0]["updates"]))):
        for r, (x, y) in enumerate(zip(ra, rb)):
            a = [x["updates"][u]["loss_sum_local"], x["updates"][u]["grad_norm"]]
            b = [y["updates"][u]["loss_sum_local"], y["updates"][u]["grad_norm"]]
            if a != b:
                return Parting(update=u + 1, rank=r, a=a, b=b)
    return Parting(update=None, rank=None)


def train_here(home: Path, arm: str, world: int, model_dir: Path, share_gpus: int | None, *,
               echo: Callable[[str], None] | None = None, **supervision: Any) -> list[GroupResult]:
    """`arm`'s ranks in `home` on this machine, supervised (`supervise`'s options), as the embedded local
    cluster launches them: the runs a recovery trial (or a determinism benchmark) compares."""
    launch = local_launch(local_argv(train_argv(Site.here(home, model_dir), arm, threads_per_rank(world))), world,
                          heartbeats=[home / "runs" / arm / f"rank-{r}" / "heartbeat.json" for r in range(world)],
                          echo=echo, share_gpus=share_gpus)
    return supervise(launch, log_root=home / "logs" / arm, echo=echo, **supervision)


def _shared(world: int, device: str, share_gpus: bool, say: Callable[[str], None]) -> int | None:
    """How many GPUs the ranks share (None: one each, or the CPU); refuses, before anything is
    prepared, a CUDA arm with more ranks than GPUs unless the operator shares them on purpose."""

    if device != "cuda":
        if share_gpus:
            say("--share-gpus: the profile runs on the CPU; there is no GPU to share")
        return None
    n, src = visible_gpus()
    if n < 1:
        raise ValueError(f"the profile runs on CUDA and this machine has no GPU ({src})")
    if world <= n:
        return None
    if not share_gpus:
        raise ValueError(f"the arm has {world} ranks and this machine {n} GPU(s) ({src}): pass --share-gpus to "
                         f"run them sharing the GPUs (rank r on GPU r mod {n}, gloo between them)")
    say(f"{world} ranks share {n} GPU(s) (--share-gpus): gloo between them; the comparison is exact, the timings "
        "are not those of a GPU per rank")
    return n


IO_BASELINE = {"TRIAL_IO_BASELINE": "1"}  # checkpoint write/restore next to a plain write of the same bytes


def recovery_trial(base: Path, *, experiment_chain: list, arm: str, model_dir: Path, from_step: int,
                   kill_rank: int, kill_after: int, say: Callable[[str], None],
                   share_gpus: bool = False, control: bool = True) -> RecoveryComparison:
    cfg = experiment_chain[-1]
    a = cfg.arm(arm)
    world, updates, every = a.world_size, cfg.profile.updates, cfg.checkpoint_interval
    if not every or from_step % every or not 0 < from_step < kill_after < updates:
        raise ValueError(f"need checkpoints (profile has checkpoint_every={every}) and "
                         f"0 < from_step ({from_step}, a multiple of it) < kill_after ({kill_after}) "
                         f"< updates ({updates})")
    if kill_after >= (from_step // every + 1) * every:
        say(f"note: a checkpoint is published after update {(from_step // every + 1) * every}, "
            f"before the kill at {kill_after}: the restart will resume from that later step")
    gpus = _shared(world, cfg.profile.device, share_gpus, say)
    uninterrupted, recovered = base / "uninterrupted", base / "recovered"
    list(prepare_chain(experiment_chain, lambda c: uninterrupted if c is cfg else base / c.experiment.name,
                       model_dir))  # earlier experiments under their names: the no-recurrence proof

    steps = 4 if control else 3
    say(f"[1/{steps}] {arm}: uninterrupted run, {updates} updates, a group checkpoint every {every}"
        + ("; every kernel deterministic (the profile's deterministic = true)" if cfg.profile.deterministic else
           "; the profile does not set deterministic = true: on CUDA two runs may differ, and this comparison with them"))
    t0 = time.monotonic()
    first = train_here(uninterrupted, arm, world, model_dir, gpus, max_restarts=0, env=IO_BASELINE)
    if not first[-1].ok:
        raise RuntimeError(f"the uninterrupted run failed: {first[-1].failure_text()}")
    t_uninterrupted = time.monotonic() - t0

    base_results = load_results(uninterrupted, arm, world)
    held = None
    if control:  # the same restart without a kill: is the trajectory itself reproducible here?
        say(f"[2/{steps}] control: copies of every rank's step-{from_step} checkpoint, resumed without a kill")
        twin = base / "control"
        seed_recovered_home(uninterrupted, twin, arm, world, from_step)
        t0 = time.monotonic()
        runs = train_here(twin, arm, world, model_dir, gpus, max_restarts=0, resume_first=True)
        if not runs[-1].ok:
            raise RuntimeError(f"the control run failed: {runs[-1].failure_text()}")
        twin_results = load_results(twin, arm, world)
        held = Control(comparison=compare_homes(uninterrupted, twin, arm, updates, base_results, twin_results),
                       parting=first_parting(base_results, twin_results, from_step), seconds=time.monotonic() - t0)
        say(f"  control vs uninterrupted: {'IDENTICAL' if held.comparison.identical else 'DIFFERENT'} (max |Δ| = "
            f"{held.comparison.max_abs_diff!r})" + (f"; first parts at update {held.parting.update}, rank "
                                                     f"{held.parting.rank}" if held.parting.update else ""))

    say(f"[{steps - 1}/{steps}] recovered run: copies of every rank's step-{from_step} checkpoint; rank {kill_rank} "
        f"is killed after update {kill_after}; the supervisor restarts from the common manifest")
    seed_recovered_home(uninterrupted, recovered, arm, world, from_step)
    t0 = time.monotonic()
    attempts = train_here(recovered, arm, world, model_dir, gpus, echo=lambda line: say(f"  {line}"), max_restarts=1,
                          env=IO_BASELINE, first_env={"TRIAL_FAULT_KILL": f"{kill_rank}:{kill_after}"},
                          resume_first=True)
    t_recovered = time.monotonic() - t0
    if len(attempts) != 2 or not attempts[-1].ok:
        raise RuntimeError("the recovery did not go kill → restart → finish: "
                           + "; ".join(r.failure_text(3) if not r.ok else "ok" for r in attempts))
    killed = read_json(recovered / "runs" / arm / f"rank-{kill_rank}" / "fault.json")
    fail = attempts[0]
    results = load_results(recovered, arm, world)

    say(f"[{steps}/{steps}] comparing every rank's final state by tensor contents")
    comparison = compare_homes(uninterrupted, recovered, arm, updates, base_results, results)
    io = [r["checkpoints"]["io"] for r in results]  # the resumed run both restored and wrote
    restored = [r["checkpoints"]["restored"] for r in results]
    report = RecoveryComparison.sealed(
        experiment=cfg.experiment.name, profile=cfg.profile_name, arm=arm,
        world_size=world, updates=updates, checkpoint_every=every,
        device=cfg.profile.device, shared=Shared(ranks=world, gpus=gpus) if gpus else None,
        from_step=from_step, kill=Kill(rank=kill_rank, after_update=kill_after),
        failure=Failure(
            killed_at=killed["at"], observed_rank=fail.first_failure, reason=fail.reason,
            observed_at=fail.failure_observed_at, survivors_stopped_at=fail.survivors_stopped_at,
            kill_to_observed_seconds=fail.failure_observed_at - killed["at"],
            kill_to_survivors_stopped_seconds=fail.survivors_stopped_at - killed["at"],
            exit_codes=fail.codes,
        ),
        resumed_from=[r["step"] for r in restored],
        comparison=comparison,
        checkpoint_io_per_rank=[{"rank": i, **(x or {})} for i, x in enumerate(io)],
        restore_per_rank=restored,
        seconds=Seconds(uninterrupted=t_uninterrupted, recovered_total=t_recovered),
        uninterrupted_final_parameters=[r["digests"]["final_parameters"] for r in base_results],
        deterministic=cfg.profile.deterministic, parting=first_parting(base_results, results, from_step),
        control=held,
    )
    write_json_atomic(base / "recovery-comparison.json", report.body())
    return report


class RecoveryOptions(BaseModel):
    """What one `orchestrate recovery-trial` asks for; every field is its option of the same name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str = "diloco-four"
    profile: str = "recovery"
    from_step: int = 64
    kill_rank: int = 1
    kill_after: int = 75
    out: Path = Path("trials/recovery")
    seeds: Path = Path(".seeds")
    model_dir: Optional[Path] = None
    share_gpus: bool = False
    control: bool = True


def run_recovery(o: RecoveryOptions, progress: Progress) -> RecoveryComparison:
    """The recovery trial as one call: the arm's lineage resolved, its seed materialized (or your
    model imported), then `recovery_trial` in a fresh `out`. It trains one arm twice on this machine,
    not the experiment's stages, so it does not go through `run_trial`; its refusals are the same
    kinds (`OptionError`, `UserError`). Returns the comparison written to recovery-comparison.json."""
    name, arm = address(o.arm)
    chain = lineage(name, o.profile)
    if o.out.exists():
        raise OptionError("--out", f"{o.out} exists; give a fresh --out")
    kind = chain[-1].profile.seed
    if (o.model_dir is None) != (kind != "local"):  # neither ignored nor missing
        raise OptionError("--model-dir", f"profile {o.profile}'s seed is '{kind}': " + (
            "pass --model-dir" if o.model_dir is None else f"--model-dir {o.model_dir} would not be used"))
    if o.model_dir is not None:
        md = seed_from_model_dir(o.model_dir, o.seeds, progress)
    else:
        md = o.seeds / kind
        materialize(kind, md)
    return recovery_trial(o.out, experiment_chain=chain, arm=arm, model_dir=md, from_step=o.from_step,
                          kill_rank=o.kill_rank, kill_after=o.kill_after, share_gpus=o.share_gpus, say=progress.line,
                          control=o.control)

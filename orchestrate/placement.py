"""Placement before launch: which arms of an experiment the cluster can run, and why not the others.

Where ranks go decides what they need:
  embedded local cluster   every rank a process on this machine, rank r on GPU r (LOCAL_RANK;
                           training/runtime.pick_device), so a CUDA arm of N ranks needs N GPUs here;
  SSH hosts                one rank per host, on that host's GPU 0, so ranks 0..N−1's hosts each need one.
Either way an arm also needs N host slots. Test scoring needs one GPU (this machine's on the local
cluster, rank 0's host's on SSH hosts); the serving probe runs max(2, N) replicas of the serving arm,
one GPU each on a CUDA profile: on this machine for the local cluster, one per host of ranks
0..max(2, N)−1 on SSH hosts (on its first GPU), so there it needs that many hosts.

GPU counts: this machine's from `TRIAL_GPUS` when set (a whole number: to use fewer GPUs than a
shared machine has, together with CUDA_VISIBLE_DEVICES, or to exercise placement on a machine without
any), else `torch.cuda.device_count()`; an SSH host's from the environment report staging gathers on
it (recorded beside the environment digest, not inside it: hosts with different GPU counts are not
different environments); a planned host's from its instance type (infra/prices.py).

An arm that cannot be placed is "not run: needs N GPUs, the cluster has M" (or N hosts): never
launched, so never restarted into the same refusal, and the arms that can run still do. Unless the run
shares GPUs on purpose (`orchestrate run --share-gpus`, the embedded local cluster only): then an arm of
N ranks on M < N GPUs runs with rank r on GPU r mod M, the probe's replicas likewise, and the record
says so per arm ("shared": {"ranks": N, "gpus": M}), so the report can mark the timing gates of those
arms not comparable (training/sharing.py says what sharing changes). `orchestrate
run` writes the decision to `placement.json` and commits it before the first arm launches
(evidence/placement.py says what select and the report do with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from evidence.canonical import write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.placement import (
    FORMAT,
    PLACEMENT,
    ArmPlacement,
    PlacementCluster,
    PlacementRecord,
    ServingPlacement,
    SharedRanks,
    SharedReplicas,
    committed_placement,
    not_run,
)
from orchestrate.cluster import ClusterError

GPUS_ENV = "TRIAL_GPUS"


@dataclass(frozen=True)
class Devices:
    """What a cluster offers ranks."""

    source: str  # the cluster's (orchestrate/cluster.py: local | hosts | pulumi), or stack (a planned stack)
    hosts: int | None  # host slots; None: the embedded cluster without a description (any number of ranks)
    gpus_per_host: tuple[int | None, ...]  # by rank; the local cluster: one entry, this machine's (None: unknown)
    controller_gpus: int | None  # this machine's, where the local cluster's serving probe runs (None: unknown,
    #                               not asked, or SSH hosts, whose replicas run on the hosts)
    gpus_from: str  # where the counts came from
    one_rank_per_host: bool  # SSH hosts; the local cluster's ranks share this machine's GPUs
    share_gpus: bool = False  # the operator's --share-gpus: more ranks than GPUs run, GPUs shared
    no_serve: bool = False  # the operator's --no-serve: the serving probe is not run

    def record(self) -> PlacementCluster:
        """As placement.json's `cluster` records it."""
        return PlacementCluster(source=self.source, hosts=self.hosts, gpus_per_host=list(self.gpus_per_host),
                                controller_gpus=self.controller_gpus, gpus_from=self.gpus_from,
                                share_gpus=self.share_gpus, no_serve=self.no_serve)


@dataclass(frozen=True)
class Decision:
    """`place`'s answer: every trained arm's row and the serving probe's, before they are recorded."""

    arms: list[ArmPlacement]
    serving: ServingPlacement


def trial_device(cfg: Any) -> str:
    """The device type the profile's ranks, scoring and replicas run on."""
    return cfg.profile.device


def visible_gpus(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """This machine's GPU count and where it came from: `TRIAL_GPUS`, else torch."""
    env = os.environ if env is None else env
    raw = env.get(GPUS_ENV)
    if raw is not None:
        if not raw.strip().isdigit():
            raise ClusterError(f"{GPUS_ENV}={raw!r} is not a whole number of GPUs (unset it to count them)")
        return int(raw), GPUS_ENV
    # start-up: torch takes seconds to import; only a CUDA profile's GPU count needs it
    import torch

    return torch.cuda.device_count(), "torch.cuda.device_count()"


def local_devices(hosts: int | None, device: str, env: Mapping[str, str] | None = None, *,
                  share_gpus: bool = False) -> Devices:
    """The embedded local cluster: `hosts` slots (None: as many as an arm needs) on this machine;
    `share_gpus`: the operator lets more processes than GPUs share them."""
    if device != "cuda":
        return Devices("local", hosts, (None,), None, "not counted (a CPU profile needs no GPU)", False, share_gpus)
    n, src = visible_gpus(env)
    return Devices("local", hosts, (n,), n, src, False, share_gpus)


def hosts_devices(source: str, gpus_per_host: list[int | None], controller_gpus: int | None,
                  gpus_from: str) -> Devices:
    """Hosts that each run one rank (SSH hosts, or a planned stack)."""
    return Devices(source, len(gpus_per_host), tuple(gpus_per_host), controller_gpus, gpus_from, True)


def shared(n: int, device: str, d: Devices) -> int | None:
    """M when `n` processes on this machine will share its M GPUs on purpose, else None."""
    m = d.gpus_per_host[0]
    if device != "cuda" or d.one_rank_per_host or not d.share_gpus or not m or n <= m:
        return None
    return m


def _arm_reason(world: int, device: str, d: Devices) -> str | None:
    if d.hosts is not None and world > d.hosts:
        return f"not run: needs {world} hosts, the cluster has {d.hosts}"
    if device != "cuda":
        return None
    if not d.one_rank_per_host:
        m = d.gpus_per_host[0]
        if m is None or world <= m or shared(world, device, d):
            return None
        return f"not run: needs {world} GPUs, the cluster has {m}"
    usable = sum(1 for g in d.gpus_per_host if g)  # one rank per host: a host's first GPU
    bare = [r for r, g in enumerate(d.gpus_per_host[:world]) if g == 0]
    if not bare:
        return None
    return (f"not run: needs {world} GPUs, the cluster has {usable}"
            + ("" if usable < world else f" (one rank per host, and rank {bare[0]}'s host has none)"))


NO_SERVE = "not run: the operator chose --no-serve"
NO_DEV = "not run: the profile takes no dev cases (dev = 0), and the probe's requests are dev cases"


def place(arms: list[Any], serving_arm: str, device: str, d: Devices, *, dev_cases: int = 1) -> Decision:
    """The decision for every trained arm and the serving probe (pure: no I/O). Raises ClusterError
    when nothing could run at all: a CUDA profile where scoring finds no GPU."""
    if device == "cuda":
        scorer = d.gpus_per_host[0]
        if scorer == 0:
            where = "this machine" if not d.one_rank_per_host else "rank 0's host"
            raise ClusterError(f"the profile runs on CUDA and {where} has no GPU ({d.gpus_from}): nothing could "
                               "train or score here; use a cpu profile, or a machine with a GPU")
    rows = []
    for a in arms:
        if not a.trains:
            continue
        why = _arm_reason(a.world_size, device, d)
        sh = shared(a.world_size, device, d) if why is None else None
        rows.append(ArmPlacement(arm=a.name, kind=a.kind, world_size=a.world_size, runs=why is None, reason=why,
                                 shared=SharedRanks(ranks=a.world_size, gpus=sh) if sh else None))
    by_name = {r.arm: r for r in rows}
    sv = next(a for a in arms if a.name == serving_arm)
    replicas = max(2, sv.world_size)  # the probe's last phase stops one replica
    served = by_name.get(serving_arm)
    why = None
    if d.no_serve:
        why = NO_SERVE
    elif dev_cases == 0:
        why = NO_DEV
    elif served is not None and not served.runs:
        why = f"not run: its arm {serving_arm} is not run ({served.reason.removeprefix('not run: ')})"
    elif d.one_rank_per_host:  # one replica per host of ranks 0..N-1, on that host's first GPU
        bare = [r for r, g in enumerate(d.gpus_per_host[:replicas]) if g == 0]
        if d.hosts is not None and replicas > d.hosts:
            why = f"not run: needs {replicas} hosts (one replica per host), the cluster has {d.hosts}"
        elif device == "cuda" and bare:
            why = (f"not run: needs {replicas} GPUs (one replica per host, on its first GPU), and rank "
                   f"{bare[0]}'s host has none")
    elif (device == "cuda" and d.controller_gpus is not None and replicas > d.controller_gpus
          and not shared(replicas, device, d)):
        why = f"not run: needs {replicas} GPUs (one per replica), the cluster has {d.controller_gpus}"
    sh = shared(replicas, device, d) if why is None else None
    return Decision(rows, ServingPlacement(arm=serving_arm, replicas=replicas, runs=why is None, reason=why,
                                           shared=SharedReplicas(replicas=replicas, gpus=sh) if sh else None))


def placement_record(cfg: Any, d: Devices) -> PlacementRecord:
    device = trial_device(cfg)
    decided = place(cfg.experiment.arms, cfg.experiment.serving_arm, device, d, dev_cases=cfg.profile.dev)
    return PlacementRecord(format=FORMAT, experiment=cfg.experiment.name, profile=cfg.profile_name, device=device,
                           cluster=d.record(), arms=decided.arms, serving=decided.serving)


def commit_placement(cfg: Any, home: Path, d: Devices, *, finished: set[str] = frozenset(),
                     probed: bool = False) -> tuple[PlacementRecord | None, bool]:
    """Decide where this cluster can run the experiment's arms and commit it (once per home, before
    the candidates). A home's first placement stands for its later runs; an arm it runs that is not
    finished, or a probe not yet run, that this cluster cannot place, is refused here, before
    anything launches. Returns (the placement in force, whether it was committed now); None for a
    home whose candidates were committed before placements were recorded (every arm ran)."""
    fresh = placement_record(cfg, d)
    committed = committed_placement(home)
    if committed is None:
        log = CommitmentLog(home)
        if log.latest("candidates") is not None:
            return None, False
        write_json_atomic(home / PLACEMENT, fresh.model_dump(mode="json"))
        log.append("placement", PLACEMENT, {"not_run": sorted(not_run(fresh))})
        return fresh, True
    now = {r.arm: r for r in fresh.arms}
    hint = lambda row: (" (it shares GPUs there: run with --share-gpus)"  # noqa: E731
                        if row.shared and not d.share_gpus else "")
    for r in committed.arms:
        if r.runs and r.arm not in finished and r.arm in now and not now[r.arm].runs:
            raise ClusterError(f"{home}'s committed placement runs {r.arm} ({r.world_size} ranks){hint(r)}, "
                               f"which is not finished, and this cluster cannot: {now[r.arm].reason}. A home's "
                               "placement is fixed at its first run: run it where it was placed")
    if committed.serving.runs and not probed and d.no_serve:
        raise ClusterError(f"{home}'s committed placement runs the serving probe: --no-serve cannot change a "
                           "placement committed at the home's first run; run without it, or in a fresh --trials folder")
    if committed.serving.runs and not probed and not fresh.serving.runs:
        raise ClusterError(f"{home}'s committed placement runs the serving probe{hint(committed.serving)}, and "
                           f"this cluster cannot: {fresh.serving.reason}")
    return committed, False


def committed_share(home: Path, arm: str | None = None) -> int | None:
    """How many GPUs the committed placement has `arm`'s ranks (None: the serving probe's replicas)
    share on purpose; None where they do not share (or the home has no placement). The launch
    follows the committed decision, never the option of a later run."""
    rec = committed_placement(home)
    if rec is None:
        return None
    row = rec.serving if arm is None else next((r for r in rec.arms if r.arm == arm), None)
    return row.shared.gpus if row is not None and row.shared is not None else None

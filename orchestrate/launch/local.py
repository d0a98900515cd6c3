"""Ranks as processes on this machine (the embedded local cluster), gloo over loopback.

Rank 0's progress goes to the console; every rank's full output is kept in `log_dir/rank-<r>.log`
(rank 0's lines are echoed as they arrive), stdout in `rank-<r>.out`. Each rank's environment is
`command.process_env`'s; the group is watched by `supervise.run_group`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from orchestrate.launch.command import Rendezvous, device_share, free_port, process_env, threads_per_rank
from orchestrate.launch.supervise import GroupResult, Launch, run_group


def launch_group(argv: Sequence[str], world: int, *, log_dir: Path, cwd: Path | None = None,
                 env: dict[str, str] | None = None, port: int | None = None,
                 grace_s: float = 10.0, echo: Callable[[str], None] | None = None,
                 heartbeats: Sequence[Path] | None = None, stale_s: float = 600.0,
                 guard: Callable[[], str | None] | None = None, share_gpus: int | None = None) -> GroupResult:
    """Start one process per rank on this machine and supervise them as a group (`run_group`);
    `share_gpus`: the ranks share this machine's first M GPUs on purpose, as one job."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    share = device_share(share_gpus, f"group-{port}")
    procs: list[subprocess.Popen] = []
    logs = [log_dir / f"rank-{r}.log" for r in range(world)]
    for r in range(world):
        e = process_env(r, here=True, threads=threads_per_rank(world), inherited={**os.environ, **(env or {})},
                        group=Rendezvous(world, "127.0.0.1", port), share=share)
        # stderr (progress, errors) is the log; stdout (the rank's JSON summary) is kept apart
        with open(logs[r], "w") as fh, open(logs[r].with_suffix(".out"), "w") as fo:
            procs.append(subprocess.Popen(list(argv), cwd=cwd, env=e, stdout=fo, stderr=fh))
    return run_group(procs, logs, grace_s=grace_s, echo=echo,
                     heartbeats=[_mtime(p) for p in heartbeats or []], stale_s=stale_s, guard=guard)


def _mtime(path: Path) -> Callable[[], float | None]:
    def read() -> float | None:
        try:
            return path.stat().st_mtime
        except OSError:
            return None
    return read


def local_launch(argv: Sequence[str], world: int, *, heartbeats: Sequence[Path] = (), stale_s: float = 600.0,
                 echo: Callable[[str], None] | None = None, guard: Callable[[], str | None] | None = None,
                 share_gpus: int | None = None) -> Launch:
    """Attempts of `argv` as `world` processes on this machine (`launch_group`)."""
    return lambda extra, log_dir, env: launch_group([*argv, *extra], world, log_dir=log_dir, env=env, echo=echo,
                                                    heartbeats=heartbeats, stale_s=stale_s, guard=guard,
                                                    share_gpus=share_gpus)

"""A rank's lease on its controller: nothing runs unsupervised for hours.

A rank started over SSH (`orchestrate/launch/ssh.py`) finds `TRIAL_LEASE_FILE` and `TRIAL_LEASE_S` in its
environment; its controller touches the file every few seconds while it reaches the host. At each group
checkpoint but the last, every rank reads the file's age and the group agrees (one small all-reduce): once
any rank's lease has gone unrenewed for `TRIAL_LEASE_S`, every rank stops right after that checkpoint,
which every rank holds, so the next controller resumes from it. A blink or a reconnect of the controller
costs nothing; a controller gone for good (a laptop closed for the night) leaves nothing running long.
A rank without the variables (the local cluster, a rank started by hand) holds no lease.
"""

from __future__ import annotations

import os
import time
from typing import Any

from training.errors import TrainError

CONTROLLER_GONE_EXIT = 4


class ControllerGone(TrainError):
    """No controller renewed the group's lease in time: the rank stopped at a checkpoint, resumable."""

    exit_code = CONTROLLER_GONE_EXIT


def env(path: str, length: float) -> dict[str, str]:
    """The environment that gives a process started over SSH a lease of `length` seconds in `path`."""
    return {"TRIAL_LEASE_FILE": path, "TRIAL_LEASE_S": f"{length:g}"}


def held() -> tuple[str, float] | None:
    """(the lease file, its length in seconds), or None when this rank holds no lease."""
    path, length = os.environ.get("TRIAL_LEASE_FILE"), os.environ.get("TRIAL_LEASE_S")
    if not path or not length:
        return None
    return path, float(length)


def age(path: str) -> float:
    """Seconds since the lease was last renewed; a lease file that is gone was never renewed."""
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return float("inf")


def stop_if_gone(step: int, device: Any) -> None:
    """At checkpoint `step`: raise `ControllerGone` on every rank when any rank's lease ran out."""
    lease = held()
    if lease is None:
        return
    path, length = lease
    mine = age(path)
    expired = mine > length
    # start-up: torch ~1.5 s; the controller imports this module (env) and a replica (held, age)
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        flag = torch.tensor([1 if expired else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        anyone = bool(int(flag.item()))
    else:
        anyone = expired
    if anyone:
        whose = (f"no controller has renewed this rank's lease for {mine:.0f} s" if expired
                 else "another rank's lease on the controller ran out")
        raise ControllerGone(f"{whose} (lease {length:g} s): stopped after group checkpoint step {step}, which "
                             "every rank holds; `orchestrate run` again resumes from it")

"""Processes that share GPUs on purpose, as the controller tells a rank or replica (torch-free: the
launch layer builds it, `training.runtime` acts on it).

A researcher rehearses a multi-rank arm on fewer GPUs than it has ranks (`orchestrate run
--share-gpus`): the learning result does not depend on where a rank runs, only the timings do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from training.errors import RuntimeSetupError

SHARED_GPUS_ENV = "TRIAL_SHARED_GPUS"
DEVICE_JOB_ENV = "TRIAL_DEVICE_JOB"


@dataclass(frozen=True)
class DeviceShare:
    """Processes of one job that share GPUs on purpose (`orchestrate run --share-gpus`): the group's
    ranks, or the serving probe's replicas, on this machine's first `gpus` GPUs, process k on GPU
    k mod `gpus`. The controller sets it (orchestrate/launch/command.py) only where the committed
    placement says so; without it every process needs a GPU of its own, as before.

    Two things change for such a group. NCCL refuses two ranks of one communicator on one device
    ("Duplicate GPU detected"), so the group reduces through gloo, which takes CUDA tensors (staged
    through host memory): the same sums, more slowly, so the learning result stands and the timings
    do not compare (the report says so). And the device lock admits every process of `job`, and
    still refuses any other job: a co-located group is one job on its GPUs."""

    gpus: int
    job: str

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "DeviceShare | None":
        env = dict(os.environ if env is None else env)
        raw, job = env.get(SHARED_GPUS_ENV), env.get(DEVICE_JOB_ENV)
        if raw is None and job is None:
            return None
        if raw is None or job is None or not raw.isdigit() or int(raw) < 1 or not job:
            raise RuntimeSetupError(f"{SHARED_GPUS_ENV}={raw!r} and {DEVICE_JOB_ENV}={job!r}: sharing GPUs needs "
                                    "both, a number of GPUs ≥ 1 and the job's name (orchestrate sets them)")
        return cls(int(raw), job)

    def env(self) -> dict[str, str]:
        """What a process of the job gets in its environment (`from_env` reads it back)."""
        return {SHARED_GPUS_ENV: str(self.gpus), DEVICE_JOB_ENV: self.job}

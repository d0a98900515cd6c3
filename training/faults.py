"""Fault injection for recovery trials and tests: a rank that SIGKILLs itself at a chosen point, or
ranks slower than the model makes them.

TRIAL_FAULT_KILL="RANK:UPDATE[:publish]" makes that rank SIGKILL itself after UPDATE, or
(":publish") in the middle of publishing step UPDATE: after the receipt digests are exchanged,
before its own manifest is written.

TRIAL_FAULT_SLOW_S="SECONDS" makes every rank rest that long after each update, as a larger model's
update would take: a tiny-seed arm ends within seconds, before a controller under test could act
mid-arm (a guard tripping, a controller killed while its ranks run on).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from evidence.canonical import write_json_atomic


class FaultPlan:
    """Where, if anywhere, this rank dies; read once from the environment."""

    def __init__(self, rank_dir: Path, rank: int, at: tuple[int, str] | None, slow_s: float = 0.0):
        self.rank_dir, self.rank, self.at, self.slow_s = rank_dir, rank, at, slow_s

    @classmethod
    def from_env(cls, rank_dir: Path, rank: int) -> "FaultPlan":
        spec = os.environ.get("TRIAL_FAULT_KILL")
        at = None
        if spec:
            r, u, *phase = spec.split(":")
            at = (int(u), phase[0] if phase else "after") if int(r) == rank else None
        return cls(rank_dir, rank, at, float(os.environ.get("TRIAL_FAULT_SLOW_S") or 0))

    def while_publishing(self, step: int) -> Callable[[], None] | None:
        """The kill to run between the digests' exchange and the manifest of `step`, if planned."""
        if self.at != (step, "publish"):
            return None
        return lambda: die(self.rank_dir, f"fault injection: rank {self.rank} killed while publishing "
                                          f"step {step}")

    def after_update(self, done: int) -> None:
        if self.slow_s > 0:
            time.sleep(self.slow_s)
        if self.at == (done, "after"):
            die(self.rank_dir, f"fault injection: rank {self.rank} killed after update {done}")


def die(rank_dir: Path, msg: str) -> None:
    """SIGKILL this process (no cleanup, like a crash), after noting when in `fault.json`."""
    write_json_atomic(rank_dir / "fault.json", {"at": time.time(), "pid": os.getpid(), "what": msg})
    print(msg, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

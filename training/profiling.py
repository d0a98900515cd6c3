"""`TRIAL_PROFILE=DIR`: torch.profiler over the three updates after two warm ones; the kernel
table and a per-phase summary go to DIR/<arm>-rank-<r>.txt (nothing, if the run has fewer than
five updates left; nothing either if the run ends inside the window). `TRIAL_PROFILE_FROM=U`
starts the window at update U instead (e.g. past PowerSGD's dense warm-up). A benchmark tool:
the timings it records include the profiler's overhead.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator


class UpdateProfiler:
    """The profiler over a window of three updates, entered and left around `Trainer.step`."""

    def __init__(self, arm: str, rank: int, first: int):
        self.out = os.environ.get("TRIAL_PROFILE")
        start = max(first, int(os.environ.get("TRIAL_PROFILE_FROM") or first + 2))
        self.name, self.window = f"{arm}-rank-{rank}", range(start, start + 3)
        self.prof: Any = None

    @contextlib.contextmanager
    def around(self, update: int) -> Iterator[None]:
        if not self.out or update not in self.window:
            yield
            return
        # start-up: torch; training.train (this module's reader) is read by CLIs that never load it
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.prof is None:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts, record_shapes=False)
            self.prof.__enter__()
        yield
        if update == self.window[-1]:
            self.prof.__exit__(None, None, None)
            key = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
            table = self.prof.key_averages().table(sort_by=key, row_limit=45)
            phases = [e for e in self.prof.key_averages() if e.key.startswith("trial.")]
            lines = [f"{e.key:20} cpu {e.cpu_time_total / 1e3:10.1f} ms  device "
                     f"{getattr(e, 'device_time_total', getattr(e, 'cuda_time_total', 0)) / 1e3:10.1f} ms  "
                     f"x{e.count}" for e in phases]
            d = Path(self.out)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{self.name}.txt").write_text(
                f"updates {list(self.window)} (3 updates)\n" + "\n".join(lines) + "\n\n" + table + "\n")

"""The embedded local cluster's launcher: one process per rank on this machine, gloo over loopback.

The group is supervised as a unit: when any rank exits non-zero, the others are stopped (SIGTERM,
then SIGKILL after a grace period), by their own pids only, so a failed rank never leaves peers
blocked in a collective. Rank 0's progress goes to the console; every rank's full output is kept in
`log_dir/rank-<r>.log` (rank 0's lines are echoed as they arrive), stdout in `rank-<r>.out`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


@dataclass
class GroupResult:
    codes: list[int]
    logs: list[Path]
    seconds: float
    first_failure: int | None  # the rank that failed first, if any

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    def failure_text(self, lines: int = 20) -> str:
        r = self.first_failure if self.first_failure is not None else 0
        tail = self.logs[r].read_text(errors="replace").splitlines()[-lines:]
        return f"rank {r} exited {self.codes[r]} (log {self.logs[r]}):\n" + "\n".join(tail)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def threads_per_rank(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)


def launch_group(argv: Sequence[str], world: int, *, log_dir: Path, cwd: Path | None = None,
                 env: dict[str, str] | None = None, port: int | None = None,
                 grace_s: float = 10.0, echo: Callable[[str], None] | None = None) -> GroupResult:
    log_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    procs: list[subprocess.Popen] = []
    logs = [log_dir / f"rank-{r}.log" for r in range(world)]
    t0 = time.monotonic()
    try:
        for r in range(world):
            e = dict(os.environ, **(env or {}), WORLD_SIZE=str(world), RANK=str(r),
                     LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     PYTHONUNBUFFERED="1")
            e.setdefault("OMP_NUM_THREADS", str(threads_per_rank(world)))
            # stderr (progress, errors) is the log; stdout (the rank's JSON summary) is kept apart
            with open(logs[r], "w") as fh, open(logs[r].with_suffix(".out"), "w") as fo:
                procs.append(subprocess.Popen(list(argv), cwd=cwd, env=e, stdout=fo, stderr=fh))
        with open(logs[0]) as follow:
            first_failure = _supervise(procs, grace_s, follow, echo)
    finally:
        for p in procs:  # only ever our own children, by pid
            if p.poll() is None:
                p.kill()
                p.wait()
    return GroupResult([p.returncode for p in procs], logs, time.monotonic() - t0, first_failure)


def _supervise(procs: list[subprocess.Popen], grace_s: float, follow, echo) -> int | None:
    pending = [""]

    def drain() -> None:  # echo whole lines only; a partial line waits for its end
        text = pending[0] + follow.read()
        *lines, pending[0] = text.split("\n")
        for line in lines:
            if echo:
                echo(line)

    while True:
        drain()
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            drain()
            return failed[0]
        if all(c == 0 for c in codes):
            drain()
            return None
        time.sleep(0.2)

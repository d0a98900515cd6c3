"""The embedded local cluster as a backend: every rank, scoring job and serving replica a process on
this machine, gloo over loopback, stopped by its own pid.

The home is on this machine, so nothing is staged or collected: a rank writes its results where the
controller reads them (`host_parts` has nothing to add). GPUs are this machine's, shared between
ranks only where the home's committed placement says so (`orchestrate run --share-gpus`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evidence.canonical import read_json
from orchestrate.guard import Guard
from orchestrate.launch.command import (
    Site,
    device_share,
    local_argv,
    process_env,
    serve_argv,
    threads_per_rank,
    train_argv,
)
from orchestrate.launch.local import local_launch
from orchestrate.launch.supervise import GroupResult, supervise
from orchestrate.placement import Devices, committed_share, local_devices
from orchestrate.serving import Endpoint, ProbeError, Timeouts, profile_device, replicas_probe
from training.config import Arm
from training.errors import TrainError
from training.evaluate import EvaluationSummary, evaluate
from training.runs import latest_common, local_manifests, set_aside_unfinished


class LocalBackend:
    """The embedded local cluster: every rank a process on this machine, gloo over loopback."""

    shared_cores = True  # every rank, replica and scoring job runs on this machine's cores
    ranks_here = True

    def __init__(self, model_dir: Path | None = None, guard: Guard | None = None, hosts: int | None = None,
                 share_gpus: bool = False):
        """`model_dir`: the seed the ranks train from (None: a backend that only serves what the home holds)."""
        self.model_dir, self.guard, self.hosts, self.share_gpus = model_dir, guard, hosts, share_gpus

    def train(self, home: Path, arm: Arm, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]:
        w = arm.world_size
        if self.hosts is not None and w > self.hosts:
            raise TrainError(f"arm {arm.name} needs {w} ranks; the local cluster was set up with {self.hosts} "
                             f"(orchestrate up --local --hosts {w})")
        rank_dirs = [home / "runs" / arm.name / f"rank-{r}" for r in range(w)]
        can = lambda: latest_common([local_manifests(d) for d in rank_dirs]) is not None  # noqa: E731
        first = can()
        if not first and set_aside_unfinished(home, arm.name, w):
            echo(f"an unfinished earlier attempt was moved to {home / 'runs' / arm.name / 'attempts'}")
        argv = local_argv(train_argv(Site.here(home, self.model_dir), arm.name, threads_per_rank(w)))
        gpus = committed_share(home, arm.name)  # as the home's committed placement decided
        if gpus:
            echo(f"{w} ranks share {gpus} GPU(s) as placed (--share-gpus): gloo between them; timings not comparable")
        launch = local_launch(argv, w, heartbeats=[d / "heartbeat.json" for d in rank_dirs], echo=echo,
                              guard=self.guard, share_gpus=gpus)
        return supervise(launch, log_root=home / "logs" / arm.name, max_restarts=max_restarts,
                         resume_first=first, can_resume=can, echo=echo)

    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path, retry: str | None = None) -> EvaluationSummary:
        return evaluate(home, arm, role, seed_dir=seed_dir, retry_reason=retry)

    def devices(self, device: str) -> Devices:
        """This machine's GPUs, shared by every rank (orchestrate/placement.py)."""
        return local_devices(self.hosts, device, share_gpus=self.share_gpus)

    def replicas(self, home: Path, arm: str, n: int) -> LocalReplicas:
        """The serving probe's `n` replicas: processes on this machine, on loopback."""
        return LocalReplicas(home, n, home / "logs" / "serving", threads=threads_per_rank(n), arm=arm,
                             share_gpus=committed_share(home))

    def replicas_where(self, n: int) -> str:
        return "on this machine"

    def close(self) -> None:
        pass

    def host_parts(self, url: str) -> None:
        """Nothing stays elsewhere: every payload is in the home."""
        return None


@dataclass
class LocalReplicas:
    """N `python -m training serve` processes on loopback; stopped by their own pids only."""

    home: Path
    count: int
    log_dir: Path
    threads: int = 1
    seed_dir: Path | None = None
    arm: str | None = None
    share_gpus: int | None = None  # the committed placement's: the replicas share this many GPUs
    start_timeout_s: float = 900.0
    procs: list[subprocess.Popen] = field(default_factory=list)
    endpoints: list[Endpoint] = field(default_factory=list)

    def __enter__(self) -> "LocalReplicas":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        site = Site.here(self.home, self.seed_dir)
        share = device_share(self.share_gpus, "replicas")
        try:
            for k in range(self.count):
                # on a CUDA profile, replica k takes GPU k (and its lock): LOCAL_RANK=k; sharing, GPU k mod M
                env = process_env(k, here=True, threads=self.threads, inherited=os.environ, share=share)
                ready = self.log_dir / f"replica-{k}.ready.json"
                ready.unlink(missing_ok=True)
                argv = local_argv(serve_argv(site, f"replica-{k}", "127.0.0.1", str(ready), threads=self.threads,
                                             arm=self.arm))
                with open(self.log_dir / f"replica-{k}.log", "ab") as log:
                    self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                       env=env, start_new_session=True))
            for k, p in enumerate(self.procs):
                info = self._wait_ready(k, p)
                self.endpoints.append(Endpoint(f"replica-{k}", f"http://127.0.0.1:{info['port']}"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self, k: int, p: subprocess.Popen) -> dict[str, Any]:
        ready = self.log_dir / f"replica-{k}.ready.json"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if ready.is_file():
                return read_json(ready)
            if p.poll() is not None:
                tail = (self.log_dir / f"replica-{k}.log").read_text(errors="replace").splitlines()[-8:]
                raise ProbeError(f"replica-{k} exited {p.returncode} before listening "
                                 f"(log {self.log_dir / f'replica-{k}.log'}):\n" + "\n".join(tail))
            time.sleep(0.05)
        raise ProbeError(f"replica-{k} did not listen within {self.start_timeout_s:.0f} s")

    def where(self) -> dict[str, dict[str, Any]]:
        """Every replica on this machine: on CUDA replica k on GPU k, or k mod M where the committed
        placement shares M GPUs (as `process_env` and `pick_device` place it); on CPU all on its cores."""
        kind, host = profile_device(self.home), socket.gethostname()
        return {e.name: {"host": host, "device": "cpu" if kind != "cuda" else
                         f"cuda:{k % self.share_gpus if self.share_gpus else k}"}
                for k, e in enumerate(self.endpoints)}

    def kill(self, k: int) -> dict[str, Any]:
        """Stop replica k the hard way (SIGKILL, as a crashed host would) and wait until it is gone."""
        p = self.procs[k]
        at = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait()
        return {"replica": f"replica-{k}", "pid": p.pid, "signal": "SIGKILL", "at": at,
                "exit_status": p.returncode}

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def local_probe(home: Path, arm: str, replicas: int, *, threads: int = 1, seed_dir: Path | None = None,
                retry: str | None = None, timeouts: Timeouts | None = None,
                say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The probe against `replicas` replica processes on this machine, sharing its GPUs where the
    home's committed placement says so (`--share-gpus`)."""
    return replicas_probe(home, arm, replicas, lambda: LocalReplicas(
        home, replicas, home / "logs" / "serving", threads=threads, seed_dir=seed_dir, arm=arm,
        share_gpus=committed_share(home)), retry=retry, timeouts=timeouts, say=say)

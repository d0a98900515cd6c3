"""Where ranks, scoring jobs and serving replicas run: one module per backend.

    local.py   the embedded local cluster: processes on this machine, gloo over loopback
    ssh.py     a cluster's SSH hosts: one rank per host, staged, launched, supervised and collected

The trial's stages see only `Backend`; `make_backend` picks one from the cluster description. Which
arms the chosen backend can run at all is another question, answered before launch by
orchestrate/placement.py from the backend's `devices`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from orchestrate.backends.local import LocalBackend
from orchestrate.backends.ssh import SshBackend
from orchestrate.cluster import Cluster, ClusterError
from orchestrate.guard import Guard
from orchestrate.launch.supervise import GroupResult
from orchestrate.placement import Devices
from orchestrate.progress import Progress
from orchestrate.serving import Replicas
from orchestrate.wheelhouse import build_wheelhouse
from training.config import Arm
from training.evaluate import EvaluationSummary


class Backend(Protocol):
    """Trains an arm (resuming from the hosts' latest common manifest when there is one, restarting
    at most `max_restarts` times), scores one and starts the serving probe's replicas; the results
    end up in the controller's home."""

    shared_cores: bool  # its ranks split this machine's CPU cores (what attainability and threads follow)
    ranks_here: bool  # its ranks write their checkpoints into the home here (not on hosts): an interruption reads them

    def train(self, home: Path, arm: Arm, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]: ...
    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path,
                 retry: str | None = None) -> EvaluationSummary: ...
    def devices(self, device: str) -> Devices: ...
    def replicas(self, home: Path, arm: str, n: int) -> Replicas: ...
    def replicas_where(self, n: int) -> str: ...  # where `replicas` would run them, said before they start
    def host_parts(self, url: str) -> dict[str, dict[str, dict[str, Any]]] | None: ...
    def close(self) -> None: ...


def make_backend(desc: Cluster | None, home: Path, model_dir: Path, trials: Path, wheelhouse: Optional[Path],
                 progress: Progress, *, share_gpus: bool = False) -> Backend:
    """This machine for the embedded local cluster, else the cluster's SSH hosts, staged from a
    wheelhouse built here (the hosts install offline, so every wheel comes from us).
    `share_gpus`: the operator lets ranks share this machine's GPUs (the local cluster only)."""
    if desc is None or desc.source == "local":
        return LocalBackend(model_dir, guard=Guard(deadline=desc.deadline) if desc else None,
                            hosts=len(desc.hosts) if desc else None, share_gpus=share_gpus)
    if share_gpus:
        raise ClusterError(f"--share-gpus shares this machine's GPUs between the embedded local cluster's ranks; "
                           f"the {desc.source} cluster runs one rank per host, on its own GPU: drop the option")
    with progress.status("building the wheelhouse…"):
        wheels = build_wheelhouse(trials / ".wheelhouse", wheelhouse)
    return SshBackend(desc, home, model_dir, wheel_dir=wheels, say=lambda m: progress.line(f"  {m}"))

"""A `training` process's command and environment, built here for every place one starts: a rank on
this machine or on an SSH host, and a serving replica on either.

A command is Python's arguments (`-m training VERB …`): `local_argv` runs them with this
interpreter, `host_command` with a host's staged Python (`python_command`). The environment policy:

    PYTHONUNBUFFERED=1   a rank's stderr is its live log, read while it runs
    LOCAL_RANK           the device the process takes on its machine: rank r on this machine (its
                         ranks share the GPUs), 0 on a host of its own
    OMP_NUM_THREADS      `threads` (cores split between the processes sharing them) unless the
                         inherited environment already sets it: an operator's choice wins
    WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT
                         a group's rendezvous (none for a serving replica)
    GLOO/NCCL_SOCKET_IFNAME
                         the host's private interface, where the rendezvous address is
    AWS_NCCL             on AWS hosts, the fixed collective algorithm (`cluster_env`)
    TRIAL_SHARED_GPUS, TRIAL_DEVICE_JOB
                         only where the committed placement shares GPUs on purpose (`--share-gpus`):
                         process k takes GPU k mod M, its group reduces through gloo, and the
                         device lock admits this job's processes alone (training/sharing.py)
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from training.sharing import DeviceShare

if TYPE_CHECKING:
    from orchestrate.cluster import Host

AWS_NCCL = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_IB_DISABLE": "1"}
"""On AWS hosts (no EFA on g6e): one fixed algorithm and protocol, so the bytes on the wire are the
ones the plan predicted and every run of an arm moves data the same way."""


def cluster_env(source: str) -> dict[str, str]:
    """What every process on a cluster's hosts gets, by where the cluster came from."""
    return dict(AWS_NCCL) if source == "pulumi" else {}


def threads_per_rank(world: int) -> int:
    """This machine's cores split evenly between `world` processes sharing them (at least one each)."""
    return max(1, (os.cpu_count() or 1) // world)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a rendezvous or a test server to listen on."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Site:
    """The directories a `training` process reads, as that process sees them: on this machine, the
    controller's home and seed; on a host, the staged copies under its root."""

    home: str
    model_dir: str | None

    @classmethod
    def here(cls, home: Path, model_dir: Path | None) -> "Site":
        return cls(str(home), str(model_dir) if model_dir is not None else None)

    @classmethod
    def on(cls, host: "Host") -> "Site":
        return cls(f"{host.root}/home", f"{host.root}/seed")


@dataclass(frozen=True)
class Rendezvous:
    """A group's meeting point as one rank sees it: rank 0 listens on `port` at `address`;
    `interface` is the rank's own host's NIC on the network that reaches it (None: the system's
    choice, e.g. loopback here), where gloo and NCCL bind."""

    world: int
    address: str
    port: int
    interface: str | None = None


def train_argv(site: Site, arm: str, threads: int | None, extra: Sequence[str] = ()) -> list[str]:
    """`-m training train …` for one rank of `arm` (which rank it is comes from the environment)."""
    return ["-m", "training", "train", "--home", site.home, "--arm", arm,
            *(["--model-dir", site.model_dir] if site.model_dir else []),
            *(["--threads", str(threads)] if threads else []), *extra]


def serve_argv(site: Site, name: str, bind: str, ready: str, *, threads: int | None,
               arm: str | None = None) -> list[str]:
    """`-m training serve …` for one replica listening on `bind` (a port of its choice, written with
    its pid to `ready`)."""
    return ["-m", "training", "serve", "--home", site.home, "--name", name, "--host", bind, "--port", "0",
            "--ready-file", ready, *(["--threads", str(threads)] if threads else []), *(["--arm", arm] if arm else []),
            *(["--model-dir", site.model_dir] if site.model_dir else [])]


def evaluate_argv(site: Site, arm: str, role: str, retry: str | None = None) -> list[str]:
    """`-m training evaluate …`: score `arm` on `role`'s tasks (`retry`: why another attempt runs)."""
    return ["-m", "training", "evaluate", "--home", site.home, "--arm", arm, "--role", role,
            *(["--model-dir", site.model_dir] if site.model_dir else []), *(["--retry", retry] if retry else [])]


def device_share(gpus: int | None, job: str) -> DeviceShare | None:
    """The share for one job's processes on `gpus` GPUs of this machine (None: a GPU each), named
    uniquely on this machine: `job`, this controller's pid and a fresh nonce."""
    return None if gpus is None else DeviceShare(gpus, f"{job}:{os.getpid()}:{os.urandom(4).hex()}")


def process_env(index: int, *, here: bool, threads: int | None, inherited: Mapping[str, str] = {},
                group: Rendezvous | None = None, share: DeviceShare | None = None) -> dict[str, str]:
    """The environment of the `index`-th process of a group (rank `index` of `group`, when it is a
    rendezvous), started on this machine (`here`: its processes share its GPUs) or on a host of its
    own: `inherited` (this machine's environment with the caller's additions, or what is sent to a
    host) with the policy of this module's docstring over it."""
    env = dict(inherited)
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    env |= {"PYTHONUNBUFFERED": "1", "LOCAL_RANK": str(index if here else 0)}
    if group is not None:
        env |= {"WORLD_SIZE": str(group.world), "RANK": str(index), "MASTER_ADDR": group.address,
                "MASTER_PORT": str(group.port)}
        if group.interface:
            env |= {"GLOO_SOCKET_IFNAME": group.interface, "NCCL_SOCKET_IFNAME": group.interface}
    for k in DeviceShare(1, "-").env():  # never inherited: only a placement that shares sets them
        env.pop(k, None)
    if share is not None:
        if not here:
            raise ValueError("GPUs are shared only by processes on this machine (SSH hosts run one rank each)")
        env |= share.env()
    return env


def local_argv(argv: Sequence[str]) -> list[str]:
    """Python's `argv` as a process on this machine, with this interpreter."""
    return [sys.executable, *argv]


def python_command(host: "Host", *argv: str, python: str | None = None, replace_shell: bool = False) -> str:
    """`python -P ARGV…` with the host's staged packages on the path, arguments quoted: the one way
    the controller runs the project's Python on a host (status's stdlib-only script runs isolated
    instead, `-I`, on any Python). `-P` keeps the working directory off `sys.path`, so only the
    staged site can supply `training` or `evidence`. `replace_shell` execs Python in the shell's
    place, so it keeps the pid the shell wrote (a rank is signalled by that pid)."""
    return (f"PYTHONPATH={shlex.quote(host.root + '/site')} {'exec ' if replace_shell else ''}"
            f"{shlex.quote(python or host.python)} -P " + " ".join(map(shlex.quote, argv)))


def host_command(host: "Host", argv: Sequence[str]) -> str:
    """Python's `argv` as a process on `host`, from its root, Python in the shell's place so that it
    keeps the pid the shell wrote (`python_command`)."""
    return f"cd {shlex.quote(host.root)} && " + python_command(host, *argv, replace_shell=True)

"""Test hosts: network namespaces on 198.18.0.0/24, each running a real OpenSSH `sshd` (needs root).

    root namespace   bridge tb<tag>  198.18.0.1   (the operator / controller)
    host k           netns tn<tag>-k, eth0 198.18.0.(10+k), sshd on port 22, its own root directory

Each host gets its own ed25519 host key (pinned for the SSH transport — no key is ever accepted
blindly) and accepts one client key generated for the set. A firewall in each namespace plays the
security group: every port is open to member hosts only, SSH also to the operator, anything else is
refused with a reset. Everything made here is removed on exit: sshd processes by their own pids,
then the namespaces and the bridge. Namespaces share the filesystem, so each host works under its
own root directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.18.0"


class NetnsError(RuntimeError):
    """The test hosts could not be built (not root, no sshd, no iproute2)."""


def _sh(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


@dataclass
class NetnsHost:
    index: int
    namespace: str
    address: str
    root: Path
    host_key: str  # "ssh-ed25519 AAAA…", pinned by the transport
    member: bool
    sshd: subprocess.Popen | None = None

    def exec_argv(self, *argv: str) -> list[str]:
        """argv run inside this host's namespace (for tests that act as the host itself)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class NetnsHosts:
    count: int
    workdir: Path
    members: list[int] | None = None  # default: every host is a member
    hosts: list[NetnsHost] = field(default_factory=list)
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    client_key: Path | None = None
    user: str = "root"

    @property
    def bridge(self) -> str:
        return f"tb{self.tag}"

    @property
    def operator(self) -> str:
        return f"{SUBNET}.1"

    def __enter__(self) -> "NetnsHosts":
        if os.geteuid() != 0:
            raise NetnsError("network-namespace test hosts need root")
        for tool in ("ip", "iptables", "ssh-keygen", "/usr/sbin/sshd"):
            if shutil.which(tool) is None:
                raise NetnsError(f"{tool} is missing: apt-get install -y openssh-server iproute2 iptables")
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        self.client_key = self.workdir / "client_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"trials-{self.tag}", "-f", str(self.client_key))
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.operator}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        members = set(range(self.count) if self.members is None else self.members)
        for k in range(self.count):
            ns, veth, addr = f"tn{self.tag}-{k}", f"tv{self.tag}{k}", f"{SUBNET}.{10 + k}"
            root = self.workdir / f"host-{k}"
            root.mkdir()
            _sh("ip", "netns", "add", ns)
            self.hosts.append(NetnsHost(k, ns, addr, root, "", k in members))
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", veth, "master", self.bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        member_addrs = [h.address for h in self.hosts if h.member]
        for h in self.hosts:
            self._firewall(h, member_addrs if h.member else [h.address])
            self._sshd(h)
        for h in self.hosts:
            self._wait_port(h.address, 22)

    def _firewall(self, h: NetnsHost, allowed: list[str]) -> None:
        ipt = h.exec_argv("iptables")
        _sh(*ipt, "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        _sh(*ipt, "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        for a in allowed:  # members reach every port (NCCL, gloo, rendezvous), the host itself included
            _sh(*ipt, "-A", "INPUT", "-s", a, "-j", "ACCEPT")
        _sh(*ipt, "-A", "INPUT", "-p", "tcp", "--dport", "22", "-s", self.operator, "-j", "ACCEPT")
        _sh(*ipt, "-A", "INPUT", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
        _sh(*ipt, "-A", "INPUT", "-j", "DROP")

    def _sshd(self, h: NetnsHost) -> None:
        key = h.root / "ssh_host_ed25519_key"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        h.host_key = " ".join(Path(f"{key}.pub").read_text().split()[:2])
        shutil.copyfile(f"{self.client_key}.pub", h.root / "authorized_keys")
        cfg = h.root / "sshd_config"
        cfg.write_text("\n".join([
            f"ListenAddress {h.address}", "Port 22", f"HostKey {key}",
            f"AuthorizedKeysFile {h.root / 'authorized_keys'}", f"PidFile {h.root / 'sshd.pid'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "StrictModes no", "UsePAM no", "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
        log = open(h.root / "sshd.log", "ab")
        h.sshd = subprocess.Popen(h.exec_argv("/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)),
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait_port(self, address: str, port: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((address, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise NetnsError(f"sshd on {address}:{port} did not come up within {timeout:.0f} s")

    @staticmethod
    def _end_pids(h: NetnsHost) -> None:
        def pids() -> list[int]:
            p = subprocess.run(["ip", "netns", "pids", h.namespace], capture_output=True, text=True)
            return [int(x) for x in p.stdout.split() if x.isdigit()]

        for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            left = pids()
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + pause
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = pids()
            if not left:
                return

    def cut_off(self, k: int) -> None:
        """Take host k off the network (its link goes down), as a failed host or network would."""
        _sh("ip", "link", "set", f"tv{self.tag}{k}", "down")

    def __exit__(self, *exc: object) -> None:
        for h in self.hosts:
            if h.sshd is not None and h.sshd.poll() is None:
                try:
                    os.killpg(h.sshd.pid, signal.SIGTERM)  # sshd and its per-connection children: our group
                except ProcessLookupError:
                    pass
                try:
                    h.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.sshd.kill()
                    h.sshd.wait()
        for h in self.hosts:  # whatever still runs inside our namespaces (sshd's session children,
            self._end_pids(h)  # a rank a test left behind) is ours: end it by pid before the namespace
            subprocess.run(["ip", "netns", "del", h.namespace], capture_output=True)
            # the root side of the pair goes with the namespace, unless the kernel still holds it
            subprocess.run(["ip", "link", "del", f"tv{self.tag}{h.index}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

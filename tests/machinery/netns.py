"""Test hosts: network namespaces on 198.18.0.0/24, each running a real OpenSSH `sshd` (needs root).

The /24 holds four slots, its /26 quarters (198.18.0.0/26 … 198.18.0.192/26), so four sets can live at once
(each of the test suite's workers builds its own, `TRIALS_NETNS_SLOT`: tests/conftest.py); in slot s (base
b = 64·s):

    root namespace   bridge tb<tag>  198.18.0.(b+1)/26   (the operator / controller)
    host k           netns tn<tag>-k, eth0 198.18.0.(b+10+k), sshd on port 22, its own root directory

Each host gets its own ed25519 host key (pinned for the SSH transport — no key is ever accepted
blindly) and accepts one client key generated for the set. A firewall in each namespace plays the
security group: every port is open to member hosts only, SSH also to the operator, anything else is
refused with a reset. Everything made here is removed on exit: sshd processes by their own pids,
then the namespaces and the bridge. Namespaces share the filesystem, so each host works under its
own root directory, and its sessions log in to a home of their own there (`NetnsHost.login_home`: HOME, which
sshd's SetEnv sets over the account's, seeded from /etc/skel as a new account's home is). A session's
shell reads its startup files from HOME (bash run by sshd reads ~/.bashrc even for a command), and a
real host's are its own, never this machine's root user's: here those start pyenv, ~0.1 s of CPU that
every SSH command would pay. A real host's cores are its own too, while these hosts share this machine's:
sessions get OMP_WAIT_POLICY=PASSIVE (`shared_cores_env`), so that torch's idle OpenMP threads sleep
rather than spin on cores the other hosts' processes are waiting for (the operator's own setting, or a
host's `env`, wins).

Links and namespaces outlive the process that made them: a test run killed mid-way (a session that
ends, a CI job cancelled) leaves its bridge holding its slot's operator address, and every later set in
that slot would route into it and time out. Two sets cannot share a slot either. So a live set holds
its slot's machine-wide lock (/run/trials-netns-<slot>.lock, flock: the kernel drops it with its
process) for its whole life; the next set for that slot waits for it, bounded by `wait_s`, and once it
holds it, any test bridge still in the slot was left by a set that is gone: it is reclaimed (its
namespaces' processes ended by pid, then the namespaces and links). Each bridge also names its owner
(pid and start time) in its alias, for the one case the lock cannot see: a set from code older than
the lock, still running, is refused by name. An address in the slot that is not a test bridge is
refused at once, and left alone."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrate.cluster import Cluster, Host

SUBNET = "198.18.0"
SLOTS = 4  # the /24's /26 quarters: one per test worker, up to four
SLOT_SIZE = 256 // SLOTS  # addresses in a slot
PREFIX = 32 - (SLOT_SIZE - 1).bit_length()  # a slot's prefix length: 26
MAX_HOSTS = SLOT_SIZE - 11  # hosts are b+10 … b+SLOT_SIZE-2 (the last address is the slot's broadcast)
assert SLOT_SIZE & (SLOT_SIZE - 1) == 0, "a slot is a CIDR block: SLOTS must be a power of two"
SLOT_ENV = "TRIALS_NETNS_SLOT"  # which slot a set takes unless told (default 0)
_OPEN_HERE = 0  # sets open in this process (a second would wait on its own lock)
_BRIDGE = re.compile(r"tb([0-9a-f]{4})")
_OWNER = re.compile(r"trials-netns owner=(\d+):(\d+)")


class NetnsError(RuntimeError):
    """The test hosts could not be built (not root, no sshd, no iproute2)."""


class SubnetBusy(NetnsError):
    """Another live set of test hosts holds the slot."""


def slot_base(slot: int) -> int:
    """The slot's first address's last octet: 0, 64, 128 or 192."""
    if not 0 <= slot < SLOTS:
        raise NetnsError(f"test-host slot {slot} does not exist (0 … {SLOTS - 1}; {SLOT_ENV})")
    return SLOT_SIZE * slot


def lock_path(slot: int) -> Path:
    return Path(f"/run/trials-netns-{slot}.lock")


def in_slot(address: str, slot: int) -> bool:
    head, _, last = address.rpartition(".")
    return head == SUBNET and last.isdigit() and slot_base(slot) <= int(last) < slot_base(slot) + SLOT_SIZE


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat): with the pid,
    it names one process, whatever later reuses the number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _owner_alive(alias: str | None) -> int | None:
    """The pid that owns a bridge whose alias is `alias`, if that very process still runs."""
    m = _OWNER.fullmatch(alias or "")
    if m and _start_time(int(m[1])) == int(m[2]):
        return int(m[1])
    return None


def _sh(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def default_slot() -> int:
    """This process's slot: `TRIALS_NETNS_SLOT`, else 0."""
    return int(os.environ.get(SLOT_ENV, "0") or 0)


def operator_address(slot: int | None = None) -> str:
    """The bridge's address in `slot` (default: this process's): where the hosts reach this machine
    (a test's moto server), known before the set is built."""
    return f"{SUBNET}.{slot_base(default_slot() if slot is None else slot) + 1}"


def shared_cores_env() -> dict[str, str]:
    """What every session on these hosts gets because they share one machine's cores (a real host's are its
    own): libgomp's idle threads sleep instead of spinning. No thread count, kernel or result changes. The
    operator's own OMP_WAIT_POLICY, where set, is passed on instead."""
    return {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


@dataclass
class NetnsHost:
    index: int
    namespace: str
    address: str
    root: Path
    host_key: str  # "ssh-ed25519 AAAA…", pinned by the transport
    member: bool
    sshd: subprocess.Popen | None = None

    @property
    def login_home(self) -> Path:
        """The home a session on this host logs in to (its HOME)."""
        return self.root / "login-home"

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
    wait_s: float = 1800.0  # for another live set to end (another suite's SSH module lasts minutes)
    env: dict[str, str] = field(default_factory=dict)  # set in every session (sshd's SetEnv), as a host's own
    slot: int = field(default_factory=default_slot)

    @property
    def bridge(self) -> str:
        return f"tb{self.tag}"

    @property
    def operator(self) -> str:
        return operator_address(self.slot)

    def address_of(self, k: int) -> str:
        """Host k's address, or (k ≥ count) one in the slot that no host holds; never one outside the slot,
        which the route would send off this machine."""
        if not 0 <= k < MAX_HOSTS:
            raise NetnsError(f"host {k} is outside the slot (0 … {MAX_HOSTS - 1})")
        return f"{SUBNET}.{slot_base(self.slot) + 10 + k}"

    def __enter__(self) -> "NetnsHosts":
        global _OPEN_HERE
        if os.geteuid() != 0:
            raise NetnsError("network-namespace test hosts need root")
        for tool in ("ip", "iptables", "ssh-keygen", "/usr/sbin/sshd"):
            if shutil.which(tool) is None:
                raise NetnsError(f"{tool} is missing: apt-get install -y openssh-server iproute2 iptables")
        if _OPEN_HERE:
            raise NetnsError("a set of test hosts is already open in this process: two cannot share the slot; "
                             "close it first")
        if not 0 < self.count <= MAX_HOSTS:
            raise NetnsError(f"a set holds 1 … {MAX_HOSTS} hosts, not {self.count}")
        slot_base(self.slot)  # a slot that does not exist is refused before any lock is taken
        self._take_subnet()
        _OPEN_HERE += 1
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _take_subnet(self) -> None:
        """The slot's machine-wide lock that one live set holds for its whole life: a second set for the
        slot waits for it (bounded), so no two build at once, and whatever a set finds in the slot once it
        holds the lock was left by a set that is gone."""
        import fcntl

        lock = lock_path(self.slot)
        self._lock = open(lock, "a+")
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._lock.seek(0)
                    holder = self._lock.read().strip() or "unknown"
                    self._lock.close()
                    self._lock = None
                    raise SubnetBusy(f"{lock} is held by another set of test hosts ({holder}) after {self.wait_s:.0f} s: "
                                     "two sets cannot share a slot; wait for it or end it") from None
                time.sleep(0.5)
        self._lock.truncate(0)
        self._lock.write(f"pid {os.getpid()}\n")
        self._lock.flush()

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        self.client_key = self.workdir / "client_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"trials-{self.tag}", "-f", str(self.client_key))
        self.reclaim_stale(self.slot)  # under the lock: any test bridge still here is a dead set's
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "alias", f"trials-netns owner={os.getpid()}:{_start_time(os.getpid())}")
        _sh("ip", "addr", "add", f"{self.operator}/{PREFIX}", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        members = set(range(self.count) if self.members is None else self.members)
        for k in range(self.count):
            ns, veth, addr = f"tn{self.tag}-{k}", f"tv{self.tag}{k}", self.address_of(k)
            root = self.workdir / f"host-{k}"
            root.mkdir()
            _sh("ip", "netns", "add", ns)
            self.hosts.append(NetnsHost(k, ns, addr, root, "", k in members))
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", veth, "master", self.bridge, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        member_addrs = [h.address for h in self.hosts if h.member]
        for h in self.hosts:
            self._firewall(h, member_addrs if h.member else [h.address])
            self._sshd(h)
        for h in self.hosts:
            self._wait_sshd(h)

    @staticmethod
    def reclaim_stale(slot: int) -> list[str]:
        """Remove the test bridges in the slot whose owner is gone, with their namespaces; refuse
        anything else there by name. Returns the bridges removed."""
        net = f"{SUBNET}.{slot_base(slot)}/{PREFIX}"
        links = {l["ifname"]: l for l in json.loads(_sh("ip", "-j", "link", "show") or "[]")}
        holders = [a["ifname"] for a in json.loads(_sh("ip", "-j", "-4", "addr", "show") or "[]")
                   if any(in_slot(i.get("local", ""), slot) for i in a.get("addr_info", []))]
        namespaces = [line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line.strip()]
        for name in holders:  # first, so that it is refused at once rather than after a wait
            if _BRIDGE.fullmatch(name) is None:
                raise NetnsError(f"{name} holds an address in {net}, which the test hosts need; "
                                 f"it is not a test bridge (tb<tag>), so it is left alone: remove it or free the subnet")
        removed = []
        for name in holders:
            m = _BRIDGE.fullmatch(name)
            owner = _owner_alive(links.get(name, {}).get("ifalias"))
            if owner is not None and owner != os.getpid():  # a set that runs without the lock (older code)
                raise NetnsError(f"{name} holds {net} for the test hosts of pid {owner}, which still runs "
                                 "without the test hosts' lock: end it")
            tag = m[1]
            for ns in (n for n in namespaces if re.fullmatch(rf"tn{tag}-\d+", n)):
                NetnsHosts._end_namespace(ns)
            for leftover in (n for n in links if re.fullmatch(rf"tv{tag}\d+", n)):
                subprocess.run(["ip", "link", "del", leftover], capture_output=True)
            _sh("ip", "link", "del", name)
            removed.append(name)
        return removed

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
        home = h.login_home
        if Path("/etc/skel").is_dir():
            shutil.copytree("/etc/skel", home, symlinks=True)
        else:
            home.mkdir()
        env = {"HOME": str(home), **shared_cores_env(), **self.env}
        cfg = h.root / "sshd_config"
        cfg.write_text("\n".join([
            f"ListenAddress {h.address}", "Port 22", f"HostKey {key}",
            f"AuthorizedKeysFile {h.root / 'authorized_keys'}", f"PidFile {h.root / 'sshd.pid'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "StrictModes no", "UsePAM no", "Subsystem sftp internal-sftp", "LogLevel ERROR",
            f"SetEnv {' '.join(f'{k}={v}' for k, v in env.items())}", ""]))
        log = open(h.root / "sshd.log", "ab")
        h.sshd = subprocess.Popen(h.exec_argv("/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)),
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait_sshd(self, h: NetnsHost, timeout: float = 20) -> None:
        """Until sshd answers on the host's port 22; if it does not, say why: sshd's exit and log, or
        where the kernel routes the address (a bridge other than ours means the subnet is shared)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if h.sshd is not None and h.sshd.poll() is not None:
                log = (h.root / "sshd.log").read_text(errors="replace").strip()[-2000:]
                raise NetnsError(f"sshd on {h.address} exited with {h.sshd.returncode}: {log or '(no output)'}")
            try:
                with socket.create_connection((h.address, 22), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        route = subprocess.run(["ip", "route", "get", h.address], capture_output=True, text=True).stdout.strip()
        raise NetnsError(f"sshd on {h.address}:22 did not answer within {timeout:.0f} s (sshd runs; the route "
                         f"from here: {route or 'none'}; the test hosts' bridge is {self.bridge})")

    @staticmethod
    def _end_namespace(ns: str) -> None:
        """End what runs in namespace `ns` by pid, then delete it."""
        NetnsHosts._end_pids(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    @staticmethod
    def _end_pids(namespace: str) -> None:
        def pids() -> list[int]:
            p = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
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

    def reconnect(self, k: int) -> None:
        """Host k's link up again (a stopped instance started: reachable at the same address here)."""
        _sh("ip", "link", "set", f"tv{self.tag}{k}", "up")

    def cut_controller(self, cut: bool = True) -> None:
        """Drop every packet between this machine (the controller, at the operator's address) and the
        hosts, both ways, while the hosts still reach one another: a laptop's Wi-Fi change or a VPN
        reconnect as the hosts see it. Dropped, not refused, so connections stall rather than end;
        `cut=False` lets the traffic through again."""
        for h in self.hosts:
            ipt = h.exec_argv("iptables")
            for chain, way in (("INPUT", "-s"), ("OUTPUT", "-d")):
                _sh(*ipt, *(("-I", chain, "1") if cut else ("-D", chain)), way, self.operator, "-j", "DROP")

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
            self._end_namespace(h.namespace)  # a rank a test left behind) is ours: ended by pid first
            # the root side of the pair goes with the namespace, unless the kernel still holds it
            subprocess.run(["ip", "link", "del", f"tv{self.tag}{h.index}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self._release()

    def _release(self) -> None:
        global _OPEN_HERE
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.close()  # the flock goes with the descriptor
            self._lock = None
            _OPEN_HERE -= 1


def netns_cluster(hosts: NetnsHosts, store: str, python: str) -> Cluster:
    """From live `NetnsHosts`: one rank per namespace host, its sshd's key pinned — SSH hosts described
    by hand, as an operator would describe machines of their own, except that these share this machine's
    cores (`shared_cores`: the controller splits them between the ranks). The namespaces share this
    machine's filesystem, so `python` (with the project's dependencies) is theirs too."""
    return Cluster(source="hosts", shared_cores=True, store=store, key_file=str(hosts.client_key), hosts=[
        Host(rank=h.index, name=f"ns-{h.index}", transport="ssh", address=h.address, private_address=h.address,
             user=hosts.user, host_key=h.host_key, root=str(h.root), interface="eth0", python=python)
        for h in hosts.hosts])

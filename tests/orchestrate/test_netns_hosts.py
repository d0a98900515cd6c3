"""The network-namespace test hosts themselves (root only): a set left behind by a killed run (its
bridge still holding its slot's operator address, its sshd still running) is reclaimed by the next set,
which then answers; a set whose owner still runs, and an address in the slot on a link that is not a
test bridge, are refused by name and left as they were; two slots hold two live sets at once, each
reaching its own hosts; the slots' addresses stay inside the /24, apart, and a host's inside its slot. Without this a run killed mid-way makes every later SSH test time out, which is
how a CI run once failed. Each test works in this worker's slot (tests/conftest.py), its helper child
processes too (they inherit the slot), so the other workers' sets in their slots never meet it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from machinery.netns import (MAX_HOSTS, PREFIX, SLOT_ENV, SLOT_SIZE, SLOTS, NetnsError, NetnsHosts, default_slot,
                            lock_path, operator_address, slot_base)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")

ROOT = Path(__file__).resolve().parents[2]

# A child that opens one set of test hosts, prints its bridge, namespace and sshd pid, then waits.
HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, "tests")  # where machinery/ is (the child runs in the checkout's root)
    from machinery.netns import NetnsHosts
    with NetnsHosts(1, Path(sys.argv[1])) as hs:
        print(hs.bridge, hs.hosts[0].namespace, hs.hosts[0].sshd.pid, flush=True)
        sys.stdin.readline()
""")


def holder(workdir: Path) -> tuple[subprocess.Popen, str, str, int]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], cwd=ROOT, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    assert line, p.stderr.read()
    bridge, ns, sshd = line.split()
    return p, bridge, ns, int(sshd)


def links() -> set[str]:
    return {l.split()[0].split("@")[0] for l in subprocess.run(["ip", "-br", "link"], capture_output=True,
                                                              text=True).stdout.splitlines()}


def namespaces() -> set[str]:
    return {l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                 text=True).stdout.splitlines() if l.strip()}


def answers(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def test_a_set_left_by_a_killed_run_is_reclaimed(tmp_path):
    p, bridge, ns, sshd = holder(tmp_path / "killed")
    p.kill()  # no cleanup runs: the bridge, the namespace and sshd (its own session) stay behind
    p.wait()
    try:
        assert bridge in links() and ns in namespaces() and os.path.exists(f"/proc/{sshd}")
        with NetnsHosts(1, tmp_path / "next") as hs:
            assert answers(hs.hosts[0].address)
            assert bridge not in links() and ns not in namespaces()
            assert not os.path.exists(f"/proc/{sshd}") or "Z" in Path(f"/proc/{sshd}/stat").read_text().split(")")[1][:3]
    finally:  # if the reclaim failed, leave nothing behind for the next test
        if ns in namespaces():
            NetnsHosts._end_namespace(ns)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def test_a_set_whose_owner_runs_is_waited_for_then_refused_by_name(tmp_path):
    p, bridge, ns, _ = holder(tmp_path / "live")
    try:
        t0 = time.monotonic()
        with pytest.raises(NetnsError, match=rf"{lock_path(default_slot())} is held by another set of test hosts "
                                             rf"\(pid {p.pid}\) after 2 s"):
            with NetnsHosts(1, tmp_path / "second", wait_s=2):
                pass
        assert time.monotonic() - t0 >= 2
        assert bridge in links() and ns in namespaces()  # the live set is untouched
        assert answers(f"198.18.0.{slot_base(default_slot()) + 10}")
    finally:
        p.communicate("\n", timeout=30)
    assert p.returncode == 0 and bridge not in links() and ns not in namespaces()


def test_a_second_suite_waits_for_the_subnet_then_comes_up(tmp_path):
    p, bridge, ns, _ = holder(tmp_path / "first")
    try:
        def release() -> None:  # the first set ends
            p.stdin.write("\n")
            p.stdin.flush()

        threading.Timer(2.0, release).start()
        t0 = time.monotonic()
        with NetnsHosts(1, tmp_path / "second", wait_s=60) as hs:
            assert time.monotonic() - t0 >= 2 and answers(hs.hosts[0].address)
            assert bridge not in links() and hs.bridge in links()
    finally:
        p.communicate(timeout=30)
    assert p.returncode == 0


def test_the_slots_are_apart_inside_the_24_and_a_host_never_leaves_its_slot(tmp_path):
    """Checked with `ipaddress`, not with netns.py's own arithmetic: every slot a network of the test /24,
    no two overlapping; the operator and every host a set can hold inside their slot, none of them its
    network or broadcast address; a host number past the slot refused before any address is made."""
    import ipaddress

    test_net = ipaddress.ip_network("198.18.0.0/24")
    nets = [ipaddress.ip_network(f"198.18.0.{slot_base(s)}/{PREFIX}") for s in range(SLOTS)]
    assert all(n.subnet_of(test_net) for n in nets) and len(nets) == SLOTS
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    for s, net in enumerate(nets):
        hs = NetnsHosts(1, tmp_path, slot=s)  # not entered: no namespace, no lock
        used = [ipaddress.ip_address(operator_address(s))] + [ipaddress.ip_address(hs.address_of(k))
                                                              for k in range(MAX_HOSTS)]
        assert all(a in net and a not in (net.network_address, net.broadcast_address) for a in used)
        assert len(set(used)) == len(used)
        with pytest.raises(NetnsError, match="outside the slot"):
            hs.address_of(MAX_HOSTS)
        with pytest.raises(NetnsError, match="outside the slot"):
            hs.address_of(-1)


def test_a_foreign_address_in_the_subnet_is_refused_and_left_alone(tmp_path):
    name = f"td{os.getpid() % 0xffff:04x}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True)
    try:
        base = slot_base(default_slot())
        subprocess.run(["ip", "addr", "add", f"198.18.0.{base + SLOT_SIZE - 8}/{PREFIX}", "dev", name], check=True)
        before = links()
        with pytest.raises(NetnsError, match=rf"{name} holds an address in 198\.18\.0\.{base}/{PREFIX}.*not a test bridge"):
            with NetnsHosts(1, tmp_path / "blocked"):
                pass
        assert links() == before
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)


def test_a_second_set_in_the_same_process_is_refused_at_once(tmp_path):
    with NetnsHosts(1, tmp_path / "first") as hs:
        t0 = time.monotonic()
        with pytest.raises(NetnsError, match="already open in this process"):
            with NetnsHosts(1, tmp_path / "second"):
                pass
        assert time.monotonic() - t0 < 5 and answers(hs.hosts[0].address)
    with NetnsHosts(1, tmp_path / "third") as hs:  # closed: the next one opens
        assert answers(hs.hosts[0].address)


def test_two_slots_hold_two_live_sets_each_reaching_its_own_hosts(tmp_path):
    """A set in another slot (the next) comes up beside this one at once; each answers on its own addresses,
    and ending one leaves the other answering. The other set is a child told that slot — or, when another
    of the suite's workers already holds it, that worker's own live set."""
    import fcntl

    other = (default_slot() + 1) % SLOTS
    with open(lock_path(other), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            busy = None
        except BlockingIOError:
            lock.seek(0)
            busy = lock.read().strip()
    if busy:  # another worker's set lives there: it must keep answering while this one comes up beside it
        pid = int(busy.split()[1])
        t0 = time.monotonic()
        with NetnsHosts(2, tmp_path / "mine") as hs:
            assert time.monotonic() - t0 < 30 and all(answers(h.address) for h in hs.hosts)
            assert os.path.exists(f"/proc/{pid}")  # that set's owner still ran all along
        return
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "other")], cwd=ROOT, text=True,
                         env=dict(os.environ, **{SLOT_ENV: str(other)}),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        bridge = line.split()[0]
        t0 = time.monotonic()
        with NetnsHosts(2, tmp_path / "mine") as hs:
            assert time.monotonic() - t0 < 30  # built, not waiting for the other slot's lock
            assert [h.address for h in hs.hosts] == [f"198.18.0.{slot_base(hs.slot) + 10 + k}" for k in range(2)]
            assert all(answers(h.address) for h in hs.hosts)
            assert answers(f"198.18.0.{slot_base(other) + 10}") and bridge in links()
        assert answers(f"198.18.0.{slot_base(other) + 10}")
    finally:
        p.communicate("\n", timeout=30)
    assert p.returncode == 0 and bridge not in links()

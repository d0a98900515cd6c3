"""SSH transport against real OpenSSH sshd processes in network namespaces on 198.18.0.0/24
(root only): exit status, separate output streams, a session in the host's own login home, verified copies, pinned host keys, the member-only
firewall on a rendezvous port, an unreachable host failing fast, and a remote rank's liveness
verdict kept on the clock while its probes hang — a host silent while another answers, every host silent
at once (the controller's network), the controller itself stopped — a detached rank attached again after its
connection dies with nothing lost, its status as Popen's or 'lost' when none was left, and the liveness
probe that reads a zombie as gone."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from machinery.netns import MAX_HOSTS, PREFIX, NetnsHosts
from orchestrate.launch.ssh import Hearing, RemoteRank, liveness_probe
from orchestrate.transport import SSHTransport, TransportError

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("/usr/sbin/sshd") is None,
                                reason="needs root and openssh-server (CI installs both)")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(3, tmp_path_factory.mktemp("netns"), members=[0, 1]) as hs:
        yield hs


def ssh(hs, k, **kw) -> SSHTransport:
    h = hs.hosts[k]
    return SSHTransport(f"host-{k}", h.address, user=hs.user, key_file=hs.client_key,
                        **({"host_key": h.host_key} | kw))


def test_exec_status_streams_and_env(hosts):
    t = ssh(hosts, 0)
    try:
        r = t.run("echo out; echo err >&2; exit 7")
        assert (r.status, r.stdout, r.stderr) == (7, "out\n", "err\n")
        r = t.run('echo "$GREETING" from $(ip -4 -o addr show eth0 | awk \'{print $4}\')',
                  env={"GREETING": "it's me"})
        assert r.status == 0 and r.stdout.strip() == f"it's me from {hosts.hosts[0].address}/{PREFIX}"
        big = t.run("head -c 300000 /dev/zero | tr '\\0' x")  # more than one channel window
        assert big.status == 0 and len(big.stdout) == 300000
        # sshd sends the exit status when the shell ends and the output still in its pipe after it: the
        # last line of a sha256sum under load once; here a child that writes after its shell has ended
        late = t.run("(sleep 0.5; echo late; echo late-err >&2) & echo early")
        assert (late.status, late.stdout, late.stderr) == (0, "early\nlate\n", "late-err\n")
    finally:
        t.close()


def test_a_session_logs_in_to_its_hosts_own_home(hosts):
    """A real host's shell reads its own startup files, never this machine's root user's: a session's
    HOME is the host's login home, and the shell sshd runs for a command reads that home's ~/.bashrc
    (Debian's bash does so when sshd starts it)."""
    h = hosts.hosts[2]
    home = h.login_home
    rc = home / ".bashrc"
    kept = rc.read_bytes() if rc.is_file() else b""  # /etc/skel's, where the system has one
    t = ssh(hosts, 2)
    try:
        assert t.run('echo "$HOME"').stdout.strip() == str(home)
        rc.write_bytes(b"echo this-hosts-bashrc >&2\n" + kept)
        r = t.run("true")
        assert r.status == 0 and set(r.stderr.splitlines()) == {"this-hosts-bashrc"}, r.stderr  # once per shell
    finally:
        rc.write_bytes(kept)
        t.close()


def test_a_sessions_idle_openmp_threads_sleep(hosts):
    """The hosts share this machine's cores, so a session's torch does not keep idle OpenMP threads spinning
    on them (`shared_cores_env`: the operator's own OMP_WAIT_POLICY where set, else PASSIVE)."""
    from machinery.netns import shared_cores_env

    t = ssh(hosts, 0)
    try:
        assert t.run('echo "$OMP_WAIT_POLICY"').stdout.strip() == shared_cores_env()["OMP_WAIT_POLICY"] != ""
    finally:
        t.close()


def test_copies_are_verified_both_ways(hosts, tmp_path):
    t = ssh(hosts, 1)
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(2 << 20))
    remote = str(hosts.hosts[1].root / "staged" / "payload.bin")
    try:
        digest = t.put(src, remote)
        assert digest == hashlib.sha256(src.read_bytes()).hexdigest()
        assert t.run(f"sha256sum {remote}").stdout.split()[0] == digest
        back = tmp_path / "back.bin"
        assert t.get(remote, back) == digest and back.read_bytes() == src.read_bytes()
    finally:
        t.close()


def test_many_copies_go_in_one_session_and_are_each_verified(hosts, tmp_path, monkeypatch):
    """`put_all`: files into folders the host lacks (names with a space, a quote, a backslash), in batches
    of paths (made small here), each read back and checked, in order; one that reads back otherwise
    is refused by its remote path."""
    import functools

    from orchestrate import transport as transport_mod

    t = ssh(hosts, 1)
    base = hosts.hosts[1].root / "many"
    names = [f"d{i % 3}/sub dir/f'{i}\\x.bin" for i in range(12)]
    pairs = []
    for i, n in enumerate(names):
        src = tmp_path / f"src-{i}"
        src.write_bytes(os.urandom(1000 + i))
        pairs.append((src, str(base / n)))
    monkeypatch.setattr(transport_mod, "_batches", functools.partial(transport_mod._batches, limit=200))
    try:
        got = t.put_all(pairs)
        assert got == [hashlib.sha256(src.read_bytes()).hexdigest() for src, _ in pairs]
        for (src, remote), digest in zip(pairs, got):
            assert Path(remote).read_bytes() == src.read_bytes()  # the namespaces share this filesystem
        assert len(transport_mod._batches([r for _, r in pairs])) > 1
        real = transport_mod.file_sha256
        monkeypatch.setattr(transport_mod, "file_sha256",
                            lambda p: "0" * 64 if Path(p) == pairs[5][0] else real(p))
        with pytest.raises(TransportError, match=rf"{re.escape(pairs[5][1])} reads back as {got[5]}, uploaded 0{{64}}"):
            t.put_all(pairs)
    finally:
        t.close()


def test_host_keys_are_pinned(hosts):
    with pytest.raises(TransportError, match="no host key"):
        SSHTransport("h", hosts.hosts[0].address, user="root", key_file=hosts.client_key)
    wrong = ssh(hosts, 0, host_key=hosts.hosts[1].host_key)  # another host's key
    with pytest.raises(TransportError, match="different host key"):
        wrong.run("true")
    tofu = ssh(hosts, 0, host_key=None, trust_on_first_use=True)  # only when asked for by name
    try:
        assert tofu.run("true").status == 0 and tofu.accepted_key == hosts.hosts[0].host_key
    finally:
        tofu.close()


def test_unreachable_host_fails_fast(hosts):
    t = SSHTransport("ghost", hosts.address_of(MAX_HOSTS - 1), user="root", key_file=hosts.client_key,
                     host_key=hosts.hosts[0].host_key, connect_timeout=2)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="cannot be reached|timed out"):
        t.run("true")
    assert time.monotonic() - t0 < 10


def test_rendezvous_port_accepts_members_only(hosts):
    """A listener in host 0 on a rendezvous port: member host 1 connects, non-member host 2 is refused."""
    listener = subprocess.Popen(hosts.hosts[0].exec_argv(
        sys.executable, "-c",
        "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('{hosts.hosts[0].address}', 29500)); s.listen(); print('ready', flush=True); "
        "[s.accept()[0].close() for _ in iter(int, 1)]"), stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        probe = (f"import socket,sys\ntry:\n socket.create_connection(('{hosts.hosts[0].address}', 29500), timeout=3).close()"
                 "; print('connected')\nexcept OSError as e: print(type(e).__name__)")
        member = subprocess.run(hosts.hosts[1].exec_argv(sys.executable, "-c", probe), capture_output=True, text=True)
        outsider = subprocess.run(hosts.hosts[2].exec_argv(sys.executable, "-c", probe), capture_output=True, text=True)
        assert member.stdout.strip() == "connected"
        assert outsider.stdout.strip() == "ConnectionRefusedError"
        # ...while SSH from the operator still reaches the non-member (it is a host, just not a member)
        t = ssh(hosts, 2)
        try:
            assert t.run("true").status == 0
        finally:
            t.close()
    finally:
        listener.kill()
        listener.wait()


class HangingProbes(SSHTransport):
    """A real connection whose liveness probes can be made to hang, as paramiko's can on a connection
    that no longer carries packets (waiting out a key exchange, an open that is never answered)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.hang = threading.Event()
        self.release = threading.Event()

    def session(self, timeout=None):
        if self.hang.is_set() and threading.current_thread().name.startswith("liveness"):
            self.release.wait(120)
            raise TransportError("probe released")
        return super().session(timeout)


class SlowShell(SSHTransport):
    """A real host whose shell takes `delay_s` before a probe's command runs, as a login shell's start-up
    files do on a host whose cores four ranks keep busy (seen: every probe past its 2 s on the netns
    cluster while ddp-four's ranks imported torch)."""

    delay_s = 3.0

    def execute(self, chan, command, env=None):
        return super().execute(chan, f"sleep {self.delay_s}; {command}" if "pid:alive" in command else command, env)


def test_a_slow_shell_is_not_an_unreachable_host(hosts, tmp_path):
    """The host answers (sshd opens every session at once) but each probe's shell needs longer than
    the probe's own timeout: the rank stays reachable, and the probe's words still arrive."""
    h = hosts.hosts[2]
    t = SlowShell("host-2", h.address, user=hosts.user, key_file=hosts.client_key, host_key=h.host_key)
    pidfile = f"{h.root}/slow.pid"
    rank = RemoteRank(t, "exec sleep 60", {}, tmp_path / "rank.log", pidfile, unreachable_s=4)
    cleanup = ssh(hosts, 2)
    try:
        assert rank.probe_timeout_s < t.delay_s < rank.unreachable_s
        began, loudest = time.monotonic(), 0.0
        while time.monotonic() - began < 3 * rank.unreachable_s:
            assert rank.poll() is None, (rank.why, rank.silent_for())
            loudest = max(loudest, rank.silent_for())
            time.sleep(0.1)
        print(f"slow shell ({t.delay_s} s a probe): longest silence {loudest:.2f} s, pid seen alive: {rank.pid_alive}")
        assert rank.pid_alive is True and loudest < rank.unreachable_s
    finally:
        rank.stop_watching()
        cleanup.run(f"kill $(cat {pidfile})")
        cleanup.close()
        t.close()


def hanging(hosts, k: int) -> HangingProbes:
    h = hosts.hosts[k]
    return HangingProbes(f"host-{k}", h.address, user=hosts.user, key_file=hosts.client_key, host_key=h.host_key)


def test_a_hanging_probe_cannot_delay_the_unreachable_verdict(hosts, tmp_path):
    """The verdict comes from the clock (no answer for unreachable_s while another host of the group
    answers), not from a probe returning: poll() never waits on the host, and the rank fails within the
    bound although every probe to its host hangs."""
    h = hosts.hosts[1]
    t, other = hanging(hosts, 1), hanging(hosts, 2)
    hearing = Hearing(unreachable_s=3)
    pidfile = f"{h.root}/hang.pid"
    rank = RemoteRank(t, "exec sleep 120", {}, tmp_path / "rank.log", pidfile, heartbeat=f"{h.root}/beat",
                      hearing=hearing)
    peer = RemoteRank(other, "exec sleep 120", {}, tmp_path / "peer.log", f"{hosts.hosts[2].root}/hang-peer.pid",
                      hearing=hearing)  # host 2 keeps answering: the controller reaches the network
    cleanup = ssh(hosts, 1)
    try:
        cleanup.run(f"touch -d @1000000000 {h.root}/beat").check("beat")
        deadline = time.monotonic() + 10
        while rank.heartbeat_mtime is None and time.monotonic() < deadline:  # the watcher answers
            assert rank.poll() is None
            time.sleep(0.05)
        assert rank.heartbeat_mtime == 1000000000.0 and rank.silent_for() < 2.5
        t.hang.set()
        hung_at, slowest = time.monotonic(), 0.0
        while True:
            t0 = time.monotonic()
            code = rank.poll()
            slowest = max(slowest, time.monotonic() - t0)
            if code is not None or time.monotonic() - hung_at > 30:
                break
            time.sleep(0.05)
        verdict = time.monotonic() - hung_at
        assert (code, rank.why, rank.unstoppable) == (255, "unreachable", True)
        # the last answer came at most one probe before the hang; a probe in flight then may still answer
        assert 3 - 2.5 < verdict < 3 + rank.probe_timeout_s + 1, verdict
        assert slowest < 0.5, slowest  # no poll waited on the host
        assert rank.heartbeat_mtime == 1000000000.0  # the last value seen stays
        assert peer.poll() is None
    finally:
        t.release.set()
        for r in (rank, peer):
            r.stop_watching()
        cleanup.run(f"kill $(cat {pidfile}) $(cat {hosts.hosts[2].root}/hang-peer.pid)")
        cleanup.close()
        for x in (t, other):
            x.close()
        hearing.close()


def test_every_host_silent_at_once_is_the_controllers_silence(hosts, tmp_path):
    """Every probe of the group hangs at once (what a controller cut off from its network sees): no host
    is declared unreachable at unreachable_s, and the operator is told why. Then one host answers again
    and the other does not: the silent one is unreachable once it has stayed silent for unreachable_s
    *after* the controller heard again, not at the first answer. A group that stays silent (one host
    here) is a verdict only past alone_s."""
    said: list[str] = []
    hearing = Hearing(unreachable_s=3, alone_s=30, say=said.append)
    ts = [hanging(hosts, k) for k in (1, 2)]
    pidfiles = [f"{hosts.hosts[k].root}/silent-{k}.pid" for k in (1, 2)]
    ranks = [RemoteRank(t, "exec sleep 120", {}, tmp_path / f"r{k}.log", pf, hearing=hearing)
             for k, t, pf in zip((1, 2), ts, pidfiles)]
    lone_t, lone_pid = hanging(hosts, 2), f"{hosts.hosts[2].root}/silent-lone.pid"
    lone = None
    cleanup = ssh(hosts, 1)
    try:
        deadline = time.monotonic() + 10
        while not all(r.pid_alive for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        for t in ts:
            t.hang.set()
        hung_at = time.monotonic()
        while time.monotonic() - hung_at < 7:  # past unreachable_s, short of alone_s
            assert [r.poll() for r in ranks] == [None, None], [r.why for r in ranks]
            time.sleep(0.1)
        assert said and said[0].startswith("no host of the group has answered for") and "30 s" in said[0], said
        ts[1].hang.clear()  # host 2 is reachable again; host 1 stays silent
        ts[1].release.set()
        while len(said) < 2 and time.monotonic() - hung_at < 20:
            assert ranks[0].poll() is None
            time.sleep(0.02)
        heard_again = time.monotonic()
        assert said[1] == "host-2 answers again", said
        while ranks[0].poll() is None and time.monotonic() - heard_again < 15:
            time.sleep(0.05)
        took = time.monotonic() - heard_again
        print(f"one host back after every host was silent: the other unreachable {took:.2f} s later (unreachable_s 3)")
        assert ranks[0].why == "unreachable" and 3 - 1 < took < 3 + 2, (ranks[0].why, took)
        assert ranks[1].poll() is None
        # a group that stays silent (here of one host): a verdict only once alone_s has passed
        lone = RemoteRank(lone_t, "exec sleep 120", {}, tmp_path / "lone.log", lone_pid, unreachable_s=3, alone_s=8)
        deadline = time.monotonic() + 10
        while not lone.pid_alive and time.monotonic() < deadline:
            time.sleep(0.05)
        lone_t.hang.set()
        gone_at = time.monotonic()
        while lone.poll() is None and time.monotonic() - gone_at < 30:
            time.sleep(0.1)
        took = time.monotonic() - gone_at
        print(f"a group of one silent: verdict after {took:.2f} s (alone_s 8, unreachable_s 3)")
        assert lone.why == "unreachable" and 8 - 1.5 < took < 8 + 3, (lone.why, took)
    finally:
        for t in (*ts, lone_t):
            t.release.set()
        for r in (*ranks, *([lone] if lone else [])):
            r.stop_watching()
        cleanup.run(f"kill $(cat {' '.join(pidfiles)} {lone_pid}) 2>/dev/null")
        cleanup.close()
        for t in (*ts, lone_t):
            t.close()
        hearing.close()


CONTROLLER = """
import json, sys, time
from pathlib import Path
from orchestrate.launch.ssh import Hearing, RemoteRank
from orchestrate.transport import SSHTransport
c = json.loads(sys.argv[1])
hearing = Hearing(unreachable_s=5, alone_s=5)  # no grace for a silent group: only the clock can spare it
ranks = [RemoteRank(SSHTransport(f"host-{k}", h["address"], user=c["user"], key_file=c["key"], host_key=h["key"]),
                    "exec sleep 120", {}, Path(c["logs"]) / f"r{k}.log", h["pidfile"], hearing=hearing)
         for k, h in enumerate(c["hosts"])]
deadline = time.monotonic() + 10
while not all(r.pid_alive for r in ranks) and time.monotonic() < deadline:
    time.sleep(0.05)
print("watching", flush=True)
end, loudest = time.monotonic() + c["watch_s"], 0.0
while time.monotonic() < end and all(r.poll() is None for r in ranks):
    loudest = max([loudest] + [r.silent_for() for r in ranks])
    time.sleep(0.05)
print(json.dumps({"verdicts": [r.why for r in ranks], "loudest": loudest}), flush=True)
for r in ranks:
    r.stop_watching()
"""


def test_a_stopped_controller_is_owed_no_verdict(hosts, tmp_path):
    """The controller itself stops for 10 s (SIGSTOP, as a laptop's sleep or a starved process would):
    its hosts did not go silent, it did; the silence it counts is the time it ran, so no verdict comes
    from those 10 s (unreachable_s 5, and no grace for a group that falls silent together)."""
    import json
    import signal

    ks = (1, 2)
    pidfiles = [f"{hosts.hosts[k].root}/stopped-ctl-{k}.pid" for k in ks]
    cfg = {"user": hosts.user, "key": str(hosts.client_key), "logs": str(tmp_path), "watch_s": 18,
           "hosts": [{"address": hosts.hosts[k].address, "key": hosts.hosts[k].host_key, "pidfile": pf}
                     for k, pf in zip(ks, pidfiles)]}
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, json.dumps(cfg)], stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    cleanup = ssh(hosts, 1)
    try:
        assert ctl.stdout.readline().strip() == "watching"
        time.sleep(2)
        ctl.send_signal(signal.SIGSTOP)
        time.sleep(10)
        ctl.send_signal(signal.SIGCONT)
        out = json.loads(ctl.stdout.readline())
        ctl.wait(timeout=30)
        print(f"controller stopped 10 s: verdicts {out['verdicts']}, longest silence counted {out['loudest']:.2f} s")
        assert out["verdicts"] == [None, None] and out["loudest"] < 5, out
    finally:
        if ctl.poll() is None:
            ctl.send_signal(signal.SIGCONT)
            ctl.kill()
            ctl.wait()
        cleanup.run(f"kill $(cat {' '.join(pidfiles)}) 2>/dev/null")
        cleanup.close()


TALKER = "for i in $(seq 1 40); do echo out-$i; echo err-$i >&2; sleep 0.1; done; exit 3"


def test_a_rank_whose_connection_dies_is_attached_again_and_loses_nothing(hosts, tmp_path):
    """The connection carrying a rank dies while its host stays up: the rank, detached on its host, runs
    on; the controller attaches again from the bytes it holds, and the rank's whole output — every line
    once — and its own exit status arrive. Before ranks ran detached, the status went with the
    connection (the rank ended as "lost") and a rank that wrote after the drop died of it."""
    h = hosts.hosts[1]
    t = ssh(hosts, 1)
    pidfile = f"{h.root}/reattach.pid"
    log = tmp_path / "rank.log"
    rank = RemoteRank(t, f"exec bash -c {shlex.quote(TALKER)}", {}, log, pidfile, unreachable_s=10)
    try:
        deadline = time.monotonic() + 10
        while b"out-5" not in log.with_suffix(".out").read_bytes() and time.monotonic() < deadline:
            assert rank.poll() is None
            time.sleep(0.05)
        t._client.get_transport().sock.shutdown(socket.SHUT_RDWR)  # the connection drops mid-output
        dropped = time.monotonic()
        assert rank.wait(timeout=30) == 3
        print(f"connection dropped → attached again {rank.reattached} time(s); rank's status after "
              f"{time.monotonic() - dropped:.2f} s")
        assert (rank.why, rank.unstoppable) == (None, False) and rank.reattached >= 1
        assert log.with_suffix(".out").read_text().split() == [f"out-{i}" for i in range(1, 41)]
        assert log.read_text().split() == [f"err-{i}" for i in range(1, 41)]
    finally:
        rank.stop_watching()
        t.close()


def test_a_signalled_rank_ends_as_popen_says_and_one_without_a_status_is_lost(hosts, tmp_path):
    """A rank stopped by SIGTERM ends -15 (Popen's word for it, which the supervisor counts as its own
    stop); a rank whose wrapper was killed with it left no exit status, and fails as "lost", never as
    a success."""
    h = hosts.hosts[0]
    t, check = ssh(hosts, 0), ssh(hosts, 0)
    ranks = []
    try:
        termed = RemoteRank(t, "exec sleep 60", {}, tmp_path / "termed.log", f"{h.root}/termed.pid")
        ranks.append(termed)
        lost_pid = f"{h.root}/lost.pid"
        lost = RemoteRank(ssh(hosts, 0), "exec sleep 60", {}, tmp_path / "lost.log", lost_pid)
        ranks.append(lost)
        deadline = time.monotonic() + 10
        while not (termed.pid_alive and lost.pid_alive) and time.monotonic() < deadline:
            time.sleep(0.05)
        termed.send_signal(15)
        assert termed.wait(timeout=10) == -15 and termed.why is None
        pid = check.run(f"cat {lost_pid}").stdout.strip()
        wrapper = check.run(f"ps -o ppid= -p {pid}").stdout.strip()
        check.run(f"kill -KILL {wrapper} {pid}").check("kill the wrapper and its rank")
        assert lost.wait(timeout=20) == 255 and lost.why == "lost"
        assert not (h.root / "lost.status").exists()
    finally:
        for r in ranks:
            r.stop_watching()
            r.t.close()
        check.close()


def test_a_closed_connection_is_never_reopened(hosts):
    """A thread that outlives the attempt it served (a late signal, a watcher's probe) finds the
    connection shut instead of opening a new one that could reach the next attempt's rank."""
    t = ssh(hosts, 0)
    assert t.run("true").status == 0
    t.close()
    with pytest.raises(TransportError, match="this connection was closed"):
        t.run("true")
    assert t._client is None


def test_the_liveness_probe_reads_a_zombie_as_gone(hosts, tmp_path, zombie):
    """The probe a watcher runs, run on a host: a running pid answers alive, an exited one whose parent
    has not reaped it (a zombie, which `kill -0` still finds) answers gone, as does a missing pidfile;
    the heartbeat's mtime comes tagged beside it."""
    t = ssh(hosts, 0)
    pidfile, zombie_file, beat = tmp_path / "rank.pid", tmp_path / "zombie-rank.pid", tmp_path / "beat"
    beat.touch()
    os.utime(beat, (1000000000, 1000000000))
    live = subprocess.Popen(["sleep", "30"])
    pidfile.write_text(f"{live.pid}\n")
    zombie_file.write_text(f"{zombie}\n")
    try:
        answers = {name: t.run(liveness_probe(str(f), str(beat)), timeout=10).check("probe").stdout.split()
                   for name, f in (("running", pidfile), ("zombie", zombie_file), ("missing", tmp_path / "none"))}
        assert answers == {"running": ["pid:alive", "beat:1000000000"], "zombie": ["pid:gone", "beat:1000000000"],
                           "missing": ["pid:gone", "beat:1000000000"]}
        assert t.run(liveness_probe(str(pidfile)), timeout=10).stdout.split() == ["pid:alive"]
    finally:
        live.kill()
        live.wait()
        t.close()

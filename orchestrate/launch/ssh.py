"""Ranks on hosts reached over SSH, one per host, each detached on its host and attached to over SSH.

A rank runs in its own session on its host (`detached_line`): its pid, stdout, stderr and exit status
go to files beside the pidfile, so it owes nothing to the controller's connection — a Wi-Fi change, a
sleep, a killed terminal or a SIGKILLed controller leaves it running. The controller attaches
(`attach_line`): one SSH channel streams both files from the offsets it already holds and ends with the
rank's own exit status. When that channel dies with its connection the controller attaches again from
where it was, losing no byte and no status; a later controller attaches the same way
(`launch_remote_group(attach=True)`, `running_ranks`). The supervisor signals a rank by pid
(`kill -TERM <pid>`). A host that stops answering fails the group like a non-zero exit: the others are
stopped; the unreachable one cannot be, and the result says so (`Reason.UNREACHABLE`). Whose silence it
is decides when (`Hearing`): a host is unreachable after `unreachable_s` without an answer, counted only
while the controller itself ran (a controller that was stopped, suspended or starved heard nothing and is
owed no verdict), and only while another host of the group answers (the controller still reaches the
network); when every host falls silent at once — the controller's own network, or a group of one — the
verdict waits `alone_s`. A rank that left no exit status (its host rebooted under it) fails as
`Reason.LOST`, never as a success. The hosts are staged first (orchestrate/remote.py); each rank's
command and environment are `command`'s.
"""

from __future__ import annotations

import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrate.cluster import Cluster, Host
from orchestrate.launch.command import Rendezvous, free_port, host_command, process_env
from orchestrate.launch.supervise import GroupResult, Reason, run_group
from orchestrate.transport import SSHTransport, finished
from training.lease import env as lease_env


def liveness_probe(pidfile: str, heartbeat: str | None = None, lease: str | None = None) -> str:
    """The shell line a watcher runs on the host: `pid:alive` or `pid:gone` for the pid in `pidfile`,
    and `beat:<mtime>` of the heartbeat file when one is given. Tagged, so whatever else a login shell
    prints cannot be taken for an answer. The pid's state comes from /proc: a zombie has exited and
    waits only for its parent to reap it, yet `kill -0` would still find it. With `lease`, the probe
    renews the rank's lease on its controller (touches the file: the rank reads its age)."""
    state = (f"p=$(cat {shlex.quote(pidfile)} 2>/dev/null); "
             "case \"$(sed -n 's/^.*) \\(.\\).*$/\\1/p' /proc/${p:-none}/stat 2>/dev/null)\" in "
             "''|Z|X) echo pid:gone;; *) echo pid:alive;; esac")
    beat = f"; echo beat:$(stat -c %Y {shlex.quote(heartbeat)} 2>/dev/null)" if heartbeat else ""
    renew = f"touch {shlex.quote(lease)} 2>/dev/null; " if lease else ""
    return f"{renew}{state}{beat}; true"


NO_STATUS = 254
"""The attach line's exit when the rank ended without its wrapper recording a status (the wrapper was
killed, the host rebooted): the rank's end is unknown, so it fails as `Reason.LOST`."""


def rank_pidfile(host: Host, rank: int) -> str:
    """Where rank `rank`'s pid lives on `host`; its other files sit beside it (`rank_files`)."""
    return f"{host.root}/rank-{rank}.pid"


def rank_files(pidfile: str) -> dict[str, str]:
    """Where a detached rank's output, exit status and tag live on its host: beside its pidfile."""
    base = pidfile.removesuffix(".pid")
    return {"pid": pidfile, "out": f"{base}.out", "err": f"{base}.err", "status": f"{base}.status",
            "tag": f"{base}.tag", "lease": f"{base}.lease"}


def detached_line(command: str, pidfile: str, tag: str = "") -> str:
    """The shell line that starts `command` in a session of its own on the host and returns at once.

    A wrapper shell (setsid: no terminal, no process group shared with sshd's session) runs `command` in
    the background with stdin from /dev/null and stdout and stderr to files, writes its pid (`command`
    execs its program: the program's pid), waits for it, and writes its exit status ($? of `wait`:
    128 + n for a death by signal n) — each file written whole and renamed into place. The files of an
    earlier run of the same pidfile are removed first; `tag` names what runs (the arm), so that a later
    controller can tell whether the rank it finds running is the one it would start."""
    f = {k: shlex.quote(v) for k, v in rank_files(pidfile).items()}
    inner = (f"{{ {command}; }} < /dev/null > {f['out']} 2> {f['err']} & "
             f"echo $! > {f['pid']}.tmp && mv {f['pid']}.tmp {f['pid']}; "
             f"wait $!; echo $? > {f['status']}.tmp && mv {f['status']}.tmp {f['status']}")
    return (f"rm -f {f['pid']} {f['out']} {f['err']} {f['status']}; echo {shlex.quote(tag)} > {f['tag']}; "
            f"touch {f['lease']}; "
            f"setsid bash -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 &")


def attach_line(pidfile: str, out_from: int = 0, err_from: int = 0) -> str:
    """The shell line whose stdout and stderr are the rank's, from byte `out_from` and `err_from` on, and
    whose exit status is the rank's (`NO_STATUS` when none was recorded). GNU tail follows each file
    until the rank's pid is gone, then reads what is left; the status file is written just after. Waits
    up to 5 s for the pidfile of a rank that is still starting."""
    f = {k: shlex.quote(v) for k, v in rank_files(pidfile).items()}
    follow = "tail -s 0.2 --pid=$p -F -c"
    return (f"for i in $(seq 100); do [ -s {f['pid']} ] && break; sleep 0.05; done; p=$(cat {f['pid']} 2>/dev/null); "
            f"if [ -n \"$p\" ]; then {follow} +{out_from + 1} {f['out']} 2>/dev/null & "
            f"{follow} +{err_from + 1} {f['err']} 1>&2 2>/dev/null & wait; fi; "
            f"for i in $(seq 100); do [ -s {f['status']} ] && exit $(cat {f['status']}); sleep 0.05; done; "
            f"exit {NO_STATUS}")


def running_line(pidfile: str, tag: str | None) -> str:
    """The shell line that prints `running` when the rank of `pidfile` runs what `tag` names (None:
    whatever it runs) and has not ended (no status written, its pid alive and no zombie)."""
    f = {k: shlex.quote(v) for k, v in rank_files(pidfile).items()}
    same = "" if tag is None else f"[ \"$(cat {f['tag']} 2>/dev/null)\" = {shlex.quote(tag)} ] && "
    return (f"{same}[ -e {f['pid']} ] && [ ! -e {f['status']} ] && "
            f"{{ {liveness_probe(pidfile)}; }} | grep -qx pid:alive && echo running; true")


UNREACHABLE_S = 10.0
"""A dead host is declared after this many seconds of the controller's running time without an answer,
while another host of its group answers: long enough for a host whose cores four ranks keep busy to open a
session (seen: 2-5 s while ranks import torch on two cores), short next to a training arm."""
ALONE_S = 180.0
"""When no host of a group answers, the controller cannot tell its own network's loss (a Wi-Fi change, a
VPN reconnect, a sleep) from every host's: the verdict then waits this long, well past such a blink."""


STALLED_S = 5.0
"""A host's connection that has let no session open for this long is replaced by a new one at the next try:
after a blink of the controller's network TCP retransmits into the old one with backoff (a minute or more
between tries after a 60-s cut), or forever when the controller's address changed."""


class Hearing:
    """When the controller last heard each host of one group, on a clock that runs only while the
    controller does: a ticker adds each tick's seconds, but at most `stall_s` of them, so a controller
    stopped (SIGSTOP, a laptop's sleep, a paused VM) or starved for a minute counts about a second of it.
    `verdict(host)` is a host's silence judged as the module says."""

    def __init__(self, *, unreachable_s: float = UNREACHABLE_S, alone_s: float = ALONE_S, tick_s: float = 0.25,
                 stall_s: float = 1.0, say: Callable[[str], None] | None = None):
        self.unreachable_s, self.alone_s, self.tick_s, self.stall_s = unreachable_s, max(alone_s, unreachable_s), \
            tick_s, stall_s
        self.say = say
        self._lock = threading.Lock()
        self._awake, self._last = 0.0, time.monotonic()
        self._heard: dict[str, float] = {}
        self._last_any = 0.0  # when any host of the group last answered
        self._back = 0.0  # when the controller last heard again after hearing no host for unreachable_s / 2
        self._all_silent = False  # said once per stretch of silence
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="hearing clock", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.now()

    def now(self) -> float:
        """Seconds the controller has run since this hearing began (stalls counted as `stall_s`)."""
        with self._lock:
            t = time.monotonic()
            self._awake += min(t - self._last, self.stall_s)
            self._last = t
            return self._awake

    def join(self, host: str) -> None:
        """A host of the group, heard from now (its rank has just been started there)."""
        now = self.now()
        with self._lock:
            self._heard.setdefault(host, now)

    def heard(self, host: str) -> None:
        now = self.now()
        with self._lock:
            if now - self._last_any > self.unreachable_s / 2:  # the controller heard nothing for a while:
                self._back = now  # the other hosts' silences count from here, not from before
            self._heard[host] = self._last_any = now
            back, self._all_silent = self._all_silent, False
        if back and self.say:
            self.say(f"{host.split(':')[0]} answers again")

    def silent_for(self, host: str) -> float:
        now = self.now()
        with self._lock:
            return now - self._heard.get(host, now)

    def verdict(self, host: str) -> bool:
        """Whether `host` is unreachable: silent past `unreachable_s` while another host answered within
        the last `unreachable_s / 2` — its silence counted from when the controller last heard again
        after hearing no host at all, so that when the controller's network comes back the first host
        to answer does not condemn the others before they could — or silent past `alone_s` when no host
        answers."""
        now = self.now()
        with self._lock:
            silent = now - self._heard.get(host, now)
            if silent <= self.unreachable_s:
                return False
            if any(now - t <= self.unreachable_s / 2 for h, t in self._heard.items() if h != host):
                return now - max(self._heard.get(host, now), self._back) > self.unreachable_s
            first, self._all_silent = not self._all_silent, True
        if first and self.say:
            self.say(f"no host of the group has answered for {silent:.0f} s: more likely the controller's own "
                     f"network than every host at once; a host is declared unreachable after {self.alone_s:.0f} s "
                     "of this")
        return silent > self.alone_s

    def close(self) -> None:
        self._stop.set()


class RemoteRank:
    """Popen's interface (poll, send_signal, kill, wait, returncode) for a rank on an SSH host.

    The rank is started detached (`detached_line`) and followed by an attach channel (`attach_line`)
    whose stderr goes to `log`, its stdout to `log` with the suffix `.out`, and whose exit status is the
    rank's. `attach=True` starts nothing: it follows a rank already running from the sizes those local
    files already have (a later controller taking over). A channel that dies with its connection is
    replaced by a new attach from the bytes received so far, as soon as the host opens a session again.

    Liveness is decided on the controller's clock, not on a probe's return: a watcher thread asks the
    host every `probe_every_s` whether the rank's pid is there (and, when given, the heartbeat's mtime),
    each answer told to the group's `Hearing`, and `poll` fails the rank once the hearing's verdict
    says so. A probe that blocks — a reconnect to a dead address, paramiko waiting out a key exchange on
    a connection that no longer carries packets — delays only the next probe, never the decision or the
    other ranks' supervision. A rank given no hearing is a group of one, judged by a hearing of its own
    made from `unreachable_s` and `alone_s`; given one (a group's), the hearing's bounds are the rank's.
    """

    def __init__(self, t: SSHTransport, command: str, env: dict[str, str], log: Path, pidfile: str,
                 *, unreachable_s: float = UNREACHABLE_S, alone_s: float = ALONE_S, probe_every_s: float = 1.0,
                 probe_timeout_s: float = 2.0, words_every_s: float = 5.0, heartbeat: str | None = None,
                 hearing: Hearing | None = None, tag: str = "", attach: bool = False):
        self.t, self.log, self.pidfile = t, log, pidfile
        self._own_hearing = hearing is None
        self.hearing = hearing or Hearing(unreachable_s=unreachable_s, alone_s=alone_s)
        self.key = f"{t.name}:{pidfile}"  # one entry per rank, even where two ranks share a host
        self.hearing.join(self.key)
        self.unreachable_s, self.probe_every_s, self.probe_timeout_s = \
            self.hearing.unreachable_s, probe_every_s, probe_timeout_s
        self.words_every_s = words_every_s  # how often the pid and heartbeat are read (a shell on the host)
        self.returncode: int | None = None
        self.why: Reason | None = None  # set when its end is decided here, not by its status
        self.unstoppable = False
        self.heartbeat_mtime: float | None = None  # the last heartbeat mtime the host reported
        self.pid_alive: bool | None = None  # whether the rank's pid ran at the last answer
        out = log.with_suffix(".out")
        if not attach:
            log.write_bytes(b"")
            out.write_bytes(b"")
        self._log = open(log, "ab")
        self._out = open(out, "ab")
        self._got = [out.stat().st_size, log.stat().st_size]  # bytes of stdout, stderr held here
        first = attach_line(pidfile, *self._got)
        self.chan = t.start(first if attach else f"{detached_line(command, pidfile, tag)} {first}", env)
        self.reattached = 0  # attach channels opened after a connection died
        self._reattaching: threading.Thread | None = None
        self._reattach_at = 0.0
        self._killed_at: float | None = None  # when kill() last sent SIGKILL
        self._stop = threading.Event()
        self._probe = liveness_probe(pidfile, heartbeat, rank_files(pidfile)["lease"])
        self._watcher = threading.Thread(target=self._watch, name=f"liveness {t.name}", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """A session each `probe_every_s`: its opening, sshd's confirmation over the network, is the
        answer that keeps the host reachable, and costs the host no process. Every `words_every_s` the
        session also runs the probe (a shell: the pid's state, the heartbeat's mtime), whose words come
        once that shell has run — which on a host whose cores the ranks keep busy can take seconds longer
        than the opening (a login shell's start-up files, four ranks importing torch on two cores). A
        probe still running is left to finish, up to `unreachable_s`, while the next sessions answer."""
        pending: tuple[Any, float] | None = None  # the probe in flight: its channel, when it began
        asked = -float("inf")  # when the probe last ran
        try:
            while not self._stop.wait(self.probe_every_s):
                if pending is not None:
                    pending = self._collect(*pending)
                try:
                    chan = self.t.session(self.probe_timeout_s)
                except Exception:  # noqa: BLE001 — no answer, whatever paramiko raised; the clock decides
                    if self.hearing.silent_for(self.key) > STALLED_S:  # the next try on a new connection
                        self.t.drop()
                    continue
                self.hearing.heard(self.key)
                answered = time.monotonic()
                if pending is not None or answered - asked < self.words_every_s:
                    chan.close()
                    continue
                asked = answered
                try:
                    self.t.execute(chan, self._probe)
                except Exception:  # noqa: BLE001 — the host answered; the next probe asks again
                    continue
                pending = self._collect(chan, time.monotonic(), wait_s=0.5)  # the usual answer; a slow one later
        finally:
            if pending is not None:
                pending[0].close()

    def _collect(self, chan: Any, began: float, wait_s: float = 0.0) -> tuple[Any, float] | None:
        """Read a probe's answer once its shell has exited (waiting up to `wait_s` for it); None when it
        is done with, the probe back when it still runs. One that outlives `unreachable_s` is dropped."""
        deadline = time.monotonic() + wait_s
        try:
            while not finished(chan):
                if time.monotonic() >= deadline:
                    if time.monotonic() - began > self.unreachable_s:
                        chan.close()
                        return None
                    return chan, began
                time.sleep(0.01)
            out = bytearray()
            while chan.recv_ready():
                out += chan.recv(65536)
        except Exception:  # noqa: BLE001 — the connection went with it; the next probe asks again
            chan.close()
            return None
        chan.close()
        for word in out.decode(errors="replace").split():
            if word in ("pid:alive", "pid:gone"):
                self.pid_alive = word == "pid:alive"
            elif word.startswith("beat:") and word[5:].isdigit():
                self.heartbeat_mtime = float(word[5:])
        return None

    def silent_for(self) -> float:
        """Seconds of the controller's running time since the host last answered a liveness probe."""
        return self.hearing.silent_for(self.key)

    def _drain(self) -> None:
        chan = self.chan
        while chan.recv_stderr_ready():
            data = chan.recv_stderr(65536)
            self._log.write(data)
            self._got[1] += len(data)
        while chan.recv_ready():
            data = chan.recv(65536)
            self._out.write(data)
            self._got[0] += len(data)
        self._log.flush()
        self._out.flush()

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self._drain()
        if finished(self.chan) and self.chan.status_event.is_set() and not self._connection_died():
            self._drain()
            status = self.chan.recv_exit_status()
            if status == NO_STATUS:  # never taken for success
                self.returncode, self.why = 255, Reason.LOST
            else:  # as Popen says it: a death by signal n is -n (the wrapper's `wait` said 128 + n)
                self.returncode = -(status - 128) if 128 < status < 128 + 65 else status
            self._close()
            return self.returncode
        # a channel closed without an exit status means the connection died, not the rank: attach
        # again once the host answers; the watcher's answers decide whether the host is still there
        if self.hearing.verdict(self.key):
            self.returncode, self.why, self.unstoppable = 255, Reason.UNREACHABLE, True
            self._close()
        elif self.chan.closed or finished(self.chan):
            self._reattach()
        return self.returncode

    def _reattach(self) -> None:
        """Open a new attach channel from the bytes held here, in a thread (opening one can block for
        as long as the host is unreachable), at most once a second; it replaces the dead one."""
        if (self._reattaching is not None and self._reattaching.is_alive()) or self._stop.is_set() \
                or time.monotonic() - self._reattach_at < self.probe_every_s:
            return
        self._reattach_at = time.monotonic()
        line = attach_line(self.pidfile, *self._got)  # the dead channel has been drained: nothing more comes

        def go() -> None:
            try:
                chan = self.t.start(line, open_timeout=self.probe_timeout_s)
            except Exception:  # noqa: BLE001 — not yet; the next poll tries again, the hearing decides
                return
            if self._stop.is_set():
                chan.close()
                return
            self.chan, self.reattached = chan, self.reattached + 1

        self._reattaching = threading.Thread(target=go, name=f"attach {self.t.name}", daemon=True)
        self._reattaching.start()

    def _connection_died(self) -> bool:
        """The channel ended with the connection, carrying no status: paramiko then reports -1, as it
        does for a rank killed by a signal over a live connection (it ignores exit-signal); only the
        latter is the rank's end. sshd sends EOF before it closes a channel, a dying connection does
        not, and paramiko closes the channels before it marks the transport inactive: so no EOF, or
        an inactive transport, means the connection died."""
        if self.chan.exit_status != -1:
            return False
        tr = self.chan.get_transport()
        return not self.chan.eof_received or tr is None or not tr.is_active()

    def _remote(self, command: str, timeout: float) -> int | None:
        """The status of a short command on the host, or None when none came: run in its own thread,
        joined for a bounded time, since paramiko can block past any timeout it is given (a command's
        start waits without one; a key exchange holds sends for 30 s). The bound covers `run`'s own
        (each phase of a reconnect, the open and the command, `timeout` each) with room to spare."""
        box: list[int] = []

        def go() -> None:
            try:
                box.append(self.t.run(command, timeout=timeout).status)
            except Exception:  # noqa: BLE001 — paramiko raises many kinds
                pass
        th = threading.Thread(target=go, name=f"remote {self.t.name}", daemon=True)
        th.start()
        th.join(timeout * 5 + 1.0)
        return box[0] if box else None

    def send_signal(self, sig: int) -> None:
        """Deliver `sig` by pid. Whether the host can be reached is the watcher's to say, not this
        send's: a send that comes back late must not make a reachable rank unstoppable."""
        if self.returncode is None:
            self._remote(f"kill -{int(sig)} $(cat {self.pidfile})", timeout=2.0)

    def kill(self) -> None:
        if self.returncode is not None:
            return
        self._killed_at = time.monotonic()
        self.send_signal(signal.SIGKILL)
        if self.hearing.verdict(self.key):  # the host is gone: it can be neither stopped nor waited for
            self.returncode, self.why, self.unstoppable = 255, self.why or Reason.UNREACHABLE, True
            self._close()

    def wait(self, timeout: float | None = None) -> int:
        """Until the rank's end is seen, or its host's silence decides it; after `kill`, the kill is
        sent again every 5 s in case one did not land."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
            if self._killed_at is not None and time.monotonic() - self._killed_at > 5.0:
                self.kill()
            time.sleep(0.05)
        return self.returncode

    def stop_watching(self, wait: bool = True) -> None:
        """End the watcher before the connection is closed, so it cannot reopen one (bounded: a probe
        blocked inside paramiko is left to end on its own; the thread is a daemon). `wait=False` only
        asks, so a group's watchers can all be asked before any is waited for."""
        self._stop.set()
        if self._own_hearing:
            self.hearing.close()
        if wait and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=2 * self.probe_timeout_s + 1)

    def _close(self) -> None:
        self._stop.set()
        if self._own_hearing:
            self.hearing.close()
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass
        self._log.close()
        self._out.close()

    @property
    def where(self) -> str:
        return f"{self.t.name} ({self.t.address}), pid in {self.pidfile}"

    def detach(self) -> None:
        """Stop following the rank and leave it running on its host (an operator's Ctrl-C): its output
        and status keep going to its files there, for a later attach."""
        self._close()
        try:
            self.t.close()
        except Exception:  # noqa: BLE001
            pass


def running_ranks(cluster: Cluster, world: int, tag: str) -> list[bool | None]:
    """For each rank 0..world-1 of `cluster`: whether its host still runs the rank `tag` names (True),
    runs none (False), or cannot be asked (None)."""
    found: list[bool | None] = []
    for r, h in enumerate(cluster.by_rank[:world]):
        t = cluster.transport(h)
        try:
            found.append(t.run(running_line(rank_pidfile(h, r), tag), timeout=20).stdout.split() == ["running"])
        except Exception:  # noqa: BLE001 — paramiko and our TransportError: unknown, not "none"
            found.append(None)
        finally:
            t.close()
    return found


def stop_ranks(cluster: Cluster, world: int, tag: str | None, grace_s: float = 10.0) -> list[str]:
    """Stop each rank 0..world-1 of `cluster` that still runs what `tag` names (None: whatever it runs),
    detached on its host: SIGTERM by pid, SIGKILL after `grace_s`. Returns the hosts where one was
    stopped."""
    stopped = []
    for r, h in enumerate(cluster.by_rank[:world]):
        pidfile = rank_pidfile(h, r)
        alive = f"[ \"$({running_line(pidfile, tag)})\" = running ]"
        line = (f"if {alive}; then kill -TERM $(cat {shlex.quote(pidfile)}); "
                f"for i in $(seq {int(grace_s * 10)}); do {alive} || break; sleep 0.1; done; "
                f"{alive} && kill -KILL $(cat {shlex.quote(pidfile)}); echo stopped; fi; true")
        t = cluster.transport(h)
        try:
            if t.run(line, timeout=grace_s + 30).stdout.split() == ["stopped"]:
                stopped.append(h.name)
        finally:
            t.close()
    return stopped


def launch_remote_group(cluster: Cluster, argv_for: Callable[[Host], Sequence[str]], world: int, *,
                        log_dir: Path, env: dict[str, str] | None = None, threads: int | None = None,
                        heartbeats: Sequence[str] = (), stale_s: float = 600.0,
                        unreachable_s: float = UNREACHABLE_S, alone_s: float = ALONE_S,
                        grace_s: float = 10.0, echo: Callable[[str], None] | None = None,
                        guard: Callable[[], str | None] | None = None, tag: str = "",
                        attach: bool = False, lease_s: float = 1800.0) -> GroupResult:
    """One rank per host of `cluster` (ranks 0..world-1) running Python's `argv_for(host)`, its
    environment `env` under `command.process_env`'s policy (`threads`: OMP_NUM_THREADS unless `env`
    sets it), rendezvous at rank 0's private address, detached on its host under `tag`; supervised by
    `run_group`, the hosts' silences judged by one `Hearing`. Each rank holds a lease on its controller
    (`lease_s`, renewed by every probe of its host; `training/lease.py`). `attach=True` starts nothing:
    it follows the ranks already running (`running_ranks`), their logs continued in `log_dir`."""
    hearing = Hearing(unreachable_s=unreachable_s, alone_s=alone_s, say=echo)
    log_dir.mkdir(parents=True, exist_ok=True)
    hosts = cluster.by_rank[:world]
    master = hosts[0].private_address
    port = free_port("0.0.0.0")  # a port number; it is opened on rank 0's host by the rank itself
    procs, logs = [], [log_dir / f"rank-{r}.log" for r in range(world)]
    try:
        for r, h in enumerate(hosts):
            t = cluster.transport(h)
            e = process_env(r, here=False, threads=threads, inherited=env or {},
                            group=Rendezvous(world, master, port, h.interface))
            e |= lease_env(rank_files(rank_pidfile(h, r))["lease"], lease_s)
            if attach:
                logs[r].touch()
                logs[r].with_suffix(".out").touch()
            cmd = "" if attach else host_command(h, argv_for(h))
            beat = f"{h.root}/{heartbeats[r]}" if r < len(heartbeats) else None
            procs.append(RemoteRank(t, cmd, {} if attach else e, logs[r], rank_pidfile(h, r), heartbeat=beat,
                                    hearing=hearing, tag=tag, attach=attach,
                                    words_every_s=min(5.0, lease_s / 4)))  # each probe renews the lease
    except BaseException:
        for p in procs:
            p.kill()
            p.stop_watching()
            p.t.close()
        hearing.close()
        raise
    # heartbeats come from each rank's watcher (its probe reads the mtime too): reading them never
    # blocks supervision, and while the host does not answer the last value stays, so no progress
    beats = [(lambda p=p: p.heartbeat_mtime) for p in procs[:len(heartbeats)]]
    try:
        return run_group(procs, logs, grace_s=grace_s, echo=echo, heartbeats=beats, stale_s=stale_s, guard=guard)
    finally:
        for p in procs:
            p.stop_watching(wait=False)
        for p in procs:  # one connection per rank per attempt: closed with the attempt
            p.stop_watching()
            p.t.close()
        hearing.close()

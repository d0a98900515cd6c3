"""A cluster's SSH hosts as a backend: one rank per host, scoring on rank 0's host, one serving replica
per host of the serving arm's ranks.

The controller's home is the authority: prepare, commit, select, report and preserve happen there.
Hosts get a staged copy and send back, verified, what they wrote:

    controller home                       host r, under its root
    prepared.json, inputs/        stage ▶  site/ (locked wheelhouse, offline), seed/, home/
                                           (through the trial's bucket when it has one: evidence/relay.py)
    commitments.jsonl              push ▶  before a group launches; to the host that scores or serves
    logs/<arm>/attempt-<n>/      ◀ stream  one rank process per host (stderr, stdout)
    runs/<arm>/                  ◀ collect home/runs/<arm>/rank-r; rank 0's model and numerical profile
    evaluations/<role>/<arm>/    ◀ collect `python -m training evaluate` on rank 0's host
    serving/attempt-<n>/         ◀ probe   `python -m training serve`, one per host of the serving arm's
                                           ranks, reached over SSH forwards (`SshReplicas` below)
    commitments.jsonl            ◀ pull    rank 0's log, accepted only as an extension of ours

A log coming back must begin with every byte the controller holds and verify as a chain; anything
else is refused, so a host can add commitments but never rewrite one.
"""


from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evidence.attempts import attempts
from evidence.canonical import file_sha256, read_json
from evidence.commitments import LOG_NAME, CommitmentLog
from orchestrate.cluster import Cluster, Host
from orchestrate.guard import Guard, Polled, host_bytes
from orchestrate.launch.command import (
    Site,
    cluster_env,
    evaluate_argv,
    host_command,
    process_env,
    serve_argv,
    threads_per_rank,
    train_argv,
)
from orchestrate.launch.ssh import launch_remote_group, liveness_probe, running_ranks, stop_ranks
from orchestrate.launch.supervise import GroupResult, supervise
from orchestrate.placement import Devices, hosts_devices
from orchestrate.remote import collect, host_parts, host_python, reports_as_staged, stage_reports
from orchestrate.serving import Endpoint, ProbeError, profile_device
from orchestrate.transport import SSHTransport, Transport, TransportError
from training.config import Arm
from training.evaluate import EvaluationSummary
from training.lease import env as lease_env
from training.runs import latest_common

STAGED = ("prepared.json", "prepare-record.json")
"""The home's files every host gets when it is staged. Not the commitments log: a host's may extend ours
with commitments not yet collected (an arm that finished after its controller stopped), and staging again,
as the next controller does, must not overwrite them. The log goes where a stage starts from it: to a
group's hosts before it is launched (`_push_log`), to the host that scores or serves (`_push_selected`)."""


class SshBackend:
    """Ranks on a cluster's SSH hosts, one per host; scoring on rank 0's host."""

    def __init__(self, cluster: Cluster, home: Path, model_dir: Path, *, wheel_dir: Path,
                 say: Callable[[str], None] = lambda m: None, guard: Guard | None = None):
        self.cluster, self.home, self.model_dir, self.wheel_dir, self.say = cluster, home, model_dir, wheel_dir, say
        self.hosts = cluster.by_rank
        self.ts: list[Transport] = [cluster.transport(h) for h in self.hosts]
        self.env = cluster_env(cluster.source)
        self.shared_cores = cluster.shared_cores  # hosts on this machine's cores split them
        self.ranks_here = False  # each rank's checkpoints are on its host
        self.guard_ts: list[Transport] = []
        self.polled: list[Polled] = []
        self.guard = guard if guard is not None else self._guard()
        self.digest: str | None = None
        self.reports: list[dict[str, Any]] = []  # each host's staging report, in rank order

    def _guard(self) -> Guard:
        c = self.cluster
        # their own connections, with a short connect timeout: a dead host must not stall supervision
        self.guard_ts = [c.transport(self.hosts[r], connect_timeout=3) for r in c.guarded_ranks]
        # read in threads, the supervisor only looks at the latest (guarded ranks need a transfer guard)
        self.polled = [Polled(host_bytes(gt), name=self.hosts[r].name) for r, gt in zip(c.guarded_ranks, self.guard_ts)]
        counters = {self.hosts[r].name: read for r, read in zip(c.guarded_ranks, self.polled)}
        kw = {} if c.guard_fraction is None else {"fraction": c.guard_fraction}  # else the shared default
        return Guard(deadline=c.deadline, counters=counters, limit_bytes=c.transfer_guard_bytes, **kw)

    # -- staging -------------------------------------------------------------------------------
    def _stage(self) -> None:
        if self.digest is not None:
            return
        running = running_ranks(self.cluster, len(self.hosts), None)
        if any(running):  # an earlier controller's ranks run from the staged site: a fresh install removes it
            self.say("ranks an earlier controller started still run on "
                     f"{', '.join(h.name for h, x in zip(self.cluster.by_rank, running) if x)}: the hosts are "
                     "left as staged, their environment read and checked")
            self.digest, self.reports = reports_as_staged(self.cluster, self.ts, say=self.say)
            return
        files = {f"home/{rel}": self.home / rel for rel in STAGED if (self.home / rel).is_file()}
        files |= {f"home/{p.relative_to(self.home)}": p for p in sorted((self.home / "inputs").rglob("*"))
                  if p.is_file()}
        files |= {f"seed/{p.relative_to(self.model_dir)}": p for p in sorted(self.model_dir.rglob("*"))
                  if p.is_file()}
        # with the trial's bucket, each artifact leaves this machine once and the hosts fetch it in region
        self.digest, self.reports = stage_reports(self.cluster, self.ts, wheel_dir=self.wheel_dir, files=files,
                                                  say=self.say, relay=self.cluster.relay)

    def devices(self, device: str) -> Devices:
        """Each host's GPUs as its staging report counted them (staging the hosts if not yet done);
        the serving probe's replicas run on the hosts too, one per host (none on this machine)."""
        self._stage()
        return hosts_devices(self.cluster.source, [r["gpus"] for r in self.reports], None,
                             "each host's environment report (torch.cuda.device_count())")

    def _push_log(self, ranks: range) -> None:
        """Every host of the next stage starts from the controller's log (rank 0 appends to it)."""
        for r in ranks:
            self.ts[r].put(self.home / LOG_NAME, f"{self.hosts[r].root}/home/{LOG_NAME}")

    def _fetch_log(self, incoming: Path, rank: int = 0) -> int:
        """Fetch rank `rank`'s log into `incoming` and check it: it must extend ours byte for byte (or
        be a prefix of ours: nothing new), verify as a chain, and every new entry's file must be in
        `incoming` (or the home) with the committed hash. Returns the number of new entries; the
        caller moves the log in after the files."""
        ours = (self.home / LOG_NAME).read_bytes()
        name = self.hosts[rank].name
        got = incoming / LOG_NAME
        self.ts[rank].get(f"{self.hosts[rank].root}/home/{LOG_NAME}", got)
        theirs = got.read_bytes()
        if ours.startswith(theirs):
            got.unlink()
            return 0
        if not theirs.startswith(ours):
            raise TransportError(f"{name}: its commitments log does not extend the controller's "
                                 "(an entry was changed or removed); nothing was taken")
        new = CommitmentLog(incoming).entries()[ours.count(b"\n"):]  # ours: a verified prefix, one entry a line
        for e in new:
            p = incoming / e["subject"] if (incoming / e["subject"]).is_file() else self.home / e["subject"]
            if not p.is_file() or file_sha256(p) != e["sha256"]:
                raise TransportError(f"{name}: commitment {e['seq']} ({e['kind']}) names {e['subject']}, "
                                     "which did not come back with the committed hash; nothing was taken")
        return len(new)

    def _collect_verified(self, remote_dirs: dict[int, str]) -> tuple[int, int]:
        """Collect into a hidden folder of the home, check rank 0's log against what came, then move
        the files in and the log last: a refused log or a broken connection leaves the home as it was."""
        incoming = Path(tempfile.mkdtemp(dir=self.home, prefix=".incoming-"))
        try:
            got = collect(self.cluster, self.ts, remote_dirs, incoming)
            added = self._fetch_log(incoming)
            for rel in got:
                dst = self.home / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(incoming / rel, dst)
            if added:
                os.replace(incoming / LOG_NAME, self.home / LOG_NAME)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return len(got), added

    def _remote_files(self, r: int, pattern: str) -> list[str]:
        """Files on host r matching a glob under its home (relative paths)."""
        h = self.hosts[r]
        out = self.ts[r].run(f"cd {shlex.quote(h.root)}/home && ls -1d {pattern} 2>/dev/null").stdout
        return [x for x in out.splitlines() if x.strip()]

    def _python(self, r: int, code: str, *args: str, timeout: float = 120) -> str:
        h = self.hosts[r]
        return host_python(self.ts[r], h, code, *args, timeout=timeout).check(f"{h.name}: {code[:40]}…").stdout

    # -- training ------------------------------------------------------------------------------
    def manifests(self, arm: str, world: int) -> list[dict[int, str]]:
        code = ("import json, sys; from pathlib import Path; from training.runs import local_manifests; "
                "print(json.dumps(local_manifests(Path(sys.argv[1]))))")
        return [{int(k): v for k, v in json.loads(self._python(
            r, code, f"{self.hosts[r].root}/home/runs/{arm}/rank-{r}")).items()} for r in range(world)]

    def remote_resumable(self, arm: str, world: int) -> bool:
        return latest_common(self.manifests(arm, world)) is not None

    def train(self, home: Path, arm: Arm, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]:
        w = arm.world_size
        if w > len(self.hosts):
            raise TransportError(f"arm {arm.name} needs {w} hosts, the cluster has {len(self.hosts)}")
        # an earlier controller's group of this arm, still running on the hosts, is followed, not started again
        running = running_ranks(self.cluster, w, arm.name)
        attached = bool(running) and all(running)
        if attached:
            self.say(f"{arm.name} is still running on the hosts (an earlier controller started it); attaching")
        elif any(running):  # part of a group, which cannot finish: stopped before anything is staged or started
            self.say(f"{arm.name}: part of an earlier group still runs "
                     f"({', '.join(f'rank {r}' for r, x in enumerate(running) if x)}); stopping it")
            stop_ranks(self.cluster, w, arm.name)
        self._stage()  # while ranks run from the staged site, it is read, not installed again
        if not attached and all(self._remote_files(r, f"runs/{shlex.quote(arm.name)}/rank-{r}/result.json")
                                for r in range(w)):
            # trained earlier, never collected (the controller stopped, a connection broke): take it
            self.say(f"{arm.name} already finished on the hosts; collecting it")
            self._collect(arm.name, w)
            return []
        can = lambda: self.remote_resumable(arm.name, w)  # noqa: E731 — the hosts hold the checkpoints
        first = False if attached else can()
        if not attached and not first:  # an unfinished earlier attempt stays on its host, set aside (never deleted)
            code = ("import sys; from pathlib import Path; from training.runs import set_aside_unfinished; "
                    "set_aside_unfinished(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))")
            for r in range(w):
                self._python(r, code, f"{self.hosts[r].root}/home", arm.name, str(w))
        if not attached:  # a running group's rank 0 may have appended to the log on its host: keep it
            self._push_log(range(w))
        threads = threads_per_rank(w) if self.shared_cores else None

        beats = [f"home/runs/{arm.name}/rank-{r}/heartbeat.json" for r in range(w)]

        def launch(extra: list[str], log_dir: Path, env: dict[str, str], attach: bool = False) -> GroupResult:
            return launch_remote_group(self.cluster, lambda h: train_argv(Site.on(h), arm.name, threads, extra), w,
                                       log_dir=log_dir, env={**self.env, **env}, threads=threads, echo=echo,
                                       heartbeats=beats, guard=self.guard, tag=arm.name, attach=attach,
                                       lease_s=self.cluster.controller_lease_s)

        attempts = supervise(launch, log_root=home / "logs" / arm.name, max_restarts=max_restarts,
                             resume_first=first, can_resume=can, echo=echo,
                             attach=(lambda d: launch([], d, {}, attach=True)) if attached else None)
        if attempts[-1].ok:
            self._collect(arm.name, w)
        return attempts

    def _collect(self, arm: str, w: int) -> None:
        """Rank 0's arm directory (its rank, the model, the numerical profile) and every other rank's own."""
        n, added = self._collect_verified({0: f"runs/{arm}", **{r: f"runs/{arm}/rank-{r}" for r in range(1, w)}})
        self.say(f"collected {n} files of {arm} from {w} host(s) (checkpoint payloads stay on the hosts), "
                 f"{added} commitment(s) taken")

    # -- scoring -------------------------------------------------------------------------------
    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path, retry: str | None = None) -> EvaluationSummary:
        """`python -m training evaluate` on rank 0's host (where every arm's model already is)."""
        self._stage()
        h, t = self.hosts[0], self.ts[0]
        where = f"evaluations/{role}/{arm}"
        if self._remote_files(0, f"{shlex.quote(where)}/attempt-*/receipt.json"):
            self.say(f"{role} scoring of {arm} already ran on {h.name}; collecting it")
            self._collect_verified({0: where})
            done = [a for a in attempts(home / where) if (a / "receipt.json").is_file()]
            return EvaluationSummary.model_validate(read_json(done[-1] / "summary.json"))
        unfinished = self._remote_files(0, f"{shlex.quote(where)}/attempt-*")  # they stay on the host
        if unfinished and not retry:
            retry = f"attempt(s) {', '.join(Path(u).name for u in unfinished)} on {h.name} did not finish"
        self._push_selected(home, 0, sorted(d.name for d in (home / "runs").iterdir()))
        cmd = host_command(h, evaluate_argv(Site.on(h), arm, role, retry))
        # hosts sharing this machine's cores: scoring runs alone, so it takes them all
        env = process_env(0, here=False, threads=threads_per_rank(1) if self.shared_cores else None)
        r = t.run(cmd, env=env, timeout=6 * 3600)
        if r.status != 0:
            raise TransportError(f"{h.name}: evaluate {arm} exited {r.status}: {r.stderr.strip()[-800:]}")
        self._collect_verified({0: where})
        # a printout that is not JSON raises json's ValueError, as it did; one that is no summary pydantic's (one too)
        return EvaluationSummary.model_validate(json.loads(r.stdout))

    def host_parts(self, url: str) -> dict[str, dict[str, dict[str, Any]]]:
        """Each host preserves the checkpoint payloads that stayed on it (`remote.host_parts`)."""
        return host_parts(self.cluster, self.ts, url, say=self.say)

    def _push_selected(self, home: Path, r: int, arms: list[str]) -> None:
        """What a command on host r that reads the committed selection needs: the selection, the
        candidates, the controller's log and each of `arms`' models that the host lacks (trained
        on another host's rank 0); every file read back and checked by `put`."""
        h, t = self.hosts[r], self.ts[r]
        send = [home / rel for rel in ("candidates.json", "selection.json", LOG_NAME) if (home / rel).is_file()]
        for name in arms:
            model = home / "runs" / name / "model"
            if model.is_dir() and t.run(f"test -f {h.root}/home/runs/{shlex.quote(name)}/model/receipt.json").status:
                send += [p for p in sorted(model.rglob("*")) if p.is_file()]
        t.put_all([(p, f"{h.root}/home/{p.relative_to(home)}") for p in send])

    # -- serving -------------------------------------------------------------------------------
    def replicas(self, home: Path, arm: str, n: int) -> SshReplicas:
        """The serving probe's `n` replicas, one per host of ranks 0..n-1 (where the arm's ranks
        ran), each serving its own host's copy of the selected model; refused, naming the counts,
        when the cluster has fewer hosts."""
        if n > len(self.hosts):
            raise ProbeError(f"the serving probe needs {n} replicas of {arm}, one per host, and the cluster has "
                             f"{len(self.hosts)} host(s) ({', '.join(h.name for h in self.hosts)})")
        self._stage()
        threads = threads_per_rank(n) if self.shared_cores else None
        return SshReplicas(self.cluster, self.hosts[:n], home, home / "logs" / "serving", arm=arm,
                              threads=threads, env=dict(self.env), lease_s=self.cluster.controller_lease_s,
                              prepare_host=lambda r: self._push_selected(home, r, [arm]))

    def replicas_where(self, n: int) -> str:
        return f"on the hosts ({', '.join(h.name for h in self.hosts[:n])}, where its ranks ran), reached over SSH forwards"

    def close(self) -> None:
        for p in self.polled:
            p.close()
        for t in [*self.ts, *self.guard_ts]:
            t.close()


def _quiet_refused_forwards(record: logging.LogRecord) -> bool:
    """paramiko logs every refused `direct-tcpip` open as an error; a forward to a stopped replica is
    refused by design (the probe records it as a failed connection), so those lines are dropped."""
    return "open FAILED" not in record.getMessage()


class Forward:
    """A loopback listening socket here whose every connection is carried to `dest` on the host over
    a `direct-tcpip` channel of the host's SSH connection: one small thread per endpoint, moving
    bytes both ways with select. A connection the host cannot open (the replica is gone) is closed
    at once, so the client sees a failed connection — what the probe retries on the next endpoint."""

    def __init__(self, t: SSHTransport, dest: tuple[str, int], name: str):
        self.t, self.dest, self.name = t, dest, name
        log = logging.getLogger("paramiko.transport")
        if _quiet_refused_forwards not in log.filters:
            log.addFilter(_quiet_refused_forwards)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self._pairs: dict[Any, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"forward {name}", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        conn, addr = self.sock.accept()
        try:
            chan = self.t.forward(self.dest, addr, timeout=5.0)
        except Exception:  # noqa: BLE001 — nothing listens there (stopped), or the connection broke
            conn.close()
            return
        self._pairs[conn], self._pairs[chan] = chan, conn

    def _drop(self, end: Any) -> None:
        other = self._pairs.pop(end, None)
        self._pairs.pop(other, None)
        for x in (end, other):
            try:
                if x is not None:
                    x.close()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.sock, *self._pairs], [], [], 0.2)
            except (OSError, ValueError):  # an end closed under us: drop the closed ones
                for end in [e for e in self._pairs if getattr(e, "closed", False) or e.fileno() < 0]:
                    self._drop(end)
                continue
            for end in ready:
                if end is self.sock:
                    self._open()
                    continue
                if end not in self._pairs:
                    continue
                try:
                    data = end.recv(65536)
                except Exception:  # noqa: BLE001 — a reset, on either side
                    data = b""
                if not data:
                    self._drop(end)
                    continue
                try:
                    self._pairs[end].sendall(data)
                except Exception:  # noqa: BLE001
                    self._drop(end)

    def close(self) -> None:
        """Stop accepting, close every carried connection, end the thread."""
        self._stop.set()
        self._thread.join(timeout=5)
        for end in list(self._pairs):
            self._drop(end)
        self.sock.close()


class SshHostParts:
    """The one thing preservation asks of the hosts outside a run (`orchestrate preserve --cluster`):
    each host preserves the checkpoint payloads that stayed on it (`remote.host_parts`)."""

    def __init__(self, cluster: Cluster, say: Callable[[str], None] = lambda m: None):
        self.cluster, self.say = cluster, say
        self.ts = [cluster.transport(h) for h in cluster.by_rank]

    def host_parts(self, url: str) -> dict[str, dict[str, dict[str, Any]]]:
        return host_parts(self.cluster, self.ts, url, say=self.say)

    def close(self) -> None:
        for t in self.ts:
            t.close()


@dataclass
class SshReplica:
    """One replica on a host: where its files are there, its pid once started, its forward here."""

    name: str
    host: Host
    t: SSHTransport
    tag: str  # this probe's: no file of an earlier probe (a stale pid above all) is ever taken for its own
    started: bool = False  # its start command was sent: from then on, it is stopped on exit
    pid: int | None = None
    port: int | None = None
    forward: Forward | None = None

    @property
    def dir(self) -> str:
        return f"{self.host.root}/serving"

    @property
    def pidfile(self) -> str:
        return f"{self.dir}/{self.name}-{self.tag}.pid"

    @property
    def ready(self) -> str:
        return f"{self.dir}/{self.name}-{self.tag}.ready.json"

    @property
    def log(self) -> str:
        return f"{self.dir}/{self.name}-{self.tag}.log"

    @property
    def lease(self) -> str:
        return f"{self.dir}/{self.name}-{self.tag}.lease"


@dataclass
class SshReplicas:
    """One `python -m training serve` per host of `hosts` (the serving arm's ranks' hosts), started
    over SSH from the host's own staged home (`prepare_host(i)` puts the selection, the log and the
    model there first), bound to the host's private address, reached here through a port forward;
    stopped by pid over SSH. Same interface as `LocalReplicas`."""

    cluster: Cluster
    hosts: list[Host]
    home: Path
    log_dir: Path
    arm: str | None = None
    threads: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    prepare_host: Callable[[int], None] | None = None
    start_timeout_s: float = 900.0
    gone_timeout_s: float = 30.0
    lease_s: float = 1800.0  # a replica whose lease this long goes unrenewed stops (training/serve.py `leased`)
    renew_every_s: float = 5.0
    replicas: list[SshReplica] = field(default_factory=list)
    endpoints: list[Endpoint] = field(default_factory=list)
    _renewing: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "SshReplicas":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tag = secrets.token_hex(4)
        threading.Thread(target=self._renew, name="replica leases", daemon=True).start()
        try:
            for k, h in enumerate(self.hosts):  # every replica is known (and will be stopped) before it starts
                self.replicas.append(SshReplica(f"replica-{k}.{h.name}", h, self.cluster.transport(h), tag))
            for k, rep in enumerate(self.replicas):
                if self.prepare_host is not None:
                    self.prepare_host(k)
                self._start(rep)
            for rep in self.replicas:
                self._wait_ready(rep)
                rep.forward = Forward(rep.t, (rep.host.private_address, rep.port), rep.name)
                self.endpoints.append(Endpoint(rep.name, f"http://127.0.0.1:{rep.forward.port}"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _renew(self) -> None:
        """Touch every started replica's lease file every `renew_every_s`, until the replicas are stopped:
        this controller is still there. A host that does not answer is skipped; its replica's lease
        runs on."""
        while not self._renewing.wait(min(self.renew_every_s, self.lease_s / 4)):  # a short lease: more often
            for rep in list(self.replicas):
                if rep.started:
                    try:
                        rep.t.run(f"touch {shlex.quote(rep.lease)}", timeout=10)
                    except Exception:  # noqa: BLE001 — not this time
                        pass

    def where(self) -> dict[str, dict[str, Any]]:
        """One replica per host, on the host's first device (LOCAL_RANK=0): no two share one."""
        device = "cuda:0" if profile_device(self.home) == "cuda" else "cpu"
        return {r.name: {"host": r.host.name, "device": device} for r in self.replicas}

    def describe(self) -> str:
        """Where each replica listens on its host, and the forward here that reaches it."""
        return ", ".join(f"{r.name} on {r.host.private_address}:{r.port} (pid {r.pid}) via {e.url}"
                         for r, e in zip(self.replicas, self.endpoints))

    def _start(self, rep: "SshReplica") -> None:
        h = rep.host
        argv = serve_argv(Site.on(h), rep.name, h.private_address, rep.ready, threads=self.threads, arm=self.arm)
        # the shell writes its pid, then execs Python in its place: the pid is the replica's; setsid
        # keeps it out of the SSH session, so it lives exactly as long as its pid is not signalled
        inner = f"echo $$ > {shlex.quote(rep.pidfile)}; " + host_command(h, argv)
        q = shlex.quote
        cmd = (f"mkdir -p {q(rep.dir)} && rm -f {q(rep.pidfile)} {q(rep.ready)} && : > {q(rep.log)} && "
               f"touch {q(rep.lease)} && "
               f"(setsid bash -c {q(inner)} > {q(rep.log)} 2>&1 < /dev/null &) && "
               f"for i in $(seq 200); do test -s {q(rep.pidfile)} && break; sleep 0.05; done; cat {q(rep.pidfile)}")
        env = process_env(0, here=False, threads=self.threads, inherited=self.env)  # the host's own first device
        env |= lease_env(rep.lease, self.lease_s)
        rep.started = True
        r = rep.t.run(cmd, env=env, timeout=60)
        out = r.stdout.strip()
        if r.status != 0 or not out.isdigit():
            raise ProbeError(f"{rep.name}: could not start on {h.name} (exit {r.status}): "
                             f"{(r.stderr or r.stdout).strip()[-500:]}")
        rep.pid = int(out)

    def _tail(self, rep: "SshReplica", lines: int = 12) -> str:
        try:
            return rep.t.run(f"tail -n {lines} {shlex.quote(rep.log)}", timeout=20).stdout.rstrip()
        except Exception as e:  # noqa: BLE001 — the host is gone: say so instead of the log
            return f"(its log could not be read: {e})"

    def _alive(self, rep: "SshReplica") -> bool | None:
        """Whether the replica's pid still runs on its host (a zombie has exited); None: no answer."""
        try:
            out = rep.t.run(liveness_probe(rep.pidfile), timeout=20).stdout.split()
        except Exception:  # noqa: BLE001
            return None
        return True if "pid:alive" in out else False if "pid:gone" in out else None

    def _wait_ready(self, rep: "SshReplica") -> None:
        q = shlex.quote
        probe_line = f"if test -s {q(rep.ready)}; then echo ready; else {liveness_probe(rep.pidfile)}; fi"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            out = rep.t.run(probe_line, timeout=30).stdout.split()
            if "ready" in out:
                local = self.log_dir / f"{rep.name}.ready.json"
                rep.t.get(rep.ready, local)  # read back, verified by sha256, then read as JSON
                info = read_json(local)
                if info.get("pid") != rep.pid or info.get("host") != rep.host.private_address:
                    raise ProbeError(f"{rep.name} on {rep.host.name}: its ready file names pid {info.get('pid')} "
                                     f"on {info.get('host')}, not the replica started (pid {rep.pid} on "
                                     f"{rep.host.private_address})")
                rep.port = int(info["port"])
                return
            if "pid:gone" in out:
                raise ProbeError(f"{rep.name} exited on {rep.host.name} before listening (log {rep.host.name}:"
                                 f"{rep.log}):\n{self._tail(rep)}")
            time.sleep(0.25)
        raise ProbeError(f"{rep.name} did not listen on {rep.host.name} within {self.start_timeout_s:.0f} s "
                         f"(log {rep.host.name}:{rep.log}):\n{self._tail(rep)}")

    def _signal(self, rep: "SshReplica", sig: int) -> None:
        if rep.pid is not None:  # that pid only, never by name; a pid already gone is no error
            rep.t.run(f"kill -{int(sig)} {rep.pid} 2>/dev/null; true", timeout=20)

    def _until_gone(self, rep: "SshReplica", timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._alive(rep) is False:
                return True
            time.sleep(0.1)
        return False

    def kill(self, k: int) -> dict[str, Any]:
        """Stop replica k the hard way (SIGKILL by its pid, as a crashed host would) and confirm on
        its host that the pid is gone before the failure phase starts."""
        rep = self.replicas[k]
        at = time.time()
        self._signal(rep, signal.SIGKILL)
        if not self._until_gone(rep, self.gone_timeout_s):
            raise ProbeError(f"{rep.name} on {rep.host.name}: pid {rep.pid} still runs "
                             f"{self.gone_timeout_s:.0f} s after SIGKILL")
        return {"replica": rep.name, "host": rep.host.name, "pid": rep.pid, "signal": "SIGKILL", "at": at,
                "confirmed_gone_seconds": time.time() - at}

    def __exit__(self, *exc: Any) -> None:
        """Every replica stopped by pid (SIGTERM, then SIGKILL), confirmed gone, its log fetched;
        every forward and connection closed — whatever ended the probe."""
        self._renewing.set()
        for rep in self.replicas:
            if rep.forward is not None:
                rep.forward.close()
        for rep in self.replicas:
            try:
                if not rep.started:
                    continue
                if rep.pid is None:  # started, its pid not yet read back (interrupted): the file says it
                    f = shlex.quote(rep.pidfile)  # (written at once by the replica's shell; allow it a moment)
                    out = rep.t.run(f"for i in $(seq 40); do test -s {f} && break; sleep 0.05; done; "
                                    f"cat {f} 2>/dev/null; true", timeout=20).stdout.strip()
                    rep.pid = int(out) if out.isdigit() else None
                self._signal(rep, signal.SIGTERM)
            except Exception:  # noqa: BLE001 — tried again below, with SIGKILL
                pass
        for rep in self.replicas:
            try:
                if rep.pid is not None and not self._until_gone(rep, 10.0):
                    self._signal(rep, signal.SIGKILL)
                    self._until_gone(rep, self.gone_timeout_s)
                rep.t.get(rep.log, self.log_dir / f"{rep.name}.log")
            except Exception:  # noqa: BLE001 — keep stopping the others
                pass
            finally:
                rep.t.close()

"""The serving probe: warm every replica, then the fixed development workload in three phases — one
replica, N replicas, N advertised endpoints with one actually stopped — with bounded retries.

A request's first attempt goes to endpoint (i mod N); a connection failure, a timeout or a 5xx moves
it to the next endpoint, at most MAX_ATTEMPTS attempts in all, with a short doubling pause between
them. A 4xx is the client's fault and is not retried. Every attempt is recorded. Nothing here can
hang: every attempt has a timeout, so with all endpoints down the probe ends with a failure record for
every request.

The replicas on the embedded local cluster are `python -m training serve` processes on loopback,
started and stopped by pid (`LocalReplicas`). On an SSH cluster they run where the model lives
(`RemoteReplicas`): one per host of the serving arm's ranks, each from that host's own copy of the
selected model (verified there by `training serve` before it listens), bound to the host's private
address only. The controller reaches each through an SSH port forward (a `direct-tcpip` channel on
its paramiko connection, fed from a loopback socket here): the hosts' firewall opens every port to
member hosts but only SSH to the operator, and a replica's port is no business of anyone else — so
no new firewall rule, no public listener, and traffic to the replica is as private and as
authenticated as the SSH session. A replica is stopped by its pid over SSH and confirmed gone
(a zombie counts as gone) before the failure phase; on exit every replica is stopped the same way,
whatever ended the probe. The same `probe()` runs either way: the evidence does not depend on where
the replicas ran.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol

import httpx

from evidence.attempts import next_attempt
from evidence.canonical import read_json, write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.receipts import make_receipt
from evidence.serving import (CONCURRENCY, MAX_ATTEMPTS, PHASES, comparisons, phase_figures, requests_of,
                              warmup_workload, workload)
from orchestrate.launch.command import Site, host_command, local_argv, process_env, serve_argv, device_share
from orchestrate.launch.ssh import liveness_probe
from training.errors import TrainError
from training.lease import env as lease_env

if TYPE_CHECKING:
    from orchestrate.cluster import Cluster, Host
    from orchestrate.transport import SSHTransport


class ProbeError(TrainError):
    """The probe could not be set up (a replica would not start, no development tasks), or a second
    probe was asked for without a reason."""


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str


@dataclass
class Timeouts:
    connect_s: float = 3.0
    answer_s: float = 300.0  # one greedy answer, queued behind at most CONCURRENCY-1 others
    backoff_s: float = 0.05


async def _one(client: httpx.AsyncClient, i: int, req: dict[str, str], endpoints: list[Endpoint],
               max_attempts: int, t: Timeouts, t0: float) -> dict[str, Any]:
    rec: dict[str, Any] = {"index": i, **req, "attempts": [], "outcome": "failed"}
    start = time.perf_counter()
    for a in range(max_attempts):
        ep = endpoints[(i + a) % len(endpoints)]
        at = time.perf_counter()
        att: dict[str, Any] = {"endpoint": ep.name, "started_seconds": at - t0}
        try:
            r = await client.post(f"{ep.url}/v1/answer", json=req)
            att["status"] = r.status_code
            if r.status_code == 200:
                try:
                    rec["response"] = r.json()
                except ValueError:  # a 200 that is not an answer: a failed attempt like any other
                    att["status"], att["error"] = None, f"200 with a body that is not JSON: {r.text[:200]!r}"
                    rec.pop("response", None)
            elif r.status_code < 500:
                att["error"] = r.text[:300]
        except httpx.HTTPError as e:
            att["status"] = None
            att["error"] = f"{type(e).__name__}: {e}"[:300]
        att["seconds"] = time.perf_counter() - at
        rec["attempts"].append(att)
        if att["status"] == 200:
            rec["outcome"] = "ok"
            rec["latency_seconds"] = time.perf_counter() - start
            break
        if att["status"] is not None and 400 <= att["status"] < 500 and att["status"] not in (408, 429):
            break  # the request itself is wrong: another endpoint would refuse it too
        if a + 1 < max_attempts:
            await asyncio.sleep(t.backoff_s * 2 ** a)
    return rec


async def _phase(requests: list[dict[str, str]], endpoints: list[Endpoint], concurrency: int,
                 max_attempts: int, t: Timeouts) -> tuple[list[dict[str, Any]], float]:
    """`concurrency` workers take the requests in order; records come back in request order."""
    queue: asyncio.Queue = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    out: list[dict[str, Any] | None] = [None] * len(requests)
    timeout = httpx.Timeout(t.answer_s, connect=t.connect_s)
    limits = httpx.Limits(max_connections=concurrency * max(1, len(endpoints)))
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        async def worker() -> None:
            while not queue.empty():
                i, r = queue.get_nowait()
                out[i] = await _one(client, i, r, endpoints, max_attempts, t, t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in out if r is not None], time.perf_counter() - t0


def run_phase(requests: list[dict[str, str]], endpoints: list[Endpoint], *, concurrency: int = CONCURRENCY,
              max_attempts: int = MAX_ATTEMPTS, timeouts: Timeouts | None = None) -> dict[str, Any]:
    records, wall = asyncio.run(_phase(requests, endpoints, concurrency, max_attempts, timeouts or Timeouts()))
    return {"endpoints": [e.__dict__ for e in endpoints], "concurrency": concurrency,
            "max_attempts": max_attempts, "wall_seconds": wall, "requests": records,
            "figures": phase_figures(records, wall)}


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


class Replicas(Protocol):
    """What the probe needs of a set of replicas, wherever they run: their endpoints, a way to stop
    one for real, and a context that stops them all on exit."""

    endpoints: list[Endpoint]

    def kill(self, k: int) -> dict[str, Any]: ...
    def __enter__(self) -> "Replicas": ...
    def __exit__(self, *exc: Any) -> None: ...


def _quiet_refused_forwards(record: logging.LogRecord) -> bool:
    """paramiko logs every refused `direct-tcpip` open as an error; a forward to a stopped replica is
    refused by design (the probe records it as a failed connection), so those lines are dropped."""
    return "open FAILED" not in record.getMessage()


class Forward:
    """A loopback listening socket here whose every connection is carried to `dest` on the host over
    a `direct-tcpip` channel of the host's SSH connection: one small thread per endpoint, moving
    bytes both ways with select. A connection the host cannot open (the replica is gone) is closed
    at once, so the client sees a failed connection — what the probe retries on the next endpoint."""

    def __init__(self, t: "SSHTransport", dest: tuple[str, int], name: str):
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


@dataclass
class RemoteReplica:
    """One replica on a host: where its files are there, its pid once started, its forward here."""

    name: str
    host: "Host"
    t: "SSHTransport"
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
class RemoteReplicas:
    """One `python -m training serve` per host of `hosts` (the serving arm's ranks' hosts), started
    over SSH from the host's own staged home (`prepare_host(i)` puts the selection, the log and the
    model there first), bound to the host's private address, reached here through a port forward;
    stopped by pid over SSH. Same interface as `LocalReplicas`."""

    cluster: "Cluster"
    hosts: list["Host"]
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
    replicas: list[RemoteReplica] = field(default_factory=list)
    endpoints: list[Endpoint] = field(default_factory=list)
    _renewing: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "RemoteReplicas":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tag = secrets.token_hex(4)
        threading.Thread(target=self._renew, name="replica leases", daemon=True).start()
        try:
            for k, h in enumerate(self.hosts):  # every replica is known (and will be stopped) before it starts
                self.replicas.append(RemoteReplica(f"replica-{k}.{h.name}", h, self.cluster.transport(h), tag))
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

    def describe(self) -> str:
        """Where each replica listens on its host, and the forward here that reaches it."""
        return ", ".join(f"{r.name} on {r.host.private_address}:{r.port} (pid {r.pid}) via {e.url}"
                         for r, e in zip(self.replicas, self.endpoints))

    def _start(self, rep: "RemoteReplica") -> None:
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

    def _tail(self, rep: "RemoteReplica", lines: int = 12) -> str:
        try:
            return rep.t.run(f"tail -n {lines} {shlex.quote(rep.log)}", timeout=20).stdout.rstrip()
        except Exception as e:  # noqa: BLE001 — the host is gone: say so instead of the log
            return f"(its log could not be read: {e})"

    def _alive(self, rep: "RemoteReplica") -> bool | None:
        """Whether the replica's pid still runs on its host (a zombie has exited); None: no answer."""
        try:
            out = rep.t.run(liveness_probe(rep.pidfile), timeout=20).stdout.split()
        except Exception:  # noqa: BLE001
            return None
        return True if "pid:alive" in out else False if "pid:gone" in out else None

    def _wait_ready(self, rep: "RemoteReplica") -> None:
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

    def _signal(self, rep: "RemoteReplica", sig: int) -> None:
        if rep.pid is not None:  # that pid only, never by name; a pid already gone is no error
            rep.t.run(f"kill -{int(sig)} {rep.pid} 2>/dev/null; true", timeout=20)

    def _until_gone(self, rep: "RemoteReplica", timeout: float) -> bool:
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


def check_retry(home: Path, retry: str | None) -> None:
    """The report uses the first committed probe; another one is allowed only with a recorded reason."""
    if CommitmentLog(home).latest("serving") is not None and not retry:
        raise ProbeError(f"{home} already has a committed serving probe (the one the report uses); "
                         "pass --retry REASON to run another, recorded beside it")


def probe(home: Path, endpoints: list[Endpoint], stop: Callable[[int], dict[str, Any]], *, arm: str,
          retry: str | None = None, timeouts: Timeouts | None = None,
          say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Warmups, the three phases and the commitment; `stop(k)` stops endpoint k for the last phase.
    Every attempt lives in serving/attempt-<n>/ (earlier attempts are kept)."""
    from training.prepare import load_cases, require_prepared

    check_retry(home, retry)
    if len(endpoints) < 2:
        raise ProbeError(f"the probe needs at least 2 replicas (got {len(endpoints)}): its last phase stops one")
    requests = requests_of(require_prepared(home))  # the committed profile's workload
    dev = sorted(cid for cid, c in load_cases(home).items() if c["split"] == "dev")
    if not dev:
        raise ProbeError(f"{home} has no development tasks")
    root = home / "serving"
    n = next_attempt(root)
    out = root / f"attempt-{n}"
    out.mkdir(parents=True)
    write_json_atomic(out / "started.json", {"attempt": n, "at": time.time(), "arm": arm, "retry_reason": retry})
    names = [e.name for e in endpoints]
    warm = [r for e in endpoints for r in run_phase(warmup_workload(dev, e.name), [e], concurrency=1,
                                                       timeouts=timeouts)["requests"]]
    write_json_atomic(out / "warmup.json", {"requests": warm})
    say(f"warmup: {sum(r['outcome'] == 'ok' for r in warm)}/{len(warm)} answered on {len(endpoints)} replicas")
    stopped = None
    phases = {}
    for phase in PHASES:
        if phase == "failure":
            stopped = stop(len(endpoints) - 1)
            say(f"stopped {stopped['replica']} (pid {stopped.get('pid')}, {stopped.get('signal')})")
        eps = endpoints[:1] if phase == "single" else endpoints
        data = {"phase": phase, "stopped": stopped if phase == "failure" else None,
                **run_phase(workload(dev, phase, requests), eps, timeouts=timeouts)}
        write_json_atomic(out / f"{phase}.json", data)
        phases[phase] = data
        f = data["figures"]
        say(f"{phase}: {f['completed']}/{f['requests']} answered, {f['retries']} retries, "
            f"{f['throughput_rps']:.2f} req/s, p50 {f['latency_seconds']['p50'] or float('nan'):.3f} s")
    write_json_atomic(out / "plan.json", {
        "arm": arm, "replicas": names, "requests": requests, "concurrency": CONCURRENCY,
        "max_attempts": MAX_ATTEMPTS, "stopped": stopped, "retry_reason": retry,
        "routing": "attempt a of request i goes to endpoint (i + a) mod N; 5xx, timeouts and "
                   "connection errors are retried, other 4xx are not"})
    receipt = make_receipt(out, meta={"kind": "serving", "attempt": n, "arm": arm}, exclude=["started.json"])
    write_json_atomic(out / "receipt.json", receipt)
    CommitmentLog(home).append("serving", str((out / "receipt.json").relative_to(home)),
                               {"attempt": n, "arm": arm, "receipt_digest": receipt["digest"],
                                "retry_reason": retry})
    return {"attempt": str(out.relative_to(home)), **comparisons(phases, warm)}


def replicas_probe(home: Path, arm: str, replicas: int, make: Callable[[], ContextManager[Replicas]], *,
                   retry: str | None = None, timeouts: Timeouts | None = None,
                   say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The probe against the `replicas` replicas `make()` starts (wherever they run); they are
    stopped when it ends, however it ends."""
    check_retry(home, retry)  # before minutes of model loading
    if replicas < 2:
        raise ProbeError(f"the probe needs at least 2 replicas (got {replicas}): its last phase stops one")
    with make() as reps:
        where = getattr(reps, "describe", None)
        say(f"{replicas} replicas listening: " + (where() if where else ", ".join(e.url for e in reps.endpoints)))
        return probe(home, reps.endpoints, reps.kill, arm=arm, retry=retry, timeouts=timeouts, say=say)


def local_probe(home: Path, arm: str, replicas: int, *, threads: int = 1, seed_dir: Path | None = None,
                retry: str | None = None, timeouts: Timeouts | None = None,
                say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The probe against `replicas` replica processes on this machine, sharing its GPUs where the
    home's committed placement says so (`--share-gpus`)."""
    from orchestrate.placement import committed_share

    return replicas_probe(home, arm, replicas, lambda: LocalReplicas(
        home, replicas, home / "logs" / "serving", threads=threads, seed_dir=seed_dir, arm=arm,
        share_gpus=committed_share(home)), retry=retry, timeouts=timeouts, say=say)

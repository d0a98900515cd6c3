"""The serving probe: warm every replica, then the fixed development workload in three phases — one
replica, N replicas, N advertised endpoints with one actually stopped — with bounded retries.

A request's first attempt goes to endpoint (i mod N); a connection failure, a timeout or a 5xx moves
it to the next endpoint, at most MAX_ATTEMPTS attempts in all, with a short doubling pause between
them. A 4xx is the client's fault and is not retried. Every attempt is recorded. Nothing here can
hang: every attempt has a timeout, so with all endpoints down the probe ends with a failure record for
every request.

Where the replicas run is the backend's business (orchestrate/backends/): on the embedded local
cluster `python -m training serve` processes on loopback, started and stopped by pid
(`backends/local.py`); on an SSH cluster where the model lives (`backends/ssh.py`): one per host of the serving arm's ranks, each from that host's own copy of the
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol

from evidence.attempts import next_attempt
from evidence.canonical import write_json_atomic
from evidence.commitments import CommitmentLog
from evidence.receipts import make_receipt
from evidence.serving import (
    CONCURRENCY,
    MAX_ATTEMPTS,
    PHASES,
    comparisons,
    devices_of,
    level_figures,
    levels_of,
    phase_figures,
    requests_of,
    run_name,
    sharing,
    warmup_workload,
    workload,
)
from training.errors import TrainError
from training.prepare import load_cases, require_prepared

if TYPE_CHECKING:
    import httpx


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
    answer_s: float = 300.0  # one greedy answer, queued behind at most (level - 1) others
    backoff_s: float = 0.05


async def _one(client: httpx.AsyncClient, i: int, req: dict[str, str], endpoints: list[Endpoint],
               max_attempts: int, t: Timeouts, t0: float) -> dict[str, Any]:
    import httpx  # start-up: ~50 ms that only a probe needs (see `_phase`)

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
            else:  # a refusal (4xx) or the replica's failure (5xx: why, e.g. the engine's error), kept as said
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
    # start-up: httpx takes ~50 ms to import, and every `orchestrate` command imports this module
    import httpx

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
              max_attempts: int = MAX_ATTEMPTS, timeouts: Timeouts | None = None,
              devices: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of `requests` at `concurrency` in flight; its figures are a sweep's (`level_figures`)
    where `devices` (replica → where it ran) is given, else those of a probe before the sweep."""
    records, wall = asyncio.run(_phase(requests, endpoints, concurrency, max_attempts, timeouts or Timeouts()))
    return {"endpoints": [e.__dict__ for e in endpoints], "concurrency": concurrency,
            "max_attempts": max_attempts, "wall_seconds": wall, "requests": records,
            "figures": phase_figures(records, wall) if devices is None else level_figures(records, wall, devices)}


def warm_all(dev: list[str], endpoints: list[Endpoint], timeouts: Timeouts | None = None) -> list[dict[str, Any]]:
    """Every replica's warmup at the same time, each its own four requests at once (a replica's engine
    batches them): the probe waits for the slowest replica once, not for the sum of them. Records in
    replica order."""
    async def each() -> list[tuple[list[dict[str, Any]], float]]:
        return await asyncio.gather(*(_phase(w, [e], len(w), MAX_ATTEMPTS, timeouts or Timeouts())
                                      for e in endpoints for w in [warmup_workload(dev, e.name)]))
    return [r for records, _ in asyncio.run(each()) for r in records]


def engines(endpoints: list[Endpoint], timeouts: Timeouts | None = None) -> dict[str, dict[str, Any] | None]:
    """What each replica's GET /health says of its engine (slots, device, weights bytes, bandwidth),
    None for a replica that reports none (one from before the batching engine) or did not answer."""
    import httpx  # see `_phase`

    t = timeouts or Timeouts()
    out: dict[str, dict[str, Any] | None] = {}
    for e in endpoints:
        try:
            r = httpx.get(f"{e.url}/health", timeout=httpx.Timeout(30.0, connect=t.connect_s), trust_env=False)
            body = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            body = {}
        eng = body.get("engine") if isinstance(body, dict) else None
        out[e.name] = eng if isinstance(eng, dict) else None
    return out


def placement_of(endpoints: list[Endpoint], where: dict[str, dict[str, Any]],
                 engine: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """plan.json's `placement`: per replica, the host and device the backend put it on (`where`),
    the replicas it shares that device with, and its engine as its health said (None: none said)."""
    rows = [{"replica": e.name, "host": (where.get(e.name) or {}).get("host"),
             "device": (where.get(e.name) or {}).get("device"), "engine": engine.get(e.name)} for e in endpoints]
    shares = sharing(rows)
    return [{**r, "shares_device_with": shares[r["replica"]]} for r in rows]


class Replicas(Protocol):
    """What the probe needs of a set of replicas, wherever they run: their endpoints, a way to stop
    one for real, and a context that stops them all on exit. A backend that knows where its replicas
    run says so with `where()` (replica name → {"host", "device"}), and what a person reads of them
    with `describe()`; both optional."""

    endpoints: list[Endpoint]

    def kill(self, k: int) -> dict[str, Any]: ...
    def __enter__(self) -> "Replicas": ...
    def __exit__(self, *exc: Any) -> None: ...


def profile_device(home: Path) -> str:
    """The committed profile's device kind ("cpu" or "cuda"), which every replica of the home runs on."""
    return require_prepared(home)["experiment"]["profile"].get("device", "cpu")


def check_retry(home: Path, retry: str | None) -> None:
    """The report uses the first committed probe; another one is allowed only with a recorded reason."""
    if CommitmentLog(home).latest("serving") is not None and not retry:
        raise ProbeError(f"{home} already has a committed serving probe (the one the report uses); "
                         "pass --retry REASON to run another, recorded beside it")


def probe(home: Path, endpoints: list[Endpoint], stop: Callable[[int], dict[str, Any]], *, arm: str,
          retry: str | None = None, timeouts: Timeouts | None = None,
          say: Callable[[str], None] = lambda m: None, where: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Each replica's health, the warmups (all at once), then the three phases, each at every
    concurrency level of the committed profile in ascending order, and the commitment; `stop(k)`
    stops endpoint k once, before the failure phase's first level. `where`: replica → its host and
    device, as the backend placed it. Every attempt lives in serving/attempt-<n>/ (earlier attempts
    are kept)."""
    check_retry(home, retry)
    if len(endpoints) < 2:
        raise ProbeError(f"the probe needs at least 2 replicas (got {len(endpoints)}): its last phase stops one")
    prepared = require_prepared(home)
    requests, levels = requests_of(prepared), levels_of(prepared)  # the committed profile's workload
    dev = sorted(cid for cid, c in load_cases(home).items() if c["split"] == "dev")
    if not dev:
        raise ProbeError(f"{home} has no development tasks")
    root = home / "serving"
    n = next_attempt(root)
    out = root / f"attempt-{n}"
    out.mkdir(parents=True)
    write_json_atomic(out / "started.json", {"attempt": n, "at": time.time(), "arm": arm, "retry_reason": retry})
    names = [e.name for e in endpoints]
    placement = placement_of(endpoints, where or {}, engines(endpoints, timeouts))
    devices = devices_of(placement)
    for p in placement:
        e = p["engine"]
        say(f"{p['replica']}: {p['host'] or 'host not known'}, {p['device'] or 'device not known'}"
            + (f", shared with {', '.join(p['shares_device_with'])}" if p["shares_device_with"] else "")
            + (f"; engine {e.get('slots')} slot(s) on {e.get('device_name') or e.get('device')}" if e else
               "; no engine reported"))
    warm = warm_all(dev, endpoints, timeouts)
    write_json_atomic(out / "warmup.json", {"requests": warm})
    say(f"warmup: {sum(r['outcome'] == 'ok' for r in warm)}/{len(warm)} answered on {len(endpoints)} replicas")
    stopped = None
    phases = {}
    for phase in PHASES:
        if phase == "failure":
            stopped = stop(len(endpoints) - 1)
            say(f"stopped {stopped['replica']} (pid {stopped.get('pid')}, {stopped.get('signal')})")
        eps = endpoints[:1] if phase == "single" else endpoints
        for c in levels:
            data = {"phase": phase, "stopped": stopped if phase == "failure" else None,
                    **run_phase(workload(dev, phase, requests, c), eps, concurrency=c, timeouts=timeouts,
                                devices=devices)}
            write_json_atomic(out / f"{run_name(phase, c)}.json", data)
            phases[run_name(phase, c)] = data
            f = data["figures"]
            say(f"{phase}: {c} in flight, {f['completed']}/{f['requests']} answered, {f['retries']} retries, "
                f"{f['throughput_rps']:.2f} req/s, {f['generated_tokens_per_second'] or 0:,.0f} generated tok/s, "
                f"p50 {f['latency_seconds']['p50'] or float('nan'):.3f} s")
    plan = {"arm": arm, "replicas": names, "requests": requests, "levels": list(levels),
            "max_attempts": MAX_ATTEMPTS, "stopped": stopped, "retry_reason": retry, "placement": placement,
            "warmup": "every replica's at once, its four requests at once",
            "routing": "attempt a of request i goes to endpoint (i + a) mod N; 5xx, timeouts and "
                       "connection errors are retried, other 4xx are not"}
    write_json_atomic(out / "plan.json", plan)
    receipt = make_receipt(out, meta={"kind": "serving", "attempt": n, "arm": arm}, exclude=["started.json"])
    write_json_atomic(out / "receipt.json", receipt)
    CommitmentLog(home).append("serving", str((out / "receipt.json").relative_to(home)),
                               {"attempt": n, "arm": arm, "receipt_digest": receipt["digest"],
                                "retry_reason": retry})
    return {"attempt": str(out.relative_to(home)), **comparisons(phases, warm, plan)}


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
        placed = getattr(reps, "where", None)
        return probe(home, reps.endpoints, reps.kill, arm=arm, retry=retry, timeouts=timeouts, say=say,
                     where=placed() if placed else None)



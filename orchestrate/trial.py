"""Where a trial's host stages run: training and scoring, on this machine or on SSH hosts.

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
                                           ranks, reached over SSH forwards (orchestrate/serving.py)
    commitments.jsonl            ◀ pull    rank 0's log, accepted only as an extension of ours

A log coming back must begin with every byte the controller holds and verify as a chain; anything
else is refused, so a host can add commitments but never rewrite one.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from evidence.commitments import LOG_NAME, CommitmentLog
from orchestrate.cluster import Cluster
from orchestrate.guard import Guard, Polled, host_bytes
from evidence.attempts import attempts
from evidence.canonical import read_json
from orchestrate.launch.command import (Site, cluster_env, evaluate_argv, host_command, local_argv, process_env,
                                        threads_per_rank, train_argv)
from orchestrate.launch.local import local_launch
from orchestrate.launch.ssh import launch_remote_group, running_ranks, stop_ranks
from orchestrate.launch.supervise import GroupResult, supervise
from orchestrate.remote import collect, host_parts, host_python, reports_as_staged, stage_reports
from orchestrate.placement import Devices, hosts_devices, local_devices
from orchestrate.transport import Transport, TransportError

if TYPE_CHECKING:
    from orchestrate.serving import LocalReplicas, RemoteReplicas

STAGED = ("prepared.json", "prepare-record.json")
"""The home's files every host gets when it is staged. Not the commitments log: a host's may extend ours
with commitments not yet collected (an arm that finished after its controller stopped), and staging again,
as the next controller does, must not overwrite them. The log goes where a stage starts from it: to a
group's hosts before it is launched (`_push_log`), to the host that scores or serves (`_push_selected`)."""


class Placement(Protocol):
    """Trains an arm (resuming from the hosts' latest common manifest when there is one, restarting
    at most `max_restarts` times) and scores one; the results end up in the controller's home."""

    def train(self, home: Path, arm: Any, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]: ...
    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path, retry: str | None = None) -> dict[str, Any]: ...
    def devices(self, device: str) -> Devices: ...
    def replicas(self, home: Path, arm: str, n: int) -> Any: ...
    def close(self) -> None: ...


class LocalPlacement:
    """The embedded local cluster: every rank a process on this machine, gloo over loopback."""

    def __init__(self, model_dir: Path, guard: Guard | None = None, hosts: int | None = None,
                 share_gpus: bool = False):
        self.model_dir, self.guard, self.hosts, self.share_gpus = model_dir, guard, hosts, share_gpus

    def train(self, home: Path, arm: Any, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]:
        from training.runs import latest_common, local_manifests, set_aside_unfinished
        from training.errors import TrainError

        w = arm.world_size
        if self.hosts is not None and w > self.hosts:
            raise TrainError(f"arm {arm.name} needs {w} ranks; the local cluster was set up with {self.hosts} "
                             f"(orchestrate up --local --hosts {w})")
        rank_dirs = [home / "runs" / arm.name / f"rank-{r}" for r in range(w)]
        can = lambda: latest_common([local_manifests(d) for d in rank_dirs]) is not None  # noqa: E731
        first = can()
        if not first and set_aside_unfinished(home, arm.name, w):
            echo(f"an unfinished earlier attempt was moved to {home / 'runs' / arm.name / 'attempts'}")
        argv = local_argv(train_argv(Site.here(home, self.model_dir), arm.name, threads_per_rank(w)))
        from orchestrate.placement import committed_share

        gpus = committed_share(home, arm.name)  # as the home's committed placement decided
        if gpus:
            echo(f"{w} ranks share {gpus} GPU(s) as placed (--share-gpus): gloo between them; timings not comparable")
        launch = local_launch(argv, w, heartbeats=[d / "heartbeat.json" for d in rank_dirs], echo=echo,
                              guard=self.guard, share_gpus=gpus)
        return supervise(launch, log_root=home / "logs" / arm.name, max_restarts=max_restarts,
                         resume_first=first, can_resume=can, echo=echo)

    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path, retry: str | None = None) -> dict[str, Any]:
        from training.evaluate import evaluate

        return evaluate(home, arm, role, seed_dir=seed_dir, retry_reason=retry)

    def devices(self, device: str) -> Devices:
        """This machine's GPUs, shared by every rank (orchestrate/placement.py)."""
        return local_devices(self.hosts, device, share_gpus=self.share_gpus)

    def replicas(self, home: Path, arm: str, n: int) -> "LocalReplicas":
        """The serving probe's `n` replicas: processes on this machine, on loopback."""
        from orchestrate.placement import committed_share
        from orchestrate.serving import LocalReplicas

        return LocalReplicas(home, n, home / "logs" / "serving", threads=threads_per_rank(n), arm=arm,
                             share_gpus=committed_share(home))

    def close(self) -> None:
        pass

    def host_parts(self, url: str) -> None:
        """Nothing stays elsewhere: every payload is in the home."""
        return None


class RemotePlacement:
    """Ranks on a cluster's SSH hosts, one per host; scoring on rank 0's host."""

    def __init__(self, cluster: Cluster, home: Path, model_dir: Path, *, wheel_dir: Path,
                 say: Callable[[str], None] = lambda m: None, guard: Guard | None = None):
        self.cluster, self.home, self.model_dir, self.wheel_dir, self.say = cluster, home, model_dir, wheel_dir, say
        self.hosts = cluster.by_rank
        self.ts: list[Transport] = [cluster.transport(h) for h in self.hosts]
        self.env = cluster_env(cluster.source)
        # hosts sharing this machine's cores (network namespaces) split them; real hosts use their own
        self.shared_cores = cluster.shared_cores
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
        from evidence.canonical import file_sha256

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
        from training.runs import latest_common

        return latest_common(self.manifests(arm, world)) is not None

    def train(self, home: Path, arm: Any, *, max_restarts: int, echo: Callable[[str], None]) -> list[GroupResult]:
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
    def evaluate(self, home: Path, arm: str, role: str, seed_dir: Path, retry: str | None = None) -> dict[str, Any]:
        """`python -m training evaluate` on rank 0's host (where every arm's model already is)."""
        self._stage()
        h, t = self.hosts[0], self.ts[0]
        where = f"evaluations/{role}/{arm}"
        if self._remote_files(0, f"{shlex.quote(where)}/attempt-*/receipt.json"):
            self.say(f"{role} scoring of {arm} already ran on {h.name}; collecting it")
            self._collect_verified({0: where})
            done = [a for a in attempts(home / where) if (a / "receipt.json").is_file()]
            return read_json(done[-1] / "summary.json")
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
        return json.loads(r.stdout)

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
    def replicas(self, home: Path, arm: str, n: int) -> "RemoteReplicas":
        """The serving probe's `n` replicas, one per host of ranks 0..n-1 (where the arm's ranks
        ran), each serving its own host's copy of the selected model; refused, naming the counts,
        when the cluster has fewer hosts."""
        from orchestrate.serving import ProbeError, RemoteReplicas

        if n > len(self.hosts):
            raise ProbeError(f"the serving probe needs {n} replicas of {arm}, one per host, and the cluster has "
                             f"{len(self.hosts)} host(s) ({', '.join(h.name for h in self.hosts)})")
        self._stage()
        threads = threads_per_rank(n) if self.shared_cores else None
        return RemoteReplicas(self.cluster, self.hosts[:n], home, home / "logs" / "serving", arm=arm,
                              threads=threads, env=dict(self.env), lease_s=self.cluster.controller_lease_s,
                              prepare_host=lambda r: self._push_selected(home, r, [arm]))

    def close(self) -> None:
        for p in self.polled:
            p.close()
        for t in [*self.ts, *self.guard_ts]:
            t.close()


PACKAGES = ("training", "evidence", "orchestrate", "infra")
"""What the project's wheel holds (pyproject.toml's `packages.find`)."""


def build_wheelhouse(out: Path, extra: Path | None = None) -> Path:
    """The project's own wheel, plus every wheel in `extra` (a host without this project's
    dependencies needs them all: torch, transformers, … — `pip download` them for the hosts' Python)."""
    from orchestrate.remote import StagingError

    root = Path(__file__).resolve().parent.parent
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # built from a copy of the sources as they are now: setuptools builds in place and never clears
    # its build/lib, so a module since removed or renamed would otherwise ship to every host
    with tempfile.TemporaryDirectory(prefix="trials-wheel-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, src / name)
        for pkg in PACKAGES:
            shutil.copytree(root / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(src)], capture_output=True, text=True)
    if p.returncode != 0:
        raise StagingError(f"building the project wheel failed: {p.stderr.strip()[-800:]}")
    if extra is not None:
        if not extra.is_dir():
            raise StagingError(f"--wheelhouse {extra} is not a directory")
        others = [p.name for p in extra.iterdir() if p.is_file() and not p.name.endswith(".whl")]
        if others:
            raise StagingError(f"{extra} holds files that are not wheels ({', '.join(sorted(others)[:5])}): hosts "
                               "install offline from wheels only — `pip wheel` them, or `pip download "
                               "--only-binary=:all:`")
        wheels = sorted(extra.glob("*.whl"))
        if not wheels:
            raise StagingError(f"--wheelhouse {extra} holds no wheels")
        for w in wheels:
            shutil.copyfile(w, out / w.name)
    return out

"""What goes to SSH hosts before their ranks run, and what comes back after: stage what they need,
collect what they wrote, preserve what stays on them. The ranks themselves are started and watched by
orchestrate/launch/ssh.py.

Staging, per host under its root: the wheelhouse (every file checked against the lock's sha256 after
upload) less what the host's own Python already has at the same version (the AMI's torch), installed
offline (`pip install --no-index`) into root/site; the seed and the prepared inputs, each file read
back and checked. With the trial's S3 bucket, each artifact leaves the controller once, into the
bucket, and every host fetches and hashes it there, in region (`evidence.relay`); only the project's
wheel (and the fetcher's boto3, where the host lacks it) and a manifest go over SSH. Then every host reports an environment digest — its Python,
every installed distribution and version, the project's installed files — and nothing trains unless
all hosts report the same one.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from evidence.canonical import canonical_sha256, file_sha256
from evidence.errors import UserError
from evidence.relay import upload_once
from evidence.stores import HOST_PAYLOAD, open_store
from orchestrate.cluster import Cluster, Host
from orchestrate.launch.command import python_command
from orchestrate.transport import Transport, TransportError
from orchestrate.wheelhouse import describe_unfit, unfit

ENV_DIGEST = r"""
import hashlib, importlib.metadata as m, json, pathlib, sys
import torch, transformers, training  # a host missing what training needs fails here, by name
dists = sorted((d.metadata["Name"].lower(), d.version) for d in m.distributions())
files = sorted(p for p in pathlib.Path(sys.argv[1]).rglob("*.py") if "__pycache__" not in p.parts)
own = hashlib.sha256(b"".join(p.relative_to(sys.argv[1]).as_posix().encode() + b"\0" + p.read_bytes()
                              for p in files)).hexdigest()
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
except Exception:  # a build without NCCL
    nccl = None
print(json.dumps({"python": sys.version, "dists": dists, "project_files": own,
                  "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl},
                  "gpus": torch.cuda.device_count()}))
"""

MIN_PYTHON = (3, 11)
"""pyproject.toml's requires-python: a host interpreter below it is refused before any upload."""

PYTHON_VERSION = 'import sys; print("%d.%d.%d" % sys.version_info[:3])'


def run_on_hosts(fn: Callable[[Any], Any], items: list[Any], transports: list[Transport], *,
                 workers: int | None = None) -> list[Any]:
    """`fn` on every item at once (one per host), results in order. The first failure, or Ctrl-C/SIGTERM,
    ends the rest at once rather than after their transfers: every transport is closed, which aborts
    what runs on it, and the failure is raised."""

    pool = ThreadPoolExecutor(max_workers=workers or len(items) or 1, thread_name_prefix="hosts")
    futures = [pool.submit(fn, it) for it in items]
    try:
        pending = set(futures)
        while pending:  # in slices, so that a signal reaches this thread promptly
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    raise f.exception()
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        for t in transports:  # what still runs on a host stops with its connection
            try:
                t.close()
            except Exception:  # noqa: BLE001 — closing is best effort; the first failure is what counts
                pass
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def check_host_python(t: Transport, host: Host) -> str:
    """The host's interpreter version, refused by name when it is missing or older than MIN_PYTHON —
    before anything is uploaded, since the project could not run there."""
    r = t.run(f"{shlex.quote(host.python)} -I -c {shlex.quote(PYTHON_VERSION)}", timeout=60)
    if r.status != 0:
        raise StagingError(f"{host.name}: its interpreter {host.python} does not run (exit {r.status}: "
                           f"{r.stderr.strip()[-200:]}); set the host's python in the cluster description")
    version = (r.stdout.strip().splitlines() or [""])[-1].strip()  # a login shell may print before it
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise StagingError(f"{host.name}: {host.python} did not say its version (it printed {r.stdout.strip()[-120:]!r})")
    if tuple(int(x) for x in version.split(".")[:2]) < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        raise StagingError(f"{host.name}: {host.python} is Python {version}, the project needs >= {need}; nothing "
                           f"was uploaded (name an interpreter >= {need} as the host's python in the cluster "
                           "description, e.g. the AMI's own PyTorch environment)")
    return version


def host_python(t: Transport, host: Host, code: str, *args: str, python: str | None = None,
                timeout: float = 120):
    """Run `code` (`python -c`) on the host with its staged packages (`python_command`)."""
    return t.run(python_command(host, "-c", code, *args, python=python), timeout=timeout)


class StagingError(UserError, RuntimeError):
    """A host whose environment or inputs differ from the others'; the message names it."""


def wheelhouse_lock(wheel_dir: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(wheel_dir.glob("*.whl"))}


PROJECT_DIST = "trials"
"""pyproject.toml's project name: its wheel goes to every host every time, since its code changes
without its version changing."""

RELAY_DISTS = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"})
"""What the relay's host side (`python -m evidence.relay`) needs besides the project: a host whose
Python lacks them gets these wheels over SSH first, with the project's, the rest from the bucket."""

HOST_DISTS = ('import importlib.metadata as m, json; '
              'print(json.dumps({d.metadata["Name"]: d.version for d in m.distributions() if d.metadata["Name"]}))')


def dist_name(name: str) -> str:
    """A distribution's normalized name (PEP 503): how a wheel's file name and a host's metadata compare."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(filename: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel from its file name (name-version[-build]-py-abi-platform.whl)."""
    parts = filename[:-len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) < 5:
        raise StagingError(f"{filename} is not a wheel's file name (name-version-python-abi-platform.whl)")
    return dist_name(parts[0]), parts[1]


def host_distributions(t: Transport, host: Host) -> dict[str, str]:
    """{normalized name: version} of what the host's interpreter has itself (isolated, `-I`: its own
    site-packages, as the AMI ships it), asked before anything is uploaded."""
    r = t.run(f"{shlex.quote(host.python)} -I -c {shlex.quote(HOST_DISTS)}", timeout=120)
    out = (r.check(f"{host.name}: listing {host.python}'s distributions").stdout.strip().splitlines() or ["{}"])[-1]
    return {dist_name(k): v for k, v in json.loads(out).items()}


def wheels_lacking(lock: dict[str, str], have: dict[str, str]) -> list[str]:
    """The wheels a host needs: the project's own always; any other only where the host's Python lacks
    that distribution at exactly that version, local label included. The label is compared because
    it names the build: a `2.13.0` wheel from PyPI and an AMI's `2.13.0+cu130` link different CUDA
    libraries, and keeping the AMI's torch while sending the PyPI build's own `nvidia-*` wheels (first
    on the path) would mix the two. A wheelhouse built from the AMI's own index (`+cu130` wheels)
    matches it and sends neither."""

    def same(a: str, b: str) -> bool:
        try:
            return Version(a) == Version(b)
        except InvalidVersion:
            return a == b

    out = []
    for name in lock:
        dist, version = wheel_dist(name)
        if dist == PROJECT_DIST or dist not in have or not same(have[dist], version):
            out.append(name)
    return out


def stage_host(t: Transport, host: Host, *, python: str, wheel_dir: Path, lock: dict[str, str],
               files: dict[str, Path], relay: str | None = None, first: frozenset[str] = frozenset(),
               manifest: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Upload and verify the wheels of `lock` (those this host lacks) and `files` (remote path under
    root → local path), install offline, report the environment digest. With `relay` (the trial's
    store, which already holds every artifact of `manifest`), only the wheels of `first` (the project
    and what the relay's fetcher needs) go over SSH; the host then fetches and verifies the rest
    itself, in region (`python -m evidence.relay fetch`). The report's "sent_bytes": what went over SSH."""
    root, sent = host.root, 0
    over_ssh = [n for n in lock if relay is None or n in first]

    def install(names: list[str], fresh: bool) -> None:
        if names:
            t.run(f"{f'rm -rf {root}/site && ' if fresh else ''}{shlex.quote(python)} -m pip install -q --no-index "
                  f"--no-deps --no-compile --target {root}/site {' '.join(f'{root}/wheels/{n}' for n in names)}",
                  timeout=900).check(f"{host.name}: offline install")

    for name, got in zip(over_ssh, t.put_all([(wheel_dir / n, f"{root}/wheels/{n}") for n in over_ssh])):
        if got != lock[name]:
            raise StagingError(f"{host.name}: wheel {name} reads back as {got}, the lock says {lock[name]}")
        sent += (wheel_dir / name).stat().st_size
    install(over_ssh, fresh=True)
    fetched = None
    if relay is not None:
        with tempfile.TemporaryDirectory() as d:  # the manifest: small, over SSH; the bytes: from the bucket
            m = Path(d) / "staging-manifest.json"
            m.write_text(json.dumps(manifest or {}, sort_keys=True))
            t.put(m, f"{root}/staging-manifest.json")
            sent += m.stat().st_size
        r = t.run(python_command(host, "-m", "evidence.relay", "fetch", "--store", relay, "--manifest",
                                 f"{root}/staging-manifest.json", "--root", root, python=python), timeout=6 * 3600)
        if r.status != 0:
            raise StagingError(f"{host.name}: fetching the staged artifacts from {relay} exited {r.status}: "
                               f"{r.stderr.strip()[-600:]}")
        fetched = json.loads(r.stdout.strip().splitlines()[-1])
        # then every wheel at once into a fresh site: pip --target skips what the site already has
        # (its bin/ from the first install), which would drop the fetched wheels' scripts
        install(list(lock), fresh=True)
    else:
        t.put_all([(local, f"{root}/{rel}") for rel, local in files.items()])
        sent += sum(local.stat().st_size for local in files.values())
    return environment_report(t, host, python) | {"sent_bytes": sent, "fetched": fetched}


def environment_report(t: Transport, host: Host, python: str | None = None) -> dict[str, Any]:
    """What the host's staged site is: its environment, that environment's digest, its GPU count."""
    r = host_python(t, host, ENV_DIGEST, f"{host.root}/site", python=python or host.python)
    env = json.loads(r.check(f"{host.name}: environment report").stdout)
    gpus = env.pop("gpus")  # what the host offers ranks, not part of its environment's identity
    return {"host": host.name, "environment": env, "digest": canonical_sha256(env), "gpus": gpus}


def reports_as_staged(cluster: Cluster, transports: list[Transport],
                      say: Callable[[str], None] = lambda m: None) -> tuple[str, list[dict]]:
    """Every host's environment report on what is staged there now, nothing uploaded or installed: for
    hosts where ranks an earlier controller started still run from that site (a fresh install would
    remove it under them). The one digest they all report, or a refusal, as `stage_reports`."""
    reports = run_on_hosts(lambda ht: environment_report(ht[1], ht[0]) | {"sent_bytes": 0, "fetched": None},
                           list(zip(cluster.by_rank, transports)), transports)
    for r in reports:
        say(f"{r['host']}: left as staged (ranks run from it), environment {r['digest'][:12]}…, {r['gpus']} GPU(s)")
    return one_digest(reports), reports


def one_digest(reports: list[dict]) -> str:
    digests = {r["digest"] for r in reports}
    if len(digests) != 1:
        raise StagingError("hosts report different environments, nothing trains: "
                           + ", ".join(f"{r['host']} {r['digest'][:16]}" for r in reports))
    return digests.pop()


def stage(cluster: Cluster, transports: list[Transport], *, wheel_dir: Path,
          files: dict[str, Path], say: Callable[[str], None] = lambda m: None) -> str:
    """Stage every host; return the one environment digest they all report, or refuse."""
    return stage_reports(cluster, transports, wheel_dir=wheel_dir, files=files, say=say)[0]


def stage_reports(cluster: Cluster, transports: list[Transport], *, wheel_dir: Path,
                  files: dict[str, Path], say: Callable[[str], None] = lambda m: None,
                  workers: int | None = None, relay: str | None = None,
                  account: dict[str, int] | None = None) -> tuple[str, list[dict]]:
    """`stage`, also returning every host's report in rank order (its GPU count under "gpus").
    `workers`: hosts staged at once (all by default; 1 is one after another, for comparison).
    `relay`: the trial's store (s3://…): each artifact leaves this machine once, into the store, and
    every host fetches it from there (`evidence.relay`); without it, everything goes over SSH to each
    host. `account`, when given, is filled with the bytes that left this machine: "ssh_bytes" (to the
    hosts), "relay_bytes" (into the store, this time) and "relay_stored_bytes" (what the hosts fetch)."""
    lock = wheelhouse_lock(wheel_dir)
    if not lock:
        raise StagingError(f"{wheel_dir} holds no wheels")
    hosts = cluster.by_rank
    for h, t in zip(hosts, transports):  # every host first: a refusal uploads nothing anywhere
        version = check_host_python(t, h)
        bad = unfit(lock, version)  # a wheel for another Python (the controller's, say) installs nowhere here
        if bad:
            raise StagingError(f"{h.name}: {h.python} is Python {version}; nothing was uploaded. "
                               + describe_unfit(bad, version, None))
        say(f"{h.name}: Python {version} ({h.python})")
    have = [host_distributions(t, h) for h, t in zip(hosts, transports)]
    needs = [wheels_lacking(lock, hv) for hv in have]
    for h, need in zip(hosts, needs):
        if len(need) < len(lock):
            say(f"{h.name}: {len(lock) - len(need)} wheel(s) of the wheelhouse are in its Python at the same "
                f"version (not sent): {', '.join(n for n in lock if n not in need)[:200]}")
    firsts = [frozenset(need) for need in needs]
    manifests: list[dict[str, dict[str, Any]] | None] = [None] * len(hosts)
    relay_bytes = stored = 0
    if relay is not None:
        for h, hv, need in zip(hosts, have, needs):
            if "boto3" not in hv and not any(wheel_dist(n)[0] == "boto3" for n in need):
                raise StagingError(f"{h.name}: the relay's fetcher needs boto3, which {h.python} lacks and the "
                                   "wheelhouse does not carry: add boto3 and its dependencies to --wheelhouse")
        firsts = [frozenset(n for n in need if wheel_dist(n)[0] in RELAY_DISTS | {PROJECT_DIST}) for need in needs]
        via = sorted({n for need, f in zip(needs, firsts) for n in need if n not in f})
        try:
            table, relay_bytes = upload_once(open_store(relay), [wheel_dir / n for n in via] + list(files.values()),
                                             say)
        except Exception as e:  # noqa: BLE001 — no credentials, no such bucket, access denied, network
            raise StagingError(f"staging through {relay} failed before any host fetched: "
                               f"{type(e).__name__}: {e}") from e
        for n in via:  # what the hosts will verify against is what the lock says
            if table[wheel_dir / n]["sha256"] != lock[n]:
                raise StagingError(f"wheel {n} hashes as {table[wheel_dir / n]['sha256']}, the lock says {lock[n]}")
        stored = sum(f["size"] for f in table.values())
        manifests = [{f"wheels/{n}": table[wheel_dir / n] for n in need if n not in f}
                     | {rel: table[p] for rel, p in files.items()} for need, f in zip(needs, firsts)]

    # every host at once, each over its own connection: the wall time is the slowest host's, not the sum
    def one(item: tuple[Host, Transport, list[str], frozenset[str], dict | None]) -> dict[str, Any]:
        h, t, need, first, manifest = item
        t0 = time.monotonic()
        rep = stage_host(t, h, python=h.python, wheel_dir=wheel_dir, lock={n: lock[n] for n in need}, files=files,
                         relay=relay, first=first, manifest=manifest)
        how = (f"{rep['fetched']['bytes'] / 1e6:,.1f} MB fetched from the store and verified" if rep["fetched"]
               else f"{rep['sent_bytes'] / 1e6:,.1f} MB over SSH")
        say(f"staged {h.name}: {len(need)} wheel(s), {len(files)} files ({how}), environment {rep['digest'][:12]}…, "
            f"{rep['gpus']} GPU(s) in {time.monotonic() - t0:.1f} s")
        return rep

    items = list(zip(hosts, transports, needs, firsts, manifests))
    reports = run_on_hosts(one, items, transports, workers=workers)
    if account is not None:
        account.update(ssh_bytes=sum(r["sent_bytes"] for r in reports), relay_bytes=relay_bytes,
                       relay_stored_bytes=stored)
    return one_digest(reports), reports


KEEP_ON_HOST = HOST_PAYLOAD
"""Checkpoint payloads stay on the hosts' volumes (tens of GB per rank at 1.7B); their receipts,
the manifests and everything else come back. Each host preserves its own (`host_parts`)."""


def host_parts(cluster: Cluster, transports: list[Transport], url: str,
               say: Callable[[str], None] = lambda m: None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every SSH host preserves the checkpoint payloads on its volume into the trial's store, from where
    they are (`python -m evidence preserve-part`), all hosts at once. {host name: {path: {sha256, size}}}."""
    def one(ht: tuple[Host, Transport]) -> tuple[str, dict[str, dict[str, Any]]]:
        h, t = ht
        if h.transport != "ssh":
            return h.name, {}
        r = t.run(python_command(h, "-m", "evidence", "preserve-part", "--home", f"{h.root}/home", "--store", url),
                  timeout=6 * 3600)
        if r.status != 0:
            raise TransportError(f"{h.name}: preserving its checkpoint payloads exited {r.status}: "
                                 f"{r.stderr.strip()[-600:]}")
        part = json.loads(r.stdout)
        say(f"{h.name}: {len(part)} checkpoint payload(s), {sum(f['size'] for f in part.values()) / 1e6:,.1f} MB, "
            "preserved from the host and read back there")
        return h.name, part

    return dict(run_on_hosts(one, list(zip(cluster.by_rank, transports)), transports))


def safe_relative(path: str, under: str) -> str:
    """`path` as the host listed it, refused unless it is a plain relative path inside `under`:
    a host must never be able to write outside the directory it was asked for."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not path.startswith(under.rstrip("/") + "/") \
            or any(c in path for c in "\0\n\r"):
        raise TransportError(f"refusing a listed path outside {under}: {path!r}")
    return str(p)


def collect(cluster: Cluster, transports: list[Transport], remote_dirs: dict[int, str], local_home: Path,
            *, keep_on_host: re.Pattern[str] | None = KEEP_ON_HOST) -> list[str]:
    """Copy every file under each rank's remote directory (relative to its root/home) into
    `local_home`, each verified by sha256; payloads matching `keep_on_host` are left where they are.
    Returns the relative paths collected."""
    got = []
    root = local_home.resolve()
    for rank, rel in remote_dirs.items():
        h, t = cluster.by_rank[rank], transports[rank]
        listing = t.run(f"cd {shlex.quote(h.root)}/home && find {shlex.quote(rel)} -type f -print0 2>/dev/null")
        for path in filter(None, listing.check(f"{h.name}: listing {rel}").stdout.split("\0")):
            path = safe_relative(path, rel)
            if keep_on_host is not None and keep_on_host.search(path):
                continue
            dst = local_home / path
            if not dst.resolve().is_relative_to(root):  # a symlink already in the home, say
                raise TransportError(f"{h.name}: {path} would land outside {local_home}")
            t.get(f"{h.root}/home/{path}", dst)
            got.append(path)
    return got

"""Shared fixtures: one tiny seed and one prepared smoke home per test session; and the markers
every test gets (`pytest -m unit` is the quick loop, docs/benchmarks-and-tests.md)."""

from __future__ import annotations

import fnmatch
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from machinery.netns import shared_cores_env
from orchestrate.launch.command import free_port
from training.heap import long_lived

ROOT = Path(__file__).resolve().parents[1]

# The suite runs three workers and their subprocesses on two cores. torch's OpenMP (libgomp) keeps a
# parallel region's idle threads spinning for a while by default, which on cores that other processes
# are waiting for burns CPU without doing any work: 36 in-process training tests on three workers used
# 111.7-121.9 core-seconds, 82.6-86.7 with PASSIVE (bench/results/2026-12-05-omp-wait-2cpu/), which makes
# idle threads sleep instead. It changes no thread count, kernel or result, only how a thread waits; libgomp
# reads it when torch loads it, so it is set here, before any test process imports torch, and every process
# the tests start inherits it. One definition with the namespace hosts' (`shared_cores_env`: an operator's
# setting wins).
os.environ.update(shared_cores_env())

# Collection imports every test module and, through them, torch, transformers, Pulumi, moto and boto3: about
# 470,000 tracked objects (measured) that live as long as the process. With the cyclic collector on, each full
# collection during those imports traverses all that is loaded so far, and each one later traverses it again;
# collecting the suite took 6.5-6.8 core-seconds, 3.9-4.0 with the collector paused. So collection runs inside
# training/heap.py's `long_lived`, as a rank's loading does: the collector paused, what is alive at its end
# frozen out of its sight, and the collector resumed before the first test. Each xdist worker collects the suite
# itself; the controller, which does not, only freezes what it had loaded by then.
@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    with long_lived():
        return (yield)


def built_once(tmp_path_factory: pytest.TempPathFactory, key: str, build: Callable[[Path], None]) -> Path:
    """A folder that `build` fills once per test run, whatever the number of workers. Under pytest-xdist
    each worker is a session of its own, so a session fixture was built once per worker (the tiny seed
    and the trained smoke arms twice on two workers); here the first worker to ask builds it under the
    run's shared temporary root (the workers' own roots' parent) while any other waits on a lock, and
    every worker then reads the one copy. Read-only to tests, as any session fixture: copy before altering."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    root.mkdir(exist_ok=True)
    out = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a worker dies holding it
        if not (root / f"{key}.built").exists():
            shutil.rmtree(out, ignore_errors=True)  # what a worker that failed mid-build left
            out.mkdir()
            build(out)
            (root / f"{key}.built").touch()
    return out


@pytest.fixture(scope="session")
def tiny_seed(tmp_path_factory) -> Path:
    """The tiny seed, alone in a seeds folder (`tiny_seed.parent`)."""
    from training.seed import materialize

    def build(d: Path) -> None:
        out = d / "seeds" / "tiny"
        given = os.environ.get("TRIAL_TEST_TINY_SEED")  # a machine without the GGUF wheel (the GPU one)
        if given:
            shutil.copytree(given, out)
        materialize("tiny", out)  # builds it, or verifies the copy against its receipt

    return built_once(tmp_path_factory, "tiny-seed", build) / "seeds" / "tiny"


def prepared_once(tmp_path_factory, key: str, experiment: str, seed: Path, previous: Path | None = None) -> Path:
    from training.config import resolve
    from training.prepare import prepare

    def build(d: Path) -> None:
        prepare(resolve(experiment, "smoke"), d / "home", seed, previous_home=str(previous) if previous else None)

    return built_once(tmp_path_factory, key, build) / "home"


@pytest.fixture(scope="session")
def smoke_home(tmp_path_factory, tiny_seed) -> Path:
    """cooperative-learning/smoke prepared once; tests that alter it must work on a copy."""
    return prepared_once(tmp_path_factory, "coop", "cooperative-learning", tiny_seed)


SMOKE_ARMS = ("clean-single", "damaged-single", "clean-pair")


@pytest.fixture(scope="session")
def ltw_home(tmp_path_factory, smoke_home, tiny_seed):
    """local-training-windows/smoke prepared once (after cooperative-learning's); copy before altering."""
    return prepared_once(tmp_path_factory, "ltw", "local-training-windows", tiny_seed, smoke_home)


@pytest.fixture(scope="session")
def batched_home(tmp_path_factory, ltw_home, tiny_seed):
    """batched-learning/smoke prepared once (after local-training-windows'); copy before altering."""
    return prepared_once(tmp_path_factory, "batched", "batched-learning", tiny_seed, ltw_home)


def gpus(n: int, share: bool = False):
    """The devices `orchestrate run` finds with TRIAL_GPUS=n (`--share-gpus` or not)."""
    from orchestrate.placement import local_devices

    return local_devices(None, "cuda", {"TRIAL_GPUS": str(n)}, share_gpus=share)


def train_as_placed(home: Path, arms: Iterable[str], seed: Path, placed_gpus: int, share: bool,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit the placement `orchestrate run` would on `placed_gpus` GPUs, then train every arm
    through the controller's LocalBackend, which launches as that placement says (a process per rank,
    `python -m training train`, its threads as the controller gives them)."""
    from evidence.canonical import read_json
    from orchestrate.placement import commit_placement
    from orchestrate.backends.local import LocalBackend
    from training.config import resolve

    cfg = resolve(read_json(home / "prepared.json")["experiment"]["experiment"]["name"], "smoke")
    with monkeypatch.context() as m:
        m.setattr("orchestrate.placement.trial_device", lambda c: "cuda")  # decided as for a GPU profile
        commit_placement(cfg, home, gpus(placed_gpus, share))
    lp = LocalBackend(seed, share_gpus=share)
    for arm in arms:
        attempts = lp.train(home, cfg.arm(arm), max_restarts=0, echo=lambda line: None)
        assert attempts[-1].ok, attempts[-1].failure_text()


@pytest.fixture(scope="session")
def powersgd_trained(tmp_path_factory, batched_home, tiny_seed) -> Path:
    """batched-learning/smoke with powersgd-pair trained on the ordinary path: placed on two GPUs, one rank
    each, and launched by the controller's LocalBackend; read only: copy before altering."""
    def build(d: Path) -> None:
        shutil.copytree(batched_home, d / "home")
        with pytest.MonkeyPatch.context() as mp:
            train_as_placed(d / "home", ["powersgd-pair"], tiny_seed, 2, False, mp)

    return built_once(tmp_path_factory, "powersgd", build) / "home"


@pytest.fixture(scope="session")
def trained(tmp_path_factory, smoke_home, tiny_seed) -> Path:
    """Every arm of cooperative-learning/smoke trained (no selection yet); copy before altering."""
    def build(d: Path) -> None:
        shutil.copytree(smoke_home, d / "home")
        for arm in SMOKE_ARMS:
            world = 2 if arm == "clean-pair" else 1
            res = run_ranks([sys.executable, "-m", "training", "train", "--home", str(d / "home"), "--arm", arm,
                             "--model-dir", str(tiny_seed)], world)
            assert all(c == 0 for c, _ in res), res

    return built_once(tmp_path_factory, "trained", build) / "home"


@pytest.fixture(scope="session")
def finished_trial(tmp_path_factory, tiny_seed):
    """One `orchestrate run diloco-four --profile smoke` on the embedded local cluster, finished and
    preserved (copy before altering), in a trials folder whose name holds brackets (printed verbatim
    or not at all). While it trains, a second run is started in the same folder: the two-runs test
    reads what each said (`first`, `second`)."""
    from types import SimpleNamespace

    from training.hold import lock_path

    root = tmp_path_factory.mktemp("finished")
    trials, seeds = root / "trials[a-z]", root / "seeds"
    seeds.mkdir()
    shutil.copytree(tiny_seed, seeds / "tiny")
    args = [sys.executable, "-m", "orchestrate", "run", "diloco-four", "--profile", "smoke", "--trials", str(trials),
            "--seeds", str(seeds)]
    first = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lock = lock_path(trials / "cooperative-learning-smoke")
        deadline = time.monotonic() + 120
        while not (lock.is_file() and f'"pid": {first.pid}' in lock.read_text()) and first.poll() is None:
            assert time.monotonic() < deadline, "the first run never took its home"
            time.sleep(0.1)
        second = run_cli(*args[1:])  # the same trials folder, while the first one runs
        out, err = first.communicate(timeout=1200)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    done = subprocess.CompletedProcess(args, first.returncode, out, err)
    return SimpleNamespace(trials=trials, seeds=seeds, home=trials / "local-training-windows-smoke",
                           store=trials / "store", first=done, first_pid=first.pid, second=second)


@pytest.fixture
def zombie():
    """The pid of an exited process that its parent never reaps (a zombie, which `kill -0` still
    finds): the parent forks a child that exits at once, prints its pid and sleeps without waiting."""
    parent = subprocess.Popen([sys.executable, "-c", "import os, time\npid = os.fork()\nif pid == 0:\n"
                               "    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        z = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while proc_state(z) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc_state(z) == "Z"
        os.kill(z, 0)  # the premise: kill -0 finds it
        yield z
    finally:
        parent.kill()
        parent.wait()


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses, so the
    split is at its last ")"): field 3 of proc(5), the state, first. None once the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def proc_state(pid: int) -> str | None:
    """The process state letter (R, S, Z, …), None once the pid is gone."""
    fields = proc_stat(pid)
    return None if fields is None else fields[0]


def cpu_seconds(pid: int) -> float:
    """User and system CPU a live process has used (proc(5)'s utime and stime, fields 14 and 15)."""
    fields = proc_stat(pid)
    assert fields is not None, f"pid {pid} is gone"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serving_processes(namespaces: dict[str, str]) -> list[tuple[str, int]]:
    """(host, pid) of every live `training serve` process inside the given network namespaces
    (host name → namespace, as `ip netns pids` sees them; a zombie has exited and does not count)."""
    left = []
    for name, ns in namespaces.items():
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True)
        for pid in (int(x) for x in p.stdout.split()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmd and b"training" in cmd and proc_state(pid) not in (None, "Z"):
                left.append((name, pid))
    return left


@pytest.fixture
def home_copy(smoke_home, tmp_path) -> Path:
    dst = tmp_path / "home"
    shutil.copytree(smoke_home, dst)
    return dst


class QuietProgress:
    """A stage's progress (orchestrate.progress.Progress) that shows nothing and keeps what it was told."""

    def __init__(self):
        self.said: list[str] = []

    def say(self, label: str, text: str, style: str = "bold") -> None:
        self.said.append(f"{label} {text}")

    def line(self, text: str) -> None:
        self.said.append(text)

    def status(self, text: str):
        import contextlib

        return contextlib.nullcontext()


def score(home: Path, arms: Iterable[str], seed: Path, retry: str | None = None) -> None:
    """Each arm scored on the test tasks in this process, as a trial on this machine scores them
    (orchestrate/backends/local.py, `LocalBackend.evaluate`), for a fixture that needs a scored home: a
    `training evaluate` process spends most of its time importing the libraries (#34). Tests of the CLI's
    own refusals and retries run the CLI."""
    from training.evaluate import evaluate

    for arm in arms:
        evaluate(home, arm, "test", seed_dir=seed, retry_reason=retry)


def run_cli(*args: str, stdin: str = "", cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`timeout` guards against a hang, not a speed: a whole trial on four hosts needs more."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def _plain_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def signal_cli_when(path: Path, sig: int, *args: str, timeout: float = 600,
                    before: Callable[[], None] | None = None) -> tuple[subprocess.Popen, str]:
    """Start `python *args` (a CLI, unbuffered), send it `sig` once `path` exists (a rank's heartbeat,
    say) and `before()` has run, and return the ended process and its stderr. Only the process started
    here is ever killed."""
    # as a terminal's foreground job has it: SIGINT at its default, not blocked. Under pytest-xdist a
    # Ctrl-C sent to the CLI once did nothing (its threads, dumped: still supervising a minute later),
    # and an ignored or blocked SIGINT is what a child inherits from its parent
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_plain_sigint)
    try:
        deadline = time.monotonic() + timeout
        while not path.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.05)
        if before is not None:
            before()
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler prints every thread on SIGABRT
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"{args} did not end within 60 s of signal {sig}; its threads:\n{err[-12000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, err


def run_ranks(argv: list[str], world: int, *, env: dict[str, str] | None = None,
              rank_env: dict[int, dict[str, str]] | None = None, timeout: float = 300,
              cwd: Path = ROOT) -> list[tuple[int, str]]:
    """Start `world` rank processes of `argv` over loopback gloo; return (exit code, output) each.

    Only the processes started here are ever killed, by their own pid, if they outlive `timeout`.
    """
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ, WORLD_SIZE=str(world), RANK=str(r), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                 PYTHONUNBUFFERED="1", **(env or {}), **((rank_env or {}).get(r, {})))
        procs.append(subprocess.Popen(argv, cwd=cwd, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def run_worker(tmp: Path, model_dir: Path, world: int, jobs: list[dict], **kw) -> Path:
    """Run tests/dist_worker.py on `world` ranks; fail with every rank's output if one fails."""
    import json

    out = tmp / f"worker-{world}"
    out.mkdir(parents=True, exist_ok=True)
    res = run_ranks([sys.executable, str(ROOT / "tests" / "dist_worker.py"), str(out),
                     str(model_dir), json.dumps(jobs)], world, **kw)
    if any(code != 0 for code, _ in res):
        raise AssertionError("\n".join(f"--- rank {r} exit {c}\n{o[-3000:]}"
                                       for r, (c, o) in enumerate(res)))
    return out


@pytest.fixture(scope="session")
def moto_url():
    """moto's server on loopback, for the AWS APIs (no AWS account is ever reached)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def point_at_moto(mp: pytest.MonkeyPatch, moto_url: str) -> None:
    """This process's and every subprocess's AWS calls go to moto, with its test credentials."""
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        mp.delenv(k, raising=False)
    for k, v in (("AWS_ENDPOINT_URL", moto_url), ("AWS_ACCESS_KEY_ID", "testing"),
                 ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        mp.setenv(k, v)


@pytest.fixture
def aws(moto_url, monkeypatch):
    """A boto3 session whose every client — and every subprocess the test starts — talks to moto;
    at teardown, asserts that every request this session sent went there."""
    import boto3

    point_at_moto(monkeypatch, moto_url)
    s = boto3.Session(region_name="us-east-1")
    urls: list[str] = []
    s.events.register("before-send", lambda request, **_: urls.append(request.url))
    yield s
    assert urls and all(u.startswith(moto_url) for u in urls)


@pytest.fixture(scope="module")
def moto_module(moto_url):
    """`aws`'s environment for a module's shared fixture (one `pulumi up` several tests read): a boto3
    session to moto, and every subprocess pointed at it, for as long as the module runs."""
    import boto3

    with pytest.MonkeyPatch.context() as mp:
        point_at_moto(mp, moto_url)
        yield boto3.Session(region_name="us-east-1")


def public_key() -> str:
    """A fresh ed25519 public key in OpenSSH form ('ssh-ed25519 AAAA…'), as an operator's .pub holds."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def example_stack(dst: Path, **changes) -> Path:
    """The shipped example stack (Pulumi.dev.yaml) with what is the user's to set: a deadline 3 h
    from now and the operator's public key (the shipped file has neither on purpose), plus `changes`
    to trials:cluster."""
    import datetime as dt

    import yaml

    conf = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    cl = conf["config"]["trials:cluster"]
    cl["deadline"] = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)).isoformat()
    cl["ssh_public_key"] = public_key()
    cl.update(changes)
    out = Path(dst) / "Pulumi.test.yaml"
    out.write_text(yaml.safe_dump(conf))
    return out


# --- markers -------------------------------------------------------------------------------------
# Every test is marked by what it reaches: the fixtures it requests (and theirs), and the names used
# by its body, its fixtures and every helper or class of tests/ that these call, followed through.
# A test that reaches none of REACHES, and is not in EXPLICIT, is `unit`. Markers are registered in
# pyproject.toml; `unit` excludes every other marker but `cuda`, which only says where a test runs.
REACHES = {
    # ranks in subprocesses (torch.distributed over loopback), or a whole trial run
    "run_ranks": "dist", "run_worker": "dist", "local_launch": "dist", "launch_group": "dist",
    "finished_trial": "dist",
    # real sshd processes in network namespaces
    "NetnsHosts": "ssh",
    # moto's server, or the Pulumi program under Pulumi's mocks
    "moto_url": "aws", "ThreadedMotoServer": "aws", "set_mocks": "aws", "Mocks": "aws", "MockMonitor": "aws",
    "pulumi_run": "aws",  # the program run as the engine runs it (tests/pulumi_engine.py)
    # the project's CLIs in subprocesses (each imports torch), or a model trained, run or scored in
    # this process
    "run_cli": "slow", "Popen": "slow", "Trainer": "slow", "AutoModelForCausalLM": "slow",
    "generate_answers": "slow", "score": "slow",
    # dist_worker's device: these run on one GPU per rank under TRIAL_TEST_DEVICE=cuda
    "dist_worker.device": "cuda",
}
# What the names cannot tell, by node id pattern (fnmatch).
EXPLICIT = {
    "tests/evidence/test_anchors.py::*[[]s3[]]": {"aws"},  # store_url asks for `aws` by getfixturevalue
    # a whole trial through `orchestrate run` in this process (CliRunner); its ranks are subprocesses
    "tests/orchestrate/test_cli.py::test_run_reports_an_arm_the_gpus_cannot_place_and_runs_the_rest": {"dist"},
    "tests/training/test_seed.py::test_smollm2_135m_materializes_to_the_pinned_weights": {"slow"},  # the 135M GGUF
    "tests/orchestrate/test_remote.py::test_the_hosts_wheel_holds_*": {"slow"},  # pip builds the project wheel
    # a whole trial through the page's own bash blocks (`orchestrate run` in a subprocess, ranks its children)
    "tests/orchestrate/test_your_own_study.py::test_the_walk_*": {"dist", "slow"},
}
MARKERS = ("unit", "dist", "ssh", "aws", "slow", "cuda")
TESTS = Path(__file__).resolve().parent


def _ours(obj) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(TESTS)


def _reached(func, seen: set[int], out: set[str]) -> None:
    """Add to `out` the names `func` uses (a function or class also as module.name), following the
    functions and classes of tests/ it uses."""
    func = inspect.unwrap(func)
    if id(func) in seen or not _ours(func):
        return
    seen.add(id(func))
    glob = func.__globals__
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if inspect.iscode(c)]  # nested functions, lambdas, comprehensions
        for name in code.co_names:
            out.add(name)
            obj = glob.get(name)
            if obj is None:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.add(f"{obj.__module__}.{name}")  # where it is defined: dist_worker.device
            if inspect.isfunction(obj):
                _reached(obj, seen, out)
            elif inspect.isclass(obj) and obj.__module__ == glob.get("__name__"):
                out.update(b.__name__ for b in obj.__mro__)
                for member in vars(obj).values():
                    if inspect.isfunction(member):
                        _reached(member, seen, out)


def reached_names(item) -> set[str]:
    """Every name one collected test uses, through its fixtures and the functions of tests/ it calls."""
    names = set(item.fixturenames)
    seen: set[int] = set()
    _reached(item.function, seen, names)
    for name in item.fixturenames:
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            _reached(fixturedef.func, seen, names)
    return names


def markers_of(item, names: set[str] | None = None) -> set[str]:
    """The markers of one collected test: what it reaches (REACHES), EXPLICIT, else `unit`."""
    names = reached_names(item) if names is None else names
    marks = {REACHES[n] for n in names if n in REACHES}
    for pattern, extra in EXPLICIT.items():
        if fnmatch.fnmatchcase(item.nodeid, pattern):
            marks |= extra
    if not marks - {"cuda"}:
        marks.add("unit")
    return marks


# Under `pytest -n` (scripts/test.sh runs three workers) some tests must share one worker, in order: the
# finished trial (a whole smoke trial, about two minutes, whose fixture also holds the two runs' processes
# and what they said, so not `built_once`) is built once per worker, so its tests stay together; and the
# tests of one module on the network-namespace hosts (marker `ssh`), which share that module's hosts and
# stagings. The namespace hosts' modules go to every worker: each worker builds its sets in a slot of its
# own (`pytest_configure`), so none waits for another's lock. The first match names a test's group
# (`--dist loadgroup`: a group runs whole on one worker; every other test goes where a worker is free).
# The tests that compile (test_arms: the compiled step, its warm-up, packed rows) share one worker too: what
# Inductor keeps in a process (its compile workers, ~15 s of CPU to start, and the graphs compiled so far)
# is then paid once, and no two workers compile the same shape at once. Last, the tests that reach a
# fixture their own module builds for more than one test (a scored home, a probe, a replica, the Pulumi
# program's registrations) share a worker, which builds it once — unless it is `built_once` already.
GROUPS = (("ssh", "netns-hosts"), ("finished_trial", "finished-trial"))
GROUP_PATTERNS = {"tests/training/test_arms.py::*compile*": "inductor"}  # node ids (fnmatch)


_BUILT_ONCE: dict[int, bool] = {}  # fixture function → whether it builds through `built_once` (read once)


def _builds_once(func) -> bool:
    if id(func) not in _BUILT_ONCE:
        reached: set[str] = set()
        _reached(func, set(), reached)
        _BUILT_ONCE[id(func)] = "built_once" in reached
    return _BUILT_ONCE[id(func)]


def own_shared_fixtures(item) -> list[str]:
    """The fixtures of module or session scope that `item`'s own module defines and builds in each worker
    that reaches them (not through `built_once`)."""
    module = item.nodeid.split("::")[0]
    return [name for name, defs in item._fixtureinfo.name2fixturedefs.items() for fd in defs
            if fd.scope in ("module", "session") and fd.baseid == module and not _builds_once(fd.func)]


def group_of(marks: set[str], names: set[str], module: str = "", nodeid: str = "",
             own_fixtures: list[str] | None = None) -> str | None:
    group = next((g for key, g in GROUPS if key in marks or key in names), None)
    if group is None:
        group = next((g for pattern, g in GROUP_PATTERNS.items() if fnmatch.fnmatchcase(nodeid, pattern)), None)
    if group is None and own_fixtures:
        group = f"module-fixtures:{module}"
    return f"{group}:{module}" if group == "netns-hosts" else group


def pytest_configure(config):
    """Each xdist worker's namespace hosts in a slot of its own (tests/machinery/netns.py's /26 quarters: gw0
    the first, gw1 the second, …); one process, or a fifth worker, shares a slot and waits on its lock."""
    from machinery.netns import SLOT_ENV, SLOTS

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        os.environ.setdefault(SLOT_ENV, str(int(worker[2:]) % SLOTS))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns each group into its node ids' suffix
def pytest_collection_modifyitems(items):
    for item in items:
        names = reached_names(item)
        marks = markers_of(item, names)
        for m in sorted(marks):
            item.add_marker(m)
        group = group_of(marks, names, item.module.__name__, item.nodeid, own_shared_fixtures(item))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))

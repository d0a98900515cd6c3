"""The Pulumi program run the way Pulumi's engine runs it, with no Pulumi CLI: the tests' harness.

`pulumi_run("up" | "preview" | "destroy", config)` starts the program as a subprocess exactly as the
engine and Python's language host start it, and returns what the program registered and what the
emulated engine then did (`Deployment`). Every program test and the AWS loop test go through it.

What is reproduced, each from the engine's source (pulumi/pulumi, read, not copied):

* **Where the program starts.** `pkg/engine/project.go` `getPwdMain`: for `main: infra/` the working
  directory is `<root>/infra` and the entry point ".". `pkg/resource/deploy/program_source.go` hands both
  to the language host; `sdk/python/cmd/pulumi-language-python/main.go` (`Run`,
  `constructArguments`) runs `<virtualenv>/bin/python pulumi-language-python-exec --monitor … --engine …
  --project … --root_directory … --stack … --pwd … --dry_run … --parallel … --organization … .`
  with the engine's own environment plus `VIRTUAL_ENV`/`PATH` (the toolchain's `ActivateVirtualEnv`),
  `PULUMI_CONFIG` (a JSON object of `namespace:key` → the value as a string, objects as JSON) and
  `PULUMI_CONFIG_SECRET_KEYS` (a JSON list, `[]` when none).
* **How the program is run.** `tests/engine/pulumi-language-python-exec` stands in for
  `sdk/python/cmd/pulumi-language-python-exec`: the same arguments, config read with
  `pulumi.runtime.get_config_env` / `set_all_config`, `pulumi.runtime.Settings`, `os.chdir(pwd)`, a new
  event loop, `run_in_stack(lambda: runpy.run_path(program, run_name="__main__"))`, `RunError` → exit 1,
  anything else → exit 32. The script sits alone in its directory, which is therefore the interpreter's
  `sys.path[0]` as the real script's directory is; `runpy.run_path(".")` then puts "." (= infra/) before
  it. Nothing else is added to the path: the only difference from the real exec is the monitor, which is
  an in-process object (this module's `Monitor`, loaded by file path) instead of a gRPC address.
* **What the engine does after the program registered.** `pkg/resource/deploy/step_generator.go`
  (`GenerateSteps` in destroy mode, `GenerateDeletes`, `ScheduleDeletes`), `pkg/resource/graph/
  dependency_graph.go` (`DependenciesOf`, `TransitiveDependenciesOf`), `pkg/resource/deploy/
  deployment_executor.go` (`performPostSteps`: antichains one after the other, a failed step cancels
  the rest unless --continue-on-error), `pkg/resource/deploy/step_executor.go` (`cancelDueToError`),
  `pkg/resource/deploy/step.go` (`DeleteStep.Apply`: before-delete hooks, protect, retainOnDelete,
  deletedWith, the provider's Delete, after-delete hooks) and `pkg/resource/deploy/deployment.go`
  (`RunHooks`). Hooks are called as the engine calls them: a `ResourceHookRequest` sent over gRPC to
  the callback server the Python SDK started in the program's process
  (`source_eval.go` `wrapResourceHookCallback`), while the program waits in `SignalAndWaitForShutdown`.

* **What a registration does.** For a resource the state holds, the provider's Diff as pulumi-aws answers
  it (`diff`: ForceNew properties replace, the rest update in place, `ignore_changes` left out): an update
  is applied at once; a replacement creates the new resource at once and deletes the old one with the post
  steps, its old hooks and all (`step_generator.go`, `step.go` ReplaceStep/DeleteReplaced). In a preview
  (`dry_run`) a create gets no id and the program sees its outputs as unknown, and only `on_dry_run` hooks
  run; in destroy mode a skipped create is answered unknown.
* **When the engine goes away** (#65). A fault with `"interrupt": True` lets the provider's create reach the
  cloud (moto makes the instance) and ends the deployment there: the checkpoint keeps a pending CREATE with no id
  (`pkg/backend/snapshot.go` `doCreate`), which every later deployment carries (`Snap`) and every later non-preview
  one warns of in the engine's words (`deployment_executor.go` `printPendingOperationsWarning`, `Deployment.warnings`);
  a pending create is no resource, so the next `up` creates it again. The root stack resource keeps its outputs
  (a same step keeps the old ones; the program's registration at its end replaces them, a failed one's too:
  `pulumi/runtime/stack.py` `run_in_stack`), and the builtin `pulumi:pulumi:readStackOutputs` answers them for
  this stack (`read_stack_outputs`). With `provider="moto"` the program's instance look-ups are answered by moto's
  EC2 (`moto_invoke`): the account holds what was created there, whatever the state says.
* **When the cloud says no.** `faults` fail a create, update, replacement or delete with the provider's
  error; the engine then stops ("cancel") or lets every independent step finish ("drain"), and no delete
  runs after a failed `up` (`step_executor.go` `cancelDueToError`). A plain `pulumi destroy` without
  `--run-program` is refused when the state holds delete hooks (`pkg/engine/destroy.go`, 3.182).

What it is not: no provider plugin runs. Resources are answered by `answers` (mocks), or for a few S3
and EC2 types by `MotoProvider` against moto's server; the program's lookups of instances and subnets are
answered from the state (`account_invoke`). docs/aws-emulation.md lists what only a real engine and account
can show.

This module is imported by the tests and loaded, by its file path, into the program's process by the
exec stand-in: its top level imports the standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
EXEC = Path(__file__).resolve().parent / "engine" / "pulumi-language-python-exec"
STACK_TYPE = "pulumi:pulumi:Stack"
PROVIDER_PREFIX = "pulumi:providers:"
HOOK_TYPES = ("before_create", "after_create", "before_update", "after_update", "before_delete", "after_delete")


# --- the test's side: start the program as the engine does ------------------------------------------

def get_pwd_main(root: Path, main: str | None) -> tuple[Path, str]:
    """pkg/engine/project.go `getPwdMain`: a directory `main` becomes the working directory, entry "."."""
    if not main:
        return root, "."
    path = Path(main) if Path(main).is_absolute() else (root / main)
    path = Path(os.path.normpath(path))
    if path.is_dir():
        return path, "."
    return path.parent, path.name


def config_env(config: dict[str, Any]) -> str:
    """`PULUMI_CONFIG` as the language host builds it: every key `namespace:name`, every value a string
    (an object or list as JSON, as `pulumi config set --path` stores it)."""
    def text(v: Any) -> str:
        if isinstance(v, str):
            return v
        return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)

    return json.dumps({k: text(v) for k, v in config.items()})


def stack_config(stack_file: Path) -> dict[str, Any]:
    """A stack file's `config:` as the engine hands it on (no `secure:` values: none are used here)."""
    import yaml

    conf = yaml.safe_load(Path(stack_file).read_text())["config"]
    if any(isinstance(v, dict) and set(v) == {"secure"} for v in conf.values()):
        raise ValueError(f"{stack_file}: secret config values are not emulated")
    return conf


@dataclass
class Registered:
    """One RegisterResource as the engine received it: `inputs` deserialized (camelCase keys, numbers as
    floats, as Pulumi's mocks see them), the options the engine reads, and the engine's answer."""
    seq: int
    urn: str
    typ: str
    name: str
    custom: bool
    parent: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    provider: str
    retain_on_delete: bool
    protect: bool
    deleted_with: str
    hooks: dict[str, list[str]]
    ignore_changes: list[str]
    aliases: list[dict[str, Any]]
    op: str = ""
    state: dict[str, Any] | None = None
    outputs_registered: dict[str, Any] | None = None


@dataclass
class Deployment:
    """What one `pulumi up` / `preview` / `destroy --run-program` did under the harness."""
    operation: str
    returncode: int
    stdout: str
    stderr: str
    record: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    resources: list[Registered] = field(default_factory=list)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return self.record["calls"]

    @property
    def logs(self) -> list[dict[str, str]]:
        return self.record["logs"]

    @property
    def errors(self) -> str:
        """Everything the program said at error level (a RunError's message alone, or a traceback)."""
        return "\n".join(m["message"] for m in self.logs if m["severity"] == "ERROR")

    @property
    def exports(self) -> dict[str, Any]:
        return self.record.get("exports") or {}

    @property
    def hooks(self) -> dict[str, dict[str, Any]]:
        return self.record["hooks"]

    @property
    def state(self) -> list[dict[str, Any]]:
        """The stack's state after this deployment, in the engine's order (for a later deployment)."""
        return self.record["state"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The deployment's delete steps, in the order they ran or were left: wave, urn, outcome."""
        return self.record["steps"]

    @property
    def failed(self) -> str | None:
        """The engine's error for this deployment (a failed step), or None."""
        return self.record.get("deployment_error")

    @property
    def ops(self) -> list[dict[str, Any]]:
        """Every step of the deployment in the order the engine took it: op ("create", "update", "same",
        "replace", "skipped-create", "failed", "not started", "delete-before-replace"), urn, name, type, and
        for a replacement the changed paths; the post-program deletes are in `steps`."""
        return self.record.get("ops", [])

    @property
    def warnings(self) -> list[str]:
        """What the engine itself warned of (the pending operations of an interrupted deployment)."""
        return self.record.get("engine_warnings", [])

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The pending CREATE operations the checkpoint holds after this deployment (`pending_operations`)."""
        return [s for s in self.state if s.get("pending")]

    @property
    def modules(self) -> dict[str, str]:
        return self.record.get("modules", {})

    def of(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str, typ: str | None = None) -> Registered:
        (r,) = [r for r in self.resources if r.name == name and (typ is None or r.typ == typ)]
        return r


def pulumi_run(operation: str, config: dict[str, Any], **kw: Any) -> Deployment:
    """`pulumi_start(...)`, waited for: see there."""
    return pulumi_start(operation, config, **kw).wait()


def pulumi_start(operation: str, config: dict[str, Any], *, root: Path = ROOT, stack: str = "test",
                 state: list[dict[str, Any]] | None = None, answers: list[dict[str, Any]] | None = None,
                 calls: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 site: Path | None = None, provider: str | None = None, continue_on_error: bool = False,
                 faults: list[dict[str, Any]] | None = None, after_failure: str = "cancel", run_program: bool = True,
                 backend: "DiyBackend | None" = None, timeout: float = 300) -> "Running":
    """Run the program of the project at `root` as `pulumi <operation>` would (`destroy` is `destroy
    --run-program`: the environment, e.g. TRIALS_TEARDOWN=1, is the caller's), with `config` as the
    stack's config, `state` as what an earlier deployment left, `answers` for the resources (rules
    matched by `type` and/or `name`, giving `id` and `outputs` merged over the inputs) and `calls` for
    invokes by token. `site`: a project tree to make importable as the virtualenv's install of it would
    (PYTHONPATH, which sits after the program's own path entries); None: the virtualenv's own install.
    `provider="moto"`: S3 buckets' settings and instances are created/deleted in moto (MotoProvider).

    `faults`: steps the provider fails (`fault_for`: by name and/or type, and the operation), with the
    provider's error. After a failed step the engine starts nothing more (`after_failure="cancel"`: the
    program's later registrations are refused) — or, `"drain"`, every registration that does not depend on
    the failed resource still completes: the most the engine's in-flight steps can have created before it
    stopped (`step_executor.go` `cancelDueToError`: steps already applying run to their end and are
    recorded). Either way no delete runs after a failed `up`. `continue_on_error`: the engine's flag.
    `run_program=False` (`destroy` only): a plain `pulumi destroy`, refused when the state holds delete hooks.

    `backend`: a self-managed backend (`DiyBackend`) holding the stack's checkpoint and locks, as the CLI uses
    one: the operation takes the stack's lock (refused while another holds one), reads `state` from the
    checkpoint, and at its end writes the checkpoint and removes its lock. A fault with `"pause": PATH` holds
    that create or delete (after its before-delete hooks) until the file PATH exists, the checkpoint as of then
    written and `PATH.reached` made: a second operation can be started meanwhile (`pulumi_start` returns at once)."""
    import yaml

    if operation not in ("up", "preview", "destroy", "destroy-preview"):
        raise ValueError(operation)
    if after_failure not in ("cancel", "drain"):
        raise ValueError(after_failure)
    lock = None
    if backend is not None and operation in ("up", "destroy"):  # `diy/backend.go`: Preview takes no lock
        try:
            lock = backend.lock(stack)
        except BackendLocked as e:  # the CLI stops before any program runs
            return Running.done(Deployment(operation, 255, "", str(e), {
                "registrations": [], "calls": [], "logs": [], "hooks": {}, "hook_calls": [], "component_outputs": {},
                "exports": None, "steps": [], "waves": [], "ops": [], "deployment_error": str(e),
                "state": backend.read(stack), "program_ran": False}, config))
    if backend is not None:
        state = backend.read(stack)
    if not run_program:
        d = plain_destroy(operation, state or [], config)
        if backend is not None:
            backend.finish(stack, lock, d.state)
        return Running.done(d)
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())
    runtime = project.get("runtime") or {}
    options = runtime.get("options", {}) if isinstance(runtime, dict) else {}
    pwd, entry = get_pwd_main(root, project.get("main"))
    venv = root / options["virtualenv"] if options.get("virtualenv") else None
    python = venv / "bin" / "python" if venv and (venv / "bin" / "python").exists() else Path(sys.executable)
    work = Path(tempfile.mkdtemp(prefix="pulumi-engine-"))
    try:
        session = {"record": str(work / "record.json"), "engine_module": str(Path(__file__).resolve()),
                   "operation": "destroy" if operation == "destroy-preview" else operation, "state": state,
                   "answers": answers or [], "calls": calls or {}, "provider": provider,
                   "continue_on_error": continue_on_error, "faults": faults or [], "after_failure": after_failure,
                   "checkpoint": str(backend.checkpoint(stack)) if backend is not None else None}
        (work / "session.json").write_text(json.dumps(session))
        e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PULUMI_CONFIG", "PULUMI_CONFIG_SECRET_KEYS")}
        if venv is not None and python != Path(sys.executable):
            e["VIRTUAL_ENV"] = str(venv)
            e["PATH"] = f"{venv / 'bin'}{os.pathsep}{e.get('PATH', '')}"
        e["PULUMI_CONFIG"] = config_env(config)
        e["PULUMI_CONFIG_SECRET_KEYS"] = "[]"
        if site is not None:
            e["PYTHONPATH"] = str(site)
        e.update(env or {})
        account_ssm(e, config)
        argv = [str(python), str(EXEC), "--monitor", str(work / "session.json"), "--engine", "harness",
                "--project", project["name"], "--root_directory", str(root), "--stack", stack, "--pwd", str(pwd),
                "--dry_run", "true" if operation in ("preview", "destroy-preview") else "false", "--parallel", "16",
                "--organization", "organization", entry]
        p = subprocess.Popen(argv, cwd=root, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Running(operation, config, p, work, timeout, backend, stack, lock)


class Running:
    """An operation under way (`pulumi_start`): `wait()` gives its Deployment, after which a backend's checkpoint
    holds its state and its lock is gone."""

    def __init__(self, operation: str, config: dict[str, Any], p: subprocess.Popen | None, work: Path | None,
                 timeout: float, backend: "DiyBackend | None", stack: str, lock: Path | None) -> None:
        self.operation, self.config, self.p, self.work, self.timeout = operation, config, p, work, timeout
        self.backend, self.stack, self.lock = backend, stack, lock
        self.deployment: Deployment | None = None

    @classmethod
    def done(cls, d: Deployment) -> "Running":
        r = cls(d.operation, d.config, None, None, 0, None, "", None)
        r.deployment = d
        return r

    def wait(self) -> Deployment:
        if self.deployment is not None:
            return self.deployment
        assert self.p is not None and self.work is not None
        try:
            try:
                stdout, stderr = self.p.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.communicate()
                raise
            path = self.work / "record.json"
            if not path.exists():
                raise AssertionError(f"the program wrote no record (exit {self.p.returncode}):\n{stdout[-3000:]}\n"
                                     f"{stderr[-6000:]}")
            record = json.loads(path.read_text())
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        d = Deployment(self.operation, self.p.returncode, stdout, stderr, record, self.config)
        d.resources = [Registered(**r) for r in record["registrations"]]
        for r in d.resources:
            r.outputs_registered = record["component_outputs"].get(r.urn)
        if self.backend is not None and self.operation in ("up", "destroy"):
            self.backend.finish(self.stack, self.lock, d.state)
        self.deployment = d
        return d


class BackendLocked(Exception):
    """`pkg/backend/diy/lock.go` `checkForLock`: another operation's lock file exists."""


class DiyBackend:
    """A self-managed backend's files for one project, as pulumi/pulumi `pkg/backend/diy` lays them out under
    `<url>/.pulumi/`: the checkpoint `stacks/<org>/<project>/<stack>.json` (here: the state list the harness
    uses) and one lock file per operation `locks/<org>/<project>/<stack>/<uuid>.json`. `lock` is `Lock`
    (refused with `checkForLock`'s words while any other lock exists), `finish` is the end of an operation (the
    checkpoint written, its own lock deleted: `Unlock`), and `cancel` is `pulumi cancel` on this backend
    (`backend.go` `CancelCurrentUpdate`): every lock file deleted, nothing else, the operation running on."""

    def __init__(self, root: Path, project: str = "trials", org: str = "organization") -> None:
        self.root, self.project, self.org = Path(root), project, org

    def checkpoint(self, stack: str) -> Path:
        return self.root / ".pulumi" / "stacks" / self.org / self.project / f"{stack}.json"

    def lock_dir(self, stack: str) -> Path:
        return self.root / ".pulumi" / "locks" / self.org / self.project / stack

    def read(self, stack: str) -> list[dict[str, Any]]:
        path = self.checkpoint(stack)
        return json.loads(path.read_text()) if path.exists() else []

    def lock(self, stack: str) -> Path:
        import datetime as dt
        import getpass
        import socket
        import uuid

        def held() -> list[Path]:
            return sorted(self.lock_dir(stack).glob("*.json")) if self.lock_dir(stack).exists() else []

        def refuse(others: list[Path]) -> BackendLocked:
            lines = [f"the stack is currently locked by {len(others)} lock(s). Either wait for the other process(es) "
                     "to end or delete the lock file with `pulumi cancel`."]
            for o in others:
                c = json.loads(o.read_text())
                lines.append(f"  file://{o}: created by {c['username']}@{c['hostname']} (pid {c['pid']}) at {c['timestamp']}")
            return BackendLocked("\n".join(lines))

        if held():
            raise refuse(held())
        mine = self.lock_dir(stack) / f"{uuid.uuid4()}.json"
        mine.parent.mkdir(parents=True, exist_ok=True)
        mine.write_text(json.dumps({"pid": os.getpid(), "username": getpass.getuser(), "hostname": socket.gethostname(),
                                    "timestamp": dt.datetime.now(dt.timezone.utc).isoformat()}))
        others = [o for o in held() if o != mine]
        if others:  # Lock checks again after writing its own, and backs off
            mine.unlink()
            raise refuse(others)
        return mine

    def finish(self, stack: str, lock: Path | None, state: list[dict[str, Any]]) -> None:
        path = self.checkpoint(stack)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state))
        if lock is not None:
            lock.unlink(missing_ok=True)  # after a `cancel` it is gone already (Unlock reports it, and goes on)

    def cancel(self, stack: str) -> int:
        """`pulumi cancel`: the number of lock files deleted."""
        gone = 0
        for f in sorted(self.lock_dir(stack).glob("*.json")) if self.lock_dir(stack).exists() else []:
            f.unlink()
            gone += 1
        return gone


_ACCOUNT: list[Any] = []


def account_ssm(e: dict[str, str], config: dict[str, Any]) -> None:
    """Every account has Parameter Store, where the program takes its operation lease (infra/lease.py). A test
    that brings no AWS endpoint of its own (the mocks answer its resources) gets this process's moto server for
    SSM alone, with moto's test keys where the environment has no identity: the program's other AWS calls go
    where they went before."""
    endpoints = config.get("aws:endpoints") or []
    endpoints = json.loads(endpoints) if isinstance(endpoints, str) else endpoints
    if e.get("AWS_ENDPOINT_URL_SSM") or e.get("AWS_ENDPOINT_URL") or any("ssm" in x for x in endpoints):
        return
    if not _ACCOUNT:
        import atexit
        import logging

        from moto.server import ThreadedMotoServer

        from orchestrate.launch.command import free_port

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        atexit.register(server.stop)
        _ACCOUNT.append(f"http://127.0.0.1:{port}")
    e["AWS_ENDPOINT_URL_SSM"] = _ACCOUNT[0]
    # moto's keys, never this machine's: a profile could name a role, SSO or a credential process, which would
    # reach out for credentials (the stack's own static keys, if it names any, are answered by moto all the same)
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    e.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})


_REQUESTS: list[Path] = []


def teardown_env(stack: str = "test", project: str = "trials") -> dict[str, str]:
    """The environment `orchestrate destroy` gives `pulumi destroy --run-program`: `TRIALS_TEARDOWN` naming a
    request written by this process (infra/destroy_request.py), which every program the harness starts has
    as an ancestor. Removed when this process ends, as `orchestrate destroy` removes its own."""
    import atexit

    from infra.destroy_request import VARIABLE, write_request

    path = write_request(project, stack)
    if not _REQUESTS:
        atexit.register(lambda: [p.unlink(missing_ok=True) for p in _REQUESTS])
    _REQUESTS.append(path)
    return {VARIABLE: str(path)}


def plain_destroy(operation: str, state: list[dict[str, Any]], config: dict[str, Any]) -> Deployment:
    """`pulumi destroy` (or its preview) without `--run-program`: no program runs. Refused up front, nothing
    deleted, when any resource has delete hooks (`plain_destroy_refusal`); otherwise every resource is
    deleted from its state, dependents first (what the harness can do without a program: providers'
    deletes are the mocks')."""
    refusal = plain_destroy_refusal(state)
    record: dict[str, Any] = {"registrations": [], "calls": [], "logs": [], "hooks": {}, "hook_calls": [],
                              "component_outputs": {}, "exports": None, "steps": [], "waves": [], "ops": [],
                              "deployment_error": refusal, "state": list(state), "program_ran": False}
    if refusal is None:
        plan = plan_deletes("destroy", state, [])
        record["waves"] = [[n.urn for n in chain] for chain in plan.antichains]

        def apply(n: Node) -> str:
            if n.state.get("protect"):
                raise StepError(f"resource {n.urn} cannot be deleted because it is protected")
            if operation == "destroy-preview":
                return "would delete"
            return "retained" if n.state.get("retainOnDelete") else "deleted (mocks only)"

        record["steps"], record["deployment_error"] = execute(plan, apply, continue_on_error=False)
        gone = {st["urn"] for st in record["steps"] if st["outcome"] not in ("failed", "not started", "would delete")}
        record["state"] = [s for s in state if s["urn"] not in gone]
    return Deployment(operation, 255 if record["deployment_error"] else 0, "", record["deployment_error"] or "",
                      record, config)


# --- the engine's side: what happens after the program registered (runs in the program's process) ----

def is_provider(typ: str) -> bool:
    return typ.startswith(PROVIDER_PREFIX)


def default_provider_urn(stack: str, project: str, typ: str, version: str) -> str:
    """The default provider the engine creates for a package on first use (`providers.DefaultName`:
    `default_<major>_<minor>_<patch>`), parented by nothing."""
    name = "default" + ("_" + version.replace(".", "_").replace("-", "_") if version else "")
    return f"urn:pulumi:{stack}::{project}::{PROVIDER_PREFIX}{typ.split(':')[0]}::{name}"


def all_dependencies(s: dict[str, Any]) -> list[tuple[str, str]]:
    """`State.GetAllDependencies` (pkg/resource/state.go), provider aside: (kind, urn)."""
    deps = [("parent", s["parent"])] if s.get("parent") else []
    deps += [("dependency", u) for u in s.get("dependencies", []) if u]
    deps += [("property-dependency", u) for us in s.get("propertyDependencies", {}).values() for u in us if u]
    if s.get("deletedWith"):
        deps.append(("deleted-with", s["deletedWith"]))
    return deps


class Node:
    """One resource state in a dependency graph; identity, not URN, tells two states of one URN apart
    (a destroy's new registration and the state it came from)."""

    def __init__(self, state: dict[str, Any], origin: str) -> None:
        self.state, self.origin = state, origin
        self.urn: str = state["urn"]

    def __repr__(self) -> str:
        return f"Node({self.urn.split('::')[-1]}, {self.origin})"


class DependencyGraph:
    """pkg/resource/graph/dependency_graph.go over a list in topological order."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.index = {id(n): i for i, n in enumerate(nodes)}
        self.children: dict[str, list[int]] = {}
        by_urn: dict[str, int] = {}
        for i, n in enumerate(nodes):
            by_urn[n.urn] = i
            parent = n.state.get("parent", "")
            while parent:
                self.children.setdefault(parent, []).append(i)
                parent = nodes[by_urn[parent]].state.get("parent", "")

    def __contains__(self, n: Node) -> bool:
        return id(n) in self.index

    def dependencies_of(self, n: Node) -> list[Node]:
        """`DependenciesOf`: the resources before `n` that it names (a component named brings its
        children listed before `n`), its provider, and its parent."""
        wanted = {u for kind, u in all_dependencies(n.state) if kind != "parent"}
        if n.state.get("provider"):
            wanted.add(n.state["provider"])
        cursor = self.index[id(n)]
        found: dict[int, Node] = {}
        for i in range(cursor - 1, -1, -1):
            cand = self.nodes[i]
            if cand.urn in wanted:
                found[id(cand)] = cand
                if not cand.state["custom"]:
                    for j in self.children.get(cand.urn, []):
                        if j < cursor:
                            found[id(self.nodes[j])] = self.nodes[j]
            if cand.urn == n.state.get("parent"):
                found[id(cand)] = cand
        return list(found.values())

    def transitive_dependencies_of(self, n: Node) -> set[int]:
        """`TransitiveDependenciesOf`: provider, parent, dependencies, property dependencies and
        deleted-with, followed through (ids of the nodes)."""
        by_urn = {m.urn: m for m in self.nodes}
        seen: set[int] = set()
        todo = [n]
        while todo:
            m = todo.pop()
            urns = [u for _, u in all_dependencies(m.state)]
            if m.state.get("provider"):
                urns.append(m.state["provider"])
            for u in urns:
                d = by_urn.get(u)
                if d is not None and id(d) not in seen:
                    seen.add(id(d))
                    todo.append(d)
        seen.discard(id(n))
        return seen


def schedule_deletes(graph: DependencyGraph, condemned: list[Node]) -> list[list[Node]]:
    """`ScheduleDeletes`: peel off the condemned resources none of whose condemned dependencies remain,
    round by round; reversed, each round is an antichain the engine deletes in parallel, dependents first."""
    left = {id(n): n for n in condemned}
    rounds: list[list[Node]] = []
    while left:
        now = [n for n in left.values() if not any(id(d) in left for d in graph.dependencies_of(n))]
        if not now:
            raise RuntimeError(f"dependency cycle among {list(left.values())}")
        for n in now:
            del left[id(n)]
        rounds.append(now)
    rounds.reverse()
    return rounds


@dataclass
class Plan:
    """The post-program steps of one deployment: the delete antichains and the graphs they came from."""
    antichains: list[list[Node]]
    prev_graph: DependencyGraph
    delete_graph: DependencyGraph
    skipped: list[str]


def plan_deletes(operation: str, prev: list[dict[str, Any]], registered: list[dict[str, Any]],
                 replaced: list[dict[str, Any]] | None = None) -> Plan:
    """What the step generator deletes once the program is done. `up`: every resource of `prev` the
    program no longer registered. `destroy` (DestroyV2, destroy mode): each registration with a state
    becomes a same step whose new state (the program's options and hooks, the old inputs, outputs and
    id) is deleted; a custom resource with no state — or any resource depending on one — is a skipped
    create and deleted from its old state if it has one; components and providers are (re)created and
    deleted; whatever of `prev` the program did not register is deleted from its old state. The graph
    is the new states followed by `prev` (`getDepgraphForScheduling`). `replaced`: the states (members of
    `prev`) of resources an `up` replaced create-before-delete; they are condemned with the rest, in the same waves
    (`GenerateDeletes`: DeleteReplaced steps, scheduled by `ScheduleDeletes` with the deletes)."""
    prev = [s for s in prev if not s.get("pending")]  # a pending create is no resource: nothing deletes it
    old = {s["urn"]: s for s in prev if not s.get("delete")}
    to_delete: list[Node] = []
    operated: set[str] = set()
    skipped: set[str] = set()
    for reg in registered:
        urn = reg["urn"]
        if operation == "destroy":
            deps = [u for _, u in all_dependencies(reg)] + ([reg["provider"]] if reg.get("provider") else [])
            if any(u in skipped for u in deps):
                skipped.add(urn)
                continue
            if reg["custom"] and not is_provider(reg["type"]):
                if urn not in old:
                    skipped.add(urn)
                    continue
                new = {**reg, "id": old[urn]["id"], "inputs": old[urn]["inputs"], "outputs": old[urn]["outputs"]}
                operated.add(urn)
            else:
                new = dict(reg)
                if urn in old:
                    operated.add(urn)
            to_delete.append(Node(new, "new"))
        elif urn in old:
            operated.add(urn)
    gone = {id(s) for s in replaced or []}  # states of `prev` itself, in their place in its order
    prev_nodes = [Node(s, "replaced" if id(s) in gone else "old") for s in prev]
    # an old copy pending deletion (`delete`: a replacement's, whose delete did not run) is always deleted
    condemned = [n for n in prev_nodes if n.urn not in operated or n.origin == "replaced" or n.state.get("delete")]
    condemned += to_delete
    graph = DependencyGraph(to_delete + prev_nodes)
    return Plan(schedule_deletes(graph, condemned), DependencyGraph(prev_nodes), DependencyGraph(to_delete),
                sorted(skipped))


# --- what a changed registration does: the provider's Diff, as pulumi-aws answers it ------------------

REPLACES: dict[str, tuple[str, ...]] = {
    # terraform-provider-aws (which pulumi-aws bridges) marks these ForceNew: a change replaces the resource.
    # internal/service/ec2/ec2_instance.go (resourceInstance: ami, availability_zone, subnet_id, key_name,
    # private_ip, root_block_device.encrypted/kms_key_id; instance_type only across CPU architectures)
    "aws:ec2/instance:Instance": ("ami", "availabilityZone", "subnetId", "keyName", "privateIp",
                                  "rootBlockDevice.encrypted", "rootBlockDevice.kmsKeyId"),
    # vpc_subnet.go, vpc_.go, ec2_key_pair.go, vpc_route_table_association.go
    "aws:ec2/subnet:Subnet": ("cidrBlock", "availabilityZone", "availabilityZoneId", "vpcId"),
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/keyPair:KeyPair": ("keyName", "publicKey"),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": ("subnetId", "gatewayId"),
    "aws:ec2/securityGroup:SecurityGroup": ("name", "namePrefix", "description", "vpcId"),
    # cloudwatch/metric_alarm.go, scheduler/schedule.go, iam/role_policy.go, budgets/budget(_action).go
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("name",),
    "aws:scheduler/schedule:Schedule": ("name", "groupName"),
    "aws:iam/rolePolicy:RolePolicy": ("name", "role"),
    "aws:iam/role:Role": ("name", "namePrefix", "path"),
    "aws:iam/instanceProfile:InstanceProfile": ("name", "namePrefix", "path"),
    "aws:budgets/budget:Budget": ("name", "accountId"),
    "aws:budgets/budgetAction:BudgetAction": ("actionType", "budgetName", "accountId"),
    "aws:s3/bucket:Bucket": ("bucket", "bucketPrefix", "objectLockEnabled"),
}
"""The replacing properties of the types the program uses (pulumi/pulumi-terraform-bridge turns a ForceNew
attribute into a replace). Every other change is an in-place update; `STOPS_AND_STARTS` names the updates
pulumi-aws applies by stopping the instance and starting it again (`modifyInstanceAttributeWithStopStart`,
ec2_instance.go: the start is unconditional, so a host a guard had stopped comes back running)."""

STOPS_AND_STARTS: dict[str, tuple[str, ...]] = {"aws:ec2/instance:Instance": ("instanceType", "userData")}


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """The dotted paths at which two property values differ (objects compared key by key)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += changed_paths(old.get(k), new.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if old == new else [path]


def diff(typ: str, old_inputs: dict[str, Any], new_inputs: dict[str, Any],
         ignore_changes: list[str]) -> tuple[str, list[str]]:
    """("same" | "update" | "replace", the changed paths) for a registration of a resource the state holds:
    the old and new inputs compared, `ignore_changes` left out (the engine drops those paths from the new
    inputs before the provider's Diff: `step_generator.go` `processIgnoreChanges`)."""
    ignored = [i.replace("[", ".").replace("]", "") for i in ignore_changes]
    changed = [c for c in changed_paths(old_inputs, new_inputs)
               if not any(c == i or c.startswith(i + ".") for i in ignored)]
    if not changed:
        return "same", []
    replaces = REPLACES.get(typ, ())
    if any(c == r or c.startswith(r + ".") or r.startswith(c + ".") for c in changed for r in replaces):
        return "replace", changed
    return "update", changed


def with_ignored(old_inputs: dict[str, Any], new_inputs: dict[str, Any], ignore_changes: list[str]) -> dict[str, Any]:
    """The inputs the engine keeps for a changed resource: the new ones, with each ignored top-level property
    at its old value (`processIgnoreChanges`)."""
    out = dict(new_inputs)
    for key in ignore_changes:
        top = key.split(".")[0].split("[")[0]
        if top in old_inputs:
            out[top] = old_inputs[top]
        else:
            out.pop(top, None)
    return out


def stops_and_starts(typ: str, changed: list[str]) -> bool:
    return any(c == k or c.startswith(k + ".") for c in changed for k in STOPS_AND_STARTS.get(typ, ()))


def replacement_id(old_id: str) -> str:
    """A new physical id for a replaced resource (the mocks answer by name, so they would repeat the old one)."""
    if old_id.startswith("i-") and all(c in "0123456789abcdef" for c in old_id[2:]):
        return "i-" + f"{int(old_id[2:], 16) + (1 << 60):0{len(old_id) - 2}x}"[-(len(old_id) - 2):]
    return f"{old_id}-replacement"


def fault_for(faults: list[dict[str, Any]], name: str, typ: str, op: str) -> dict[str, Any] | None:
    """The injected failure for this step, if any: a rule names the resource (and/or its type) and the
    operation it fails ("create", "update", "replace" — the replacement's create — or "delete")."""
    for f in faults:
        if f.get("name", name) == name and f.get("type", typ) == typ and f.get("op", "create") == op:
            return f
    return None


# --- the account as the stack's state has it: the invokes the program makes before it registers -------

ACCOUNT_INVOKES = ("aws:ec2/getInstances:getInstances", "aws:ec2/getInstance:getInstance",
                   "aws:ec2/getSubnets:getSubnets", "aws:ec2/getSubnet:getSubnet")


def _tags_match(tags: dict[str, Any], want: dict[str, Any] | None) -> bool:
    return all(tags.get(k) == v for k, v in (want or {}).items())


def account_invoke(token: str, args: dict[str, Any], state: list[dict[str, Any]]) -> dict[str, Any]:
    """What EC2 answers the program's lookups of instances and subnets when the account holds exactly what
    the stack's state holds (every instance running): the shapes of pulumi-aws's `get_instances`,
    `get_instance`, `get_subnets` and `get_subnet` results (camelCase, as the engine returns them). A
    lookup of one resource that matches none fails, as EC2's does."""
    def custom(typ: str) -> list[dict[str, Any]]:  # an old copy pending deletion still exists in the account
        return [s for s in state if s["type"] == typ and s.get("id") and not s.get("pending")]

    tags_arg = args.get("instanceTags") or args.get("tags")
    if token == "aws:ec2/getInstances:getInstances":
        states = args.get("instanceStateNames") or ["running"]
        found = [s for s in custom("aws:ec2/instance:Instance")
                 if "running" in states and _tags_match(s["outputs"].get("tags") or {}, tags_arg)]
        return {"id": "us-east-1", "ids": [s["id"] for s in found], "ipv6Addresses": [],
                "privateIps": [s["outputs"]["privateIp"] for s in found if s["outputs"].get("privateIp")],
                "publicIps": [s["outputs"]["publicIp"] for s in found if s["outputs"].get("publicIp")]}
    if token == "aws:ec2/getInstance:getInstance":
        (s,) = [s for s in custom("aws:ec2/instance:Instance") if s["id"] == args.get("instanceId")] or [None]
        if s is None:
            raise LookupError(f"Your query returned no results: instance {args.get('instanceId')}")
        o = s["outputs"]
        return {"id": s["id"], "instanceState": "running", "availabilityZone": o.get("availabilityZone"),
                "instanceType": o.get("instanceType"), "subnetId": o.get("subnetId"), "keyName": o.get("keyName"),
                "privateIp": o.get("privateIp"), "publicIp": o.get("publicIp"), "tags": o.get("tags") or {}}
    if token == "aws:ec2/getSubnets:getSubnets":
        found = [s for s in custom("aws:ec2/subnet:Subnet") if _tags_match(s["outputs"].get("tags") or {}, tags_arg)]
        return {"id": "us-east-1", "ids": [s["id"] for s in found]}
    if token == "aws:ec2/getSubnet:getSubnet":
        (s,) = [s for s in custom("aws:ec2/subnet:Subnet") if s["id"] == args.get("id")] or [None]
        if s is None:
            raise LookupError(f"Your query returned no results: subnet {args.get('id')}")
        o = s["outputs"]
        return {"id": s["id"], "cidrBlock": o.get("cidrBlock"), "availabilityZone": o.get("availabilityZone"),
                "availabilityZoneId": o.get("availabilityZoneId"), "vpcId": o.get("vpcId"), "tags": o.get("tags") or {}}
    raise KeyError(token)


READ_STACK_OUTPUTS = "pulumi:pulumi:readStackOutputs"


def read_stack_outputs(name: str, state: list[dict[str, Any]], project: str, stack: str) -> dict[str, Any]:
    """The builtin provider's `readStackOutputs` (pkg/resource/deploy/builtins.go `readStackReference`, through
    pkg/backend/backend.go `GetStackOutputs`) for the stack being deployed, as the self-managed backend answers
    it: the root stack resource's outputs in the checkpoint as last written (pkg/backend/diy/state.go
    `getSnapshotStackOutputs`: an empty map for a stack with no deployment yet). Names are `stack`,
    `org/stack` or `organization/<project>/<stack>` (pkg/backend/diy/store.go; the organization is always
    "organization"); another stack is not emulated."""
    accepted = {stack, f"organization/{stack}", f"organization/{project}/{stack}"}
    if name not in accepted:
        raise LookupError(f'unknown stack "{name}"')
    root = next((s for s in state if s["type"] == STACK_TYPE), None)
    return {"name": name, "outputs": dict((root or {}).get("outputs") or {}), "secretOutputNames": []}


MOTO_INVOKES = ("aws:ec2/getInstances:getInstances", "aws:ec2/getInstance:getInstance")


def moto_invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
    """The instance lookups answered by moto's EC2 (with `provider="moto"` the account is moto's, and holds what
    was created there — an interrupted `up`'s instance too, which the state lacks), in pulumi-aws's shapes."""
    import boto3

    ec2 = boto3.client("ec2")
    if token == "aws:ec2/getInstances:getInstances":
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in (args.get("instanceTags") or {}).items()]
        filters.append({"Name": "instance-state-name", "Values": args.get("instanceStateNames") or ["running"]})
        found = [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]
        return {"id": "us-east-1", "ids": [i["InstanceId"] for i in found], "ipv6Addresses": [],
                "privateIps": [i["PrivateIpAddress"] for i in found if i.get("PrivateIpAddress")],
                "publicIps": [i["PublicIpAddress"] for i in found if i.get("PublicIpAddress")]}
    (i,) = [i for r in ec2.describe_instances(InstanceIds=[args["instanceId"]])["Reservations"] for i in r["Instances"]]
    return {"id": i["InstanceId"], "instanceState": i["State"]["Name"],
            "availabilityZone": i["Placement"]["AvailabilityZone"], "instanceType": i["InstanceType"],
            "subnetId": i.get("SubnetId"), "keyName": i.get("KeyName"), "privateIp": i.get("PrivateIpAddress"),
            "publicIp": i.get("PublicIpAddress"), "tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])}}


def pending_operations_warning(pending: list[dict[str, Any]]) -> str:
    """pkg/resource/deploy/deployment_executor.go `printPendingOperationsWarning`, in its words: printed by every
    non-preview deployment of a checkpoint holding pending operations; the deployment then goes on (a pending
    create's URN is not a resource of the checkpoint, so the step generator creates it again)."""
    return ("Attempting to deploy or update resources " + f"with {len(pending)} pending operations from previous "
            "deployment.\n" + "".join(f"  * {p['urn']}, interrupted while {p['pending']}\n" for p in pending)
            + "These resources are in an unknown state because the Pulumi CLI was interrupted while waiting for "
            "changes to these resources to complete. You should confirm whether or not the operations listed "
            "completed successfully by checking the state of the appropriate provider. For example, if you are using "
            "AWS, you can confirm using the AWS Console.\n\nOnce you have confirmed the status of the interrupted "
            "operations, you can repair your stack using `pulumi refresh` which will refresh the state from the "
            "provider you are using and clear the pending operations if there are any.\n\nNote that `pulumi refresh` "
            "will need to be run interactively to clear pending CREATE operations.")


def plain_destroy_refusal(state: list[dict[str, Any]]) -> str | None:
    """`pulumi destroy` without `--run-program` (Pulumi >= 3.182, pkg/engine/destroy.go `getDeleteHooks`,
    `newDestroySource`): refused before anything runs, preview included, when any resource of the state
    carries a before- or after-delete hook; the engine's words."""
    lines = [f"{s['urn']}: Resource has delete hooks registered, but the program is not running. Hooks: "
             + ", ".join(s["hooks"].get("before_delete", []) + s["hooks"].get("after_delete", []))
             for s in state if s.get("hooks", {}).get("before_delete") or s.get("hooks", {}).get("after_delete")]
    if not lines:
        return None
    return "\n".join(lines + ["You must run with the `--run-program` flag to use delete hooks during destroy."])


class StepError(Exception):
    """A step that failed; the message is the engine's."""


def execute(plan: Plan, apply_step: Callable[[Node], str], *, continue_on_error: bool) -> tuple[list[dict[str, Any]], str | None]:
    """`performPostSteps`: the antichains in order, each wholly before the next. A failed step cancels
    the deployment (`cancelDueToError` → `se.cancel()`): no later antichain starts; the steps of its own
    antichain were dispatched together, so all of them are taken to have run (the most the engine may
    have done). With --continue-on-error, later antichains leave out whatever a failed step depends on."""
    steps: list[dict[str, Any]] = []
    errored: list[Node] = []
    error: str | None = None
    cancelled = False
    for wave, chain in enumerate(plan.antichains):
        blocked: set[int] = set()
        for n in errored:
            g = plan.prev_graph if n in plan.prev_graph else plan.delete_graph
            blocked |= g.transitive_dependencies_of(n)
        failed_here = False
        for n in chain:
            entry = {"wave": wave, "urn": n.urn, "type": n.state["type"], "name": n.urn.split("::")[-1],
                     "custom": n.state["custom"]}
            if cancelled or id(n) in blocked:
                entry["outcome"] = "not started"
            else:
                try:
                    entry["outcome"] = apply_step(n)
                except StepError as e:
                    entry["outcome"], entry["error"] = "failed", str(e)
                    error = error or f"{n.urn}: {e}"
                    errored.append(n)
                    failed_here = True
            steps.append(entry)
        if failed_here and not continue_on_error:
            cancelled = True
    return steps, error


class MotoProvider:
    """pulumi-aws's Create and Delete for the types the AWS loop test keeps in moto: the evidence bucket
    and what keeps it safe, the instances (terminated) and the deadline stop's schedule (autonamed). Everything
    else exists only in the mocks.
    The TLS-only bucket policy is not put: this emulation talks plain HTTP to moto, which enforces
    `aws:SecureTransport` (it is checked as a document in tests/infra/test_infra.py)."""

    def __init__(self) -> None:
        import boto3

        self.s3 = boto3.client("s3")
        self.ec2 = boto3.client("ec2")
        self.scheduler = boto3.client("scheduler")

    def create(self, typ: str, inputs: dict[str, Any], outputs: dict[str, Any], rid: str) -> str | None:
        """Create as the provider would; returns the physical id when it is the cloud's (an instance)."""
        s3 = self.s3
        if typ == "aws:ec2/instance:Instance":
            tags = [{"Key": k, "Value": str(v)} for k, v in (inputs.get("tags") or {}).items()]
            try:  # an instance the test made beforehand (its id answered): it carries the program's tags
                self.ec2.describe_instances(InstanceIds=[rid])
                self.ec2.create_tags(Resources=[rid], Tags=tags)
                return rid
            except self.ec2.exceptions.ClientError:
                pass
            ami = inputs.get("ami") or "ami-0123456789abcdef0"  # moto launches any image id (describing its 1,301 takes 3 s)
            placement = {"AvailabilityZone": inputs["availabilityZone"]} if inputs.get("availabilityZone") else {}
            made = self.ec2.run_instances(ImageId=ami, InstanceType=inputs.get("instanceType", "g6e.xlarge"),
                                          MinCount=1, MaxCount=1, Placement=placement,
                                          TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
            outputs["arn"] = f"arn:aws:ec2:us-east-1:123456789012:instance/{made['Instances'][0]['InstanceId']}"
            return made["Instances"][0]["InstanceId"]
        if typ == "aws:scheduler/schedule:Schedule":
            # the provider's autonaming (a schedule given no name): the resource's name, "-", seven hex characters
            # drawn anew for each create (the mocks' fixed suffix would make a second create collide, which the real
            # one does not); its id is "<group>/<name>" (pulumi-aws `scheduler/schedule.go`)
            name = inputs.get("name") or f"{rid.removesuffix('-id')}-{uuid.uuid4().hex[:7]}"
            target = inputs.get("target") or {}
            self.scheduler.create_schedule(
                Name=name, ScheduleExpression=inputs.get("scheduleExpression", "rate(1 minute)"),
                FlexibleTimeWindow={"Mode": (inputs.get("flexibleTimeWindow") or {}).get("mode", "OFF")},
                Target={"Arn": target.get("arn") or "arn:aws:lambda:us-east-1:123456789012:function:x",
                        "RoleArn": target.get("roleArn") or "arn:aws:iam::123456789012:role/x"})
            outputs["name"] = name
            return f"default/{name}"
        if typ == "aws:s3/bucket:Bucket":
            try:
                s3.create_bucket(Bucket=outputs["bucket"], ObjectLockEnabledForBucket=bool(inputs.get("objectLockEnabled")))
            except s3.exceptions.BucketAlreadyOwnedByYou:
                pass
        elif typ == "aws:s3/bucketVersioning:BucketVersioning":
            s3.put_bucket_versioning(Bucket=inputs["bucket"], VersioningConfiguration={
                "Status": inputs["versioningConfiguration"]["status"]})
        elif typ == "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration":
            rules = [{"ApplyServerSideEncryptionByDefault": {
                "SSEAlgorithm": r["applyServerSideEncryptionByDefault"]["sseAlgorithm"]},
                "BucketKeyEnabled": bool(r.get("bucketKeyEnabled"))} for r in inputs["rules"]]
            s3.put_bucket_encryption(Bucket=inputs["bucket"], ServerSideEncryptionConfiguration={"Rules": rules})
        elif typ == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
            s3.put_public_access_block(Bucket=inputs["bucket"], PublicAccessBlockConfiguration={
                k: bool(inputs.get(k[0].lower() + k[1:])) for k in
                ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")})
        elif typ == "aws:s3/bucketOwnershipControls:BucketOwnershipControls":
            s3.put_bucket_ownership_controls(Bucket=inputs["bucket"], OwnershipControls={
                "Rules": [{"ObjectOwnership": inputs["rule"]["objectOwnership"]}]})

    def delete(self, typ: str, rid: str, inputs: dict[str, Any]) -> str:
        """Delete as the provider would; returns what was done (raises the AWS error, as the provider)."""
        s3 = self.s3
        if typ == "aws:s3/bucket:Bucket":
            s3.delete_bucket(Bucket=rid)  # force_destroy=False: a bucket holding objects answers BucketNotEmpty
        elif typ == "aws:s3/bucketVersioning:BucketVersioning":
            s3.put_bucket_versioning(Bucket=inputs["bucket"], VersioningConfiguration={"Status": "Suspended"})
        elif typ == "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration":
            s3.delete_bucket_encryption(Bucket=inputs["bucket"])
        elif typ == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
            s3.delete_public_access_block(Bucket=inputs["bucket"])
        elif typ == "aws:s3/bucketOwnershipControls:BucketOwnershipControls":
            s3.delete_bucket_ownership_controls(Bucket=inputs["bucket"])
        elif typ == "aws:s3/bucketPolicy:BucketPolicy":
            s3.delete_bucket_policy(Bucket=inputs["bucket"])
        elif typ == "aws:ec2/instance:Instance":
            self.ec2.terminate_instances(InstanceIds=[rid])
        elif typ == "aws:scheduler/schedule:Schedule":
            self.scheduler.delete_schedule(Name=rid.split("/", 1)[1])
        else:
            return "deleted (mocks only)"
        return "deleted"

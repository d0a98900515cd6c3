"""How a `pulumi destroy --run-program` tells the program it is a teardown, in a way no `pulumi up` can inherit.

Why this exists. The engine tells a program only whether it is a dry run (`dryRun` in the language host's
`RunRequest`), never whether it runs for an `up` or a destroy, and the teardown registers what the stack holds
without the plan's refusals or the look-up (infra/__main__.py). A plain `TRIALS_TEARDOWN=1`, exported once in a
shell and left there, turned the next `pulumi up` into a teardown too: a resize became a stop/start of an
unpreserved host, a deadline in the past went into the schedule.

So a teardown is asked for by `orchestrate destroy --stack S`, which writes a request file and runs `pulumi
destroy --run-program` with `TRIALS_TEARDOWN=<that file>`. The program takes it as a teardown only when all of
these hold, else it does what an `up` does (plan, look-up, refusals) and says why:
  - the file exists and parses (it is removed when the destroy ends);
  - it names this project and this stack (`pulumi.get_project()`, `pulumi.get_stack()`);
  - the process that wrote it still runs and is an ancestor of the program (Linux: /proc; elsewhere: it runs):
    the shell a value was copied into is not.
A destroy asked for any other way (the old `TRIALS_TEARDOWN=1 pulumi destroy --run-program`) is then run as an
`up` of the same config: past the deadline the plan refuses and nothing is deleted; before it, the delete hooks
refuse while the trial is unpreserved (infra/teardown.py), so nothing is lost either way.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

VARIABLE = "TRIALS_TEARDOWN"
FORMAT = "trials-teardown-request-v1"


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    project: str
    stack: str  # the stack's name (the last part of org/project/stack)
    pid: int
    at: str


def stack_name(stack: str) -> str:
    """`org/project/name` or `name` → `name`, as `pulumi.get_stack()` has it."""
    return stack.rsplit("/", 1)[-1]


def write_request(project: str, stack: str, *, pid: int | None = None, where: Path | None = None) -> Path:
    """A request file for a teardown of `project`/`stack` by process `pid` (this one); the caller removes it
    when the destroy ends."""
    fd, path = tempfile.mkstemp(prefix="trials-teardown-", suffix=".json", dir=where)
    body = Request(format=FORMAT, project=project, stack=stack_name(stack), pid=os.getpid() if pid is None else pid,
                   at=dt.datetime.now(dt.timezone.utc).isoformat())
    with os.fdopen(fd, "w") as f:
        f.write(body.model_dump_json())
    return Path(path)


def _ancestors(pid: int) -> list[int] | None:
    """The parent chain of `pid` (itself first) through /proc, or None where there is no /proc."""
    if not Path("/proc/self/stat").exists():
        return None
    chain: list[int] = []
    while pid > 0 and pid not in chain:
        chain.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
    return chain


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def teardown_asked(value: str | None, project: str, stack: str) -> tuple[bool, str | None]:
    """(True, None): a valid teardown request for this stack; (False, None): none set; (False, why): set, but not
    a request this program may take (the run then does what an `up` does)."""
    if not value:
        return False, None
    advice = f"a destroy is `orchestrate destroy --stack {stack}`, which asks for the teardown itself"
    path = Path(value)
    try:
        req = Request.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as e:
        why = "names no request file" if isinstance(e, OSError) else f"names a file that is not a request ({type(e).__name__})"
        return False, f"{VARIABLE}={value[:80]} {why}: this run does what `pulumi up` does ({advice})"
    if req.format != FORMAT or req.project != project or req.stack != stack_name(stack):
        return False, (f"{VARIABLE} names a request for {req.project}/{req.stack}, not {project}/{stack}: this run does "
                       f"what `pulumi up` does ({advice})")
    chain = _ancestors(os.getpid())
    mine = req.pid in chain if chain is not None else _alive(req.pid)
    if not mine:
        return False, (f"{VARIABLE} names a request of process {req.pid}, which "
                       + ("no longer runs" if not _alive(req.pid) else "did not start this run")
                       + f" (written {req.at}): this run does what `pulumi up` does ({advice})")
    return True, None

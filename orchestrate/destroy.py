"""`orchestrate destroy`: the one way a trial's stack is torn down — `pulumi destroy --run-program` asked for
as a teardown through a request no later `pulumi up` can inherit (infra/destroy_request.py).

Why not the CLI alone. The program cannot tell a destroy from an `up` (the engine says only whether a run is a
preview), so the teardown is named by a request file this process writes and removes, in the environment of the
one `pulumi` process it starts. The delete hooks still refuse while the trial is unpreserved or while an instance
of it exists that the stack does not hold (infra/teardown.py); this command adds nothing that could let a delete
through, only what the user should see: the command run, and Pulumi's own output and prompt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from evidence.errors import UserError
from infra.destroy_request import VARIABLE, write_request
from infra.outputs import passphrase_problem


class DestroyRefused(UserError, RuntimeError):
    """The destroy could not be started here; the message says what to do."""


def project_name(work_dir: Path) -> str:
    import yaml

    try:
        return str((yaml.safe_load((work_dir / "Pulumi.yaml").read_text()) or {})["name"])
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        raise DestroyRefused(f"{work_dir / 'Pulumi.yaml'} cannot be read ({type(e).__name__}: {e}): run `orchestrate "
                             "destroy` in the project's directory, or give --work-dir") from None


def run_destroy(stack: str, work_dir: Path, *, yes: bool, preview_only: bool,
                say: Callable[[str, str], None]) -> int:
    """Runs the teardown of `stack`; returns `pulumi`'s exit status (0: the stack's resources are deleted but the
    evidence and what keeps it safe, which are retained)."""
    if shutil.which("pulumi") is None:
        raise DestroyRefused("`orchestrate destroy` runs `pulumi destroy --run-program`: put the pulumi CLI on PATH")
    problem = passphrase_problem(stack, work_dir)
    if problem:
        raise DestroyRefused(problem)
    project = project_name(work_dir)
    argv = ["pulumi", "destroy", "--run-program", "--stack", stack]
    argv += ["--yes"] if yes else []
    argv += ["--preview-only"] if preview_only else []
    private = Path(tempfile.mkdtemp(prefix="trials-teardown-"))
    request = write_request(project, stack, where=private)
    say("destroy", f"{' '.join(argv)} (in {work_dir}, with {VARIABLE} naming this run's request: refused, deleting "
                   "nothing, while the trial is unpreserved or a host of it is outside the stack)")
    try:
        return subprocess.run(argv, cwd=work_dir, env={**os.environ, VARIABLE: str(request)}).returncode
    finally:
        request.unlink(missing_ok=True)
        shutil.rmtree(private, ignore_errors=True)

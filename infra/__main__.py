"""Pulumi entry (`main: infra/`): read `trials:cluster` and `aws:region`, then build the cluster.

How Pulumi starts this file, and why the first lines below exist: for a directory `main`, the engine
runs the program with that directory as its working directory and its entry point "." (pulumi/pulumi
`pkg/engine/project.go`, `getPwdMain`), and Python's language host runs it with
`runpy.run_path(".", run_name="__main__")` (`sdk/python/cmd/pulumi-language-python-exec`), which puts
"." — this directory — first on `sys.path`. Every module of infra/ is then also a top-level module, and
one named like a package (`infra/evidence.py` until #31) shadowed that package for the whole program.
No module here is named like an importable one (tests/infra/test_entry.py), and this entry takes the
directory off `sys.path` and puts its own checkout first, so that `infra`, `evidence` and `training`
are this checkout's packages whatever the virtualenv has installed.

A refused stack (invalid config, over budget, a deadline that is missing, past or later than the paid
hours) ends as a `RunError`: Pulumi prints its message alone — the same words `orchestrate plan`
prints for the same stack — instead of a Python traceback.

`pulumi destroy` must run the program (`--run-program`) so that the hooks refusing an unpreserved
trial exist; by then the deadline has usually passed and the plan would refuse, so the destroy is
run with `TRIALS_TEARDOWN=1` in its environment: the program then registers what the stack holds
without refusing the plan and without looking anything up (an environment variable, not stack
config, so that no later `pulumi up` inherits it)."""

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import pulumi  # noqa: E402 — after the path is settled

from infra.plan import trial_config  # noqa: E402
from infra.program import build  # noqa: E402

TEARDOWN = os.environ.get("TRIALS_TEARDOWN") == "1"

try:
    _cluster = dict(pulumi.Config("trials").require_object("cluster"))
    if TEARDOWN:  # the key may be gone from this machine by now; deleting needs no key
        _cluster["ssh_public_key"] = None
    build(trial_config(_cluster, pulumi.Config("aws").require("region")), teardown=TEARDOWN)
except ValueError as e:  # the plan's StackConfigError and BudgetError are ValueErrors
    raise pulumi.RunError(str(e)) from None

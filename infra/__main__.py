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
trial exist; by then the deadline has usually passed and the plan would refuse, so the destroy is a
teardown: the program registers what the stack holds without refusing the plan and without looking
anything up. Only `orchestrate destroy` asks for one, through a request no later `pulumi up` can inherit
(infra/destroy_request.py); a `TRIALS_TEARDOWN` that is not such a request is said and ignored: the run
then does what an `up` does."""

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import pulumi  # noqa: E402 — after the path is settled

from infra.destroy_request import VARIABLE, teardown_asked  # noqa: E402
from infra.held import keep_previous, read_previous  # noqa: E402
from infra.plan import trial_config  # noqa: E402
from infra.program import build  # noqa: E402

# first, before anything can refuse: the stack's record exported again, so that a refused run keeps it (infra/held.py)
_previous = read_previous()
keep_previous(_previous)
TEARDOWN, _ignored = teardown_asked(os.environ.get(VARIABLE), pulumi.get_project(), pulumi.get_stack())
if _ignored:
    pulumi.log.warn(_ignored)

try:
    _cluster = dict(pulumi.Config("trials").require_object("cluster"))
    if TEARDOWN:  # the key may be gone from this machine by now; deleting needs no key
        _cluster["ssh_public_key"] = None
    build(trial_config(_cluster, pulumi.Config("aws").require("region")), teardown=TEARDOWN, previous=_previous)
except ValueError as e:  # the plan's StackConfigError and BudgetError are ValueErrors
    raise pulumi.RunError(str(e) + (f"\n({_ignored})" if _ignored else "")) from None

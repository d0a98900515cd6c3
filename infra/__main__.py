"""Pulumi entry (`main: infra/`): read `trials:cluster` and `aws:region`, then build the cluster.

A refused stack (invalid config, over budget, a deadline that is missing, past or later than the paid
hours) ends as a `RunError`: Pulumi prints its message alone — the same words `orchestrate plan`
prints for the same stack — instead of a Python traceback.

`pulumi destroy` must run the program (`--run-program`) so that the hook refusing an unpreserved
trial exists; by then the deadline has usually passed and the plan would refuse, so the destroy is
run with `TRIALS_TEARDOWN=1` in its environment: the program then registers what the stack holds
without refusing the plan (an environment variable, not stack config, so that no later `pulumi up`
inherits it)."""

import os

import pulumi

from infra.plan import TrialConfig
from infra.program import build

TEARDOWN = os.environ.get("TRIALS_TEARDOWN") == "1"

try:
    _cluster = dict(pulumi.Config("trials").require_object("cluster"))
    if TEARDOWN:  # the key may be gone from this machine by now; deleting needs no key
        _cluster["ssh_public_key"] = None
    build(TrialConfig.model_validate({**_cluster, "region": pulumi.Config("aws").require("region")}),
          teardown=TEARDOWN)
except ValueError as e:  # pydantic's ValidationError and the plan's BudgetError are ValueErrors
    raise pulumi.RunError(str(e)) from None

"""Pulumi entry (`main: infra/`): read `trials:cluster` and `aws:region`, then build the cluster.

A refused stack (invalid config, over budget, a deadline that is missing, past or later than the paid
hours) ends as a `RunError`: Pulumi prints its message alone — the same words `orchestrate plan`
prints for the same stack — instead of a Python traceback."""

import pulumi

from infra.plan import TrialConfig
from infra.program import build

try:
    _cluster = pulumi.Config("trials").require_object("cluster")
    build(TrialConfig.model_validate({**_cluster, "region": pulumi.Config("aws").require("region")}))
except ValueError as e:  # pydantic's ValidationError and the plan's BudgetError are ValueErrors
    raise pulumi.RunError(str(e)) from None

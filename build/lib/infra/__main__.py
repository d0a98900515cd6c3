"""Pulumi entry (`main: infra/`): read `trials:cluster` and `aws:region`, then build the cluster."""

import pulumi

from infra.plan import TrialConfig
from infra.program import build

_cluster = pulumi.Config("trials").require_object("cluster")
build(TrialConfig.model_validate({**_cluster, "region": pulumi.Config("aws").require("region")}))

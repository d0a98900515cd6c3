"""The destroy gate: the one resource `pulumi destroy` deletes first, whose hook refuses the destroy
while the trial is unpreserved (infra/teardown.py) — so that a refused destroy deletes nothing.

Why a resource of its own. The engine deletes a stack in waves, dependents first (pulumi/pulumi
`pkg/resource/deploy/step_generator.go` `ScheduleDeletes`), each wave wholly before the next, and a failed
step cancels every later wave (`deployment_executor.go` `performPostSteps`; `step_executor.go`
`cancelDueToError`). A `before_delete` hook runs inside its own resource's step (`step.go`
`DeleteStep.Apply`). The gate depends on every other resource of the stack, so it is the only resource
of the first wave: its hook runs before any other step, and its refusal leaves everything in place —
under --continue-on-error too, since the engine then skips whatever a failed step depends on.

Why a component, not a cloud resource. `DeleteStep.Apply` runs a component's hooks as it runs a custom
resource's (only the provider's Delete is skipped), so the gate needs nothing in the account, no
permission and no API call. And under `pulumi destroy --run-program` the engine (re)creates components
the program registers and then deletes them (`GenerateSteps` in destroy mode), whereas a custom resource
the stack does not hold yet is a skipped create, never deleted: a stack created before the gate existed
is therefore gated by its first destroy too. (In destroy mode a registration that depends on a resource
the state lacks is skipped as well; the gate the state already holds is then deleted from its old state —
still first, since its recorded dependencies are all there: tests/infra/test_destroy.py.)

Its dependencies are the four concerns: the SDK turns a local component named in `depends_on` into every
custom resource under it (`pulumi/runtime/rpc.py` `_add_dependency`), which is what the engine records.
Its inputs record the bucket its hook reads.
"""

from __future__ import annotations

import pulumi

from infra.bucket import Evidence
from infra.concern import PACKAGE
from infra.plan import TrialConfig
from infra.teardown import before_gate_delete


class DestroyGate(pulumi.ComponentResource):
    """`<trial>-destroy-gate`, depending on every resource of `concerns`, with the refusing hook."""

    def __init__(self, cfg: TrialConfig, evidence: Evidence, concerns: list[pulumi.Resource]) -> None:
        hook = pulumi.ResourceHook(f"{cfg.trial}-destroy-gate",
                                   before_gate_delete(cfg.trial, cfg.region, cfg.abandon_unpreserved))
        super().__init__(f"{PACKAGE}:DestroyGate", f"{cfg.trial}-destroy-gate",
                         {"trial": cfg.trial, "bucket": evidence.bucket.bucket, "prefix": evidence.prefix},
                         pulumi.ResourceOptions(depends_on=concerns,
                                                hooks=pulumi.ResourceHookBinding(before_delete=[hook])))
        self.register_outputs({"trial": cfg.trial, "bucket": evidence.bucket.bucket})

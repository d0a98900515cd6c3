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

What the gate cannot cover: a stack whose state lacks something the gate depends on and never held the
gate — a first `up` that failed before its end (the gate registers last). Then the gate is a skipped
create and the first wave is whatever has no dependents. So the gate is not the only line: every child of
the concerns carries the same check as its own `before_delete` hook (infra/concern.py), and whichever of
them a destroy reaches first refuses before its provider's Delete; the gate only makes the usual case one
refusal instead of one per resource of the first wave.

Its dependencies are the four concerns: the SDK turns a local component named in `depends_on` into every
custom resource under it (`pulumi/runtime/rpc.py` `_add_dependency`), which is what the engine records.
Its inputs record the trial's bucket (for the reader of the state; the check reads each host's own tag).
"""

from __future__ import annotations

import pulumi

from infra.bucket import Evidence
from infra.concern import PACKAGE
from infra.plan import TrialConfig
from infra.teardown import DeleteCheck


class DestroyGate(pulumi.ComponentResource):
    """`<trial>-destroy-gate`, depending on every resource of `concerns`, with the refusing hook (the run's
    check, the same every resource's hook asks)."""

    def __init__(self, cfg: TrialConfig, evidence: Evidence, concerns: list[pulumi.Resource], check: DeleteCheck) -> None:
        hook = pulumi.ResourceHook(f"{cfg.trial}-destroy-gate", check.hook,
                                   pulumi.ResourceHookOptions(on_dry_run=True))
        super().__init__(f"{PACKAGE}:DestroyGate", f"{cfg.trial}-destroy-gate",
                         {"trial": cfg.trial, "bucket": evidence.bucket.bucket, "prefix": evidence.prefix},
                         pulumi.ResourceOptions(depends_on=concerns,
                                                hooks=pulumi.ResourceHookBinding(before_delete=[hook])))
        self.register_outputs({"trial": cfg.trial, "bucket": evidence.bucket.bucket})

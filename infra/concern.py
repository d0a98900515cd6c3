"""The base of each infra concern's `ComponentResource` (network, hosts, guards, evidence): the one
place that says how a concern's resources are parented and named, so that the four cannot drift apart.

Stacks created before the concerns existed hold every resource directly under the stack. Parenting a
resource under a component changes its URN, and the engine would read a changed URN as "delete the old
resource, create a new one": every host, with the evidence on its disk, replaced. So each child also
carries the alias `Alias(parent=ROOT_STACK_RESOURCE)` — its own name and type, parented by the stack —
which is the URN those stacks recorded: the engine then matches the old resource to the new URN and
changes nothing.

Every child whose delete would delete something in the account carries the run's refusing hook
(infra/teardown.py): whichever of a stack's resources a `pulumi destroy` reaches first, from whatever state
an `up` left, refuses while the trial is unpreserved. A retained child (the evidence) deletes nothing and
carries none.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.plan import TrialConfig

PACKAGE = "trials:infra"  # a component's type is trials:infra:<Kind>: the engine requires pkg:module:type


class Concern(pulumi.ComponentResource):
    """One concern of a trial's cluster. Its logical name is `<trial>-<kind>`; its children keep the
    names they had under the stack (`<trial>-...`), which the resources' physical names, tags and the
    aliases above depend on."""

    def __init__(self, kind: str, cfg: TrialConfig, refuse: pulumi.ResourceHook,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{PACKAGE}:{kind}", f"{cfg.trial}-{kind.lower()}", None, opts)
        self.cfg, self.refuse = cfg, refuse
        self.tags = {"trial": cfg.trial, "managed-by": "trials"}

    def name(self, *parts: Any) -> str:
        """Every name of a trial starts with the trial: two trials share one account without clashing."""
        return "-".join([self.cfg.trial, *map(str, parts)])

    def child(self, **options: Any) -> pulumi.ResourceOptions:
        """A child's options: parented here, aliased to the URN it had under the stack, and — unless it is
        retained — refusing its delete while the trial is unpreserved (see above)."""
        before_create = options.pop("before_create", None)
        if not options.get("retain_on_delete"):
            options["hooks"] = pulumi.ResourceHookBinding(before_delete=[self.refuse], before_create=before_create)
        return pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)],
                                      **options)

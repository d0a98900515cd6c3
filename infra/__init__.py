"""The Pulumi program for a trial cluster: hosts, volumes, network, guards, evidence bucket, destroy gate.

`plan` (config, estimate, refusal), `prices` and `userdata` are plain Python and test without
Pulumi; `program.build` registers the resources; `__main__` is what Pulumi's engine runs (from inside
this directory, which is why no module here is named like an importable package: see `__main__`);
`outputs` is the shape `orchestrate` reads from `pulumi stack output --json`; `teardown` is the check every
delete hook asks (nothing deleted while a live host's evidence is unpreserved), `existing` what an `up` finds
of the trial before it changes anything, `credentials` the stack's own AWS identity for both.
"""

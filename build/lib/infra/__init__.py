"""The Pulumi program for a trial cluster: hosts, volumes, network, guards, evidence bucket.

`plan` (config, estimate, refusal), `prices` and `userdata` are plain Python and test without
Pulumi; `program.build` registers the resources and stays importable under Pulumi's mocks;
`outputs` is the shape `orchestrate` reads from `pulumi stack output --json`.
"""

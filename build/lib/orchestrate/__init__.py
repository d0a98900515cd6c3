"""The `orchestrate` CLI: plan, stage, launch, supervise, collect, preserve, tear down.

Today it drives the embedded local cluster up to committed, prepared inputs; the later stages land
with issues #3–#8.
"""

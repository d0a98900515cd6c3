"""The `orchestrate` CLI and the trial's stages: plan, cluster, stage, prepare, launch, supervise,
collect, select, evaluate, serve, report, preserve, tear down (orchestrate/stages/ holds them as code).
"""

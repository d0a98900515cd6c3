"""What runs on a training host: seeds, tasks and checker, corpus, arms, checkpoints, evaluation.

Never imports `orchestrate` or `infra`: this package (plus `evidence`) is what gets installed on a
GPU host. Entry point: `python -m training …`.
"""

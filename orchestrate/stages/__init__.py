"""The trial's stages as code, in the order of a trial's life (DESIGN.md, "The trial's life").

Each stage is one function with its inputs as parameters and its outcome as the returned value; what
it tells the person running it goes through the `Progress` it is handed (orchestrate/progress.py).
`run_trial` (orchestrate/trial.py) calls them in this order; a command or a benchmark that needs one stage
calls it too, never the CLI.

    plan                 stages/plan.py       plan_arm (`plan`), staging_upload
    cluster              stages/cluster.py    write_cluster (`up`), kept_host_keys, load_cluster, alarm_check
    judge                orchestrate/study.py judge_study (also `validate`), and orchestrate/names.py
                                              judge_names: the cases and the trial names, nothing written
    seed, prepare        stages/prepare.py    materialize_seed, prepare
    stage, place, train  stages/train.py      place_arms (the placement and the gates'
                                              attainability committed), train_arms (GuardStopped)
    select → report      stages/evaluate.py   select_primary, evaluate_test,
                                              serve_once (serve_probe, also `probe`), write_trial_report
    preserve             stages/preserve.py   anchor_home, preserve_home (also `preserve`), guard_stop
    (every stage)        stages/clock.py      StageClock: seconds per stage, for the run's record

Launch, supervision, restart and collection happen inside `train_arms`, through the backend
(orchestrate/backends/); teardown is `orchestrate down` (orchestrate/cloud.py).
"""

from __future__ import annotations

from enum import Enum


class Stage(str, Enum):
    """The stages `orchestrate run` times; their values are the keys of the run record's
    `stages_seconds`, so a record reads the same whichever code wrote it."""

    JUDGE = "judge"
    SEED = "seed"
    PREPARE = "prepare"
    PLACEMENT = "placement"
    TRAIN = "train"
    SELECT = "select"
    SCORE = "score"
    SERVE = "serve"
    REPORT = "report"
    PRESERVE = "preserve"

"""Seconds per stage of one trial, and what scoring took per arm: the run record's figures
(orchestrate/trial.py writes the record)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from orchestrate.stages import Stage


class StageClock:
    """A stage entered twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.scoring: dict[str, dict[str, Any]] = {}
        self.current: Stage | None = None  # the stage running now: what an interruption names

    @contextlib.contextmanager
    def __call__(self, stage: Stage) -> Iterator[None]:
        t = time.monotonic()
        self.current = stage
        try:
            yield
            self.current = None  # ended: a stage that raised stays current, for the run's ending to name
        finally:
            self.seconds[stage.value] = self.seconds.get(stage.value, 0.0) + time.monotonic() - t

"""Seconds per stage of one `orchestrate run`, and the run's machine-readable record."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

from orchestrate.progress import Progress
from orchestrate.stages import Stage


class StageClock:
    """A stage entered twice adds up. The record is written however the run ends (once anything
    was prepared, or when `--record` names the file), so a failed run still says how far it got."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.about: dict = {}
        self.scoring: dict[str, dict] = {}
        self.exit: int | None = 0
        self.path: Optional[Path] = None

    @contextlib.contextmanager
    def __call__(self, stage: Stage) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.seconds[stage.value] = self.seconds.get(stage.value, 0.0) + time.monotonic() - t

    def write(self, path: Optional[Path], trials: Path, home: Optional[Path], started: float,
              out: Progress) -> None:
        import datetime as dt

        from evidence.canonical import json_bytes, write_bytes_atomic
        from evidence.covered import CoveredFileError, guard_writes

        now = dt.datetime.now(dt.timezone.utc)
        if path is None:
            if home is None:  # refused before anything was prepared: nothing is written unless asked for
                return
            path = trials / "run-records" / f"{home.name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
        data = json_bytes({"format": "trial-run-record-v1", "command": sys.argv, "ended_at": now.isoformat(),
                           "exit": self.exit, **self.about, "stages_seconds": self.seconds,
                           "total_seconds": time.monotonic() - started, "scoring": self.scoring})
        try:  # --record is the user's choice of path: never a trial home's evidence
            for p, d in guard_writes({path: data}).items():
                write_bytes_atomic(p, d)
            self.path = path
        except (CoveredFileError, OSError) as e:  # the run's own outcome stands; only its record is missing
            out.line(f"the run record is not written: {e}")

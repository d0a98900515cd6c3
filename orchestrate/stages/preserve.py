"""preserve: the home's commitments anchored in the evidence store as they are made, and at the end
every file uploaded content-addressed and read back — the condition for any host to be taken down,
also when the controller's guard stops a trial midway."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from evidence.anchors import anchor_log
from evidence.canonical import write_json_atomic
from evidence.errors import UserError
from evidence.stores import Anchors, PreservationError, Preserved, open_store
from evidence.stores import preserve as run_preserve
from orchestrate.progress import Progress
from orchestrate.transport import TransportError
from training.errors import TrainError
from training.results import finished

if TYPE_CHECKING:
    from orchestrate.stages.train import GuardStopped
    from training.config import Resolved



class HostParts(Protocol):
    """What preservation asks of the backend the ranks ran on: the checkpoint payloads each host
    preserves from where they are (None: every payload is in the home)."""

    def host_parts(self, url: str) -> dict[str, dict[str, dict[str, Any]]] | None: ...


GUARD_STOP_EXIT = 3
"""`orchestrate run`'s exit status when the controller's guard stopped training (deadline or transfer
guard near) and what the trial had so far was preserved."""


def anchor_home(home: Path, url: str, progress: Progress) -> dict | None:
    """Every commitment of the home's log not yet in the store, anchored there (`evidence.anchors`);
    returns the log's anchors in the store (what preservation records)."""

    got = anchor_log(home, open_store(url))
    if got and got["added"]:
        progress.say("anchor", f"{got['added']} commitment(s) of {home.name} anchored in {url}")
    return got


def preserve_home(home: Path, url: str, progress: Progress, backend: HostParts | None = None,
                  leave_host_payloads: str | None = None) -> Preserved:
    """Every file of the home into the evidence store, each object read back, and — with the backend
    the ranks ran on (anything with `host_parts`) — every host's checkpoint payloads from that host;
    raises TrainError."""

    anchors = anchor_home(home, url, progress)
    try:
        with progress.status(f"preserving {home} → {url}…"):
            parts = backend.host_parts(url) if backend is not None else None
            rec = run_preserve(home, url, trial=home.resolve().name, host_parts=parts,
                               leave_host_payloads=leave_host_payloads,
                               anchors=anchors and Anchors(prefix=anchors["prefix"], count=anchors["count"]))
    except (PreservationError, TransportError, OSError) as e:
        raise TrainError(f"preservation failed, nothing may be torn down: {e}") from None
    progress.say("preserve", f"{rec.files} files, {rec.bytes / 1e6:,.1f} MB "
                 f"({rec.uploaded_bytes / 1e6:,.1f} MB uploaded now), every object read back")
    return rec


def guard_stop(home: Path, stop: GuardStopped, cfg: Resolved, url: str, progress: Progress,
               backend: HostParts | None = None) -> int:
    """Record what the guard stopped in the home (`stops/<time>.json`) and preserve every file the
    controller holds, so the hosts can be taken down without losing the trial: the finished arms, the
    stopped arm's rank logs, the commitments. The stopped arm's checkpoints stay where its ranks wrote
    them (on SSH hosts, their volumes, which the cloud's deadline stops rather than deletes); `run`
    again, with a later deadline, resumes from them. Returns the run's exit status."""
    try:
        at = dt.datetime.now(dt.timezone.utc)
        done = [a.name for a in cfg.experiment.arms if a.trains and finished(home, a.name, a.world_size)]
        rel = f"stops/{at.strftime('%Y%m%dT%H%M%S%fZ')}.json"
        write_json_atomic(home / rel, {"format": "trial-stop-v1", "at": at.isoformat(), "stopped_by": "guard",
                                       "guard": stop.said, "arm": stop.arm, "finished_arms": done,
                                       "rank_logs": f"logs/{stop.arm}"})
        progress.say("stopped", f"{stop.arm} by the controller's guard: {stop.said}", style="bold yellow")
        progress.line(f"  finished before it: {', '.join(done) or 'none'}; recorded in {home / rel}")
        rec = preserve_home(home, url, progress, backend)
    except (UserError, OSError, ValueError) as e:  # the stop stands; what is on disk stays where it is
        progress.say("error:", f"stopped by the guard ({stop.said}), and then: {e}", style="bold red")
        return 2
    progress.line(f"the trial so far is preserved ({rec.store}{rec.index}): `orchestrate down --home {home}` "
                  f"may proceed; `orchestrate run` again, with a later deadline, resumes where it stopped")
    return GUARD_STOP_EXIT

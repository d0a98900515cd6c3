"""A group of rank processes watched as one, and restarted as one.

`run_group` watches started ranks (anything with Popen's interface: a local process, an SSH rank):
when any rank fails — a non-zero exit, a heartbeat that stopped changing, a host gone silent — every
other rank is stopped (SIGTERM, then SIGKILL after a grace period), by its own pid only, so a failed
rank never leaves peers blocked in a collective. Why the group ended is a `Reason`, recorded with
the failure (the recovery trial's report stores its value). `supervise` is the restart rule: the
same membership again, with `--resume` from the latest common checkpoint, unless the failure was one
a restart would meet again.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Sequence

from evidence.attempts import next_attempt
from evidence.errors import USER_ERROR_EXIT
from training.errors import PEER_FAILED_EXIT

PEER_EXIT_WAIT_S = 5.0
"""How long the supervisor lets the other ranks exit on their own once the first to fail says it
stopped because of another (`PEER_FAILED_EXIT`), before it stops them."""

SUPERVISOR_STOPS = (-signal.SIGTERM, -signal.SIGKILL)
"""How a rank that the supervisor stopped ends (Popen's status for a death by that signal)."""


class Reason(StrEnum):
    """Why a group failed. A `str`: records keep the value (`"exit"`), byte for byte as before."""

    EXIT = "exit"  # a rank exited non-zero
    HEARTBEAT = "heartbeat"  # a rank's heartbeat stopped changing (a hang)
    UNREACHABLE = "unreachable"  # a rank's host stopped answering (cut off)
    LOST = "lost"  # its connection died and the rank is gone, its exit status unknown
    GUARD = "guard"  # the controller stopped the group: its deadline or a transfer guard


class LeftRunning(KeyboardInterrupt):
    """The controller was interrupted while ranks that run detached on their hosts were still running:
    they were left to run (a later controller attaches to them). `where` says, per rank, where."""

    def __init__(self, why: str, where: list[str]):
        super().__init__(why)
        self.where = where


@dataclass
class GroupResult:
    codes: list[int]
    logs: list[Path]
    seconds: float
    first_failure: int | None  # the rank whose failure was observed first, if any
    reason: Reason | None = None  # why it failed (None: it did not)
    guard: str | None = None  # what the guard said
    failure_observed_at: float | None = None  # unix time the supervisor saw it
    survivors_stopped_at: float | None = None  # unix time every other rank had exited

    def __post_init__(self) -> None:
        if self.reason is not None:  # a plain string of Reason's values is taken as that reason
            self.reason = Reason(self.reason)

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    @property
    def refused(self) -> int | None:
        """The rank whose refusal of its own arguments, inputs or environment (`USER_ERROR_EXIT`)
        failed the group, if that is what failed it: the first failure seen, or, when that was a
        rank stopped by another's failure (`PEER_FAILED_EXIT`, never a cause), the one rank whose
        exit was neither that nor the supervisor's own stop. Anything else (a crash, a kill, a busy
        GPU, a silent host) is not a refusal, and the group may be restarted."""
        r = self.first_failure
        if self.reason is not Reason.EXIT or r is None:
            return None
        if self.codes[r] == PEER_FAILED_EXIT:
            causes = [q for q, c in enumerate(self.codes) if c not in (0, PEER_FAILED_EXIT, *SUPERVISOR_STOPS)]
            r = causes[0] if len(causes) == 1 else r
        return r if self.codes[r] == USER_ERROR_EXIT else None

    def failure_text(self, lines: int = 20) -> str:
        if self.reason is Reason.GUARD:
            return f"stopped by the controller's guard: {self.guard}"
        r = self.first_failure if self.first_failure is not None else 0
        tail = self.logs[r].read_text(errors="replace").splitlines()[-lines:]
        why = {Reason.HEARTBEAT: "stopped making progress", Reason.UNREACHABLE: "became unreachable",
               Reason.LOST: "ended after its connection died (exit status unknown)"}.get(
            self.reason, f"exited {self.codes[r]}")
        return f"rank {r} {why} (log {self.logs[r]}):\n" + "\n".join(tail)


def run_group(procs: Sequence[Any], logs: list[Path], *, grace_s: float = 10.0,
              echo: Callable[[str], None] | None = None,
              heartbeats: Sequence[Callable[[], float | None]] = (), stale_s: float = 600.0,
              guard: Callable[[], str | None] | None = None) -> GroupResult:
    """Supervise started rank processes (anything with Popen's poll/send_signal/kill/wait/returncode).

    A rank fails when it exits non-zero or, once it has written a heartbeat, when the heartbeat has
    not changed for `stale_s` seconds (a hang, e.g. a peer stuck in a collective). Either way every
    other rank is stopped (SIGTERM, SIGKILL after `grace_s`), by pid. `guard()` (the controller's
    deadline and transfer watch) is asked every pass; a reason from it stops every rank the same way.
    """
    t0 = time.monotonic()
    sup = _Supervision()
    left: list[Any] = []
    try:
        with open(logs[0]) as follow:
            sup.run(list(procs), grace_s, follow, echo, list(heartbeats), stale_s, guard)
    except KeyboardInterrupt as e:  # the operator's Ctrl-C (or the controller's SIGTERM)
        running = [p for p in procs if p.poll() is None]
        if running and all(hasattr(p, "detach") for p in running):  # detached on their hosts: leave them
            for p in running:
                p.detach()
            left = running
            raise LeftRunning(str(e) or "interrupted", [getattr(p, "where", str(p)) for p in running]) from None
        raise
    finally:
        for p in procs:  # only ever our own children, by pid
            if p not in left and p.poll() is None:
                p.kill()
                p.wait()
    return GroupResult([p.returncode for p in procs], logs, time.monotonic() - t0, sup.failed,
                       sup.reason, sup.guard, sup.observed_at, sup.stopped_at)


class _Supervision:
    failed: int | None = None
    reason: Reason | None = None
    guard: str | None = None
    observed_at: float | None = None
    stopped_at: float | None = None

    def run(self, procs: list[Any], grace_s: float, follow, echo,
            heartbeats: list[Callable[[], float | None]], stale_s: float,
            guard: Callable[[], str | None] | None) -> None:
        pending = [""]

        def drain() -> None:  # echo whole lines only; a partial line waits for its end
            text = pending[0] + follow.read()
            *lines, pending[0] = text.split("\n")
            for line in lines:
                if echo:
                    echo(line)

        seen: dict[int, tuple[float, float]] = {}  # rank -> (heartbeat mtime, when it last changed)
        peers_since: float | None = None  # when a rank first exited PEER_FAILED_EXIT
        while True:
            drain()
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            now = time.monotonic()
            stale = []
            for r, hb in enumerate(heartbeats):
                m = hb()
                if m is None:
                    continue
                if r not in seen or seen[r][0] != m:
                    seen[r] = (m, now)
                elif codes[r] is None and now - seen[r][1] > stale_s:
                    stale.append(r)
            said = guard() if guard and not failed and not stale else None
            if failed and all(codes[r] == PEER_FAILED_EXIT for r in failed) and not stale:
                # only ranks stopped by another's failure so far: that other rank is still on its way
                # out and says why with its own exit status (a refusal is not restarted); give it a
                # moment rather than stop it by signal and lose that status
                peers_since = peers_since if peers_since is not None else now
                if now - peers_since < PEER_EXIT_WAIT_S and any(c is None for c in codes):
                    time.sleep(0.05)
                    continue
            if failed or stale or said:
                self.observed_at = time.time()
                if failed:
                    self.failed, self.reason = failed[0], Reason(getattr(procs[failed[0]], "why", None) or Reason.EXIT)
                elif stale:
                    self.failed, self.reason = stale[0], Reason.HEARTBEAT
                else:
                    self.reason, self.guard = Reason.GUARD, said
                    if echo:
                        echo(f"guard: {said}; stopping every rank")
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.02)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                self.stopped_at = time.time()
                drain()
                return
            if all(c == 0 for c in codes):
                drain()
                return
            time.sleep(0.1)


Launch = Callable[[list[str], Path, dict[str, str]], GroupResult]
"""Start and supervise one attempt of a group: (extra arguments, log directory, environment) → result."""


def supervise(launch: Launch, *, log_root: Path, max_restarts: int = 1,
              first_env: dict[str, str] | None = None, env: dict[str, str] | None = None,
              echo: Callable[[str], None] | None = None, resume_first: bool = False,
              can_resume: Callable[[], bool] | None = None,
              attach: Callable[[Path], GroupResult] | None = None) -> list[GroupResult]:
    """Run the group; after a failure, restart the same membership with `--resume`.

    The same rule serves ranks on this machine and on SSH hosts: only `launch` differs.
    `can_resume()` is asked before each restart (default: yes); when it says no — the group failed
    before its first common checkpoint — the restart begins from the seed instead.
    `first_env` applies to the first attempt only (fault injection for recovery trials). A group
    is not restarted after the guard stopped it, nor after a rank refused its own arguments, inputs
    or environment (`refused`): the restart would meet the same refusal, after loading everything
    again. Returns every attempt's result, in order; each attempt's logs are under
    `log_root/attempt-<n>/`. `attach(log_dir)` is the first attempt when given: it follows a group an
    earlier controller started and left running, its logs continued in that controller's last attempt
    directory; it counts as that attempt, not as a restart.
    """
    attempts: list[GroupResult] = []
    start = next_attempt(log_root)
    for i in range(max_restarts + 1):
        resume = resume_first if i == 0 else (can_resume() if can_resume else True)
        e = {**(env or {}), **((first_env or {}) if i == 0 else {})}
        if i == 0 and attach is not None:
            res = attach(log_root / f"attempt-{max(start - 1, 1)}")
        else:
            res = launch(["--resume"] if resume else [], log_root / f"attempt-{start + i - (attach is not None)}", e)
        attempts.append(res)
        if res.ok or res.reason is Reason.GUARD:  # a guard's stop is final: no restart past a deadline
            break
        if echo:
            echo(f"group failed: {res.failure_text(lines=3)}")
        if res.refused is not None:
            if echo and i < max_restarts:
                echo(f"not restarted: rank {res.refused} refused its arguments, inputs or environment "
                     f"(exit {USER_ERROR_EXIT}), which a restart would meet again")
            break
        if echo and i < max_restarts:
            echo("restarting the same membership from the latest common manifest")
    return attempts

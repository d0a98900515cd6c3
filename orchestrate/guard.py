"""The controller's own deadline and transfer watch, checked while ranks run.

The cloud has the last word (a scheduled stop at the deadline; on each isolated-zone host a guard
that powers the host off at its limit, and a CloudWatch alarm), but a stopped host loses its
rank's work since the last group checkpoint and leaves the group hanging. The controller therefore
stops the group itself first — every rank by pid, SIGTERM then SIGKILL, no restart — when

  - the deadline is less than `margin_s` away (default 10 minutes), or
  - a guarded host has moved more than `fraction` (the stack's guard_fraction; default
    infra.userdata.GUARD_FRACTION, the number `plan` checks against) of the transfer guard, counted as
    the host's own guard counts (`COUNTERS`).

Work since the last group checkpoint is lost as with any stop; the logs are on the controller and
the checkpoints stay on the hosts. The guard looks at its counters each time it is asked; each
host's counters are read in a thread of their own (`Polled`), every few seconds over a connection
with a short connect timeout, so a host that does not answer holds up no supervision (the
supervisor's liveness probe decides whether it is gone).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Callable

from infra.userdata import GUARD_FRACTION, NETDEV_SUM

COUNTERS = ("echo $(( $(cat /var/lib/trial-guard/carried 2>/dev/null || echo 0) + $("
            + NETDEV_SUM + " /proc/net/dev) ))")
"""What the host's own guard counts (infra/userdata.py): rx + tx of every interface but loopback,
plus what it carried across earlier boots of the trial."""


def parse_counters(text: str) -> int | None:
    s = text.strip()
    return int(s) if s.isdigit() else None


def host_bytes(transport) -> Callable[[], int | None]:
    """A reader of a host's off-host bytes (rx + tx), None when the host does not answer."""
    def read() -> int | None:
        try:
            r = transport.run(COUNTERS, timeout=5.0)
        except Exception:  # noqa: BLE001 — an unreachable host is the liveness probe's business
            return None
        return parse_counters(r.stdout) if r.status == 0 else None
    return read


class Polled:
    """A reader run in its own thread every `every_s` seconds; calling this returns the latest value
    at once (None before the first answer, the last one while the host does not answer), so a host
    that stops answering cannot hold up the supervision that consults the guard."""

    def __init__(self, read: Callable[[], int | None], every_s: float = 5.0, name: str = "counter"):
        self.read, self.every_s = read, every_s
        self.value: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"guard {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            b = self.read()
            if b is not None:
                self.value = b
            if self._stop.wait(self.every_s):
                return

    def __call__(self) -> int | None:
        return self.value

    def close(self) -> None:
        self._stop.set()


class Guard:
    def __init__(self, *, deadline: dt.datetime | None = None, margin_s: float = 600.0,
                 counters: dict[str, Callable[[], int | None]] | None = None, limit_bytes: float | None = None,
                 fraction: float = GUARD_FRACTION, clock: Callable[[], float] = time.time):
        """`counters`: name → a reader of that host's bytes that returns at once (a `Polled`): the
        supervision loop asks the guard between polls of its ranks."""
        if deadline is not None and deadline.tzinfo is None:
            raise ValueError("the deadline needs a timezone")
        self.deadline, self.margin_s = deadline, margin_s
        self.counters, self.limit_bytes, self.fraction = counters or {}, limit_bytes, fraction
        self.clock = clock
        self.last: dict[str, int] = {}

    @property
    def active(self) -> bool:
        return self.deadline is not None or (bool(self.counters) and self.limit_bytes is not None)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline.timestamp() - self.clock()

    def __call__(self) -> str | None:
        left = self.seconds_left()
        if left is not None and left < self.margin_s:
            return (f"the deadline {self.deadline.isoformat()} is {max(left, 0) / 60:.1f} min away "
                    f"(the controller stops {self.margin_s / 60:.0f} min before it)")
        if self.limit_bytes is None:
            return None
        for name, read in self.counters.items():
            b = read()
            if b is None:
                continue
            self.last[name] = b
            if b > self.fraction * self.limit_bytes:
                return (f"{name} has moved {b:,} bytes, over {self.fraction:.0%} of its "
                        f"{self.limit_bytes:,.0f}-byte transfer guard")
        return None

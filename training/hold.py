"""One process at a time: an OS lock (flock) on a small file beside what it guards, which also says
who holds it, so a second run is refused — or waits — naming the first.

A trial home is held by one `orchestrate run` for its whole life: two runs in one home took each
other's live attempt for an abandoned one and collided on checkpoints. A seed directory is held while
it is materialized: a second run waits, then verifies what the first made, instead of racing it.
The kernel drops the lock when its process ends, however it ends, so a crashed run never leaves a
stale hold behind; the descriptor is not inherited by child processes (ranks never hold it).

A hold whose target does not exist when it ends (a refused run whose home was never made, a home
removed while held) unlinks its lock file while still holding it, so nothing is left beside a target
that is not there. That makes "who holds the file at the path" the question: a waiter that opened
the old file gets its lock once the file is unlinked, while a newcomer creates and locks a new one.
So a holder, once locked, checks that the path still names the file it locked (its inode) and
otherwise takes the lock anew on the path's file — never two holders at once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable, Iterator

from evidence.errors import UserError

NEW_HOME = ("use a new --home (with `orchestrate run`: a new --trials folder; or, for a home never preserved, "
            "`orchestrate remove --unpreserved --home HOME` to let it go and run the same name again)")
"""The way out of a refusal that a home's evidence cannot change, for both front doors: `python -m
training` takes --home, `orchestrate run` makes its homes under --trials — and a home never preserved
can be let go, its name with it (orchestrate/homes.py `discard_home`)."""


class HeldError(UserError, RuntimeError):
    """What the caller needs is held by another live process; the message names it."""


def lock_path(target: Path) -> Path:
    """The lock file guarding `target`: beside it, hidden, so it is never part of what it guards."""
    target = Path(target).resolve()  # one lock however the home is reached (a symlink, a relative path)
    return target.parent / f".{target.name}.lock"


def _holder(fd: int) -> str:
    try:
        h = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {h['pid']} on {h['host']} ({h['command']}) since {h['since']}"
    except (ValueError, KeyError, TypeError, OSError):
        return "another process (it has not said which yet)"


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (not unlinked, not replaced by another)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _lock(path: Path, what: str, wait: bool, say: Callable[[str], None]) -> int:
    """An open descriptor of the lock file at `path`, flocked, that `path` still names."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                if not wait:
                    raise HeldError(f"{what} is held by {holder}: one run at a time — wait for it to end, or "
                                    f"stop it (its lock: {path})") from None
                say(f"waiting: {what} is held by {holder}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _names(path, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder unlinked the file we waited on (its target is gone): lock the path's file


@contextlib.contextmanager
def hold(target: Path, what: str, *, wait: bool = False,
         say: Callable[[str], None] = lambda m: None) -> Iterator[None]:
    """Hold `target` for the block. Held elsewhere: raise `HeldError` naming the holder, or with
    `wait`, say so and wait for it to end. A target that does not exist when the block ends leaves no
    lock file behind."""
    target = Path(target).resolve()
    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _lock(path, what, wait, say)
    try:
        prog = Path(sys.argv[0])  # `python -m orchestrate` runs .../orchestrate/__main__.py: say "orchestrate"
        cmd = " ".join([prog.parent.name if prog.name == "__main__.py" else prog.name, *sys.argv[1:]])
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": cmd[:200],
              "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        try:
            if not target.exists() and _names(path, fd):
                with contextlib.suppress(OSError):  # a lock left behind is untidy, never unsafe
                    path.unlink()  # while held: whoever opened this file retries on the path's next one
        finally:
            os.close(fd)

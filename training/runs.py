"""Where an arm's files live, which checkpoints every rank holds, and setting unfinished work aside.

Layout, per rank (each rank writes only under its own directory, so ranks on different hosts need
no shared filesystem):

    runs/<arm>/rank-<r>/checkpoints/step-000064/state.bin      this rank's whole training state
    runs/<arm>/rank-<r>/checkpoints/step-000064/receipt.json   tree sha256 of state.bin + (rank, step, …)
    runs/<arm>/rank-<r>/checkpoints/step-000064/host.json      hostname: recorded, not in the receipt
    runs/<arm>/rank-<r>/manifests/step-000064.json             every rank's receipt digest
    runs/<arm>/rank-<r>/orphaned/attempt-<n>/                  steps after the one resumed from

Torch-free on purpose: the controller runs these against hosts' homes over SSH (`python -c`), and
importing torch there costs seconds per host per arm only to hash a few JSON manifests or rename
directories. `training.checkpoint.group` publishes and restores the states these names point to;
`training.checkpoint.state_file` is the format of `state.bin`.
"""

from __future__ import annotations

import os
from pathlib import Path

from evidence.attempts import next_attempt
from evidence.canonical import canonical_sha256, read_json
from training.errors import TrainError
from training.results import finished

STATE = "state.bin"


def run_dir(home: Path, arm: str) -> Path:
    return home / "runs" / arm


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_dir(rank_dir: Path, step: int) -> Path:
    return rank_dir / "checkpoints" / step_name(step)


def manifest_path(rank_dir: Path, step: int) -> Path:
    return rank_dir / "manifests" / f"{step_name(step)}.json"


def _set_aside(path: Path) -> None:
    """Keep an unfinished attempt's files under attempts/ rather than overwrite them."""
    if not path.exists():
        return
    attempts = path.parent / "attempts"
    attempts.mkdir(exist_ok=True)
    used = [int(p.suffix[1:]) for p in attempts.glob(f"{path.name}.*") if p.suffix[1:].isdigit()]
    path.rename(attempts / f"{path.name}.{max(used, default=0) + 1}")


def set_aside_unfinished(home: Path, arm: str, world: int) -> bool:
    """Before relaunching an arm: if not every rank finished, move every rank's files aside.

    A rank that finished while a peer died cannot be reused on its own (the group restarts from the
    beginning until checkpoints exist), so its result is kept as part of the earlier attempt.
    Returns whether anything was moved.
    """
    if finished(home, arm, world):
        return False
    rd = run_dir(home, arm)
    dirs = [rd / f"rank-{r}" for r in range(world)]
    for d in dirs:
        pid = live_rank(d)
        if pid is not None:
            raise TrainError(f"{d} belongs to a rank that is still running (pid {pid}): a live attempt is "
                             "never set aside — wait for it to end or stop it")
    moved = False
    for d in [*dirs, rd / "model"]:
        if d.exists():
            _set_aside(d)
            moved = True
    return moved


def live_rank(rank_dir: Path) -> int | None:
    """The pid of the training process still writing `rank_dir`'s heartbeat on this machine, if any
    (a heartbeat that cannot be read, or whose pid is gone or now trains another home: None)."""
    try:
        pid = read_json(rank_dir / "heartbeat.json", keys=("pid",))["pid"]
        argv = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (ValueError, TypeError, OSError, IndexError):
        return None
    try:  # its --home, taken from its own working directory
        at = argv.index(b"--home") + 1
        ours = (Path(os.readlink(f"/proc/{int(pid)}/cwd")) / os.fsdecode(argv[at])).resolve() == \
            rank_dir.resolve().parents[2]
    except (ValueError, IndexError, OSError):
        ours = False
    return int(pid) if b"training" in argv and b"train" in argv and ours and state != "Z" else None


def local_manifests(rank_dir: Path) -> dict[int, str]:
    """step → sha256 of each manifest this rank holds (unreadable ones count as absent)."""
    out = {}
    for p in sorted((rank_dir / "manifests").glob("step-*.json")):
        try:
            out[int(p.stem[5:])] = canonical_sha256(read_json(p))
        except (ValueError, OSError):
            continue
    return out


def latest_common(held: list[dict[int, str]]) -> int | None:
    """The latest step whose manifest every rank holds with identical content, or None.

    The one rule for "resumable": the controller asks it before restarting a group with `--resume`
    and the ranks ask it (over a collective) before loading, so the two can never disagree.
    """
    if not held:
        return None
    common = [s for s in set.intersection(*(set(h) for h in held))
              if all(h[s] == held[0][s] for h in held)]
    return max(common, default=None)


def orphan_after(rank_dir: Path, step: int) -> list[str]:
    """Move checkpoints and manifests beyond `step` to orphaned/attempt-<n>/ (kept, not deleted)."""
    later = [p for p in (rank_dir / "checkpoints").glob("*step-*") if _step_of(p) > step]
    later += [p for p in (rank_dir / "manifests").glob("step-*.json") if _step_of(p) > step]
    if not later:
        return []
    base = rank_dir / "orphaned"
    dest = base / f"attempt-{next_attempt(base)}"
    moved = []
    for p in later:
        d = dest / p.parent.name
        d.mkdir(parents=True, exist_ok=True)
        p.rename(d / p.name)
        moved.append(f"{p.parent.name}/{p.name}")
    return moved


def _step_of(p: Path) -> int:
    name = p.name.lstrip(".").removesuffix(".json").removesuffix(".partial")
    try:
        return int(name[5:])
    except ValueError:
        return -1

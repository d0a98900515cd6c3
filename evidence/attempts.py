"""`attempt-<n>` directories: every retried stage keeps each attempt beside the earlier ones
(evaluations, serving probes, supervised groups' logs, orphaned checkpoints), numbered from 1."""

from __future__ import annotations

from pathlib import Path


def attempt_number(path: Path) -> int:
    """n of `.../attempt-<n>`, or -1 for a name that is not one."""
    tail = path.name.rsplit("-", 1)[-1]
    return int(tail) if path.name.startswith("attempt-") and tail.isdigit() else -1


def attempts(root: Path) -> list[Path]:
    """The attempt directories under `root`, in number order (none when root does not exist)."""
    return sorted((p for p in root.glob("attempt-*") if attempt_number(p) > 0), key=attempt_number) \
        if root.exists() else []


def next_attempt(root: Path) -> int:
    return 1 + max((attempt_number(p) for p in attempts(root)), default=0)

"""A trial home once its evidence is preserved: verified before anything is torn down, and removed from
this machine only when every file in it is in its verified evidence index.

Both refuse with `Refused`, naming the home and what to do, and change nothing: a home never
preserved, held by a run, whose evidence does not verify in its store, or (for removal) holding a
file its index does not hold as it is now (a later run's report, a changed file).
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ConfigDict

from evidence.canonical import EvidenceFileError, file_sha256
from evidence.errors import UserError
from evidence.stores import PRESERVED, PreservationError, Preserved, Verified, read_preserved, verify_index
from orchestrate.progress import Progress
from training.hold import HeldError, hold, lock_path


class Refused(UserError):
    """A home that may not be torn down or removed as it is; the message says why and what to do."""


class Removed(BaseModel):
    """What `remove_home` deleted, and the index that holds every file of it."""

    model_config = ConfigDict(frozen=True)

    files: int
    bytes: int
    index: str  # the store's URL and the index in it
    objects: int  # objects of the index re-read and verified before anything was deleted


@contextmanager
def verified_home(home: Path, not_preserved: str, progress: Progress) -> Iterator[tuple[Preserved, Verified]]:
    """Hold `home` (not while a run writes in it) with its preservation record read and its evidence index
    verified in the store, object by object: (record, verification). `not_preserved`: what to do when
    the home was never preserved."""
    rec_path = home / PRESERVED
    if not rec_path.is_file():
        raise Refused(f"{home} has not been preserved (no {PRESERVED}); {not_preserved}")
    with ExitStack() as held:
        try:
            held.enter_context(hold(home, f"trial home {home}"))
        except HeldError as e:
            raise Refused(str(e)) from None
        try:
            rec = read_preserved(home)
            with progress.status("re-reading every preserved object…"):
                v = verify_index(rec.store, rec.index, rec.index_sha256)
        except (EvidenceFileError, PreservationError, OSError) as e:
            raise Refused(f"the evidence {rec_path} records does not verify: {e}") from None
        yield rec, v


def remove_home(home: Path, progress: Progress) -> Removed:
    """Delete `home` once every file in it is in its verified index (the store is not touched): how old
    trials leave the disk. Raises Refused, or OSError when the disk fails part way (the record is
    deleted last, so `remove` can verify and finish what is left)."""
    with verified_home(home, f"run `orchestrate preserve --home {home}` first — nothing of it would survive "
                             "its removal", progress) as (rec, v):
        files = [p for p in sorted(home.rglob("*")) if p.is_file() or p.is_symlink()]
        size = sum(p.stat().st_size for p in files if p.is_file())
        with progress.status(f"comparing {len(files)} files with the index…"):  # a link is never preserved
            left = [rel for rel in (p.relative_to(home).as_posix() for p in files) if rel != PRESERVED and (
                    (home / rel).is_symlink() or rel not in v.sha256 or v.sha256[rel] != file_sha256(home / rel))]
        if left:
            raise Refused(f"{home} holds {len(left)} file(s) its evidence index {rec.store}{rec.index} "
                          f"does not hold as they are now: {', '.join(left[:8])}{' …' if len(left) > 8 else ''}; "
                          f"preserve them (`orchestrate preserve --home {home}`) or move them out first")
        for p in sorted(home.iterdir()):
            if p.name != PRESERVED:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        shutil.rmtree(home)
        lock_path(home).unlink(missing_ok=True)  # while held: no other run can have taken it
    return Removed(files=len(files), bytes=size, index=f"{rec.store}{rec.index}", objects=v.files)

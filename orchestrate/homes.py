"""A trial home once its evidence is preserved: verified before anything is torn down, and removed from
this machine only when every file in it is in its verified evidence index. And a home that was never
preserved (a run that failed after prepare, a task file changed since): discarded, with its trial's
name released in the store so that the name can be used again (`evidence.anchors.release`).

Each refuses with `Refused`, naming the home and what to do, and changes nothing: a home never
preserved, held by a run, whose evidence does not verify in its store, or (for removal) holding a
file its index does not hold as it is now (a later run's report, a changed file); for discarding, a
home that was preserved or whose trial the store holds a preservation of, or a path that is no trial
home.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ConfigDict

from evidence.anchors import AnchorError, release, releasable
from evidence.canonical import EvidenceFileError, file_sha256
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.errors import UserError
from evidence.stores import (PRESERVED, FileStore, PreservationError, Preserved, Verified, open_store, read_preserved,
                             verify_index)
from orchestrate.progress import Progress
from training.hold import HeldError, hold


class Refused(UserError):
    """A home that may not be torn down or removed as it is; the message says why and what to do."""


class Removed(BaseModel):
    """What `remove_home` deleted, and the index that holds every file of it."""

    model_config = ConfigDict(frozen=True)

    files: int
    bytes: int
    index: str  # the store's URL and the index in it
    objects: int  # objects of the index re-read and verified before anything was deleted


class Discarded(BaseModel):
    """What `discard_home` deleted, and the anchors it released (the store keeps them)."""

    model_config = ConfigDict(frozen=True)

    files: int
    bytes: int
    store: str
    released: list[str]  # the release records written, each a URL


def _hold(held: ExitStack, home: Path) -> None:
    """Hold `home` until `held` closes, or refuse naming the run that holds it."""
    try:
        held.enter_context(hold(home, f"trial home {home}"))
    except HeldError as e:
        raise Refused(str(e)) from None


@contextmanager
def verified_home(home: Path, not_preserved: str, progress: Progress) -> Iterator[tuple[Preserved, Verified]]:
    """Hold `home` (not while a run writes in it) with its preservation record read and its evidence index
    verified in the store, object by object: (record, verification). `not_preserved`: what to do when
    the home was never preserved."""
    rec_path = home / PRESERVED
    if not rec_path.is_file():
        raise Refused(f"{home} has not been preserved (no {PRESERVED}); {not_preserved}")
    with ExitStack() as held:
        _hold(held, home)
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
                             f"its removal; or, to let it go unpreserved and use its name again, `orchestrate "
                             f"remove --unpreserved --home {home}`", progress) as (rec, v):
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
        shutil.rmtree(home)  # its lock goes as the hold ends (`training.hold`)
    return Removed(files=len(files), bytes=size, index=f"{rec.store}{rec.index}", objects=v.files)


DISCARD_REASON = "discarded unpreserved by orchestrate remove --unpreserved"
LOG = "commitments.jsonl"


def default_store(home: Path) -> str:
    """The store `orchestrate run` anchors a home's log in without --store or --cluster: beside the homes."""
    return FileStore.url_for(home.resolve().parent / "store")


def discard_home(home: Path, url: str, progress: Progress) -> Discarded:
    """Delete a home that was never preserved and release its trial's anchors in the store at `url`, after
    saying what goes. Its trial name (the home's folder name) can then be anchored anew there. A path
    that no longer exists is let go too when the store holds anchors of its name (a home deleted by
    hand). Raises Refused; OSError when the disk fails part way (the release is written first, so
    `remove --unpreserved` again finishes the deletion)."""
    trial = home.resolve().name
    if (home / PRESERVED).exists():
        raise Refused(f"{home} has been preserved ({PRESERVED}): what was preserved is never discarded — "
                      f"`orchestrate remove --home {home}` deletes it from this machine, its evidence kept")
    if home.exists() and not home.is_dir():
        raise Refused(f"{home} is not a trial home (not a folder): nothing to discard")
    with ExitStack() as held:
        _hold(held, home)
        if (home / PRESERVED).exists():  # preserved while we waited for the hold
            raise Refused(f"{home} has been preserved ({PRESERVED}) just now: `orchestrate remove --home {home}`")
        try:
            store = open_store(url)
            chains = releasable(store, trial)
        except (AnchorError, PreservationError) as e:
            raise Refused(f"{home}: {e}") from None
        ours = home.is_dir() and any((home / n).exists() for n in (LOG, "prepared.json"))
        if not ours and not (chains and not home.exists()):
            raise Refused(f"{home} is not a trial home (no {LOG} or prepared.json in it"
                          + (f", and {store.url} holds no anchors of trial {trial}" if not home.exists() else "")
                          + "): nothing to discard" + ("; an empty folder you may remove yourself" if
                                                      home.is_dir() and not any(home.iterdir()) else ""))
        files = [p for p in sorted(home.rglob("*")) if p.is_file() or p.is_symlink()] if home.exists() else []
        size = sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())
        try:
            said = f"{len(CommitmentLog(home).entries())} commitment(s)"
        except CommitmentError as e:
            said = f"a commitments log that does not verify ({e})"
        progress.say("discard", f"{home}: {len(files)} files, {size / 1e6:,.1f} MB, {said} — deleted from this "
                     "machine" if home.exists() else f"{home}: gone already")
        for first, count in chains.items():
            progress.say("release", f"trial {trial}'s anchors {store.url}anchors/{trial}/{first}/ ({count} "
                         "anchor(s)): kept in the store, released with a record beside them — the name is free again")
        if not chains:
            progress.say("release", f"{store.url} holds no anchors of trial {trial} still its own: nothing to release")
        try:
            keys = release(store, trial, home=str(home.resolve()), files=len(files), size=size, reason=DISCARD_REASON)
        except AnchorError as e:
            raise Refused(f"{home}: {e}") from None
        if home.exists():
            shutil.rmtree(home)  # its lock goes as the hold ends (`training.hold`)
    return Discarded(files=len(files), bytes=size, store=store.url, released=[f"{store.url}{k}" for k in keys])

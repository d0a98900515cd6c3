"""A trial home once its evidence is preserved: verified before anything is torn down, and removed from
this machine only when every file in it is in its verified evidence index. And a home that was never
preserved (a run that failed after prepare, a task file changed since): discarded, with its trial's
name released in the store so that the name can be used again (`evidence.anchors.release`) — unless
the store holds a preservation of that trial name (a home half made beside a preserved trial of its
name): then the home is discarded and nothing is released, since a preserved chain never is, and the
name stays taken there.

Each refuses with `Refused`, naming the home and a command that works in that state (judged by
orchestrate/names.py, as `run` judges it), and changes nothing: a home never preserved, held by a
run, whose evidence does not verify in its store, or (for removal) holding a file its index does not
hold as it is now (a later run's report, a changed file); for discarding, a home that was preserved
(its record there, or its log the chain a preservation index recorded), a path that is no trial home,
or an answer other than yes when asked.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from pydantic import BaseModel, ConfigDict

from evidence.anchors import AnchorError, release, trial_anchors
from evidence.canonical import EvidenceFileError, file_sha256
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.errors import UserError
from evidence.stores import (PRESERVED, PreservationError, Preserved, Verified, open_store, read_preserved,
                             verify_index)
from orchestrate.names import TAKEN_WAYS, default_store, first_entry, preserved_by, unpreserved_advice
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
    taken_by: Optional[str] = None  # the preservation index that keeps the name taken in the store (none released)


class Kept(Refused):
    """Asked before deleting, the answer was not yes: nothing was deleted or released."""


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
    if not (home / PRESERVED).is_file():  # what works instead, judged against the store (`names`)
        raise Refused(f"{home} has not been preserved (no {PRESERVED}); {unpreserved_advice(home)}")
    with verified_home(home, "`orchestrate remove` again says what works now", progress) as (rec, v):
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


def discard_home(home: Path, url: str, progress: Progress, confirm: Callable[[], bool]) -> Discarded:
    """Delete a home that was never preserved, after saying what goes and asking (`confirm`: False
    keeps everything, `Kept`), and release its trial's anchors in the store at `url`: its trial name
    (the home's folder name) can then be anchored anew there. A path that no longer exists is let go
    too when the store holds anchors of its name (a home deleted by hand).

    Where the store holds a preservation index of the trial, nothing is released (a preserved chain
    never is) and the name stays taken there; the home is still discarded, unless its own log is the
    chain that was preserved (its preserved.json deleted since: that home is the preserved trial).
    Raises Refused; OSError when the disk fails part way (the release is written first, so
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
            anchors = trial_anchors(store, trial)
        except (AnchorError, PreservationError) as e:
            raise Refused(f"{home}: {e}") from None
        ours = home.is_dir() and any((home / n).exists() for n in (LOG, "prepared.json"))
        first = first_entry(home) if ours else None
        taken = bool(anchors.indexes)  # a preserved chain is never released: the name stays taken
        chains = {} if taken else anchors.chains
        if taken and anchors.preserved(first):
            raise Refused(f"{home} is trial {trial} as {store.url} preserved it (its log is the chain "
                          f"{preserved_by(anchors)} recorded), its {PRESERVED} deleted since: what was preserved is "
                          f"never discarded — `orchestrate preserve --home {home}"
                          + ("" if url.rstrip("/") == default_store(home).rstrip("/") else f" --store {url}")
                          + f"` preserves it again (writing {PRESERVED}), then `orchestrate remove --home {home}` "
                          "deletes it from this machine")
        if taken and not ours:
            raise Refused(f"{home} " + (f"is not a trial home (no {LOG} or prepared.json in it)" if home.exists()
                                        else "is gone")
                          + f": nothing to discard, nothing to release — {store.url} holds a preservation of trial "
                          f"{trial} ({preserved_by(anchors)}), which keeps the name there for good: {TAKEN_WAYS}")
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
        for first_hash, count in chains.items():
            progress.say("release", f"trial {trial}'s anchors {store.url}anchors/{trial}/{first_hash}/ ({count} "
                         "anchor(s)): kept in the store, released with a record beside them — the name is free again")
        if taken:
            progress.say("keep", f"{store.url} holds a preservation of trial {trial} ({preserved_by(anchors)}): "
                         "nothing is released (a preserved chain never is), and the name stays taken there")
        elif not chains:
            progress.say("release", f"{store.url} holds no anchors of trial {trial} still its own: nothing to release")
        if not confirm():
            raise Kept(f"{home}: nothing deleted, nothing released")
        keys = []
        if not taken:
            try:
                keys = release(store, trial, home=str(home.resolve()), files=len(files), size=size,
                               reason=DISCARD_REASON)
            except AnchorError as e:
                raise Refused(f"{home}: {e}") from None
        if home.exists():
            shutil.rmtree(home)  # its lock goes as the hold ends (`training.hold`)
    return Discarded(files=len(files), bytes=size, store=store.url, released=[f"{store.url}{k}" for k in keys],
                     taken_by=preserved_by(anchors) if taken else None)

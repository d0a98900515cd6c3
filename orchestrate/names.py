"""A trial's name, judged before anything is written: whether a run can prepare and anchor each home
of its lineage, and, where it cannot, the one command that can.

A home is `<trials>/<experiment>-<profile>` and its folder name is the trial's name in the evidence
store. Two things hold a name, and both used to be found only after the seed was imported (gigabytes)
and prepare had run, leaving a half-made home behind:

- the home itself: it keeps the study it was prepared with (prepare refuses other inputs: "a changed
  task file is another study"), so a changed study cannot run in it;
- the store: one trial name holds one chain of anchors there (`evidence.anchors`). A new log of that
  name — any new home, changed study or not — is refused at anchoring while another chain is not
  released, and a chain is never released once a preservation index of the trial is there: what was
  preserved keeps its name in that store for good.

`judge_names` answers both from what is on disk and in the store, for `validate` and `run` alike
(before the seed is imported, before any hold or home folder is made), and refuses naming what changed
and a command that works in that state: `remove --unpreserved` only where it frees the name, a new
trials folder only where that brings another store. `unpreserved_advice` and `taken_ways` give
`remove` and `remove --unpreserved` the same judgement, so that neither sends to a command that would
refuse. Prepare's full comparison (training/prepare.py) and anchoring's (`_one_chain`) stay as the
backstop for anything this does not compare (the seed's files, a race with another run).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from evidence.anchors import AnchorError, TrialAnchors, trial_anchors
from evidence.canonical import EvidenceFileError, file_sha256, read_json
from evidence.commitments import CommitmentError, CommitmentLog
from evidence.errors import UserError
from evidence.stores import PRESERVED, FileStore, PreservationError, open_store

NEW_NAME = "or under a new name (a new profile, or a new experiment name)"


class NameRefused(UserError):
    """A home of the run cannot be prepared or anchored as things are; the message says why and the
    command that works."""


class Planned(BaseModel):
    """One home a run would prepare, and the study it would commit there: what is compared with the
    prepared.json the home holds (as prepare compares it, in part)."""

    model_config = ConfigDict(frozen=True)

    home: Path
    digest: str  # `Resolved.digest()`: prepared.json's experiment_digest
    task_source: Optional[dict[str, Any]]  # as judged (`JsonlFile.describe`); None: the generated families
    replay: Optional[Path] = None  # --replay, for the last home of the lineage (the others get none)


class Where(BaseModel):
    """Where a run keeps its homes and anchors, and how it was asked for, so that a refusal names the
    option that changes the outcome."""

    model_config = ConfigDict(frozen=True)

    trials: Path
    store: str  # the store URL the run anchors in
    store_given: bool  # --store or the cluster's: a new trials folder keeps the same store
    cluster: bool = False  # the hosts preserve into the cluster's store themselves: only a new name is free there
    rerun: list[str]  # `orchestrate run`'s arguments as given, less --trials and --store

    def new_name(self) -> str:
        """"; or under a new name", where `elsewhere` did not say it already."""
        return "" if self.cluster else f"; {NEW_NAME}"

    def command(self, *extra: str) -> str:
        return shlex.join(["orchestrate", "run", *self.rerun, *extra])

    def other_trials(self) -> Path:
        """A trials folder that does not exist yet, beside this one."""
        n = 2
        while Path(f"{self.trials}-{n}").exists():
            n += 1
        return Path(f"{self.trials}-{n}")

    def holding(self, planned: "Planned") -> Optional[Path]:
        """A sibling trials folder (`<trials>-N`, as `other_trials` names them) whose home of this name holds
        this very study already: a run there goes on from it, where a new folder would train it again."""
        n = 2
        while (folder := Path(f"{self.trials}-{n}")).exists():
            home = folder / planned.home.name
            try:
                prepared = read_json(home / "prepared.json") if (home / "prepared.json").is_file() else None
            except (EvidenceFileError, OSError, ValueError):
                prepared = None
            if isinstance(prepared, dict) and not changes(prepared, planned.model_copy(update={"home": home})):
                return folder
            n += 1
        return None

    def elsewhere(self, planned: "Optional[Planned]" = None) -> str:
        """A run that no home or anchor of this folder and store touches. On a cluster, a new name: its hosts
        preserve their checkpoint payloads into the cluster's store themselves (on AWS the stack's bucket, the
        only one their role may write), where another trials folder keeps the same name."""
        if not self.store_given and planned is not None and (folder := self.holding(planned)) is not None:
            return (f"in {folder}, whose {planned.home.name} holds this study already (a run there goes on from "
                    f"it): `{self.command('--trials', str(folder))}`")
        if self.cluster:
            return ("under a new name — a new profile, or a new experiment name (the cluster's hosts preserve into "
                    f"its store {self.store}, which keeps this one; or another cluster)")
        other = self.other_trials()
        if self.store_given:
            return f"in a new trials folder with another store: `{self.command('--trials', str(other), '--store', 'URL')}`"
        return f"in a new trials folder, which has a store of its own: `{self.command('--trials', str(other))}`"


def default_store(home: Path) -> str:
    """The store `orchestrate run` anchors a home's log in without --store or --cluster: beside the homes."""
    return FileStore.url_for(home.resolve().parent / "store")


def discard_command(home: Path, url: str) -> str:
    """`orchestrate remove --unpreserved` for `home`, with --store where the run used another store."""
    return shlex.join(["orchestrate", "remove", "--unpreserved", "--home", str(home),
                       *(["--store", url] if url.rstrip("/") != default_store(home).rstrip("/") else [])])


def _short(sha: Any) -> str:
    return f"{str(sha)[:12]}…" if sha else "none"


def first_entry(home: Path) -> Optional[str]:
    """The hash of the first entry of the home's log: which chain of anchors it is (None: no log yet,
    or one that does not verify, which prepare refuses in its own words)."""
    try:
        entries = CommitmentLog(home).entries()
    except (CommitmentError, OSError, ValueError):
        return None
    return entries[0]["hash"] if entries else None


def _replay_said(source: dict[str, Any]) -> str:
    if source.get("kind") == "user-jsonl":
        return f"the file {source.get('file')} (sha256 {_short(source.get('sha256'))})"
    return "generated" if source.get("kind") == "generated" else "none"


def changes(prepared: dict[str, Any], planned: Planned) -> list[str]:
    """What differs between the study a home was prepared with and the one a run would prepare there,
    each said short, old then new: the task file's bytes, the resolved experiment, the replay."""
    out = []
    was, now = prepared.get("task_source") or {}, planned.task_source or {}
    if was.get("sha256") != now.get("sha256"):
        said = lambda ts: (f"{ts.get('file')} ({ts.get('cases')} cases, sha256 {_short(ts.get('sha256'))})"  # noqa: E731
                           if ts else "none (generated tasks)")
        out.append(f"its task file was {said(was)}, now {said(now)}")
    else:
        for k in sorted(set(was) & set(now) - {"sha256", "used", "unused"}):
            if was[k] != now[k]:
                out.append(f"its task source's {k} was {str(was[k])[:60]}, now {str(now[k])[:60]}")
    if prepared.get("experiment_digest") != planned.digest:
        out.append(f"its experiment resolved to digest {_short(prepared.get('experiment_digest'))}, now "
                   f"{_short(planned.digest)} (the experiment's TOML or its profile changed)")
    old = prepared.get("replay_source") or {}
    if planned.replay is not None:
        sha = file_sha256(planned.replay)
        if old.get("kind") != "user-jsonl" or old.get("sha256") != sha:
            out.append(f"its replay was {_replay_said(old)}, now the file {planned.replay.name} (sha256 {_short(sha)})")
    elif old.get("kind") == "user-jsonl":
        out.append(f"its replay was {_replay_said(old)}, now generated (no --replay)")
    return out


def preserved_by(held: TrialAnchors) -> str:
    key = sorted(held.indexes)[0]
    more = f", and {len(held.indexes) - 1} more" if len(held.indexes) > 1 else ""
    return f"{held.url}{key}{more}"


def _judge(p: Planned, where: Where, held: TrialAnchors) -> str:
    """One home: a line saying what the run will find there, or NameRefused naming the way out."""
    home, trial, url = p.home, held.trial, held.url
    there = home.is_dir()
    preserved = (home / PRESERVED).is_file()
    first = first_entry(home) if there else None
    discard = discard_command(home, where.store)
    prepared = None
    if there and (home / "prepared.json").is_file():
        try:
            prepared = read_json(home / "prepared.json")
        except (EvidenceFileError, OSError, ValueError):
            prepared = None  # prepare refuses it in its own words
    if isinstance(prepared, dict) and (changed := changes(prepared, p)):
        what = "; ".join(changed)
        if preserved:
            raise NameRefused(f"{home} holds another study, preserved: {what}. A home keeps the study it was "
                              f"prepared with, and what was preserved keeps its name for good — run the changed "
                              f"study {where.elsewhere(p)}{where.new_name()}")
        if held.indexes:
            raise NameRefused(f"{home} holds another study, never preserved: {what}. A home keeps the study it was "
                              f"prepared with, and {url} holds a preservation of trial {trial} "
                              f"({preserved_by(held)}), which keeps the name there for good — run the changed "
                              f"study {where.elsewhere(p)}{where.new_name()}. The home itself may go: `{discard}`")
        raise NameRefused(f"{home} holds another study, never preserved: {what}. A home keeps the study it was "
                          f"prepared with: let it go — `{discard}` (it says what goes, asks, then deletes it and "
                          f"frees the name) — then run again; or run {where.elsewhere(p)}")
    if first is not None and first in held.released:
        raise NameRefused(f"{home}'s log was let go in {url} (released/{trial}/{first}.json): it can never anchor "
                          f"there again — `{discard}` deletes the home, then run again; or run {where.elsewhere(p)}")
    others = held.others(first)
    if others:
        if held.indexes:
            gone = "" if there else f"; its home {home} is gone"
            rest = (f"; {home}, never preserved, may go: `{discard}`" if there and not preserved else "")
            store_too = "" if there or where.cluster else " or with another store (`--store URL`)"
            raise NameRefused(f"trial name {trial} is taken in {url}: a trial of that name was preserved there "
                              f"({preserved_by(held)}{gone}), and what was preserved keeps its name for good — "
                              f"run {where.elsewhere(p)}{store_too}{where.new_name()}{rest}")
        n = sum(others.values())
        if there:
            raise NameRefused(f"{url} holds the anchors of another log of trial {trial} than {home}'s ({n} "
                              f"anchor(s), never preserved): {home} cannot anchor there until they are let go — "
                              f"`{discard}` (it deletes {home} and releases the old anchors; the store keeps "
                              f"them), then run again; or run {where.elsewhere(p)}")
        raise NameRefused(f"{url} holds the anchors of an earlier trial {trial} ({n} anchor(s), never preserved), "
                          f"whose home {home} is gone: a new home of that name cannot anchor there until they are "
                          f"let go — `{discard}` (it releases them; the store keeps them), then run again; or run "
                          f"{where.elsewhere(p)}")
    if prepared is not None:
        return f"{home}: prepared with this study{', preserved' if preserved else ''} — a run goes on from it"
    if there:
        return f"{home}: there, not prepared yet"
    return (f"{home}: to be made; {url} holds " + (f"only released anchors of trial {trial}" if held.released
                                                    else f"no anchors of trial {trial}"))


def judge_names(planned: list[Planned], where: Where) -> list[str]:
    """Each home of a run's lineage (earliest first), judged against its folder and the store the run
    anchors in, reading only: a line per home (what `validate` shows), or NameRefused for the first
    home that the run could not prepare or anchor, with the command that works."""
    try:
        store = open_store(where.store)
    except (PreservationError, UserError) as e:
        raise NameRefused(f"the evidence store {where.store} cannot be used: {e}") from None
    lines = []
    for p in planned:
        try:
            held = trial_anchors(store, p.home.resolve().name)
        except AnchorError as e:
            raise NameRefused(str(e)) from None
        lines.append(_judge(p, where, held))
    return lines


TAKEN_WAYS = ("run it again in a new trials folder (`orchestrate run … --trials OTHER`: a store of its own), with "
              f"another store (`--store URL`), {NEW_NAME}")
"""How to run a study whose trial name a store holds for good (a preservation of it is there)."""


def unpreserved_advice(home: Path) -> str:
    """What `remove` says of a home that was never preserved: the commands that work for it, judged
    against the store a run without --store anchors it in (`preserve` is offered only where its log
    can anchor there)."""
    url = default_store(home)
    trial = home.resolve().name
    try:
        held = trial_anchors(open_store(url), trial)
    except (AnchorError, PreservationError, UserError):
        held = None
    first = first_entry(home)
    discard = discard_command(home, url)
    if held is not None and held.indexes and held.preserved(first):
        return (f"its {PRESERVED} is gone, but {url} holds its preservation ({preserved_by(held)}): "
                f"`orchestrate preserve --home {home}` preserves it again (writing {PRESERVED}), then `orchestrate "
                f"remove --home {home}` deletes it from this machine")
    if held is not None and held.others(first):
        taken = (f"{url} holds a preservation of another trial {trial} ({preserved_by(held)}), so it cannot be "
                 "preserved there and its name stays taken" if held.indexes else
                 f"{url} holds the anchors of another log of trial {trial}, so it cannot be preserved there")
        return (f"{taken} — to let it go, `{discard}`; to keep it, preserve it in another store "
                f"(`orchestrate preserve --home {home} --store URL`), then `orchestrate remove --home {home}`")
    return (f"run `orchestrate preserve --home {home}` first — nothing of it would survive its removal; or, to let "
            f"it go unpreserved and use its name again, `{discard}`")

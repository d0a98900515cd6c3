"""The commitments log anchored outside the home: every entry also kept in the evidence store.

The log is a keyless hash chain, so a log rewritten with every hash recomputed cannot be told from
the home alone. Each entry is therefore also written to the store once, under a key of its own
(never overwritten; on S3 the bucket is versioned, and object lock applies where the stack enables
it):

    <store>/anchors/<trial>/<hash of entry 0>/<seq, 8 digits>.json

One trial name holds one log in a store: anchoring refuses to start a second chain beside the first
(a log rewritten from its first entry would otherwise anchor itself anew and pass), and checking
refuses a store that holds two. A new trial under an old name takes another name or another store —
unless the old trial was never preserved and its home was let go (`release`): a trial that failed
before preservation would otherwise hold its name in that store for ever.

Releasing deletes nothing. Stores have no delete (`evidence.stores.base`), a versioned or locked
bucket keeps every object anyway, and a deleted anchor is exactly what checking must catch. A
release is one more object written once, beside the anchors, and read back:

    <store>/released/<trial>/<hash of entry 0>.json

naming the chain, how many anchors it had, when, which home was discarded with how many files, and
why. A released chain is no longer the trial's: it does not count as "another log", and its own log
can never anchor again (nor verify as the trial's). A release is refused while the store holds any
preservation index of the trial (what was preserved stays the trial's for good); one that names a
chain the store does not hold, with another count, or a chain an index preserved, is refused by name
as damaged, as is one that does not parse as a release. Verifying says how many released chains the
trial has, so a reader sees that its name was used before.

What was anchored must still be in the log, field for field, without a gap from entry 0; every
preservation index of the trial in the store records how many entries were anchored then, so a
deleted anchor is missed even when it was the last. Entries made after the last anchoring are
reported as not anchored (visible, not refused: anchoring follows the trial's stages).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evidence.canonical import EvidenceFileError, bytes_sha256, canonical_bytes, parse_json
from evidence.commitments import CommitmentLog
from evidence.errors import UserError
from evidence.stores import PRESERVED, FileStore, PreservationError, Store, open_store, parse_index, read_preserved

FORMAT = "commitment-anchor-v1"
FIELDS = ("seq", "kind", "subject", "sha256", "at", "prev", "hash")
RELEASE_FORMAT = "commitment-anchors-release-v1"
_RELEASE_NAME = re.compile(r"[0-9a-f]{64}\.json")


class AnchorError(UserError, RuntimeError):
    """The home's log disagrees with the anchors in the store, or the anchors cannot be read."""


class Release(BaseModel):
    """A chain of anchors that is no longer its trial's: its home was discarded unpreserved. Strict and
    closed, so a record with a field missing, added or of another type is refused, never coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["commitment-anchors-release-v1"] = RELEASE_FORMAT
    trial: str
    prefix: str  # anchors/<trial>/<hash of entry 0>/
    count: int  # the chain's anchors when it was released (it can never gain one)
    at: str
    home: str  # the home discarded
    files: int  # its files, deleted with it
    bytes: int
    reason: str


def _prefix(trial: str) -> str:
    return f"anchors/{trial}/"


def _release_prefix(trial: str) -> str:
    return f"released/{trial}/"


def _release_key(trial: str, first: str) -> str:
    return f"{_release_prefix(trial)}{first}.json"


def _key(trial: str, first: str, seq: int) -> str:
    return f"{_prefix(trial)}{first}/{seq:08d}.json"


def _body(trial: str, entry: dict[str, Any]) -> bytes:
    return canonical_bytes({"format": FORMAT, "trial": trial, **{k: entry[k] for k in FIELDS}})


def _read(store: Store, key: str) -> dict[str, Any]:
    try:
        doc = parse_json(b"".join(store.read_chunks(key)), f"{store.url}{key}")
    except EvidenceFileError as e:
        raise AnchorError(str(e)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not all(k in doc for k in FIELDS):
        raise AnchorError(f"{store.url}{key}: damaged, not a commitment anchor")
    return doc


def _chains(store: Store, trial: str) -> dict[str, list[str]]:
    """The store's anchor chains of `trial`: first entry's hash → its keys."""
    out: dict[str, list[str]] = {}
    for k in store.list(_prefix(trial)):
        out.setdefault(k[len(_prefix(trial)):].split("/", 1)[0], []).append(k)
    return out


def _read_release(store: Store, key: str) -> Release:
    try:
        return Release.model_validate(parse_json(b"".join(store.read_chunks(key)), f"{store.url}{key}"))
    except EvidenceFileError as e:
        raise AnchorError(str(e)) from None
    except ValidationError as e:
        err = e.errors()[0]
        raise AnchorError(f"{store.url}{key}: damaged, not an anchors release "
                          f"({'.'.join(map(str, err['loc'])) or 'the record'}: {err['msg']})") from None


def _indexed_anchors(store: Store, trial: str) -> dict[str, dict[str, Any]]:
    """Each preservation index of `trial` in the store → the anchors it recorded ({} for none)."""
    out = {}
    for key in store.list(f"indexes/{trial}/"):
        try:
            out[key] = parse_index(b"".join(store.read_chunks(key)), f"{store.url}{key}").get("anchors") or {}
        except PreservationError as e:
            raise AnchorError(str(e)) from None
    return out


def _released(store: Store, trial: str, chains: dict[str, list[str]]) -> dict[str, Release]:
    """The store's releases of `trial`'s chains: first entry's hash → its release, each read through the
    strict model and checked against the chain it names (one the store holds, with the count it had,
    never one a preservation index recorded)."""
    out: dict[str, Release] = {}
    for key in store.list(_release_prefix(trial)):
        name = key[len(_release_prefix(trial)):]
        if not _RELEASE_NAME.fullmatch(name):
            raise AnchorError(f"{store.url}{key}: damaged, not an anchors release (a release is named "
                              f"{_release_prefix(trial)}<hash of entry 0>.json)")
        first, r = name.removesuffix(".json"), _read_release(store, key)
        if r.trial != trial or r.prefix != f"{_prefix(trial)}{first}/":
            raise AnchorError(f"{store.url}{key}: damaged, it releases {r.prefix} of trial {r.trial}")
        if first not in chains or len(chains[first]) != r.count:
            raise AnchorError(f"{store.url}{key}: damaged, it releases {r.count} anchor(s) of {r.prefix}, the store "
                              f"holds {len(chains.get(first, []))}: a release names only a chain as it was released")
        out[first] = r
    if out:
        for key, prefix in ((k, str(a.get("prefix", ""))) for k, a in _indexed_anchors(store, trial).items()):
            if prefix.removeprefix(_prefix(trial)).rstrip("/") in out:
                raise AnchorError(f"{store.url}{_release_key(trial, prefix.split('/')[2])}: not a genuine release: "
                                  f"{store.url}{key} preserved that chain, and a preserved chain is never released")
    return out


def _one_chain(chains: dict[str, list[str]], released: dict[str, Release], first: str, store: Store, trial: str,
               log: str) -> None:
    if first in released:
        r = released[first]
        raise AnchorError(f"{log}: its anchors {store.url}{r.prefix} were released ({store.url}"
                          f"{_release_key(trial, first)}: {r.reason}, {r.at}): this log is no longer trial {trial}'s "
                          "and can never be anchored again — run the trial anew in a new home")
    others = sorted(set(chains) - set(released) - {first})
    if others:
        raise AnchorError(f"{log}: the store {store.url} already holds the anchors of another log for trial {trial} "
                          f"(first entry {others[0][:16]}…; this log's is {first[:16]}…): this log was rewritten, "
                          "or it is a new trial under an old name — give a new trial another name (another "
                          "trials folder) or another store, or, if no trial of that name was ever preserved there, "
                          "let the old one go: `orchestrate remove --unpreserved --home HOME` (HOME: this log's "
                          "home, or the old one's path)")


def anchor_log(home: str | Path, store: Store, trial: str | None = None) -> dict[str, Any] | None:
    """Anchor every entry of the home's log that the store does not hold yet (each read back).
    Returns the log's anchors in the store ({"prefix", "count", "added"}; None for an empty log):
    what a preservation index records. Refused: an entry whose anchor differs (the log was rewritten
    since), or another log's anchors under the same trial name."""
    home = Path(home)
    trial = trial or home.resolve().name
    log = str(home / "commitments.jsonl")
    entries = CommitmentLog(home).entries()
    if not entries:
        return None
    first = entries[0]["hash"]
    added = 0
    try:
        chains = _chains(store, trial)
        _one_chain(chains, _released(store, trial, chains), first, store, trial, log)
        have = set(chains.get(first, []))
        for e in entries:
            key, body = _key(trial, first, e["seq"]), _body(trial, e)
            if key in have:
                if b"".join(store.read_chunks(key)) != body:
                    raise AnchorError(f"commitment {e['seq']} of {log} differs from its anchor {store.url}{key}: "
                                      "the log was rewritten after it was anchored, or the anchor was damaged")
                continue
            store.put_bytes(key, body)
            if bytes_sha256(b"".join(store.read_chunks(key))) != bytes_sha256(body):
                raise AnchorError(f"{store.url}{key}: the anchor does not read back as written")
            added += 1
    except AnchorError:
        raise
    except Exception as e:  # noqa: BLE001 — an unreachable or unusable store: nothing is anchored
        raise AnchorError(f"cannot anchor {log} in {store.url}: {e}") from None
    return {"prefix": f"{_prefix(trial)}{first}/", "count": len(entries), "added": added}


def check_anchors(entries: list[dict[str, Any]], store: Store, trial: str, log: str = "the log",
                  at_least: int = 0) -> dict[str, Any]:
    """Check a verified chain of `entries` against the store's anchors; raise AnchorError naming the
    first disagreement. Anchors are written in order, so they run from entry 0 without a gap, and
    each must equal its entry field for field; `at_least`: how many a preservation found there.
    Released chains are not the trial's (counted in what is returned, so that it can be said).
    Returns what was checked (anchored and not yet anchored entries)."""
    chains = _chains(store, trial)
    released = _released(store, trial, chains)
    if not entries:
        raise AnchorError(f"{log} is empty, but the store {store.url} holds anchors for trial {trial}"
                          if set(chains) - set(released) else f"{log} is empty")
    first = entries[0]["hash"]
    _one_chain(chains, released, first, store, trial, log)
    if first not in chains:
        raise AnchorError(f"{log}: the store {store.url} holds no anchors for trial {trial}: it was never anchored there")
    anchored = {}
    for k in chains[first]:
        a = _read(store, k)
        if k != _key(trial, first, a["seq"]) or a["trial"] != trial:
            raise AnchorError(f"{store.url}{k}: damaged, its content names entry {a['seq']} of {a['trial']}")
        anchored[a["seq"]] = a
    for seq, a in sorted(anchored.items()):
        key = f"{store.url}{_key(trial, first, seq)}"
        if seq >= len(entries):
            raise AnchorError(f"{log}: commitment {seq} ({a['kind']} {a['subject']}) is anchored in {key} but "
                              f"the log holds only {len(entries)} entries: the log was cut short")
        if entries[seq]["hash"] != a["hash"]:
            raise AnchorError(f"{log}: commitment {seq} ({entries[seq]['kind']} {entries[seq]['subject']}) differs "
                              f"from its anchor {key}: the log was rewritten")
        if _body(trial, entries[seq]) != canonical_bytes(a):
            raise AnchorError(f"{key}: damaged, it differs from commitment {seq} whose hash it records")
    gaps = sorted(set(range(max(len(anchored), at_least))) - set(anchored))
    if gaps:
        raise AnchorError(f"{store.url}{_key(trial, first, gaps[0])}: missing — anchors run from entry 0 without a "
                          f"gap{f' and a preservation found {at_least}' if at_least else ''}; this one was deleted")
    return {"store": store.url, "trial": trial, "anchored": len(anchored), "entries": len(entries),
            "not_anchored": [e["seq"] for e in entries if e["seq"] not in anchored], "released": len(released)}


def released_prefixes(store: Store, trial: str) -> set[str]:
    """The anchor prefixes of `trial` that are released (each release checked as anchoring checks it):
    anchors a teardown's check must not take for an unpreserved home's."""
    return {f"{_prefix(trial)}{first}/" for first in _released(store, trial, _chains(store, trial))}


class TrialAnchors(BaseModel):
    """What a store holds under one trial name: what decides, before a run writes anything, whether a
    new log of that name can anchor there (`orchestrate/names.py`), and what `remove --unpreserved` may
    let go. A name is held by every chain not released; it is held for good once any preservation index
    of the trial is there (a preserved chain is never released)."""

    model_config = ConfigDict(frozen=True)

    url: str
    trial: str
    chains: dict[str, int]  # the chains not released: first entry's hash → its anchors
    released: list[str]  # the first entries' hashes of released chains
    indexes: dict[str, str]  # each preservation index of the trial → the first entry's hash it preserved ("": none)

    def others(self, first: str | None) -> dict[str, int]:
        """The chains not released but the one that starts at `first` (a home's own log): a log of
        this name that starts at `first` is refused as long as any is there (`_one_chain`)."""
        return {f: n for f, n in self.chains.items() if f != first}

    def preserved(self, first: str | None) -> bool:
        """Whether a preservation index of the trial may have preserved the chain that starts at `first`:
        one recorded it, or one recorded no chain (a preservation without anchors: which log it was is
        not known) while that chain is anchored here. A log never anchored was never preserved."""
        return first is not None and (first in self.indexes.values()
                                      or ("" in self.indexes.values() and first in self.chains))


def trial_anchors(store: Store, trial: str) -> TrialAnchors:
    """The store's anchors, releases and preservation indexes of `trial`, each release checked as
    anchoring checks it. Raises AnchorError for a damaged record or a store that cannot be read."""
    try:
        chains = _chains(store, trial)
        released = _released(store, trial, chains)
        indexes = {k: str(a.get("prefix", "")).removeprefix(_prefix(trial)).rstrip("/")
                   for k, a in _indexed_anchors(store, trial).items()}
    except AnchorError:
        raise
    except Exception as e:  # noqa: BLE001 — an unreachable or unusable store
        raise AnchorError(f"cannot read the anchors of trial {trial} in {store.url}: {e}") from None
    return TrialAnchors(url=store.url, trial=trial, released=sorted(released), indexes=indexes,
                        chains={f: len(keys) for f, keys in sorted(chains.items()) if f not in released})


def releasable(store: Store, trial: str) -> dict[str, int]:
    """The chains of `trial` in the store not yet released (first entry's hash → its anchors): what
    `release` would let go. Refused while the store holds any preservation index of the trial."""
    try:
        indexes = store.list(f"indexes/{trial}/")
        if indexes:
            raise AnchorError(f"the store {store.url} holds {len(indexes)} preservation index(es) of trial {trial} "
                              f"({store.url}{indexes[0]}{' …' if len(indexes) > 1 else ''}): a preserved trial's "
                              "anchors are never released — give a new trial another name (another trials folder) "
                              "or another store")
        chains = _chains(store, trial)
        released = _released(store, trial, chains)
    except AnchorError:
        raise
    except Exception as e:  # noqa: BLE001 — an unreachable or unusable store: nothing is released
        raise AnchorError(f"cannot read the anchors of trial {trial} in {store.url}: {e}") from None
    return {first: len(keys) for first, keys in sorted(chains.items()) if first not in released}


def release(store: Store, trial: str, *, home: str, files: int, size: int, reason: str) -> list[str]:
    """Release every chain of `trial` that `releasable` finds: one release record each, written once
    and read back; nothing is deleted. Returns the records' keys."""
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    keys = []
    for first, count in releasable(store, trial).items():
        key = _release_key(trial, first)
        body = canonical_bytes(Release(trial=trial, prefix=f"{_prefix(trial)}{first}/", count=count, at=at,
                                       home=home, files=files, bytes=size, reason=reason).model_dump())
        try:
            if store.size(key) is not None:  # listed by no `releasable`: one being written elsewhere
                raise AnchorError(f"{store.url}{key}: already written, by another release running now")
            store.put_bytes(key, body)
            if b"".join(store.read_chunks(key)) != body:
                raise AnchorError(f"{store.url}{key}: the release does not read back as written")
        except AnchorError:
            raise
        except Exception as e:  # noqa: BLE001 — an unreachable or unusable store
            raise AnchorError(f"cannot write the release {store.url}{key}: {e}") from None
        _read_release(store, key)  # as every reader will parse it
        keys.append(key)
    return keys


def _preserved_counts(store: Store, trial: str, first: str) -> int:
    """The most anchors any preservation index of `trial` in the store recorded for this log (the
    indexes are never overwritten, so a home's own record cannot lower it); an index that records
    another log's anchors is refused."""
    most = 0
    for key, a in _indexed_anchors(store, trial).items():
        if a and a.get("prefix") != f"{_prefix(trial)}{first}/":
            raise AnchorError(f"{store.url}{key}: this preservation of trial {trial} anchored another log "
                              f"({a.get('prefix')}): the home's log was rewritten since")
        most = max(most, int(a.get("count", 0)))
    return most


def verify_anchors(home: str | Path, entries: list[dict[str, Any]], url: str | None,
                   trial: str | None = None) -> dict[str, Any] | None:
    """`check_anchors` against the store the home's evidence lives in: `url` if given, else the one
    its preservation record names, else `file://<home's folder's parent>/store` when that holds
    anchors of the trial (None when no store is known). The trial's name: given, else the one its
    preservation recorded, else the home's folder name."""
    home = Path(home)
    rec = read_preserved(home) if (home / PRESERVED).is_file() else None
    prefix = rec.anchors.prefix if rec is not None and rec.anchors is not None else ""
    trial = trial or (prefix.split("/")[1] if prefix.count("/") >= 2 else home.resolve().name)
    try:
        url = url or (rec.store if rec is not None else None)
        if url is None:
            default = home.resolve().parent / "store"
            if not (default / _prefix(trial)).is_dir():
                return None
            url = FileStore.url_for(default)
        store = open_store(url)
        got = check_anchors(entries, store, trial, log=str(home / "commitments.jsonl"),
                            at_least=_preserved_counts(store, trial, entries[0]["hash"]) if entries else 0)
    except AnchorError:
        raise
    except Exception as e:  # noqa: BLE001 — an unreachable or unusable store: the anchors are unknown
        raise AnchorError(f"the anchors in {url} cannot be read: {e}") from None
    return got

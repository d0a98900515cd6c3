"""The commitments log anchored outside the home: every entry's hash also kept in the evidence store.

The log is a keyless hash chain, so a log rewritten with every hash recomputed cannot be told from
the home alone. Each entry is therefore also written to the store once, under a key of its own
(never overwritten; on S3 the bucket is versioned, and object lock applies where the stack enables
it):

    <store>/anchors/<trial>/<hash of entry 0>/<seq, 8 digits>.json

The first entry's hash names the log, so a fresh trial that reuses a trial name in the same store
starts its own anchors instead of colliding with the old ones; a rewritten first entry therefore
finds no anchors of its own beside the original's, and that is refused too. What was anchored must
still be in the log with the same hash; entries made after the last anchoring are reported as not
anchored (visible, not refused: anchoring follows the trial's stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evidence.canonical import EvidenceFileError, bytes_sha256, canonical_bytes, parse_json
from evidence.commitments import CommitmentLog

FORMAT = "commitment-anchor-v1"
FIELDS = ("seq", "kind", "subject", "sha256", "at", "prev", "hash")


class AnchorError(RuntimeError):
    """The home's log disagrees with the anchors in the store, or the anchors cannot be read."""


def _prefix(trial: str) -> str:
    return f"anchors/{trial}/"


def _key(trial: str, first: str, seq: int) -> str:
    return f"{_prefix(trial)}{first}/{seq:08d}.json"


def _body(trial: str, entry: dict[str, Any]) -> bytes:
    return canonical_bytes({"format": FORMAT, "trial": trial, **{k: entry[k] for k in FIELDS}})


def _read(store: Any, key: str) -> dict[str, Any]:
    try:
        doc = parse_json(b"".join(store.read_chunks(key)), f"{store.url}{key}")
    except EvidenceFileError as e:
        raise AnchorError(str(e)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not all(k in doc for k in FIELDS):
        raise AnchorError(f"{store.url}{key}: damaged, not a commitment anchor")
    return doc


def anchor_log(home: str | Path, store: Any, trial: str | None = None) -> int:
    """Anchor every entry of the home's log that the store does not hold yet (each read back);
    returns how many were added. An entry whose anchor already holds another hash is refused: the
    log was rewritten since it was anchored."""
    home = Path(home)
    trial = trial or home.resolve().name
    entries = CommitmentLog(home).entries()
    if not entries:
        return 0
    first = entries[0]["hash"]
    have = set(store.list(f"{_prefix(trial)}{first}/"))
    added = 0
    for e in entries:
        key = _key(trial, first, e["seq"])
        body = _body(trial, e)
        if key in have:
            if _read(store, key)["hash"] != e["hash"]:
                raise AnchorError(f"commitment {e['seq']} of {home / 'commitments.jsonl'} differs from its anchor "
                                  f"{store.url}{key}: the log was rewritten after it was anchored")
            continue
        store.put_bytes(key, body)
        got = b"".join(store.read_chunks(key))
        if bytes_sha256(got) != bytes_sha256(body):
            raise AnchorError(f"{store.url}{key}: the anchor does not read back as written")
        added += 1
    return added


def extent(home: str | Path, trial: str | None = None) -> dict[str, Any] | None:
    """Where the home's anchors are and how many its log has: what a preservation index records, so
    that anchors deleted from the store later are missed (`check_anchors`' `at_least`, `verify_index`)."""
    home = Path(home)
    entries = CommitmentLog(home).entries()
    if not entries:
        return None
    return {"prefix": f"{_prefix(trial or home.resolve().name)}{entries[0]['hash']}/", "count": len(entries)}


def check_anchors(entries: list[dict[str, Any]], store: Any, trial: str, log: str = "the log",
                  at_least: int = 0) -> dict[str, Any]:
    """Check a verified chain of `entries` against the store's anchors; raise AnchorError naming the
    first disagreement. Anchors are written in order, so they run from entry 0 without a gap, and
    each must equal its entry field for field; `at_least`: how many a preservation found there.
    Returns what was checked (anchored and not yet anchored entries)."""
    keys = store.list(_prefix(trial))
    logs = sorted({k[len(_prefix(trial)):].split("/", 1)[0] for k in keys})
    if not entries:
        raise AnchorError(f"{log} is empty, but the store {store.url} holds anchors for trial {trial}"
                          if logs else f"{log} is empty")
    first = entries[0]["hash"]
    if first not in logs:
        if logs:
            raise AnchorError(f"{log}: its first entry ({first[:16]}…) was never anchored in {store.url} for trial "
                              f"{trial}, whose anchors belong to a log starting {', '.join(x[:16] + '…' for x in logs)}: "
                              "the log was rewritten, or is not this store's trial")
        raise AnchorError(f"{log}: the store {store.url} holds no anchors for trial {trial}: it was never anchored there")
    anchored = {}
    for k in keys:
        if k.startswith(f"{_prefix(trial)}{first}/"):
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
                          f"gap{f' and the preservation found {at_least}' if at_least else ''}; this one was deleted")
    return {"store": store.url, "trial": trial, "anchored": len(anchored), "entries": len(entries),
            "not_anchored": [e["seq"] for e in entries if e["seq"] not in anchored]}


def known_store(home: str | Path, url: str | None = None) -> str | None:
    """The store to check a home's anchors against: the one given, else the one its evidence was
    preserved to (preserved.json), else none (the chain alone is then all that can be checked)."""
    if url:
        return url
    from evidence.stores import PRESERVED, read_preserved

    return read_preserved(home)["store"] if (Path(home) / PRESERVED).is_file() else None


def verify_anchors(home: str | Path, entries: list[dict[str, Any]], url: str | None,
                   trial: str | None = None) -> dict[str, Any] | None:
    """`check_anchors` against the known store (None when no store is known)."""
    from evidence.stores import open_store

    from evidence.stores import PRESERVED, read_preserved

    url = known_store(home, url)
    if url is None:
        return None
    rec = read_preserved(home) if (Path(home) / PRESERVED).is_file() else {}
    at_least = (rec.get("anchors") or {}).get("count", 0) if rec.get("store") == url else 0
    try:
        return check_anchors(entries, open_store(url), trial or Path(home).resolve().name,
                             log=str(Path(home) / "commitments.jsonl"), at_least=at_least)
    except AnchorError:
        raise
    except Exception as e:  # noqa: BLE001 — an unreachable or unusable store: the anchors are unknown
        raise AnchorError(f"the anchors in {url} cannot be read: {e}") from None

"""Preservation: every file of a trial home, content-addressed, each object read
back from the store and re-hashed after upload, then an index of what was preserved.

    <store>/objects/sha256/<first two hex>/<digest>     the bytes; the key is their sha256
    <store>/indexes/<trial>/<utc time>.json              {"files": {relative path: {"sha256", "size"}}, ...}

Any store of the registry (`evidence.stores.registry`) serves, through the `Store` protocol
(`evidence.stores.base`). A store's echo of a checksum is not trusted — moto, for one, accepts and
echoes a wrong one — so preservation streams every object back and hashes what it reads. An index is written only after every object
verified, and is itself read back. `verify_index` repeats the whole read-back later (teardown does).

Checkpoint payloads of ranks on SSH hosts stay on the hosts (tens of GB per rank at 1.7B), so each
host preserves its own part from where the bytes are (`preserve_part`, run on the host: uploaded, read
back and hashed in region) and the controller's index lists them as `hosts/<host>/<path>` with the host
that verified them. The controller checks that each is present at its size but does not pull the
bytes through its own link; `verify_index` does the same for them and reads back everything else.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import ValidationError

from evidence.canonical import (EvidenceFileError, bytes_sha256, canonical_bytes, canonical_sha256, file_sha256,
                                parse_json, read_json, write_json_atomic)
from evidence.stores.base import PreservationError, Store
from evidence.stores.records import Anchors, HostPayloadsLeft, Index, IndexEntry, Preserved, Verified
from evidence.stores.registry import open_store

PRESERVED = "preserved.json"  # in the home: where its evidence went, and the index's digest


HOST_PAYLOAD = re.compile(r"(^|/)checkpoints/step-[^/]+/(?!receipt\.json$|host\.json$)[^/]+$")
"""Checkpoint payloads: what stays on an SSH host's volume when a rank's files are collected (their
receipts, the manifests and everything else come back), and what the host then preserves itself."""


def _hash_stream(chunks: Iterator[bytes]) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for c in chunks:
        h.update(c)
        n += len(c)
    return h.hexdigest(), n


def object_key(sha256: str) -> str:
    return f"objects/sha256/{sha256[:2]}/{sha256}"


def staging_key(sha256: str) -> str:
    """Where staging relays an artifact (a wheel, a seed file, a prepared input) for the hosts to fetch:
    apart from the evidence objects, so that the instance role can read these and nothing else it
    did not write (infra/bucket.py, `host_access`), and so that preservation never counts them as evidence."""
    return f"staging/{sha256}"


def _files(home: Path) -> list[Path]:
    """Every regular file of the home except the preservation record itself (it names the index)."""
    return sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink() and p.name != PRESERVED)


def _read_back(store: Store, key: str, sha256: str, size: int) -> None:
    got, n = _hash_stream(store.read_chunks(key))
    if (got, n) != (sha256, size):
        raise PreservationError(f"{store.url}{key} reads back as {got} ({n} bytes), written as {sha256} "
                                f"({size} bytes): the store does not hold what was uploaded")


def _put_verified(store: Store, p: Path) -> tuple[str, int, bool]:
    """One file into the store under its sha256 (unless the store holds that object already), then
    read back and hashed: uploaded now or earlier, it must read back. (sha256, size, uploaded now)."""
    digest, size = file_sha256(p), p.stat().st_size
    key = object_key(digest)
    uploaded = store.size(key) is None
    if uploaded:
        store.put_file(key, p, digest)
    _read_back(store, key, digest, size)
    return digest, size, uploaded


def preserve_part(home: str | os.PathLike[str], url: str, *, session: Any = None) -> dict[str, dict[str, Any]]:
    """On an SSH host: every checkpoint payload under `home` into the store (skipping objects it already
    holds), each read back and hashed here, in region. Returns {relative path: {"sha256", "size"}} for
    the controller's index."""
    home = Path(home)
    store = open_store(url, session)
    out = {}
    for p in _files(home):
        rel = str(p.relative_to(home))
        if not HOST_PAYLOAD.search(rel):
            continue
        digest, size, _ = _put_verified(store, p)
        out[rel] = {"sha256": digest, "size": size}
    return out


def remote_payloads(home: str | os.PathLike[str]) -> list[str]:
    """Checkpoint payloads the home's receipts name but the home does not hold: they stayed on the
    hosts that wrote them, and only those hosts can preserve them."""
    home = Path(home)
    missing = []
    for receipt in sorted(home.glob("runs/*/rank-*/checkpoints/step-*/receipt.json")):
        for name in read_json(receipt, keys=("files",))["files"]:
            if not (receipt.parent / name).is_file():
                missing.append(str((receipt.parent / name).relative_to(home)))
    return missing


def preserve(home: str | os.PathLike[str], url: str | Store, *, trial: str, session: Any = None,
             anchors: Anchors | dict[str, str | int] | None = None,
             host_parts: dict[str, dict[str, dict[str, Any]]] | None = None,
             leave_host_payloads: str | None = None,
             say: Callable[[str], None] = lambda m: None) -> Preserved:
    """Upload every file of `home` (skipping objects the store already holds and that read back
    right), verify each, then write and verify the index; record it in <home>/preserved.json.
    `anchors` ({"prefix", "count"}, from `evidence.anchors.anchor_log`): the log's anchors in this store,
    recorded in the index so that `verify_index` misses any that disappear. `host_parts` ({host: what
    `preserve_part` returned there}): checked present in the store and listed as hosts/<host>/<path>.
    A checkpoint payload the home's receipts name that neither the home nor a host part holds is refused,
    unless `leave_host_payloads` gives the reason it is left behind (recorded in the index). Returns the
    record written."""
    home = Path(home)
    store = open_store(url, session) if isinstance(url, str) else url
    anchors = Anchors.model_validate(anchors) if anchors else None
    files: dict[str, IndexEntry] = {}
    total = 0
    left = set(remote_payloads(home))
    for host, part in sorted((host_parts or {}).items()):  # preserved by the host itself, read back there
        for rel, f in sorted(part.items()):
            if not HOST_PAYLOAD.search(rel):
                raise PreservationError(f"{host}: {rel} is not a checkpoint payload; a host preserves only those")
            size = store.size(object_key(f["sha256"]))
            if size != f["size"]:
                raise PreservationError(f"{host}: {rel} is " + ("not in the store" if size is None else
                                        f"{size} bytes in the store, the host says {f['size']}"))
            files[f"hosts/{host}/{rel}"] = IndexEntry(sha256=f["sha256"], size=f["size"], verified_by=host)
            left.discard(rel)
    if left and not leave_host_payloads:
        raise PreservationError(f"{len(left)} checkpoint payload(s) the home's receipts name are on the hosts and "
                                f"not preserved (e.g. {sorted(left)[0]}): preserve with the cluster (`orchestrate "
                                "preserve --cluster cluster.json`), so that each host preserves its own")
    paths = _files(home)
    for i, p in enumerate(paths, 1):
        digest, size, uploaded = _put_verified(store, p)
        files[str(p.relative_to(home))] = IndexEntry(sha256=digest, size=size)
        total += size if uploaded else 0
        if i % 50 == 0 or i == len(paths):
            say(f"preserved {i}/{len(paths)} files ({total / 1e6:,.1f} MB uploaded this time)")
    at = _dt.datetime.now(_dt.timezone.utc)
    index = Index(trial=trial, store=store.url, at=at.isoformat(), files=files,
                  bytes=sum(f.size for f in files.values()), anchors=anchors,
                  # given up on purpose (a host that is gone, say): the reason and what is missing, recorded
                  host_payloads_left=HostPayloadsLeft(reason=leave_host_payloads, paths=sorted(left)) if left else None)
    body = canonical_bytes(index.body())
    digest = bytes_sha256(body)
    key = f"indexes/{trial}/{at.strftime('%Y%m%dT%H%M%S%fZ')}.json"
    store.put_bytes(key, body)
    _read_back(store, key, digest, len(body))
    # the paths too: what the index covers is known without the store (`evidence.covered`)
    record = Preserved.sealed(store=store.url, index=key, index_sha256=digest, files=len(files), bytes=index.bytes,
                              uploaded_bytes=total, at=index.at, paths=sorted(files), anchors=anchors)
    write_json_atomic(home / PRESERVED, record.body())
    return record


def read_preserved(home: str | os.PathLike[str]) -> Preserved:
    """The home's preservation record, refused by name when missing, damaged or altered."""
    path = Path(home) / PRESERVED
    rec = read_json(path, keys=("store", "index", "index_sha256"))
    if "digest" not in rec:
        raise EvidenceFileError(f"{path}: written by an older version (no digest): run `orchestrate preserve` again")
    if canonical_sha256({k: v for k, v in rec.items() if k != "digest"}) != rec["digest"]:
        raise EvidenceFileError(f"{path}: damaged or altered, its contents differ from its own digest")
    try:
        return Preserved.model_validate(rec)
    except ValidationError as e:  # sealed, yet not a record this version reads: refused by name, never guessed
        err = e.errors()[0]
        raise EvidenceFileError(f"{path}: damaged, not a preservation record "
                                f"({'.'.join(map(str, err['loc']))}: {err['msg']})") from None


def parse_index(body: bytes, where: str) -> dict[str, Any]:
    """An index, its file table checked entry by entry (a damaged index is refused by name)."""
    index = parse_json(body, where)
    files = index.get("files") if isinstance(index, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(f, dict) and isinstance(f.get("sha256"), str) and len(f["sha256"]) == 64
            and type(f.get("size")) is int and f["size"] >= 0 for f in files.values()):
        raise PreservationError(f"{where}: damaged, not a preservation index (its file table)")
    return index


def verify_index(url: str, key: str, sha256: str, *, session: Any = None,
                 say: Callable[[str], None] = lambda m: None) -> Verified:
    """Re-read the index and every object it names from the store; raise on the first mismatch,
    naming the home's file. Every object's presence and size are checked before any is hashed, so
    a missing or cut object is found without reading gigabytes first."""
    store = open_store(url, session)
    try:
        body = b"".join(store.read_chunks(key))
    except Exception as e:  # noqa: BLE001 — whatever the store says, the index cannot be read
        raise PreservationError(f"{store.url}{key}: the index cannot be read: {e}") from None
    if bytes_sha256(body) != sha256:
        raise PreservationError(f"{store.url}{key}: the index differs from the one recorded ({sha256})")
    index = parse_index(body, f"{store.url}{key}")
    files, anchors = index["files"], index.get("anchors") or {}
    items = sorted(files.items())
    try:
        for seq in range(int(anchors.get("count", 0))):  # the log's anchors, as many as were preserved
            a = f"{anchors['prefix']}{seq:08d}.json"
            if store.size(a) is None:
                raise PreservationError(f"{store.url}{a}: the commitments log's anchor {seq} is missing")
        for rel, f in items:
            size = store.size(object_key(f["sha256"]))
            if size != f["size"]:
                raise PreservationError(f"{rel}: object {object_key(f['sha256'])} is "
                                        + ("missing" if size is None else f"{size} bytes, the index says {f['size']}"))
    except PreservationError:
        raise
    except Exception as e:  # noqa: BLE001 — the store refused to say (permissions, network): not verified
        raise PreservationError(f"{store.url}: the preserved objects cannot be listed: {e}") from None
    for i, (rel, f) in enumerate(items, 1):
        if f.get("verified_by"):  # a host's payload: hashed where it lies when preserved; present, right size
            continue
        try:
            _read_back(store, object_key(f["sha256"]), f["sha256"], f["size"])
        except PreservationError as e:
            raise PreservationError(f"{rel}: {e}") from None
        except Exception as e:  # noqa: BLE001 — a missing object is as bad as a wrong one
            raise PreservationError(f"{rel}: object {object_key(f['sha256'])} cannot be read: {e}") from None
        if i % 200 == 0:
            say(f"verified {i}/{len(items)} objects")
    return Verified(index=key, files=len(files), bytes=sum(f["size"] for f in files.values()),
                    sha256={rel: f["sha256"] for rel, f in files.items()})
